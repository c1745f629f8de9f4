"""Focused checks of PPOModule's wiring that the golden rollout does not reach on its own.

Learning-rate schedules over several rollouts, scores of left-padded rows on a model with absolute
positions (GPT-2), dropout in train mode, the critic's start at the reward model's score, several
EOS ids, the fp16 loss scale with two optimizers, and the KL units of the adaptive controller.
"""

from __future__ import annotations

import json
import shutil

import golden_reference as ref
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from ppo_helpers import STORIES, prompt_batch, tiny_module, tiny_trainer
from torch.utils.data import DataLoader

from rlhf_lit.models import load_causal_lm, load_reward_model, sequence_scores
from rlhf_lit.models.generation import Generated, SamplingConfig, complete_generation
from rlhf_lit.models.packing import padding_free
from rlhf_lit.models.reward_norm import fold_normalization, record_normalization
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.ppo.config import KLConfig, PPOConfig, RewardConfig
from rlhf_lit.stages.ppo.metrics import RolloutTimer
from rlhf_lit.tokenizer import load_tokenizer

PROMPTS = ["Once upon a time, there was", "The", "Tom had a red", "A big dog"]


# ---------------------------------------------------------------- schedules
def test_learning_rate_schedules_step_once_per_rollout(tmp_path):
    policy_cfg = OptimizerConfig(lr=1e-3, eps=1e-5, warmup_steps=2, schedule="linear")
    critic_cfg = OptimizerConfig(lr=4e-3, eps=1e-5, schedule="cosine", min_lr_ratio=0.5)
    module = tiny_module(
        optimizer=policy_cfg, critic_optimizer=critic_cfg, max_rollouts=5, ppo=PPOConfig(epochs=1, minibatch_size=4)
    )
    used = {"policy": [], "critic": []}
    configure = module.configure_optimizers

    def recording_optimizers():
        optimizers, schedulers = configure()
        for which, opt in zip(("policy", "critic"), optimizers):
            opt.register_step_pre_hook(lambda o, a, k, which=which: used[which].append(o.param_groups[0]["lr"]))
        return optimizers, schedulers

    module.configure_optimizers = recording_optimizers
    trainer = tiny_trainer(tmp_path)
    trainer.fit(module, DataLoader([prompt_batch(module.tokenizer, PROMPTS)] * 5, batch_size=None))
    # Policy: warmup 2 rollouts (s + 1) / 2, then linear to 0 over the remaining 3:
    # s = 0..4 -> 1/2, 2/2, 1 - 0/3, 1 - 1/3, 1 - 2/3.
    policy_lr = [1e-3 * f for f in (0.5, 1.0, 1.0, 2 / 3, 1 / 3)]
    # Critic: cosine from 1 to 0.5 over 5 rollouts: 0.5 + 0.5 * (1 + cos(pi s / 5)) / 2 with
    # cos(0, 36, 72, 108, 144 deg) = 1, 0.809017, 0.309017, -0.309017, -0.809017.
    critic_lr = [4e-3 * f for f in (1.0, 0.95225425, 0.82725425, 0.67274575, 0.54774575)]
    assert used["policy"] == pytest.approx(policy_lr, rel=1e-6)  # one step per rollout each
    assert used["critic"] == pytest.approx(critic_lr, rel=1e-6)
    history = trainer.logger.history
    assert [history[k]["lr"] for k in range(5)] == pytest.approx(policy_lr, rel=1e-6)
    assert [history[k]["lr_critic"] for k in range(5)] == pytest.approx(critic_lr, rel=1e-6)


# ---------------------------------------------------------------- positions under left padding
@pytest.fixture(scope="module")
def gpt2_rm_dir(gpt2_dir, tmp_path_factory) -> str:
    """A GPT-2 reward model (random head) over the tiny GPT-2, with the run's added pad token."""
    path = tmp_path_factory.mktemp("gpt2-rm")
    tokenizer = load_tokenizer(gpt2_dir, padding_side="left")
    torch.manual_seed(3)
    rm = load_reward_model(gpt2_dir, tokenizer)
    torch.nn.init.normal_(rm.score.weight, std=1.0)
    rm.save_pretrained(path)
    return str(path)


