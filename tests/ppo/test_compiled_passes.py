"""``ppo.forward: compiled``: the buckets and their padding by hand, and the compiled pass against
the eager one (outputs and gradients) for the shared-trunk critic under gradient checkpointing and
LoRA on a policy and a separate critic, and (outputs: the library runs it without grad only) the
critic-alone scoring pass of ``ppo.old_logprobs: sampling``. The separate, fully trained
critic is the default, and its compiled passes are checked in the whole PPO iteration against the
independent loop reference in ``test_golden_rollout.py`` (its ``[compiled]`` cases: the scoring pass
and every step's gradients, in one-row minibatches), so it has no case of its own here: each case
costs inductor a minute of lowering on 2 cores. Gradient checkpointing is checked on the policy's
trunk (the shared-trunk case), the same ``gradient_checkpointing_enable`` a separate critic's trunk gets."""

from __future__ import annotations

import pytest
import torch
from float32_bounds import gradient_bound, output_bound
from ppo_helpers import tiny_module

from rlhf_lit.models.compiled_passes import bucket_length, pad_to_buckets
from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.models.memory import MemoryConfig, train_mode
from rlhf_lit.stages.ppo.config import PPOConfig
from rlhf_lit.stages.ppo.forward import ForwardPassRunner


@pytest.mark.parametrize(
    "n,bucket",
    [
        (1, 16),
        (16, 16),
        (17, 20),
        (20, 20),
        (21, 24),
        (31, 32),
        (32, 32),
        (33, 40),
        (47, 48),
        (49, 56),
        (64, 64),
        (65, 80),
        (100, 112),
        (129, 160),
        (1000, 1024),
    ],
)
def test_bucket_length_by_hand(n, bucket):
    assert bucket_length(n) == bucket


def test_padding_puts_prompt_columns_left_and_response_columns_right_unattended():
    ids = torch.tensor([[0, 5, 6, 7, 8, 9], [4, 5, 6, 7, 8, 0]])  # P = 3, R = 3
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    padded_ids, padded_mask, prompt_length = pad_to_buckets(ids, mask, 3)
    assert padded_ids.shape == padded_mask.shape == (2, 32) and prompt_length == 16
    assert torch.equal(padded_ids[:, 13:19], ids) and torch.equal(padded_mask[:, 13:19], mask)
    assert not padded_mask[:, :13].any() and not padded_mask[:, 19:].any()
    # the response part keeps its offset from the (padded) prompt length: position P' + t holds token P + t
    assert torch.equal(padded_ids[:, prompt_length : prompt_length + 3], ids[:, 3:])
    same = pad_to_buckets(torch.ones(1, 32, dtype=torch.long), torch.ones(1, 32, dtype=torch.long), 16)
    assert same[0].shape == (1, 32) and same[2] == 16  # already on a bucket: untouched


def test_the_option_takes_eager_or_compiled_and_names_itself_otherwise():
    assert PPOConfig().forward == "eager"
    with pytest.raises(ValueError, match=r"ppo.forward must be one of eager, compiled; got 'fast'"):
        PPOConfig(forward="fast")


def _pass(runner: ForwardPassRunner, module, ids, mask, prompt_length, critic_only: bool):
    """Outputs and a scalar of them (every output position weighted differently, so a shifted or
    dropped position changes the gradient)."""
    weights = torch.linspace(0.5, 1.5, ids.shape[1] - prompt_length)  # (R,)
    if critic_only:
        values = runner.critic_values(module.critic, ids, mask, prompt_length)  # (B, R)
        return (values,), (values * weights).square().sum()
    logits, values = runner.policy_and_values(module.policy, module.critic, ids, mask, prompt_length)
    loss = (logits.logsumexp(-1) * weights).sum() + (values * weights).square().sum()
    return (logits, values), loss


VARIANTS = {  # each compiles its own graphs: the conditions share cases (checkpointing with LoRA is refused)
    "shared-trunk critic, gradient checkpointing": dict(
        critic="shared_trunk", memory=MemoryConfig(gradient_checkpointing=True)
    ),
    "critic alone (old logprobs from sampling)": dict(),
    "LoRA policy and critic": dict(
        lora=LoRAConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
        critic_lora=LoRAConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    ),
}


