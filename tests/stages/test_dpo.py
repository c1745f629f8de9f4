"""DPOModule on stories260K: logprob positions, a frozen reference, learning a known rule, export."""

from __future__ import annotations

import math
import random

import lightning.pytorch as pl
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf_lit.models.lora import LoRAConfig
from rlhf_lit.models.memory import ReleasedError
from rlhf_lit.models.reference import AdapterDisabledReference, FrozenModelReference
from rlhf_lit.stages import DPOModule
from rlhf_lit.stages.optim import OptimizerConfig

PAIRS = [("Tom went out.", " He was happy.", " He was sad and cried a lot."), ("Lily", " smiled.", " frowned.")]


@pytest.fixture(scope="module")
def dpo(stories_path) -> DPOModule:
    torch.manual_seed(0)
    return DPOModule(stories_path)


def _alone_logprob(model, prompt_ids: list[int], response_ids: list[int]) -> float:
    """Sum of log p(response token | everything before it) from one unpadded row, by a plain loop."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)  # (T, V)
    P = len(prompt_ids)
    return sum(float(logp[P + i - 1, tok]) for i, tok in enumerate(response_ids))


def test_pair_logprobs_count_exactly_the_response_tokens(dpo, helpers):
    tok = dpo.tokenizer
    batch = helpers.preference_batch(tok, PAIRS)
    assert batch["prompt_length"].tolist() == [len(tok("Tom went out.").input_ids), len(tok("Lily").input_ids)]
    with torch.no_grad():
        lp = dpo.pair_logprobs(batch)
    for i, (prompt, chosen, rejected) in enumerate(PAIRS):
        for response, key in ((chosen, "chosen"), (rejected, "rejected")):
            p, r = helpers.encode_pair(tok, prompt, response)
            expected = _alone_logprob(dpo.model, p, r)
            assert float(lp[f"logps_{key}"][i]) == pytest.approx(expected, abs=1e-4)
            assert float(lp[f"ref_logps_{key}"][i]) == pytest.approx(expected, abs=1e-4)  # untrained: same model
    # The prompt is not scored: one token fewer in the prompt count puts the last prompt token in the response.
    shifted = dict(batch, prompt_length=batch["prompt_length"] - 1)
    with torch.no_grad():
        longer = dpo.pair_logprobs(shifted)
    assert float(longer["logps_chosen"][0]) < float(lp["logps_chosen"][0]) - 1e-3


def test_untrained_policy_scores_log_2_and_ties(dpo, helpers):
    with torch.no_grad():
        loss, stats = dpo.loss(helpers.preference_batch(dpo.tokenizer, PAIRS))
    # policy == reference: h = 0 for every pair, -log sigmoid(0) = log 2, all implicit rewards 0
    assert float(loss) == pytest.approx(math.log(2), abs=1e-6)
    assert float(stats["reward_accuracy"]) == 0.0 and float(stats["implicit_kl"]) == pytest.approx(0.0, abs=1e-6)


def test_reference_is_frozen_and_never_receives_gradients(stories_path, helpers, tmp_path):
    pl.seed_everything(0)
    module = DPOModule(stories_path, beta=0.1, optimizer=OptimizerConfig(lr=1e-3))
    assert isinstance(module.reference, FrozenModelReference) and module.reference.model is module.ref_model
    before = {k: v.clone() for k, v in module.ref_model.state_dict().items()}
    policy_before = {k: v.clone() for k, v in module.model.state_dict().items()}
    batches = [helpers.preference_batch(module.tokenizer, PAIRS)] * 3
    seen = {}

    class AtTrainEnd(pl.Callback):  # callbacks' on_train_end runs before the module's, which releases the reference
        def on_train_end(self, trainer, pl_module):
            ref = pl_module.ref_model
            seen["frozen"] = all(not p.requires_grad and p.grad is None for p in ref.parameters())
            seen["eval"] = not any(m.training for m in ref.modules())  # Lightning's model.train() left it in eval
            seen["unchanged"] = [k for k, v in ref.state_dict().items() if not torch.equal(v, before[k])] == []
            optimised = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
            seen["not optimised"] = not optimised & {id(p) for p in ref.parameters()}
            seen["moments"] = len(trainer.optimizers[0].state) > 0

    trainer = helpers.cpu_trainer(tmp_path, max_steps=3, callbacks=[AtTrainEnd()])
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=batches))
    assert seen == {"frozen": True, "eval": True, "unchanged": True, "not optimised": True, "moments": True}
    changed = [k for k, v in module.model.state_dict().items() if not torch.equal(v, policy_before[k])]
    assert changed  # the policy did train
    # After fit the reference and the optimizer state are released (StageModule.release_after_fit).
    assert "ref_model" not in module._modules and all(p.is_meta for p in module.ref_model.parameters())
    assert len(trainer.optimizers[0].state) == 0
    with pytest.raises(ReleasedError, match=r"DPOModule\.ref_model was released at the end of fit"):
        trainer.validate(module, datamodule=helpers.BatchListDataModule(train=batches, val=batches[:1]), verbose=False)
    # The reference's weights are not in checkpoints; a module loaded from one has it back, from `model`.
    ckpt = tmp_path / "dpo.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=True)["state_dict"]
    assert saved and not any(k.startswith("ref_model.") for k in saved)
    restored = DPOModule.load_from_checkpoint(ckpt, weights_only=True)
    torch.testing.assert_close(restored.model.state_dict(), module.model.state_dict())
    torch.testing.assert_close(restored.ref_model.state_dict(), before)  # reloaded from `model`


def test_lora_reference_is_the_policy_with_adapters_disabled(stories_path, helpers, tmp_path):
    pl.seed_everything(0)
    module = DPOModule(stories_path, optimizer=OptimizerConfig(lr=1e-2), lora=LoRAConfig(r=4, export="merged"))
    assert isinstance(module.reference, AdapterDisabledReference) and "ref_model" not in module._modules
    base = {k: v.clone() for k, v in module.model.state_dict().items() if "lora_" not in k}
    batch = helpers.preference_batch(module.tokenizer, PAIRS)
    with torch.no_grad():
        ref_before = module.pair_logprobs(batch)["ref_logps_chosen"]
    trainer = helpers.cpu_trainer(tmp_path, max_steps=3)
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=[batch] * 3))
    with torch.no_grad():
        after = module.pair_logprobs(batch)
    torch.testing.assert_close(after["ref_logps_chosen"], ref_before, rtol=0, atol=1e-6)  # the base, unchanged
    assert float((after["logps_chosen"] - ref_before).abs().max()) > 1e-3  # the adapted policy moved
    for k, v in module.model.state_dict().items():
        if "lora_" not in k:
            assert torch.equal(v, base[k]), k
    merged = AutoModelForCausalLM.from_pretrained(module.exported_path)  # merged export loads as a plain LM
    assert not hasattr(merged, "peft_config")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(beta=0.0), "beta must be > 0"),
        (dict(label_smoothing=0.5), r"label_smoothing must be in \[0, 0.5\)"),
        (dict(loss="ipo", label_smoothing=0.1), "applies to loss='sigmoid'"),
    ],
)
def test_bad_settings_are_refused_before_loading(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DPOModule("does-not-matter", **kwargs)


def test_batches_without_prompt_length_are_refused(dpo, helpers):
    batch = helpers.preference_batch(dpo.tokenizer, PAIRS)
    del batch["prompt_length"]
    with pytest.raises(ValueError, match="prompt_length"):
        dpo.loss(batch)


# ----- learning a known rule ----------------------------------------------------------------------


def _rule_pairs(names, places, template):
    """Chosen responses say "happy", rejected ones "sad"; everything else is shared."""
    return [
        (f"{n} went to the {p}.", template.format(n=n, p=p, w="happy"), template.format(n=n, p=p, w="sad"))
        for n in names
        for p in places
    ]


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_learns_a_known_preference_rule(stories_path, helpers, tmp_path, loss):
    pl.seed_everything(0)
    module = DPOModule(stories_path, beta=0.1, loss=loss, optimizer=OptimizerConfig(lr=1e-3, schedule="linear"))
    tok = module.tokenizer
    train = _rule_pairs(
        ["Tom", "Lily", "Ben", "Sue", "Max", "Anna", "Tim", "Mia"],
        ["park", "garden", "school", "shop", "beach", "forest"],
        " {n} was {w} all day.",
    )
    random.Random(0).shuffle(train)
    # Held out: other names, other places and another sentence.
    held_out = _rule_pairs(
        ["Sam", "Lucy", "Jack", "Emma"], ["farm", "zoo", "river", "house"], " The {p} made {n} feel very {w}."
    )
    dm = helpers.BatchListDataModule(
        train=[helpers.preference_batch(tok, train[i : i + 8]) for i in range(0, len(train), 8)],
        val=[helpers.preference_batch(tok, held_out[i : i + 8]) for i in range(0, len(held_out), 8)],
    )
    trainer = helpers.cpu_trainer(tmp_path, max_steps=12, check_val_every_n_epoch=100)
    trainer.validate(module, datamodule=dm, verbose=False)
    # policy == reference: every implicit reward is 0, a tie, which counts as wrong
    assert float(trainer.callback_metrics["val/reward_accuracy"]) == 0.0
    trainer.fit(module, datamodule=dm)
    # fit released the frozen reference: validate the trained policy as a module loaded from a checkpoint.
    trainer.save_checkpoint(tmp_path / "trained.ckpt")
    trainer.validate(DPOModule.load_from_checkpoint(tmp_path / "trained.ckpt"), datamodule=dm, verbose=False)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    print(f"{loss}: held-out metrics of the happy/sad rule after 12 steps: {metrics}")
    assert metrics["val/reward_accuracy"] > 0.9
    # measured: sigmoid 2.00 (beta * summed log ratios), ipo 0.096 (beta * token-mean log ratios)
    assert metrics["val/reward_margin"] > {"sigmoid": 0.5, "ipo": 0.03}[loss]
    assert metrics["val/rewards_chosen"] > metrics["val/rewards_rejected"]
    # The export loads in transformers and is the trained policy.
    exported = AutoModelForCausalLM.from_pretrained(module.exported_path)
    batch = dm.val[0]
    with torch.no_grad():
        ids, mask = batch["chosen_input_ids"], batch["chosen_attention_mask"]
        torch.testing.assert_close(
            exported(input_ids=ids, attention_mask=mask).logits,
            module.model(input_ids=ids, attention_mask=mask).logits,
            rtol=0,
            atol=1e-5,
        )


def _fit_policy(stories_path, helpers, tmp_path, precompute_ref: bool):
    """Three steps on two distinct pair batches (one repeated); returns the module and the number of
    reference forward passes made while training and validating (after the precompute, if any)."""
    pl.seed_everything(0)
    module = DPOModule(stories_path, optimizer=OptimizerConfig(lr=1e-3), precompute_ref=precompute_ref)
    tok = module.tokenizer
    first = helpers.preference_batch(tok, PAIRS)
    second = helpers.preference_batch(tok, [("Ben ran.", " He won.", " He fell."), ("Sue", " sang.", " wept.")])
    val = helpers.preference_batch(tok, list(reversed(PAIRS)))  # the same pairs in another order and padding
    calls = {"precompute": 0, "train": 0}

    class Count(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            calls["phase"] = "train"

    calls["phase"] = "precompute"
    hook = module.ref_model.register_forward_pre_hook(
        lambda m, a: calls.__setitem__(calls["phase"], calls[calls["phase"]] + 1)
    )
    trainer = helpers.cpu_trainer(tmp_path, max_steps=3, callbacks=[Count()])
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=[first, second, first], val=[val]))
    hook.remove()
    return module, calls


def test_precomputed_reference_logprobs_are_looked_up_and_change_nothing(stories_path, helpers, tmp_path):
    per_batch, calls = _fit_policy(stories_path, helpers, tmp_path / "a", precompute_ref=False)
    assert calls == {"precompute": 0, "train": 4, "phase": "train"}  # one pass per step and one for validation
    precomputed, calls = _fit_policy(stories_path, helpers, tmp_path / "b", precompute_ref=True)
    # 3 train batches + 1 validation batch once before training; none during training and validation
    assert calls == {"precompute": 4, "train": 0, "phase": "train"}
    assert len(precomputed._ref_table) == 4  # 4 distinct pairs (the val pairs are the first train pairs)
    torch.testing.assert_close(precomputed.model.state_dict(), per_batch.model.state_dict(), rtol=0, atol=1e-6)