def _one_row(gen: Generated, row: int, prompt_length: int) -> Generated:
    """Row ``row`` alone, its prompt without left padding."""
    keep = gen.attention_mask[row, :prompt_length].bool()
    prompt_ids = gen.query_responses[row, :prompt_length][keep]
    return Generated(
        torch.cat([prompt_ids, gen.response_ids[row]])[None],
        torch.cat([torch.ones_like(prompt_ids), gen.response_mask[row].long()])[None],
        gen.response_ids[row : row + 1],
        gen.response_mask[row : row + 1],
        gen.ended[row : row + 1],
    )


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("critic", ["separate", "shared_trunk"])
def test_left_padded_rows_score_as_they_do_alone_on_gpt2(gpt2_dir, gpt2_rm_dir, critic, packed):
    # GPT-2 has absolute position embeddings: a forward pass without position_ids = cumsum(mask) - 1
    # moves a left-padded row's logprobs, values and score (Llama's rotary positions would hide it).
    module = tiny_module(sft_model=gpt2_dir, reward_model=gpt2_rm_dir, critic=critic)
    torch.nn.init.normal_(module.critic.head.weight, std=1.0) if critic == "shared_trunk" else None
    batch = prompt_batch(module.tokenizer, ["Once upon a time there was a", "The", "Tom had a", "A big dog ran"])
    eos = module.tokenizer.eos_token_id
    responses = torch.tensor([[464, 3290, eos, 11], [50, 51, 52, 53], [eos, 7, 8, 9], [100, 200, 300, eos]])
    gen = complete_generation(
        torch.cat([batch["input_ids"], responses], 1),
        batch["attention_mask"],
        module.stop_ids,
        module.tokenizer.pad_token_id,
    )
    assert batch["attention_mask"].sum(1).tolist() == [7, 1, 3, 4]  # left padding of 0 to 6 tokens
    P = batch["input_ids"].shape[1]
    with padding_free(packed):  # ppo.remove_padding: the rows' real tokens as one sequence
        padded = module.experience_maker.score_rollout(gen)
    for row in range(4):
        alone = module.experience_maker.score_rollout(_one_row(gen, row, P))
        mask = gen.response_mask[row]
        for key in ("old_logprobs", "ref_logprobs", "old_values"):
            torch.testing.assert_close(
                getattr(padded, key)[row][mask],
                getattr(alone, key)[0][mask],
                rtol=1e-5,
                atol=1e-5,
                msg=lambda m, key=key, row=row: f"row {row} {key}: {m}",
            )
        torch.testing.assert_close(padded.rm_scores[row], alone.rm_scores[0], rtol=1e-5, atol=1e-5)


