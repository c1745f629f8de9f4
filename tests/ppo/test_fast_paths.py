"""The performance paths keep the math: ignore_eos sampling, logits only at response positions,
the 16-bit CUDA attention mask, fused AdamW, fused activations (the padding columns no row attends:
test_fast_paths_padding.py)."""

from __future__ import annotations

import types

import pytest
import torch
from ppo_helpers import EOS, PAD, STORY_PROMPTS, prompt_batch

from rlhf_lit.models import load_causal_lm
from rlhf_lit.models.generation import SamplingConfig, generate_responses
from rlhf_lit.models.scoring import model_attention_mask, position_ids_from_mask, self_attending_causal_mask
from rlhf_lit.models.teacher_forced import forward_response_logits, forward_with_positions, response_logits
from rlhf_lit.stages.optim import OptimizerConfig, build_optimizer, fused_adamw_supported

PROMPTS = STORY_PROMPTS


# ---------------------------------------------------------------- ignore_eos
def test_ignore_eos_runs_every_row_to_full_length_with_the_same_samples(policy, tokenizer):
    """The same seed samples the same tokens up to each row's first EOS (the logits are untouched:
    suppressing EOS, as min_new_tokens does, would change the token at the EOS step); then the row
    goes on, every position is the response's, and no row counts as ended."""
    batch = prompt_batch(tokenizer, PROMPTS * 2)
    R = 12

    def sample(ignore_eos):
        sampling = SamplingConfig(max_new_tokens=R, temperature=0.9, ignore_eos=ignore_eos)
        return generate_responses(
            policy,
            batch["input_ids"],
            batch["attention_mask"],
            sampling,
            EOS,
            PAD,
            generator=torch.Generator().manual_seed(5),
        )

    stopped, full = sample(False), sample(True)
    assert stopped.ended.any(), "the biased EOS must end some rows for this test to mean anything"
    assert full.response_ids.shape == (len(PROMPTS) * 2, R)
    assert full.response_mask.all() and not full.ended.any()
    assert torch.equal(full.attention_mask[:, -R:], torch.ones_like(full.response_ids))
    continued = 0
    for row in range(stopped.response_ids.shape[0]):
        n = int(stopped.response_mask[row].sum())
        assert full.response_ids[row, :n].tolist() == stopped.response_ids[row, :n].tolist()
        if stopped.ended[row] and n < R:
            continued += 1  # an ended row that the full-length sampling carried on
    assert continued > 0


def test_ignore_eos_refuses_a_missing_eos_penalty():
    from ppo_helpers import tiny_module

    from rlhf_lit.stages.ppo.config import RewardConfig

    with pytest.raises(ValueError, match="ignore_eos.*missing_eos_penalty"):
        tiny_module(
            sampling=SamplingConfig(max_new_tokens=4, ignore_eos=True), reward=RewardConfig(missing_eos_penalty=-1.0)
        )


