"""Per-rollout text metrics (judge, distinct-n) and the Hugging Face export of the trained policy."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from ppo_helpers import JUDGED, STORIES, prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer

import rlhf_lit.stages.ppo.module as ppo_stage
from rlhf_lit.evaluation import distinct_n, response_texts
from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.teacher_forced import forward_with_positions
from rlhf_lit.stages.ppo import PPOModule
from rlhf_lit.stages.ppo.metrics import reduce_over_ranks, text_statistics

PROMPTS = ["Once upon a time", "The", "Tom had a red", "A big dog"]


def _loader(module, copies: int = 4) -> DataLoader:
    return DataLoader([prompt_batch(module.tokenizer, PROMPTS)] * copies, batch_size=None)


def test_text_statistics_judge_mean_and_distinct_n():
    texts = ["a b a", "b c"]
    stats = text_statistics(texts, judge_scores=[5.0, 3.0])
    # judge scores 5 and 3 -> mean 4. unigrams a b a b c: 5, distinct 3 -> 0.6;
    # bigrams (a b) (b a) (b c): 3, all distinct -> 1.0, within each text and across them.
    assert stats == {
        "diversity/distinct_1": 0.6,
        "diversity/distinct_2": 1.0,
        "diversity/distinct_2_within": 1.0,
        "diversity/distinct_2_across": 1.0,
        "objective/judge": 4.0,
    }
    # "a b a b" repeats (a b) within itself, "a b" shares it: T = 3 + 1, W = 2 + 1, U = 2.
    shared = text_statistics(["a b a b", "a b"])
    assert shared == {
        "diversity/distinct_1": 2 / 6,
        "diversity/distinct_2": 2 / 4,
        "diversity/distinct_2_within": 3 / 4,
        "diversity/distinct_2_across": 2 / 3,
    }


class _TwoRanks:
    """A strategy stand-in whose other rank holds the same values plus 1 (mean: + 0.5)."""

    def reduce(self, tensor, reduce_op):
        assert reduce_op == "mean"
        return (tensor + (tensor + 1)) / 2


def test_reduce_over_ranks_averages_every_value_in_one_call():
    local = {"a": torch.tensor(1.0), "b": 2.5, "c": torch.tensor(4)}
    reduced = reduce_over_ranks(_TwoRanks(), local, torch.device("cpu"))
    assert reduced == {"a": 1.5, "b": 3.0, "c": 4.5}  # (1 + 2) / 2, (2.5 + 3.5) / 2, (4 + 5) / 2


def test_judge_and_diversity_logged_every_rollout(tmp_path, monkeypatch):
    module = tiny_module(max_rollouts=2, judge="ppo_helpers:index_judge")
    rollouts = []
    make_rollout = module.make_rollout

    def recording_make_rollout(batch, timer, *args):
        rollout, entropy = make_rollout(batch, timer, *args)
        rollouts.append(rollout)
        return rollout, entropy

    monkeypatch.setattr(module, "make_rollout", recording_make_rollout)
    reduced_keys, reduce = [], ppo_stage.reduce_over_ranks

    def recording_reduce(strategy, local, device):
        reduced_keys.append(set(local))
        return reduce(strategy, local, device)

    monkeypatch.setattr(ppo_stage, "reduce_over_ranks", recording_reduce)
    JUDGED.clear()
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, _loader(module))
    history = trainer.logger.history
    assert sorted(history) == [0, 1]
    assert len(JUDGED) == 2  # one judge call per rollout, on the whole batch
    # Judge and diversity go through the one cross-rank reduction with the other metrics.
    assert all({"objective/judge", "diversity/distinct_1", "objective/kl"} <= keys for keys in reduced_keys)
    assert len(reduced_keys) == 2
    for step in (0, 1):
        # index_judge scores the 4 texts 0, 1, 2, 3: the batch mean is 1.5.
        assert history[step]["objective/judge"] == 1.5
        texts = JUDGED[step]
        r = rollouts[step]
        # The responses only, decoded the project's one way (tests/evaluation/test_texts.py).
        assert texts == response_texts(module.tokenizer, r.query_responses, r.attention_mask, r.response_mask, r.ended)
        assert history[step]["diversity/distinct_1"] == pytest.approx(distinct_n(texts, 1))
        assert history[step]["diversity/distinct_2"] == pytest.approx(distinct_n(texts, 2))
        assert "time/text_s" in history[step]


def test_a_judge_reading_query_response_gets_each_prompt_as_the_policy_read_it_then_its_response(tmp_path):
    module = tiny_module(max_rollouts=1, judge="ppo_helpers:index_judge", judge_reads="query_response")
    rollouts, make_rollout = [], module.make_rollout
    module.make_rollout = lambda batch, timer, *args: rollouts.append(make_rollout(batch, timer, *args)) or rollouts[-1]
    JUDGED.clear()
    tiny_trainer(tmp_path).fit(module, _loader(module, copies=1))
    r = rollouts[0][0]
    responses = response_texts(module.tokenizer, r.query_responses, r.attention_mask, r.response_mask, r.ended)
    # by hand: the prompts as the policy read them (BOS first: stories260K's tokenizer adds one), written so that
    # tokenizing the text again gives those ids (no space after <s>), then the response
    prompts = [module.tokenizer.bos_token + p for p in PROMPTS]
    assert [module.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts] == [
        module.tokenizer(p)["input_ids"] for p in PROMPTS
    ]
    assert JUDGED == [[p + t for p, t in zip(prompts, responses, strict=True)]]
    with pytest.raises(ValueError, match="judge_reads must be one of response, query_response; got 'prompt'"):
        tiny_module(judge_reads="prompt")


def test_without_judge_diversity_is_logged_and_judge_and_compile_cost_are_not(tmp_path):
    module = tiny_module(max_rollouts=1)
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, _loader(module, copies=1))
    logged = trainer.logger.history[0]
    assert "objective/judge" not in logged
    assert not [k for k in logged if k.startswith("compile/")]  # the eager decode path logs no compile cost
    assert 0.0 < logged["diversity/distinct_1"] <= 1.0 and 0.0 < logged["diversity/distinct_2"] <= 1.0


def test_bad_judge_spec_fails_before_any_model_is_loaded():
    with pytest.raises(ValueError, match="module:function"):
        PPOModule(sft_model="/no/such/model", reward_model="/no/such/rm", judge="ppo_helpers.index_judge")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_export_reloads_the_trained_policy(tmp_path, capsys, family, gpt2_dir):
    # GPT-2's tokenizer gains a pad token: embeddings grow, and the export must carry both.
    models = {} if family == "llama" else {"sft_model": gpt2_dir, "reward_model": gpt2_dir}
    module = tiny_module(max_rollouts=2, export_dir=str(tmp_path / "policy"), **models)
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, _loader(module))
    assert module.exported_path == tmp_path / "policy"
    assert f"[rlhf-lit] exported PPO policy to {tmp_path / 'policy'}" in capsys.readouterr().out

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "policy").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "policy")
    assert tokenizer.pad_token_id == module.tokenizer.pad_token_id and len(tokenizer) == len(module.tokenizer)
    batch = prompt_batch(module.tokenizer, PROMPTS)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        expected = forward_with_positions(module.policy, ids, mask).logits  # (B, P, V)
        # Loaded as rlhf-lit loads it, the export is bit-identical. Plain transformers computes GPT-2's
        # tanh-GELU op by op where rlhf-lit fuses it (models/kernels.py): equal to float32 rounding.
        ours = load_causal_lm(str(tmp_path / "policy"), module.tokenizer).eval()
        assert torch.equal(forward_with_positions(ours, ids, mask).logits, expected)
        plain = forward_with_positions(exported, ids, mask).logits
        torch.testing.assert_close(plain, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
        # ... and it is the trained policy, not the starting SFT model (the reference, released after fit).
        start = load_causal_lm(models.get("sft_model", STORIES), module.tokenizer).eval()
        assert not torch.allclose(forward_with_positions(start, ids, mask).logits, expected)


def test_export_defaults_to_the_log_dir(tmp_path):
    module = tiny_module(max_rollouts=1)
    trainer = tiny_trainer(tmp_path, logger=TensorBoardLogger(tmp_path, name="tb"))
    trainer.fit(module, _loader(module, copies=1))
    assert module.exported_path == tmp_path / "tb" / "version_0" / "model"
    assert (module.exported_path / "config.json").is_file()


def _hand_rollout():
    """Two responses of lengths 2 and 3, summed KL 0.6 and 0.5, values a hand can follow."""
    from rlhf_lit.stages.ppo.rollout import Rollout

    mask = torch.tensor([[True, True, False], [True, True, True]])  # lengths 2 and 3
    zeros = torch.zeros(2, 3)
    return Rollout(
        query_responses=torch.zeros(2, 4, dtype=torch.long),
        attention_mask=torch.ones(2, 4, dtype=torch.long),
        response_ids=torch.zeros(2, 3, dtype=torch.long),
        response_mask=mask,
        ended=torch.tensor([True, False]),
        old_logprobs=zeros,
        ref_logprobs=zeros,
        # values / returns on the mask: values [1, 1 | 2, 2, 2], returns [1, 3 | 2, 2, 2];
        # the masked-out slot holds garbage (0 vs 100) that must not count.
        old_values=torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]]),
        returns=torch.tensor([[1.0, 3.0, 100.0], [2.0, 2.0, 2.0]]),
        raw_scores=torch.tensor([1.0, -2.0]),
        scores=torch.tensor([0.5, -1.0]),
        kl=torch.tensor([[0.2, 0.4, 0.0], [0.1, 0.1, 0.3]]),
        rewards=torch.full((2, 3), 9.0),  # e.g. after reward whitening: must not enter rlhf_reward
        advantages=zeros,
    )


def test_rollout_statistics_by_hand():
    from rlhf_lit.stages.ppo.metrics import rollout_statistics

    rollout = _hand_rollout()
    stats = rollout_statistics(rollout, torch.tensor(1.5), {"loss/policy": torch.tensor(0.1)}, kl_coef=0.5)
    expected = {
        "objective/scores": -0.5,  # (1 - 2) / 2
        "objective/scores_std": 1.5,  # population std of 1 and -2: |1 - (-2)| / 2
        "objective/scores_shaped": -0.25,  # (0.5 - 1) / 2
        "objective/kl": 0.55,  # per response 0.6 and 0.5
        "objective/non_score_reward": -0.275,  # -0.5 * 0.6 = -0.3, -0.5 * 0.5 = -0.25
        "objective/rlhf_reward": -0.525,  # (0.5 - 0.3 + -1.0 - 0.25) / 2
        "objective/entropy": 1.5,
        # returns mean 2, Var 0.4; residual [0, 2, 0, 0, 0] mean 0.4, Var (4 * 0.16 + 2.56) / 5 = 0.64
        "value/explained_variance": -0.6,  # 1 - 0.64 / 0.4
        "response/length": 2.5,
        "response/ended_fraction": 0.5,
        "loss/policy": 0.1,
    }
    assert set(stats) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(stats[name], torch.tensor(value), msg=name)


def test_rollout_statistics_with_the_kl_in_the_loss_count_the_losss_token_mean():
    """kl.mode loss adds beta x the token mean of the KL to the loss: rlhf_reward's KL part is that, not
    beta x the sum per response (which would grow with the length and fall while the objective rises)."""
    from rlhf_lit.stages.ppo.metrics import rollout_statistics

    stats = rollout_statistics(_hand_rollout(), torch.tensor(1.5), {}, kl_coef=0.5, kl_mode="loss")
    # KL tokens 0.2, 0.4 | 0.1, 0.1, 0.3: token mean 1.1 / 5 = 0.22; beta x it = 0.11
    torch.testing.assert_close(stats["objective/non_score_reward"], torch.tensor(-0.11))
    torch.testing.assert_close(stats["objective/rlhf_reward"], torch.tensor(-0.25 - 0.11))  # shaped scores' mean -0.25
    torch.testing.assert_close(stats["objective/kl"], torch.tensor(0.55))  # the logged KL stays the sum per response


def test_a_run_with_the_kl_in_the_loss_logs_its_token_mean_as_the_kl_part(tmp_path):
    from rlhf_lit.stages.ppo.config import KLConfig

    module = tiny_module(max_rollouts=2, kl=KLConfig(kind="fixed", init_coef=0.5, mode="loss"))
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, _loader(module, copies=2))
    logged = trainer.logger.history[1]  # rollout 0 samples the reference itself: KL 0
    assert logged["objective/kl"] != 0 and logged["response/length"] > 1  # the two readings differ
    # beta x (KL per response / mean length): the sum per response would be -0.5 x objective/kl
    token_mean = logged["objective/kl"] / logged["response/length"]
    assert logged["objective/non_score_reward"] == pytest.approx(-0.5 * token_mean)