def test_scores_taken_in_chunks_of_rows_come_back_in_the_rollouts_order():
    # ppo.score_chunk_size: the rows by prompt length in chunks of 3 (then 1): the prompts of 8, 2, 7 and 6
    # tokens are taken as rows 1, 3, 2 | 0, so scores put back out of that order would land on other rows.
    module = tiny_module()
    gen = _scripted_gen(module)
    assert gen.attention_mask[:, : -gen.response_ids.shape[1]].sum(1).tolist() == [8, 2, 7, 6]
    with torch.no_grad():
        whole = module.experience_maker.score_rollout(gen)
        module.ppo = PPOConfig(score_chunk_size=3)  # the maker reads the stage's settings as it runs
        chunked = module.experience_maker.score_rollout(gen)
    mask = gen.response_mask
    for key in ("old_logprobs", "ref_logprobs", "old_values", "entropy"):
        torch.testing.assert_close(getattr(chunked, key)[mask], getattr(whole, key)[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked.rm_scores, whole.rm_scores, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- dropout
def _llama_with_dropout(tmp_path) -> str:
    path = tmp_path / "llama-dropout"
    shutil.copytree(STORIES, path)
    config = json.loads((path / "config.json").read_text())
    config["attention_dropout"] = 0.5  # a functional dropout in LlamaAttention, no nn.Dropout module
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def _forward_twice(model, ids, mask):
    with torch.no_grad():
        return [model(input_ids=ids, attention_mask=mask).logits for _ in range(2)]


def test_dropout_stays_off_in_train_mode_in_every_ppo_model(tmp_path, gpt2_dir):
    llama = _llama_with_dropout(tmp_path)
    module = tiny_module(sft_model=llama, reward_model=llama)
    module.train()  # Lightning may put modules in train mode: dropout must stay off anyway
    batch = prompt_batch(module.tokenizer, PROMPTS)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    # Dropout 0.5 would make two passes differ; with it off they are identical and equal eval mode.
    for name in ("policy", "ref_policy"):
        model = getattr(module, name)
        first, second = _forward_twice(model.train(), ids, mask)
        assert torch.equal(first, second), name
        assert torch.equal(first, _forward_twice(model.eval(), ids, mask)[0]), name
    for name, model in (("reward_model", module.reward_model), ("critic", module.critic.model)):
        model.train()
        with torch.no_grad():
            scores = [sequence_scores(model, ids, mask) for _ in range(2)]
        assert torch.equal(*scores), name
    # GPT-2's nn.Dropout modules (attn_pdrop, resid_pdrop, embd_pdrop = 0.1 in the tiny config).
    gpt2 = load_causal_lm(gpt2_dir).train()
    tokens = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    first, second = _forward_twice(gpt2, tokens, torch.ones_like(tokens))
    assert torch.equal(first, second)
    assert load_causal_lm(llama, keep_dropout=True).model.layers[0].self_attn.attention_dropout == 0.5  # opt-out kept


# ---------------------------------------------------------------- the critic starts at the reward
def _values_at_last_token(module, gen: Generated) -> torch.Tensor:
    with torch.no_grad():
        values = module.critic(gen.query_responses, gen.attention_mask)  # (B, T)
    last = gen.attention_mask.shape[1] - 1 - gen.attention_mask.flip(1).argmax(1)  # last attended position
    return values.gather(1, last[:, None]).squeeze(1)


def _scripted_gen(module) -> Generated:
    batch = prompt_batch(module.tokenizer, PROMPTS)
    eos = module.tokenizer.eos_token_id
    responses = torch.tensor([[30, eos, 31], [40, 41, 42], [eos, 50, 51], [60, 61, eos]])
    return complete_generation(
        torch.cat([batch["input_ids"], responses], 1),
        batch["attention_mask"],
        module.stop_ids,
        module.tokenizer.pad_token_id,
    )


def test_critic_value_at_the_last_token_equals_the_reward_with_an_unfolded_bias(tmp_path):
    # A Llama RM as RewardModelModule exports it when the bias cannot be folded: config.reward_bias.
    torch.manual_seed(0)
    rm = load_reward_model(STORIES)
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    rm.config.reward_bias = -3.0
    rm.save_pretrained(tmp_path / "rm")
    module = tiny_module(reward_model=str(tmp_path / "rm"))
    gen = _scripted_gen(module)
    with torch.no_grad():
        scores = module.score(gen.query_responses, gen.attention_mask)
        raw = sequence_scores(module.reward_model, gen.query_responses, gen.attention_mask)
    torch.testing.assert_close(scores, raw - 3.0)  # the reward carries the bias ...
    torch.testing.assert_close(_values_at_last_token(module, gen), scores)  # ... and so does the critic


def test_critic_value_at_the_last_token_equals_the_reward_of_a_folded_gpt2_rm(gpt2_dir, gpt2_rm_dir, tmp_path):
    tokenizer = load_tokenizer(gpt2_dir, padding_side="left")
    rm = load_reward_model(gpt2_rm_dir, tokenizer)
    assert fold_normalization(rm, gain=2.0, bias=-3.0)  # into ln_f's bias: the logit is the reward
    record_normalization(rm.config, 2.0, -3.0, "test", folded=True)
    rm.save_pretrained(tmp_path / "rm")
    module = tiny_module(sft_model=gpt2_dir, reward_model=str(tmp_path / "rm"))
    gen = _scripted_gen(module)
    with torch.no_grad():
        scores = module.score(gen.query_responses, gen.attention_mask)
        unfolded = sequence_scores(load_reward_model(gpt2_rm_dir, tokenizer), gen.query_responses, gen.attention_mask)
    torch.testing.assert_close(scores, 2.0 * unfolded - 3.0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_values_at_last_token(module, gen), scores)


# ---------------------------------------------------------------- several EOS ids
class TokenBias(torch.nn.Module):
    """Wraps an LM head and adds ``bias`` to one token's logit, so it is sampled at varied steps."""

    def __init__(self, head: torch.nn.Module, token: int, bias: float) -> None:
        super().__init__()
        self.head, self.token, self.bias = head, token, bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)  # (B, T, V)
        return logits + self.bias * torch.nn.functional.one_hot(torch.tensor(self.token), logits.shape[-1])


def test_every_eos_id_of_the_model_ends_a_response(tmp_path):
    # A chat-style model: generation_config lists two EOS ids, the tokenizer names one (2).
    path = tmp_path / "two-eos"
    shutil.copytree(STORIES, path)
    module0 = tiny_module()
    dot = module0.tokenizer.convert_tokens_to_ids(".")
    generation = json.loads((path / "generation_config.json").read_text())
    generation["eos_token_id"] = [2, dot]
    (path / "generation_config.json").write_text(json.dumps(generation))
    module = tiny_module(
        sft_model=str(path),
        reward_model=str(path),
        sampling=SamplingConfig(max_new_tokens=12),
        reward=RewardConfig(missing_eos_penalty=-7.0),
    )
    assert module.stop_ids == (2, dot)
    module.policy.lm_head = TokenBias(module.policy.lm_head, dot, 2.5)  # "." at varied steps
    raw = []
    generate = module.policy.generate
    module.policy.generate = lambda **kw: raw.append(generate(**kw)) or raw[-1]
    batch = prompt_batch(module.tokenizer, PROMPTS * 2)
    rollout, _ = module.make_rollout(batch, RolloutTimer(torch.device("cpu")))
    P = batch["input_ids"].shape[1]
    pad = module.tokenizer.pad_token_id
    by_dot = 0
    for row in range(8):
        response = rollout.response_ids[row].tolist()
        stops = [t for t, token in enumerate(response) if token in (2, dot)]
        n = stops[0] + 1 if stops else len(response)
        assert rollout.response_mask[row].tolist() == [t < n for t in range(len(response))], row
        assert bool(rollout.ended[row]) == bool(stops), row
        # generate itself stopped the row at its first stop id: only pad follows it.
        generated = raw[0][row, P:].tolist()
        assert generated[:n] == response[:n] and all(t == pad for t in generated[n:]), row
        # The RM reads the row up to its stop id; a row that stopped at "." is no missing-EOS row.
        prompt = [t for t, m in zip(batch["input_ids"][row].tolist(), batch["attention_mask"][row].tolist()) if m]
        with torch.no_grad():
            want = ref.reward_score(module.reward_model, prompt, response[:n], 0.0)
        assert rollout.raw_scores[row].item() == pytest.approx(want, rel=1e-5, abs=1e-5), row
        assert rollout.scores[row].item() == (rollout.raw_scores[row].item() if stops else -7.0), row
        by_dot += bool(stops) and response[n - 1] == dot
    assert by_dot >= 2 and not rollout.ended.all()  # the case under test happened, and a truncated row too


# ---------------------------------------------------------------- fp16 with two optimizers
def _fp16_run(tmp_path, growth_interval: int):
    module = tiny_module(max_rollouts=1, ppo=PPOConfig(epochs=1, minibatch_size=2, max_grad_norm=None))
    norms = {"policy": [], "critic": []}
    configure = module.configure_optimizers

    def recording_optimizers():
        optimizers, schedulers = configure()
        for which, opt in zip(("policy", "critic"), optimizers):

            def hook(o, a, k, which=which):
                grads = [p.grad for g in o.param_groups for p in g["params"] if p.grad is not None]
                norms[which].append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

            opt.register_step_pre_hook(hook)
        return optimizers, schedulers

    module.configure_optimizers = recording_optimizers
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=growth_interval)
    trainer = tiny_trainer(tmp_path, plugins=[MixedPrecision("16-mixed", device="cpu", scaler=scaler)])
    trainer.fit(module, DataLoader([prompt_batch(module.tokenizer, PROMPTS)], batch_size=None))
    return norms, scaler.get_scale()


