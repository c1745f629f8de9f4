"""`rlhf-lit evaluate` and `rlhf-lit best-of-n` sample a chat policy inside its template (--chat-template).

The expected prompts are written by hand from the template of ``assets/models/stories260K-chat``
(assets/README.md: ``<s>``, ``User: ...\\n``, generation prompt ``Assistant:``); the ids the policy
is given are read where the library hands them to ``generate``.
"""

from __future__ import annotations

import json

from assets_paths import STORIES260K, STORIES260K_CHAT
from cli_helpers import error_line, ids_of, run_main

from rlhf_lit.tokenizer import load_tokenizer

CHAT, STORIES = str(STORIES260K_CHAT), str(STORIES260K)
JUDGE = "test_chat_prompts_cli:characters"


def characters(texts: list[str]) -> list[float]:
    """A judge that shows what it read: the number of characters of each text."""
    return [float(len(t)) for t in texts]


TOKENIZED: list[list[int]] = []


def reward_model_like(texts: list[str]) -> list[float]:
    """A judge that tokenizes what it reads as a reward model would (``add_special_tokens=False``: the
    template's specials are in the text) and keeps the ids in :data:`TOKENIZED`."""
    TOKENIZED.extend(load_tokenizer(CHAT)(t, add_special_tokens=False)["input_ids"] for t in texts)
    return [0.0] * len(texts)


def evaluate(tmp_path, policy: str, prompts: str, *extra: str) -> tuple[dict, str]:
    """Run ``rlhf-lit evaluate`` on ``prompts`` (a file's text); (the JSON written, stderr)."""
    path = tmp_path / ("p.jsonl" if prompts.startswith("{") else "p.txt")
    path.write_text(prompts, encoding="utf-8")
    out = tmp_path / "eval.json"
    result = run_main(
        "evaluate",
        "--policy",
        policy,
        "--prompts",
        str(path),
        "--max-new-tokens",
        "4",
        "--out",
        str(out),
        "--overwrite",
        *extra,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text()), result.stderr


def test_evaluate_renders_string_prompts_with_the_chat_template_by_default(tmp_path, fed):
    data, stderr = evaluate(
        tmp_path, CHAT, "Once upon a time\nThe dog ran\n", "--judge", JUDGE, "--judge-reads", "query_response"
    )
    assert fed == [ids_of("User: Once upon a time\nAssistant:"), ids_of("User: The dog ran\nAssistant:")]
    texts = [s["prompt_text"] for s in data["samples"]]
    assert texts == ["<s>User: Once upon a time\nAssistant:", "<s>User: The dog ran\nAssistant:"]
    assert [s["prompt"] for s in data["samples"]] == ["Once upon a time", "The dog ran"]  # as given
    # The judge read the rendered prompt + the response: the text the policy continued.
    assert [s["judge"] for s in data["samples"]] == [len(t + s["response"]) for t, s in zip(texts, data["samples"])]
    assert data["config"]["chat_template"] == "auto"
    assert (
        f"--prompts: 2 string prompt(s) rendered as one user turn with the chat template (--chat-template auto, "
        f"and the tokenizer '{CHAT}' has a chat template)"
    ) in stderr


def test_a_judge_reading_the_prompt_gets_the_ids_the_policy_read(tmp_path, fed):
    TOKENIZED.clear()
    evaluate(
        tmp_path,
        CHAT,
        '{"prompt": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell a story"}]}\n',
        "--judge",
        "test_chat_prompts_cli:reward_model_like",
        "--judge-reads",
        "query_response",
    )
    assert fed == [ids_of("System: Be kind.\nUser: Tell a story\nAssistant:")]
    # The last text it read (the first is the plain sentence every function judge is asked when it is loaded):
    assert TOKENIZED[-1][: len(fed[0])] == fed[0]  # the rendered prompt, its <s> once, then the response