@pytest.mark.slow
@pytest.mark.kernels
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_compiled_pass_gives_the_eager_outputs_and_gradients(variant, two_layer_stories):
    # policy, critic and reward model on the 2-layer trunk (tests/conftest.py): cheaper to compile
    module = tiny_module(sft_model=two_layer_stories, reward_model=two_layer_stories, **VARIANTS[variant])
    assert module.policy.config.num_hidden_layers == 2
    torch.manual_seed(4)
    heads = [p for n, p in module.critic.named_parameters() if n.endswith(("score.weight", "head.weight"))]
    assert heads
    with (
        torch.no_grad()
    ):  # the value head starts at 0 (N details #4): a trained one, so values and their gradients are not 0
        for head in heads:
            head.normal_(0.0, 0.5)
    critic_only = variant.startswith("critic alone")
    torch.manual_seed(3)
    ids = torch.randint(3, 500, (3, 5 + 7))  # P = 5, R = 7; left padding of 2 and 4 columns
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[2, :4] = 0
    eager, compiled = ForwardPassRunner("eager"), ForwardPassRunner("compiled")
    config = module.policy.config  # the critic is the same (2-layer) stories260K trunk
    positions = bucket_length(5) + bucket_length(7)  # the compiled pass's padded rows
    if critic_only:  # the library runs this pass only to score, without grad (experience.py): one graph
        with torch.no_grad():
            (wanted,), _ = _pass(eager, module, ids, mask, 5, critic_only)
            (got,), _ = _pass(compiled, module, ids, mask, 5, critic_only)
            (again,), _ = _pass(compiled, module, ids, mask, 5, critic_only)  # no new graph, the same values
        assert got.shape == wanted.shape == (3, 7)
        torch.testing.assert_close(got, wanted, rtol=0, atol=output_bound(config, float(wanted.abs().max()), positions))
        assert torch.equal(again, got) and wanted.abs().min() > 0
        assert compiled.stats.graphs == 1 and eager.stats.graphs == 0
        return
    trained = [p for p in module.parameters() if p.requires_grad]
    results = []
    for runner in (eager, compiled, compiled):  # the second compiled call: no new graph
        with train_mode(module.policy, module.critic):
            outputs, loss = _pass(runner, module, ids, mask, 5, critic_only=False)
            loss.backward()
        results.append(([o.detach() for o in outputs], [p.grad.clone() for p in trained]))
        module.zero_grad(set_to_none=True)
    with torch.no_grad():  # the scoring passes: another graph, the same values
        no_grad_outputs, _ = _pass(compiled, module, ids, mask, 5, critic_only=False)
    (eager_out, eager_grads), (compiled_out, compiled_grads), (again_out, _) = results
    for got, wanted in zip([*compiled_out, *no_grad_outputs], [*eager_out, *eager_out]):
        assert got.shape == wanted.shape
        # another summation order: tests/float32_bounds.py's bound at the largest |output| (logits or values)
        bound = output_bound(config, float(wanted.abs().max()), positions)
        torch.testing.assert_close(got, wanted, rtol=0, atol=bound)
    assert all(torch.equal(a, b) for a, b in zip(again_out, compiled_out))
    assert len(compiled_grads) == len(eager_grads) > 0
    largest = max(float(g.abs().max()) for g in eager_grads)
    assert largest > 0
    for got, wanted in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, wanted, rtol=0, atol=gradient_bound(config, largest, 3 * positions))
    assert compiled.stats.graphs == 2 and eager.stats.graphs == 0  # grad and no-grad, one shape


def test_lora_with_gradient_checkpointing_is_refused_before_any_model_loads():
    lora = LoRAConfig(r=4, alpha=8, target_modules=["q_proj"])
    with pytest.raises(
        ValueError,
        match=r"^ppo.forward: compiled does not run with memory.gradient_checkpointing "
        r"and LoRA together",
    ):
        tiny_module(
            sft_model="/nonexistent",
            ppo=PPOConfig(forward="compiled"),
            lora=lora,
            memory=MemoryConfig(gradient_checkpointing=True),
        )


def test_compiled_passes_are_refused_under_fsdp_and_taken_without_it():
    module = tiny_module(ppo=PPOConfig(forward="compiled"), max_rollouts=1)
    module.configure_model()  # one device: nothing to refuse
    module._device_mesh = object()  # what the fsdp / fsdp2 strategy gives the module
    with pytest.raises(
        ValueError, match=r"^ppo.forward compiled is not supported under fsdp / fsdp2; use ppo.forward eager"
    ):
        module.configure_model()
