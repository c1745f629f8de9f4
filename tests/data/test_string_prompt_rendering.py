"""One string-prompt file reaches the policy as the same token ids in every stage and command.

SFT, the reward model, DPO and PPO (each through the data module its shipped config names), PPO under
``rlhf-lit iterate`` (the option the loop passes), ``rlhf-lit evaluate``, ``rlhf-lit best-of-n`` and the
``OnlineGeneration`` callback read the file below with every rendering option left at ``auto``; the ids of
its prompts are compared with ids built by hand from the template's text. With the chat tokenizer the
prompt is one user turn with the generation prompt; with the plain one, the string itself after BOS.
"""

from __future__ import annotations

import pytest
import yaml
from assets_paths import CONFIGS, STORIES260K, STORIES260K_CHAT
from data_assets import write_jsonl

from rlhf_lit.callable_specs import import_class
from rlhf_lit.callbacks import OnlineGeneration
from rlhf_lit.commands.iterate_config import IterateConfig
from rlhf_lit.commands.iterate_steps import Paths, fit_args, policy_reads_chat
from rlhf_lit.data.prompt_source import read_prompt_source
from rlhf_lit.evaluation import samples
from rlhf_lit.evaluation.best_of_n_sweep import best_of_n
from rlhf_lit.evaluation.policy_metrics import evaluate_policy
from rlhf_lit.functional.losses import IGNORE_INDEX
from rlhf_lit.tokenizer import load_tokenizer

PROMPTS = ["Once upon a time", "Tom had a red ball."]
RECORDS = [{"prompt": p, "response": "There was a cat.", "chosen": "A cat.", "rejected": "A dog."} for p in PROMPTS]


def by_hand(tokenizer, prompt: str, chat: bool) -> list[int]:
    """The prompt's ids, built from the template's text (assets/models/stories260K-chat's tokenizer_config.json:
    ``{{ bos_token }}``, ``'User: ' + content + '\\n'``, then the generation prompt ``'Assistant:'``); without a
    template the string as written after the BOS the tokenizer puts in front (id 1)."""
    if chat:
        return tokenizer(f"<s>User: {prompt}\nAssistant:", add_special_tokens=False)["input_ids"]
    return [1] + tokenizer(prompt, add_special_tokens=False)["input_ids"]


def stage_data(stage: str) -> type:
    """The data module class the stage's shipped config names."""
    config = yaml.safe_load((CONFIGS / "offline" / f"{stage}.yaml").read_text(encoding="utf-8"))
    return import_class(config["data"]["class_path"])


def prompt_ids(item: dict) -> list[int]:
    """The prompt part of a data module's item: SFT's unlabelled start, a pair's shared prompt, PPO's prompt."""
    if "labels" in item:
        return item["input_ids"][: next(i for i, label in enumerate(item["labels"]) if label != IGNORE_INDEX)]
    if "prompt_length" in item:
        return item["chosen_input_ids"][: item["prompt_length"]]
    return item["input_ids"]


def data_ids(module: type, tokenizer, path: str, **options) -> list[list[int]]:
    dm = module(tokenizer=tokenizer, train_path=path, format="fields", **options)
    dm.setup("fit")
    return [prompt_ids(item) for item in dm.train_dataset]


class Captured(Exception):
    """Stops a command once its prompts are rendered (no model is loaded)."""


def command_ids(monkeypatch, run) -> list[list[int]]:
    """The ids a command gives the policy (``samples.policy_prompts``, which every command calls to render them)."""
    real, seen = samples.policy_prompts, []

    def capture(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        raise Captured

    with monkeypatch.context() as patch, pytest.raises(Captured):
        patch.setattr(samples, "policy_prompts", capture)
        run()
    return seen[0].ids


@pytest.mark.parametrize(("model", "chat"), [(STORIES260K_CHAT, True), (STORIES260K, False)])
def test_one_string_prompt_file_is_rendered_alike_everywhere(model, chat, tmp_path, monkeypatch):
    path = str(write_jsonl(tmp_path / "prompts.jsonl", RECORDS))
    tokenizer = load_tokenizer(str(model))
    want = [by_hand(tokenizer, p, chat) for p in PROMPTS]
    got = {stage: data_ids(stage_data(stage), tokenizer, path) for stage in ("sft", "reward_model", "dpo", "ppo")}
    args = fit_args(IterateConfig(), Paths(str(tmp_path), 1), "ppo", replace=False, chat=policy_reads_chat(tokenizer))
    option = args.index("--data.init_args.chat_template")
    got["iterate ppo"] = data_ids(stage_data("ppo"), tokenizer, path, chat_template=args[option + 1])
    prompts = read_prompt_source(path, tokenizer).prompts
    got["evaluate"] = command_ids(monkeypatch, lambda: evaluate_policy(str(model), prompts))
    m = 2  # best-of-n's samples per prompt: each prompt's ids M times in a row
    got["best-of-n"] = command_ids(monkeypatch, lambda: best_of_n(str(model), "unread", prompts, [1, m]))[::m]
    got["OnlineGeneration"] = OnlineGeneration(prompts).rendered(tokenizer).ids
    assert got == {name: want for name in got}
