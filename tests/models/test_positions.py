"""Rows longer than a model's positions: refused before any step for a learned table, said for rotary ones.

A GPT-2 with ``n_positions`` 16 has a 16-row position table: a longer row crashed inside the first forward
pass (``IndexError: index out of range in self``). The expected lengths below are counted by hand from the
options (a rollout row: prompt + new tokens, one more for the reward model under ``with_eos``).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from assets_paths import GPT2_TOKENIZER, TINYSTORIES
from cli_in_process import run_main
from transformers import (
    BloomConfig,
    BloomForCausalLM,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
)

from rlhf_lit.models.positions import check_sequence_length, position_limit
from rlhf_lit.stages.ppo.checks import check_rollout_lengths

TINY = {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 64}


def gpt2(n_positions: int, head: type = GPT2LMHeadModel) -> torch.nn.Module:
    """A one-block GPT-2 with a learned table of ``n_positions`` rows."""
    return head(GPT2Config(n_positions=n_positions, num_labels=1, pad_token_id=0, **TINY))


def tiny_llama(max_position_embeddings: int) -> torch.nn.Module:
    """A one-block Llama: rotary positions, trained (by its config) up to ``max_position_embeddings``."""
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=max_position_embeddings,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def test_position_limit_tells_learned_tables_from_rotary_positions():
    opt = OPTForCausalLM(
        OPTConfig(
            vocab_size=64,
            hidden_size=16,
            num_hidden_layers=1,
            ffn_dim=32,
            num_attention_heads=2,
            max_position_embeddings=20,
            word_embed_proj_dim=16,
        )
    )
    llama = tiny_llama(24)
    bloom = BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=16, n_layer=1, n_head=2))
    got = {
        name: position_limit(m) for name, m in {"gpt2": gpt2(16), "opt": opt, "llama": llama, "bloom": bloom}.items()
    }
    assert (got["gpt2"].key, got["gpt2"].length, got["gpt2"].learned) == ("n_positions", 16, True)
    assert (got["opt"].key, got["opt"].length, got["opt"].learned) == ("max_position_embeddings", 20, True)
    assert (got["llama"].key, got["llama"].length, got["llama"].learned) == ("max_position_embeddings", 24, False)
    assert got["bloom"] is None  # ALiBi: no position table, nothing to check


def test_a_learned_table_refuses_one_row_past_it_and_takes_its_own_length():
    model = gpt2(16)
    check_sequence_length([model], 16, "--data.init_args.max_length")
    with pytest.raises(ValueError, match=r"rows of up to 17 tokens \(--data.init_args.max_length\).*n_positions 16"):
        check_sequence_length([None, model], 17, "--data.init_args.max_length")


def test_a_rotary_model_past_its_length_is_said_not_refused(caplog):
    llama = tiny_llama(24)
    with caplog.at_level(logging.WARNING, logger="rlhf_lit"):
        check_sequence_length([llama], 24, "x")
        assert not caplog.records
        check_sequence_length([llama], 25, "x")
    assert "max_position_embeddings 24" in caplog.text and "rotary" in caplog.text


def rollout_stage(policy: int, reward: int, unfinished: str, *, ptx: int = 0, ptx_coef: float = 0.0):
    """What check_rollout_lengths reads of a PPO stage: prompts of 10 tokens and 6 new ones (16 a row)."""
    datamodule = SimpleNamespace(max_prompt_length=10, ptx_max_length=ptx)
    return SimpleNamespace(
        trainer=SimpleNamespace(datamodule=datamodule),
        sampling=SimpleNamespace(max_new_tokens=6),
        policy=gpt2(policy),
        ref_policy=gpt2(policy),
        critic=None,
        reward_model=gpt2(reward, GPT2ForSequenceClassification),
        reward_cfg=SimpleNamespace(unfinished=unfinished),
        ppo=SimpleNamespace(ptx_coef=ptx_coef),
    )


@pytest.mark.parametrize(
    "policy, reward, unfinished, ptx, ptx_coef, refused",
    [
        (16, 16, "as_sampled", 0, 0.0, None),  # 10 + 6 = 16 fits both
        (15, 16, "as_sampled", 0, 0.0, "n_positions 15"),  # the policy's row is one too long
        (16, 16, "with_eos", 0, 0.0, "with_eos"),  # the RM reads 16 + the end = 17
        (16, 17, "with_eos", 0, 0.0, None),
        (16, 17, "with_eos", 20, 0.0, None),  # ptx rows are not read without ptx
        (16, 17, "with_eos", 20, 0.1, "ptx_max_length"),
    ],
)
def test_a_rollout_row_is_the_prompt_the_new_tokens_and_the_rewards_end(
    policy, reward, unfinished, ptx, ptx_coef, refused
):
    stage = rollout_stage(policy, reward, unfinished, ptx=ptx, ptx_coef=ptx_coef)
    if refused is None:
        check_rollout_lengths(stage)
        return
    with pytest.raises(ValueError, match=refused) as caught:
        check_rollout_lengths(stage)
    assert "max_prompt_length 10" in str(caught.value) or refused == "ptx_max_length"


@pytest.fixture(scope="module")
def gpt2_16(tmp_path_factory):
    """A GPT-2 folder with a 16-row position table and the GPT-2 tokenizer."""
    path = tmp_path_factory.mktemp("gpt2-16")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=16, vocab_size=50257)).save_pretrained(path)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2_TOKENIZER / name, path / name)
    return path


def test_sft_fit_refuses_rows_longer_than_the_table_in_one_line(gpt2_16, tmp_path):
    data = tmp_path / "stories.txt"
    data.write_text("\n\n".join(TINYSTORIES.read_text().split("\n\n")[:40]))
    result = run_main(
        "fit", "--config", "configs/demo/sft.yaml", "--model.init_args.model", str(gpt2_16),
        "--data.init_args.train_path", str(data), "--data.init_args.max_length", "64",
        "--data.init_args.max_prompt_length", "12", "--trainer.max_steps", "20",
        "--trainer.logger.init_args.save_dir", str(tmp_path / "logs"),
        "--model.init_args.export_dir", str(tmp_path / "sft"),
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert "rows of up to 64 tokens (--data.init_args.max_length)" in result.stderr
    assert "n_positions 16" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "sft").exists()


def test_evaluate_refuses_before_sampling(gpt2_16, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time there was a little girl\n\nThe dog ran to the park and\n")
    result = run_main(
        "evaluate", "--policy", str(gpt2_16), "--prompts", str(prompts), "--prompt-format", "lines",
        "--max-new-tokens", "8", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert "+ max_new_tokens 8" in result.stderr and "n_positions 16" in result.stderr
    assert "Traceback" not in result.stderr
