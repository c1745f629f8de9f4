"""BoNBoNModule on stories260K: its loss and gradient against the formula on unpadded rows, N and beta."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.models.reference import AdapterDisabledReference
from rlhf_lit.stages import BoNBoNModule

# (prompt, best of N, worst of N)
PAIRS = [("Tom went out.", " He was happy.", " He was sad and cried a lot."), ("Lily", " smiled.", " frowned.")]
ALPHA = 0.1
TARGET_N4 = 5.5  # 1 / (2 beta_4) = (N - 1) H_(N-1) = 3 * (1 + 1/2 + 1/3), by hand


@pytest.fixture
def moved(stories_path) -> BoNBoNModule:
    """N = 4, alpha 0.1, its policy moved off its reference (so that h is not 0)."""
    module = BoNBoNModule(stories_path, n=4, alpha=ALPHA)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return module


def _sequence_logprob(model, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    """Sum of log p(response token | everything before it), one unpadded row, by a plain loop."""
    logp = torch.log_softmax(model(input_ids=torch.tensor([prompt_ids + response_ids])).logits[0].float(), dim=-1)
    P = len(prompt_ids)
    return sum(logp[P + i - 1, tok] for i, tok in enumerate(response_ids))


def _formula_loss(module: BoNBoNModule, helpers) -> torch.Tensor:
    """alpha (-log pi(best)) + (1 - alpha) (h - 5.5)^2, mean over pairs: the policy's sums with gradient, the
    frozen reference's without, written from the formula (not with the code under test)."""
    losses = []
    for prompt, best, worst in PAIRS:
        p, b = helpers.encode_pair(module.tokenizer, prompt, best)
        _, w = helpers.encode_pair(module.tokenizer, prompt, worst)
        logp_best, logp_worst = _sequence_logprob(module.model, p, b), _sequence_logprob(module.model, p, w)
        with torch.no_grad():
            ref_best, ref_worst = _sequence_logprob(module.ref_model, p, b), _sequence_logprob(module.ref_model, p, w)
        h = (logp_best - ref_best) - (logp_worst - ref_worst)
        losses.append(ALPHA * -logp_best + (1 - ALPHA) * (h - TARGET_N4) ** 2)
    return sum(losses) / len(losses)


def _gradients(module: BoNBoNModule, loss: torch.Tensor) -> list[torch.Tensor]:
    module.model.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in module.model.parameters()]


def test_loss_and_gradient_are_the_formula_on_the_model(moved, helpers):
    batch = helpers.preference_batch(moved.tokenizer, PAIRS)  # chosen = best, rejected = worst
    with torch.no_grad():
        lp = moved.pair_logprobs(batch)
    assert float((lp["logps_chosen"] - lp["ref_logps_chosen"]).abs().min()) > 0.1  # the policy moved off
    loss, stats = moved.loss(batch)
    expected = _formula_loss(moved, helpers)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)
    assert set(BoNBoNModule.STATISTICS) <= set(stats)
    # The gradient reaches the policy through the best AND the worst, and nothing through the reference.
    got, want = _gradients(moved, loss), _gradients(moved, _formula_loss(moved, helpers))
    assert sum(float(g.abs().sum()) for g in want) > 0
    for g, w in zip(got, want, strict=True):  # float32 sums: a tolerance on each tensor's own scale (up to ~1e4)
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * float(w.abs().max()))
    assert all(p.grad is None for p in moved.ref_model.parameters())


def test_untrained_policy_sits_at_the_ipo_target(stories_path, helpers):
    module = BoNBoNModule(stories_path, n=4, alpha=0.0)
    with torch.no_grad():
        loss, stats = module.loss(helpers.preference_batch(module.tokenizer, PAIRS))
    # policy == reference: h = 0, so the IPO term is (0 - 5.5)^2 = 30.25 for every pair
    torch.testing.assert_close(loss, torch.tensor(30.25))
    assert float(stats["implicit_kl"]) == pytest.approx(0.0, abs=1e-6)


def test_lora_reference_is_the_policy_with_adapters_disabled(stories_path, helpers):
    module = BoNBoNModule(stories_path, n=4, lora=LoRAConfig(r=4))
    assert isinstance(module.reference, AdapterDisabledReference) and "ref_model" not in module._modules
    loss, _ = module.loss(helpers.preference_batch(module.tokenizer, PAIRS))
    loss.backward()
    trained = {name for name, p in module.model.named_parameters() if p.grad is not None}
    assert trained and all("lora_" in name for name in trained)


@pytest.mark.parametrize(("n", "beta"), [(2, 0.5), (4, 1 / 11), (8, 10 / 363)])  # 1 / (2 (N-1) H_(N-1)), by hand
def test_beta_is_derived_from_n(stories_path, n, beta):
    assert BoNBoNModule(stories_path, n=n).beta == pytest.approx(beta, rel=1e-12)
    assert BoNBoNModule(stories_path, n=n, beta=0.3).beta == 0.3  # set: as set


def _data(values: list, field: str = "n") -> SimpleNamespace:
    """A data module as the stage sees it (duck-typed): the records' extra column with their locations."""
    rows = [(f"pairs.jsonl line {i + 1}", v) for i, v in enumerate(values)]
    return SimpleNamespace(extra_fields=[field], extra_values=lambda name: rows)


def test_n_is_read_from_the_records_or_checked_against_them(stories_path):
    unset = BoNBoNModule(stories_path)
    with pytest.raises(ValueError, match=r"BoNBoNModule does not know N yet: set n, or fit with a data module"):
        _ = unset.beta
    assert unset.resolved_n(_data([8, 8, 8])) == 8
    assert BoNBoNModule(stories_path, n=8).resolved_n(_data([8, 8])) == 8
    with pytest.raises(ValueError, match=r"pairs\.jsonl line 2: field 'n' is 8, but BoNBoN's n is 4: beta is derived"):
        BoNBoNModule(stories_path, n=4).resolved_n(_data([4, 8]))
    with pytest.raises(ValueError, match=r"pairs\.jsonl line 3: field 'n' is 4, but pairs\.jsonl line 1 has 8"):
        unset.resolved_n(_data([8, 8, 4]))
    with pytest.raises(ValueError, match=r"pairs\.jsonl line 1: field 'n' must be an integer >= 2, got '8'"):
        unset.resolved_n(_data(["8"]))
    with pytest.raises(ValueError, match=r"pairs\.jsonl line 2: field 'n' must be an integer >= 2, got 1"):
        unset.resolved_n(_data([8, 1]))


def test_without_the_records_n_the_setting_is_needed(stories_path):
    no_column = _data([8], field="scored_by")
    with pytest.raises(ValueError, match=r"BoNBoN needs N, .*set model\.init_args\.n, or .*extra_fields: \[n\]"):
        BoNBoNModule(stories_path).resolved_n(no_column)
    assert BoNBoNModule(stories_path, n=4).resolved_n(no_column) == 4  # not checked: nothing to check against
    assert BoNBoNModule(stories_path, beta=0.2).resolved_n(no_column) is None  # beta set: N not needed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 1}, r"n must be an integer >= 2"),
        ({"alpha": 1.5}, r"alpha must be in \[0, 1\]"),
        ({"beta": 0.0}, r"beta must be > 0, or null to derive it from n"),
        ({"model": None}, r"model"),
    ],
)
def test_bad_settings_are_refused(stories_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        BoNBoNModule(**{"model": stories_path, **kwargs})