def test_chat_template_never_keeps_plain_strings(tmp_path, fed):
    data, stderr = evaluate(tmp_path, CHAT, "Once upon a time\n", "--chat-template", "never", "--judge", JUDGE)
    assert fed == [ids_of("Once upon a time")]
    assert data["samples"][0]["prompt_text"] == "Once upon a time"
    assert data["samples"][0]["judge"] == len(data["samples"][0]["response"])  # --judge-reads response: the default
    assert "--prompts: 1 string prompt(s) kept as plain strings (--chat-template never)" in stderr


def test_a_policy_without_a_template_is_unchanged(tmp_path, fed, gpt2_dir):
    _, stderr = evaluate(tmp_path, STORIES, "Once upon a time\n")
    assert fed == [ids_of("Once upon a time", STORIES)]  # the BOS once, as before
    assert "kept as plain strings (--chat-template auto, and the tokenizer" in stderr
    fed.clear()
    evaluate(tmp_path, gpt2_dir, "Once upon a time\n")
    assert fed == [[7454, 2402, 257, 640]]  # GPT-2's ids of "Once upon a time", no specials


def test_always_without_a_template_and_messages_without_one_are_refused_before_any_weights(tmp_path, monkeypatch):
    import rlhf_lit.models

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded before the prompts were rendered")

    monkeypatch.setattr(rlhf_lit.models, "load_causal_lm", no_weights)
    (tmp_path / "p.txt").write_text("Once upon a time\n", encoding="utf-8")
    result = run_main(
        "evaluate", "--policy", STORIES, "--prompts", str(tmp_path / "p.txt"), "--chat-template", "always", cwd=tmp_path
    )
    assert result.returncode == 1
    assert error_line(result).startswith("rlhf-lit: error: --chat-template always, but the tokenizer")
    (tmp_path / "c.jsonl").write_text('{"prompt": [{"role": "user", "content": "Hi"}]}\n', encoding="utf-8")
    result = run_main("evaluate", "--policy", STORIES, "--prompts", str(tmp_path / "c.jsonl"), cwd=tmp_path)
    assert result.returncode == 1 and "has no chat template" in error_line(result)


def test_best_of_n_samples_conversational_and_string_prompts_in_the_template(tmp_path, fed, stories_rm):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        '{"prompt": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell a '
        'story"}]}\n{"prompt": "The cat"}\n',
        encoding="utf-8",
    )
    out = tmp_path / "bon.json"
    result = run_main(
        "best-of-n",
        "--policy",
        CHAT,
        "--reward-model",
        stories_rm,
        "--prompts",
        str(prompts),
        "--n",
        "1,2",
        "--max-new-tokens",
        "4",
        "--judge",
        JUDGE,
        "--judge-reads",
        "query_response",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    system = "System: Be kind.\nUser: Tell a story\nAssistant:"
    assert fed == [ids_of(system)] * 2 + [ids_of("User: The cat\nAssistant:")] * 2  # M = 2 samples per prompt
    data = json.loads(out.read_text())
    assert data["prompt_texts"] == [f"<s>{system}", "<s>User: The cat\nAssistant:"]
    for s in data["samples"]:
        assert s["judge"] == len(data["prompt_texts"][s["prompt_index"]] + s["response"])
    assert "1 conversational prompt(s) rendered with the chat template" in result.stderr


def test_best_of_n_with_never_keeps_plain_strings(tmp_path, fed, stories_rm):
    (tmp_path / "p.txt").write_text("The cat\n", encoding="utf-8")
    out = tmp_path / "bon.json"
    result = run_main(
        "best-of-n",
        "--policy",
        CHAT,
        "--reward-model",
        stories_rm,
        "--prompts",
        str(tmp_path / "p.txt"),
        "--n",
        "1",
        "--max-new-tokens",
        "4",
        "--chat-template",
        "never",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert fed == [ids_of("The cat")]
    assert json.loads(out.read_text())["prompt_texts"] == ["The cat"]
