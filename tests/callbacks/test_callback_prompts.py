"""OnlineGeneration and the guard's held-out evaluation give a chat policy its prompts inside its
template, by the rule of ``rlhf_lit.data.prompt_rendering`` (``chat_template``), and their judge reads
the rendered prompt + response with ``judge_reads: query_response``.

Expected prompts are hand-written from the template of ``assets/models/stories260K-chat``
(assets/README.md: ``<s>``, ``User: ...\\n``, generation prompt ``Assistant:``).
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from assets_paths import HH_RLHF, STORIES260K, STORIES260K_CHAT

from rlhf_lit.callbacks import OnlineGeneration
from rlhf_lit.callbacks.guard import HeldOut, OverOptimisationGuard
from rlhf_lit.data.prompt_source import PromptSource
from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.generation import SamplingConfig
from rlhf_lit.tokenizer import load_tokenizer

RENDERED = "<s>User: Once upon a time\nAssistant:"


def characters(texts: list[str]) -> list[float]:
    """A judge that shows what it read: the number of characters of each text."""
    return [float(len(t)) for t in texts]


def stand_in(path) -> SimpleNamespace:
    """What the callback reads of a PPO module: policy, tokenizer, sampling, device and a score."""
    tokenizer = load_tokenizer(str(path), padding_side="left")
    fed: list[list[int]] = []

    def score(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        fed.extend(row[m.bool()].tolist() for row, m in zip(ids, mask))  # the rows the reward model reads
        return torch.zeros(ids.shape[0])

    return SimpleNamespace(
        policy=load_causal_lm(str(path), tokenizer).eval(),
        tokenizer=tokenizer,
        fed=fed,
        score=score,
        sampling=SamplingConfig(max_new_tokens=3),
        device=torch.device("cpu"),
    )


def ids_of(tokenizer, text: str) -> list[int]:
    """``<s>`` (the llama BOS, id 1) and the hand-written ``text`` tokenized without specials."""
    return [1, *tokenizer(text, add_special_tokens=False)["input_ids"]]


def test_online_generation_renders_its_prompts_and_its_judge_reads_them(caplog):
    module = stand_in(STORIES260K_CHAT)
    callback = OnlineGeneration(
        ["Once upon a time"], judge="test_callback_prompts:characters", judge_reads="query_response"
    )
    with caplog.at_level(logging.INFO):
        responses, columns = callback.sample(module)
    rendered = ids_of(module.tokenizer, "User: Once upon a time\nAssistant:")
    assert module.fed[0][: len(rendered)] == rendered  # the prompt the policy (and the RM) read
    assert columns["judge"] == [float(len(RENDERED + responses[0]))]
    assert (
        "1 string prompt(s) rendered as one user turn with the chat template (OnlineGeneration chat_template "
        "auto, and the tokenizer" in caplog.text
    )


@pytest.mark.parametrize("path", [STORIES260K_CHAT, STORIES260K], ids=["never", "no template"])
def test_online_generation_keeps_plain_strings_with_never_or_without_a_template(path):
    module = stand_in(path)
    option = "never" if path == STORIES260K_CHAT else "auto"
    callback = OnlineGeneration(
        ["Once upon a time"],
        judge="test_callback_prompts:characters",
        judge_reads="query_response",
        chat_template=option,
    )
    responses, columns = callback.sample(module)
    prompt = ids_of(module.tokenizer, "Once upon a time")
    assert module.fed[0][: len(prompt)] == prompt
    assert columns["judge"] == [float(len("Once upon a time" + responses[0]))]


@pytest.mark.parametrize("trained_rendered", [False, True])
def test_auto_follows_how_the_training_prompts_were_rendered(trained_rendered, caplog):
    """A chat tokenizer trained on plain strings (a data module's ``chat_rendered`` False): ``auto``
    samples the fixed prompts as plain strings too, so the reward model scores the rendering PPO
    trains on; trained on rendered prompts, it renders them."""
    module = stand_in(STORIES260K_CHAT)
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(chat_rendered=trained_rendered))
    with caplog.at_level(logging.INFO):
        OnlineGeneration(["Once upon a time"]).sample(module)
    text = "User: Once upon a time\nAssistant:" if trained_rendered else "Once upon a time"
    prompt = ids_of(module.tokenizer, text)
    assert module.fed[0][: len(prompt)] == prompt
    how = "rendered with" if trained_rendered else "kept outside"
    assert f"auto, and the training prompts are {how} the chat template" in caplog.text


def test_the_guard_held_out_prompts_follow_the_same_rule():
    module = stand_in(STORIES260K_CHAT)
    rendered = ids_of(module.tokenizer, "User: Once upon a time\nAssistant:")
    held_out = HeldOut(
        prompts=["Once upon a time"], judge="test_callback_prompts:characters", judge_reads="query_response"
    )
    guard = OverOptimisationGuard(held_out=held_out)
    responses, columns = guard.sampler.sample(module)
    assert module.fed[0][: len(rendered)] == rendered
    assert columns["judge"] == [float(len(RENDERED + responses[0]))]
    plain = OverOptimisationGuard(held_out=HeldOut(prompts=["Once upon a time"], chat_template="never"))
    module.fed.clear()
    plain.sampler.sample(module)
    prompt = ids_of(module.tokenizer, "Once upon a time")
    assert module.fed[0][: len(prompt)] == prompt


def test_bad_options_name_the_option():
    callback = OnlineGeneration(["Once upon a time"], chat_template="always")
    with pytest.raises(ValueError, match="OnlineGeneration chat_template always, but the tokenizer"):
        callback.sample(stand_in(STORIES260K))
    with pytest.raises(ValueError, match="judge_reads must be one of response, query_response"):
        OnlineGeneration(["x"], judge_reads="prompt")
    with pytest.raises(
        ValueError, match="OnlineGeneration chat_template must be one of auto, always, never; got 'yes'"
    ):
        OnlineGeneration(["x"], chat_template="yes")  # at construction, before any rollout
    with pytest.raises(
        ValueError, match=r"seed must be in \[-9223372036854775808, 9223372036854775807\], got 18446744073709551616"
    ):
        OnlineGeneration(["x"], seed=2**64)


def test_online_generation_s_judge_may_be_a_reward_model_export(offline_chain):
    from rlhf_lit.evaluation.reward_judge import RewardModelScorer

    rm = str(offline_chain.export("reward_model"))  # trained on plain prompts: it reads them plain
    module = stand_in(STORIES260K)
    callback = OnlineGeneration(["Once upon a time", "The dog ran"], judge=rm)  # judge_reads left at response
    responses, columns = callback.sample(module)
    assert columns["judge"] == RewardModelScorer(rm)(["Once upon a time", "The dog ran"], responses)


def test_conversations_and_sources_reach_the_policy_in_its_template(tmp_path):
    module = stand_in(STORIES260K_CHAT)
    conversation = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}]
    callback = OnlineGeneration([conversation, "Once upon a time"])
    callback.sample(module)
    want = [
        ids_of(module.tokenizer, t)
        for t in ("System: Be kind.\nUser: Hi\nAssistant:", "User: Once upon a time\nAssistant:")
    ]
    assert [row[: len(w)] for row, w in zip(module.fed, want)] == want  # the rows the RM read: prompt + response
    module.fed.clear()
    messages = tmp_path / "m.jsonl"
    messages.write_text(json.dumps({"messages": [*conversation, {"role": "assistant", "content": "Yo"}]}) + "\n")
    held_out = HeldOut(prompts=str(messages))  # a path: the held-out prompts read as the data modules read them
    OverOptimisationGuard(held_out=held_out).sampler.sample(module)
    assert module.fed[0][: len(want[0])] == want[0] and len(module.fed) == 1
    # the shipped HH file: the first transcript's turns, cut before its last assistant turn
    texts = OnlineGeneration(PromptSource(path=str(HH_RLHF), max_prompts=1)).rendered(module.tokenizer).texts
    assert texts[0].startswith("<s>User: what are some pranks with a pen i can do?\nAssistant: Are you")
    assert texts[0].endswith("</s>\nUser: okay some of these do not have anything to do with pens\nAssistant:")


def test_a_bad_prompt_is_named_at_construction_and_a_bad_source_when_fit_starts(tmp_path):
    with pytest.raises(ValueError, match=r"OnlineGeneration: field 'prompts\[0\]\[0\]' has role 'bot'"):
        OnlineGeneration([[{"role": "bot", "content": "Hi"}]])
    with pytest.raises(
        ValueError, match=r"guard held_out: field 'prompts\[1\]\[0\]' ends the prompt on an assistant turn"
    ):
        HeldOut(prompts=["Hi", [{"role": "assistant", "content": "Yo"}]])
    module, trainer = stand_in(STORIES260K), SimpleNamespace(datamodule=None)
    missing = str(tmp_path / "held_out.jsonl")
    guard = OverOptimisationGuard(held_out=HeldOut(prompts=missing))  # read when fit starts, for its tokenizer
    with pytest.raises(FileNotFoundError, match="data file not found: .*held_out.jsonl"):
        guard.setup(trainer, module, "fit")
    messages = tmp_path / "m.jsonl"
    messages.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    with pytest.raises(ValueError, match="has no chat template"):  # conversations for a policy without one
        OnlineGeneration(str(messages)).setup(trainer, module, "fit")