def test_fp16_loss_scale_changes_once_per_iteration_of_both_optimizers(tmp_path):
    # growth_interval=1: the scale doubles after every clean update. With one update per
    # iteration (2 iterations: 4 rows / minibatch 2), it ends at 2^10 * 2^2; if the scaler were
    # updated after each optimizer, it would double at the policy's step and the critic's
    # gradients (scaled with the old scale) would be unscaled with the new one: halved.
    growing, scale = _fp16_run(tmp_path / "growing", growth_interval=1)
    constant, constant_scale = _fp16_run(tmp_path / "constant", growth_interval=10**6)
    assert scale == 2.0**12 and constant_scale == 2.0**10
    assert len(growing["critic"]) == 2
    # The scale is a power of 2, so the unscaled gradients agree up to fp16 underflow of tiny
    # gradients at the smaller scale (seen: 5e-6 relative); the bug halves the critic's.
    for which in ("policy", "critic"):
        assert growing[which] == pytest.approx(constant[which], rel=1e-4), which


# ---------------------------------------------------------------- KL units of the controller
@pytest.mark.parametrize("estimator", ["k2", "abs"])
def test_adaptive_controller_refuses_estimators_that_are_not_kl_in_nats(estimator):
    with pytest.raises(ValueError, match=f"kl.estimator='{estimator}'.*nats.*kl.kind='fixed'"):
        KLConfig(kind="adaptive", estimator=estimator)
    assert KLConfig(kind="fixed", estimator=estimator).estimator == estimator  # a fixed penalty may use them
    for fine in ("k1", "k3"):
        assert KLConfig(kind="adaptive", estimator=fine).estimator == fine