# ---------------------------------------------------------------- logits at response positions
class _DropsLogitsToKeep(torch.nn.Module):
    """A model wrapper whose forward takes **kwargs but ignores logits_to_keep (returns every position)."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    def forward(self, logits_to_keep=None, **kwargs):
        return self.inner(**kwargs)


def test_response_logits_only_equal_the_full_forward_sliced(policy, tokenizer):
    batch = prompt_batch(tokenizer, PROMPTS)
    gen = generate_responses(
        policy,
        batch["input_ids"],
        batch["attention_mask"],
        SamplingConfig(max_new_tokens=6),
        EOS,
        PAD,
        generator=torch.Generator().manual_seed(1),
    )
    P = batch["input_ids"].shape[1]
    with torch.no_grad():
        full = response_logits(forward_with_positions(policy, gen.query_responses, gen.attention_mask).logits, P)
        kept, _ = forward_response_logits(policy, gen.query_responses, gen.attention_mask, P)
        wrapped, _ = forward_response_logits(_DropsLogitsToKeep(policy), gen.query_responses, gen.attention_mask, P)
    assert kept.shape == full.shape == (len(PROMPTS), 6, full.shape[-1])
    # Position P - 1 + t predicts response token t; a one-position shift is far outside this tolerance.
    torch.testing.assert_close(kept, full, rtol=1e-5, atol=1e-5)
    assert torch.equal(wrapped, full)


def test_forward_response_logits_projects_only_response_positions(policy, tokenizer):
    """The LM head sees R positions, not P + R."""
    batch = prompt_batch(tokenizer, PROMPTS)
    ids = torch.cat([batch["input_ids"], batch["input_ids"][:, -3:]], dim=1)
    mask = torch.cat([batch["attention_mask"], torch.ones_like(batch["input_ids"][:, -3:])], dim=1)
    rows = []
    handle = policy.lm_head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[1]))
    try:
        with torch.no_grad():
            logits, _ = forward_response_logits(policy, ids, mask, batch["input_ids"].shape[1])
    finally:
        handle.remove()
    assert rows == [3] and logits.shape[1] == 3


# ---------------------------------------------------------------- the 16-bit CUDA attention mask
def test_self_attending_causal_mask_by_hand():
    mask = self_attending_causal_mask(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0]]), torch.bfloat16)
    low = torch.finfo(torch.bfloat16).min
    assert mask.shape == (2, 1, 4, 4) and mask.dtype == torch.bfloat16
    # Row 0 is left-padded: pad queries 0 and 1 attend only to themselves; real queries to real keys <= them.
    allowed = [
        [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]],
        # Row 1 is right-padded: the pad query 3 sees the real keys before it and itself.
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]],
    ]
    expected = torch.where(torch.tensor(allowed, dtype=torch.bool), torch.tensor(0.0), torch.tensor(low))
    assert torch.equal(mask[:, 0].float(), expected.float())


def test_model_attention_mask_is_the_padding_mask_off_cuda_and_keeps_real_positions(policy, tokenizer):
    """On the CPU nothing changes; the 4-D mask, forced, gives the real positions the same logits."""
    batch = prompt_batch(tokenizer, PROMPTS)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert model_attention_mask(policy, mask) is mask
    with torch.no_grad():
        plain = forward_with_positions(policy, ids, mask).logits
        forced = policy(
            input_ids=ids,
            attention_mask=self_attending_causal_mask(mask, torch.float32),
            position_ids=position_ids_from_mask(mask),
            use_cache=False,
        ).logits
    real = mask.bool()
    assert (~real).any(), "the prompts must be left-padded for this test to mean anything"
    torch.testing.assert_close(forced[real], plain[real], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(forced).all()


# ---------------------------------------------------------------- fused AdamW
def test_fused_adamw_only_where_it_applies():
    model = torch.nn.Linear(4, 3)
    assert fused_adamw_supported(model)
    for precision in ("16-mixed", "bf16-mixed"):  # Lightning's mixed-precision plugin cannot clip a fused optimizer
        mixed = torch.nn.Linear(4, 3)
        mixed._trainer = types.SimpleNamespace(precision=precision)
        assert not fused_adamw_supported(mixed)
    plain = torch.nn.Linear(4, 3)
    plain._trainer = types.SimpleNamespace(precision="32-true")
    assert fused_adamw_supported(plain)
    frozen = torch.nn.Linear(4, 3).requires_grad_(False)
    assert not fused_adamw_supported(frozen)


def test_fused_adamw_takes_the_same_steps():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    b.load_state_dict(a.state_dict())
    config = OptimizerConfig(lr=1e-2, weight_decay=0.1, eps=1e-8)
    opt_a, _ = build_optimizer(a.named_parameters(), config, 10, fused=False)
    opt_b, _ = build_optimizer(b.named_parameters(), config, 10, fused=True)
    assert opt_b.defaults["fused"] and not opt_a.defaults["fused"]
    x = torch.randn(16, 8)
    for _ in range(3):
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- old logprobs from sampling
@pytest.mark.parametrize("critic", ["separate", "shared_trunk"])
def test_old_logprobs_from_sampling_equal_the_rescore(critic, tokenizer):
    """fp32 on the CPU: the logprobs recorded while sampling are the rescore's old logprobs up to float
    rounding (the KV-cache steps sum in another order: within tests/float32_bounds.py's logprob
    bound at the rows' largest logit / temperature, ~4e-4 nats here), the same values and samples;
    with a shared trunk the forward runs anyway (the rollout's old logprobs are the rescore's). A
    one-position shift differs by whole nats."""
    from float32_bounds import entropy_bound, largest_logit, logprob_bound, output_bound, summed_bound, whitened_bound
    from ppo_helpers import tiny_module

    from rlhf_lit.stages.ppo.config import PPOConfig
    from rlhf_lit.stages.ppo.metrics import RolloutTimer

    batch = prompt_batch(tokenizer, PROMPTS * 2)
    rollouts, experiences, kept = {}, {}, {}
    for source in ("rescore", "sampling"):
        module = tiny_module(
            critic=critic,
            sampling=SamplingConfig(max_new_tokens=6, temperature=0.7),
            ppo=PPOConfig(epochs=1, minibatch_size=4, old_logprobs=source),
        )
        generate = module.generate
        module.generate = lambda b, generate=generate, source=source: kept.setdefault(source, generate(b))
        rollouts[source], experiences[source] = module.make_rollout(batch, RolloutTimer(torch.device("cpu")))
    a, b = rollouts["rescore"], rollouts["sampling"]
    # Both modes record (for policy/logprob_gen_train_diff); only sampling with its own critic uses them.
    assert torch.equal(b.old_logprobs, kept["sampling"].logprobs) == (critic == "separate")
    assert not torch.equal(a.old_logprobs, kept["rescore"].logprobs)
    assert torch.equal(a.query_responses, b.query_responses)
    mask = a.response_mask
    config, positions = module.policy.config, a.query_responses.shape[1]
    magnitude = largest_logit(module.ref_policy, a.query_responses, a.attention_mask, 0.7)  # the unchanged policy
    per_token = logprob_bound(config, magnitude, positions)
    torch.testing.assert_close(b.old_logprobs[mask], a.old_logprobs[mask], rtol=0, atol=per_token)
    # The critic's pass is the same computation in both modes (alone, or beside the policy's).
    values = output_bound(config, float(a.old_values.abs().max()), positions)
    torch.testing.assert_close(b.old_values, a.old_values, rtol=0, atol=values)
    # Advantages: the KL (old - ref logprob) moves by the logprob bound per token, the shaped reward
    # by beta (0.1) times it, GAE (gamma 1, lambda 0.95) sums at most R of those and of the values'
    # moves (twice: V_t and V_(t+1)), then the whitening over the rollout's tokens.
    length = int(mask.sum(1).max())
    raw = (a.returns - a.old_values)[mask]
    advantage = summed_bound(0.1 * per_token + 2 * values, length)
    torch.testing.assert_close(b.advantages, a.advantages, rtol=0, atol=whitened_bound(raw, advantage))
    # objective/entropy: the recorded per-step entropies are the rescore's (a token mean of entropies).
    entropy = entropy_bound(config, magnitude, float(experiences["rescore"].entropy.max()), positions)
    torch.testing.assert_close(experiences["sampling"].entropy, experiences["rescore"].entropy, rtol=0, atol=entropy)


def test_old_logprobs_choice_is_checked():
    from rlhf_lit.stages.ppo.config import PPOConfig

    with pytest.raises(ValueError, match="ppo.old_logprobs"):
        PPOConfig(old_logprobs="generate")


def test_bf16_mixed_ppo_clips_its_gradients(tmp_path):
    """bf16-mixed with gradient clipping (Lightning refuses to clip a fused optimizer under mixed
    precision: this fit crashed at its first step when PPO's optimizers were fused there)."""
    from ppo_helpers import tiny_module, tiny_trainer
    from torch.utils.data import DataLoader

    from rlhf_lit.stages.ppo.config import PPOConfig

    module = tiny_module(max_rollouts=1, ppo=PPOConfig(epochs=1, minibatch_size=4, max_grad_norm=1.0))
    trainer = tiny_trainer(tmp_path, precision="bf16-mixed")
    trainer.fit(module, DataLoader([prompt_batch(module.tokenizer, PROMPTS * 2)], batch_size=None))
    assert module.rollout_index == 1
    assert not any(opt.defaults.get("fused") for opt in trainer.optimizers)


# ---------------------------------------------------------------- fused activation kernels
def _tiny_gpt2_config(activation: str):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=50,
        bos_token_id=0,
        eos_token_id=0,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        activation_function=activation,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


@pytest.mark.parametrize("activation", ["gelu_new", "gelu_fast"])
def test_fused_activations_compute_the_same_function(activation, tmp_path):
    """A GPT-2 loaded by rlhf-lit has the fused tanh-GELU and gives the transformers model's logits and
    gradients up to float32 rounding; the exact (erf) GELU instead differs by ~5e-4 of the logits' scale."""
    from transformers import GPT2LMHeadModel
    from transformers.activations import NewGELUActivation

    torch.manual_seed(0)
    reference = GPT2LMHeadModel(_tiny_gpt2_config(activation)).eval()
    with torch.no_grad():  # weights large enough that the activations leave GELU's linear range
        for p in reference.parameters():
            p.mul_(8.0)
    reference.save_pretrained(tmp_path)
    ours = load_causal_lm(str(tmp_path)).eval()
    assert not any(isinstance(m, NewGELUActivation) for m in ours.modules())
    fused = [m for m in ours.modules() if isinstance(m, torch.nn.GELU)]
    assert len(fused) == 2 and all(m.approximate == "tanh" for m in fused)
    assert ours.config.activation_function == activation  # the export keeps the checkpoint's config
    ids = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(1))
    out_ref, out = reference(ids).logits, ours(ids).logits
    scale = out_ref.abs().max().item()
    assert scale > 10  # the test means something only where tanh-GELU is nonlinear
    torch.testing.assert_close(out, out_ref, rtol=0, atol=2e-6 * scale)
    out_ref.logsumexp(-1).sum().backward()
    out.logsumexp(-1).sum().backward()
    for (name, a), b in zip(reference.named_parameters(), ours.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5 * a.grad.abs().max().item(), msg=name)
    erf = GPT2LMHeadModel(_tiny_gpt2_config("gelu")).eval()
    erf.load_state_dict(reference.state_dict())
    assert (erf(ids).logits - out_ref).abs().max() > 100 * 2e-6 * scale  # far outside the tolerance above


def test_fused_activations_leave_other_activations_alone():
    from transformers import GPT2LMHeadModel

    from rlhf_lit.models.kernels import fuse_activations

    model = GPT2LMHeadModel(_tiny_gpt2_config("gelu"))
    before = [type(m) for m in model.modules()]
    assert fuse_activations(model) == 0
    assert [type(m) for m in model.modules()] == before
    assert fuse_activations(GPT2LMHeadModel(_tiny_gpt2_config("gelu_new"))) == 2
