"""``rlhf-lit iterate`` reads its prompt and held-out sets as ``fit`` reads data: the shipped HH-RLHF ``.jsonl.gz``
(cut at the last human turn, as the policy reads it), a ``messages`` file, a run directory kept before the
prompt source existed. The loop runs with :class:`test_iterate.FakeFits` (no training).

Expected prompts are computed from the raw records by a re-implementation written here (the HH transcript up to
its last ``\\n\\nAssistant:``; the messages without the last assistant turn), not by the data package.
"""

from __future__ import annotations

import gzip
import json

from assets_paths import HH_RLHF, STORIES260K_CHAT
from iterate_helpers import FakeFits, error_line, iterate, jsonl, loop_config

HH_ASSISTANT = "\n\nAssistant:"


def hh_records(n: int) -> list[dict]:
    with gzip.open(HH_RLHF, "rt", encoding="utf-8") as f:
        return [json.loads(next(f)) for _ in range(n)]


def test_the_shipped_hh_file_gives_the_loop_its_held_out_and_fresh_prompts(tmp_path, monkeypatch, tiny_rm):
    prompts = {"path": str(HH_RLHF), "skip": 1, "words": None, "held_out": 2, "per_iteration": 4}
    config = loop_config(tmp_path, iterations=1, prompts=prompts)
    result = iterate(config, FakeFits(tiny_rm), monkeypatch, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    chosen = [r["chosen"] for r in hh_records(7)]
    want = [c[: c.rindex(HH_ASSISTANT) + len(HH_ASSISTANT)] for c in chosen]  # the policy has no template
    sampled = [s["prompt"] for s in jsonl(tmp_path / "run" / "iter_1" / "samples.jsonl")]
    assert sampled == want[1 + 2 : 1 + 2 + 4]  # after skip 1 and the 2 held out


def test_a_chat_policy_reads_a_messages_file_s_conversations(tmp_path, monkeypatch, chat_rm):
    user = [{"role": "user", "content": f"Tell a story about {name}"} for name in "ABCDEF"]
    records = [{"messages": [turn, {"role": "assistant", "content": "Once."}]} for turn in user]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    prompts = {"path": str(path), "skip": 0, "words": None, "held_out": 2, "per_iteration": 4}
    config = loop_config(tmp_path, iterations=1, sft_model=str(STORIES260K_CHAT), prompts=prompts)
    result = iterate(config, FakeFits(chat_rm, policy=STORIES260K_CHAT), monkeypatch, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    samples = jsonl(tmp_path / "run" / "iter_1" / "samples.jsonl")
    assert [s["prompt"] for s in samples] == [[turn] for turn in user[2:]]
    assert samples[0]["prompt_text"] == "<s>User: Tell a story about C\nAssistant:"


def test_a_bad_prompt_source_is_one_line_naming_it_before_any_fit(tmp_path, monkeypatch, tiny_rm):
    (tmp_path / "x.jsonl.gz").write_text('{"prompt": "a"}\n', encoding="utf-8")
    for prompts, named in (
        ({"path": str(tmp_path / "x.jsonl.gz")}, "prompts: " + str(tmp_path / "x.jsonl.gz") + ": not a complete gzip"),
        ({"path": "", "config": None}, "prompts: a prompt source takes a path"),
        ({"path": str(HH_RLHF), "skip": 2312}, "prompts: " + str(HH_RLHF) + ": no prompts left after skip 2312"),
    ):
        fits = FakeFits(tiny_rm)
        line = error_line(iterate(loop_config(tmp_path, prompts=prompts), fits, monkeypatch, tmp_path))
        assert named in line, line
        assert fits.calls == [] and not (tmp_path / "run").exists()


def test_a_run_kept_before_the_prompt_source_existed_resumes(tmp_path, monkeypatch, tiny_rm):
    """``iterate.json`` of an older version: no split, subset or config under prompts, ``field: prompt``, and no
    ``policy`` or ``bonbon`` (a PPO loop, as every loop was)."""
    assert iterate(loop_config(tmp_path, iterations=1), FakeFits(tiny_rm), monkeypatch, tmp_path).returncode == 0
    snapshot = tmp_path / "run" / "iterate.json"
    kept = json.loads(snapshot.read_text(encoding="utf-8"))
    for key in ("split", "subset", "config"):
        del kept["config"]["prompts"][key]
    kept["config"]["prompts"]["field"] = "prompt"
    del kept["config"]["policy"], kept["config"]["bonbon"]
    snapshot.write_text(json.dumps(kept), encoding="utf-8")
    fits = FakeFits(tiny_rm)
    result = iterate(loop_config(tmp_path, iterations=2), fits, monkeypatch, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [(t, stage) for (t, stage, _) in fits.calls] == [(2, "reward_model"), (2, "ppo")]