# ---------------------------------------------------------------- unfinished responses and the RM
@pytest.mark.parametrize("unfinished", ["as_sampled", "with_eos"])
def test_the_reward_model_reads_a_cut_response_as_configured(unfinished):
    module = tiny_module(reward=RewardConfig(unfinished=unfinished))
    gen = _scripted_gen(module)  # rows 1 and 3 never ended (row 3's EOS is its last token: it ended)
    eos = module.tokenizer.eos_token_id
    P = gen.query_responses.shape[1] - gen.response_ids.shape[1]
    with torch.no_grad():
        scored = module.experience_maker.score_rollout(gen)
    assert gen.ended.tolist() == [True, False, True, True]
    for row in range(4):
        prompt = [t for t, m in zip(gen.query_responses[row, :P].tolist(), gen.attention_mask[row, :P].tolist()) if m]
        n = int(gen.response_mask[row].sum())
        response = gen.response_ids[row, :n].tolist()
        if unfinished == "with_eos" and not gen.ended[row]:
            response = response + [eos]  # read at an EOS, as the RM was trained
        with torch.no_grad():
            want = ref.reward_score(module.reward_model, prompt, response, 0.0)
        assert scored.rm_scores[row].item() == pytest.approx(want, rel=1e-5, abs=1e-5), row
    # The policy's side of the rollout is untouched: the same tokens and masks either way.
    assert scored.old_logprobs.shape == gen.response_ids.shape


def test_with_eos_and_a_missing_eos_penalty_are_refused_together():
    with pytest.raises(ValueError, match="reward.unfinished='with_eos'.*missing_eos_penalty"):
        RewardConfig(unfinished="with_eos", missing_eos_penalty=-1.0)
    with pytest.raises(ValueError, match="reward.unfinished must be one of as_sampled, with_eos"):
        RewardConfig(unfinished="eos")


def test_a_positive_missing_eos_penalty_is_refused_because_it_replaces_the_score():
    # TRL subtracts a positive missing_eos_penalty; here the value replaces the score, so a ported
    # 1.0 would pay unfinished responses above the normalised RM's mean of 0.
    with pytest.raises(ValueError) as refused:
        RewardConfig(missing_eos_penalty=1.0)
    assert str(refused.value) == (
        "reward.missing_eos_penalty=1.0 is positive: it REPLACES the score of a response without EOS (TRL's "
        "missing_eos_penalty is subtracted from it instead), so a positive value pays unfinished responses; give the "
        "score they get instead, e.g. -1.0, or null"
    )
    with pytest.raises(ValueError, match=r"missing_eos_penalty=1e-06 is positive"):
        RewardConfig(missing_eos_penalty=1e-6)
    # Zero and below are scores an unfinished response may be given: they replace its score.
    raw, ended = torch.tensor([2.0, 3.0]), torch.tensor([True, False])
    for penalty in (0.0, -1.0):
        shaped = RewardConfig(missing_eos_penalty=penalty).shape(raw, ended)
        assert shaped.tolist() == [2.0, penalty]
