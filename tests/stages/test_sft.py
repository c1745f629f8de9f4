"""SFTModule on the real stories260K Llama, and the shared optimizer / LR schedule."""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForCausalLM

from rlhf_lit.stages import SFTModule
from rlhf_lit.stages.base import as_config
from rlhf_lit.stages.optim import OptimizerConfig, build_optimizer, lr_factor


def _manual_nll(logits: torch.Tensor, input_ids: torch.Tensor, spans: list[tuple[int, int]]) -> tuple[float, int]:
    """Sum of -log p(token t | < t) over the response span [start, end) of each row, and the token count.

    Written with explicit positions: the logit at t - 1 predicts the token at t.
    """
    logp = torch.log_softmax(logits.double(), dim=-1)  # (B, T, V)
    total, count = 0.0, 0
    for i, (start, end) in enumerate(spans):
        for t in range(start, end):
            total -= float(logp[i, t - 1, input_ids[i, t]])
            count += 1
    return total, count


@pytest.fixture(scope="module")
def sft(stories_path) -> SFTModule:
    return SFTModule(stories_path)


def test_loss_counts_exactly_the_response_tokens(sft, helpers):
    tok = sft.tokenizer
    pairs = [("Once upon a time", " there was a cat."), ("Tom", " ran home.")]
    batch = helpers.sft_batch(tok, pairs)
    # Exact spans from the encodings: the response (incl. EOS) follows the prompt (incl. BOS).
    spans = []
    for p, r in pairs:
        p_ids, r_ids = helpers.encode_pair(tok, p, r)
        spans.append((len(p_ids), len(p_ids) + len(r_ids)))
    T = batch["input_ids"].shape[1]
    assert spans[0][1] == T and spans[1][1] < T  # row 1 is padded
    assert batch["input_ids"][0, spans[0][1] - 1] == tok.eos_token_id

    with torch.no_grad():
        logits = sft(batch["input_ids"], batch["attention_mask"])  # (B, T, V)
        loss = sft.loss(batch)
    total, count = _manual_nll(logits, batch["input_ids"], spans)
    assert count == sum(e - s for s, e in spans)
    assert float(loss) == pytest.approx(total / count, rel=1e-6)

    # Perturb the logits at every position that predicts a prompt or pad token: the loss must not move.
    def perturb(positions):
        def hook(module, args, output):
            for i, ts in enumerate(positions):
                for t in ts:
                    output.logits[i, t] += 50.0 * torch.randn_like(output.logits[i, t])
            return output

        return hook

    outside = [[t for t in range(T) if not (s - 1 <= t < e - 1)] for s, e in spans]
    assert outside[0] == list(range(0, spans[0][0] - 1)) + [T - 1]
    handle = sft.model.register_forward_hook(perturb(outside))
    with torch.no_grad():
        loss_outside = sft.loss(batch)
    handle.remove()
    assert torch.equal(loss_outside, loss)

    # The last prompt position predicts the first response token: perturbing it changes the loss.
    handle = sft.model.register_forward_hook(perturb([[spans[0][0] - 1], []]))
    with torch.no_grad():
        loss_first = sft.loss(batch)
    handle.remove()
    assert abs(float(loss_first) - float(loss)) > 1e-3


def test_validation_loss_is_token_weighted(sft, helpers, tmp_path):
    tok = sft.tokenizer
    short = helpers.sft_batch(tok, [("Lily", " smiled.")])
    long = helpers.sft_batch(
        tok,
        [
            ("One day", " a big dog saw a little bird in the tree and barked loudly."),
            ("The sun", " was warm and the children played outside all day long."),
        ],
    )
    total, count, batch_means = 0.0, 0, []
    for batch in (short, long):
        spans = [(int(row.ne(-100).nonzero()[0]), int(row.ne(-100).nonzero()[-1]) + 1) for row in batch["labels"]]
        with torch.no_grad():
            logits = sft(batch["input_ids"], batch["attention_mask"])
        t, c = _manual_nll(logits, batch["input_ids"], spans)
        total, count = total + t, count + c
        batch_means.append(t / c)
    expected = total / count
    assert abs(expected - sum(batch_means) / 2) > 1e-2  # the two averages differ: the test can tell

    trainer = helpers.cpu_trainer(tmp_path, max_steps=1)
    trainer.validate(sft, datamodule=helpers.BatchListDataModule(train=[], val=[short, long]), verbose=False)
    assert float(trainer.callback_metrics["val/loss"]) == pytest.approx(expected, rel=1e-5)
    assert float(trainer.callback_metrics["val/ppl"]) == pytest.approx(math.exp(expected), rel=1e-5)


def _scalars(log_dir: str) -> dict[str, list[float]]:
    acc = EventAccumulator(log_dir)
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_overfits_logs_exports_and_resumes(stories_path, helpers, paragraphs, tmp_path):
    torch.manual_seed(0)
    module = SFTModule(
        stories_path, optimizer=OptimizerConfig(lr=3e-3, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    )
    tok = module.tokenizer
    pairs = []
    for text in paragraphs[:4]:
        words = text.split()
        pairs.append((" ".join(words[:4]), " " + " ".join(words[4:30])))
    batch = helpers.sft_batch(tok, pairs)
    logger = TensorBoardLogger(str(tmp_path), name="sft")
    trainer = helpers.cpu_trainer(tmp_path, max_steps=20, logger=logger, check_val_every_n_epoch=10)
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=[batch], val=[batch]))

    scalars = _scalars(logger.log_dir)
    assert {"train/loss", "train/ppl", "val/loss", "val/ppl", "lr"} <= set(scalars)
    train_loss = scalars["train/loss"]
    assert len(train_loss) == 20
    assert train_loss[-1] < 0.6 * train_loss[0], train_loss
    assert scalars["train/ppl"][0] == pytest.approx(math.exp(train_loss[0]), rel=1e-5)
    assert len(scalars["val/loss"]) == 2  # after epochs 10 and 20
    assert scalars["val/ppl"][-1] == pytest.approx(math.exp(scalars["val/loss"][-1]), rel=1e-5)
    # lr logged at steps 0, 1 (warmup 3e-3 * 1/2, 3e-3 * 2/2) and the cosine floor approached at the end.
    assert scalars["lr"][:2] == pytest.approx([1.5e-3, 3e-3])
    assert scalars["lr"][-1] == pytest.approx(3e-3 * lr_factor(19, module.optimizer_config, 20))

    # The export sits next to the logs and reproduces the trained model exactly.
    assert module.exported_path == (tmp_path / "sft" / "version_0" / "model").absolute()
    exported = AutoModelForCausalLM.from_pretrained(module.exported_path)
    with torch.no_grad():
        expected = module.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        got = exported(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.equal(got, expected)

    # A Lightning checkpoint loads with weights_only (no dataclass in hparams) and rebuilds the config.
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    state = torch.load(ckpt, weights_only=True)
    assert state["hyper_parameters"]["optimizer"] == asdict(module.optimizer_config)
    restored = SFTModule.load_from_checkpoint(ckpt, weights_only=True)
    assert restored.optimizer_config == module.optimizer_config
    for name, p in module.model.state_dict().items():
        assert torch.equal(restored.model.state_dict()[name], p), name


# ----- optimizer and schedule (rlhf_lit/stages/optim.py) ---------------------------------------------


def test_linear_schedule_with_warmup_by_hand():
    cfg = OptimizerConfig(lr=1.0, warmup_steps=2, schedule="linear", min_lr_ratio=0.0)
    # warmup (s+1)/2 -> 0.5, 1.0; then 1 - (s-2)/(6-2) for s = 2..5 -> 1, .75, .5, .25; after the last step 0.
    assert [lr_factor(s, cfg, 6) for s in range(7)] == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0])


def test_cosine_schedule_by_hand():
    cfg = OptimizerConfig(lr=1.0, schedule="cosine", min_lr_ratio=0.1)
    # 0.1 + 0.9 * (1 + cos(pi * s / 4)) / 2: cos(pi/4) = 0.70710678 -> 0.86819805, 0.55, 0.23180195, 0.1
    assert [lr_factor(s, cfg, 4) for s in range(5)] == pytest.approx([1.0, 0.86819805, 0.55, 0.23180195, 0.1])


def test_constant_schedule_and_real_scheduler_steps():
    cfg = OptimizerConfig(lr=0.2, warmup_steps=4)
    assert [lr_factor(s, cfg, float("inf")) for s in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    layer = torch.nn.Linear(3, 2)
    opt, sched = build_optimizer(layer.named_parameters(), cfg, float("inf"))
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2])


def test_weight_decay_only_on_matrices():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    opt, _ = build_optimizer(
        model.named_parameters(), OptimizerConfig(weight_decay=0.1, betas=(0.8, 0.9), eps=1e-6), 10
    )
    decayed, plain = opt.param_groups
    assert [p.shape for p in decayed["params"]] == [torch.Size([2, 3])] and decayed["weight_decay"] == 0.1
    assert [p.shape for p in plain["params"]] == [torch.Size([2])] * 3 and plain["weight_decay"] == 0.0
    assert decayed["betas"] == (0.8, 0.9) and decayed["eps"] == 1e-6


def test_incompatible_settings_raise():
    with pytest.raises(ValueError, match="finite number of steps"):
        build_optimizer(torch.nn.Linear(2, 1).named_parameters(), OptimizerConfig(schedule="linear"), float("inf"))
    with pytest.raises(ValueError, match="must exceed warmup_steps"):
        build_optimizer(torch.nn.Linear(2, 1).named_parameters(), OptimizerConfig(schedule="cosine", warmup_steps=5), 5)
    with pytest.raises(ValueError, match="no effect with schedule='constant'"):
        OptimizerConfig(min_lr_ratio=0.1)
    with pytest.raises(ValueError, match="lr must be > 0"):
        OptimizerConfig(lr=0.0)
    with pytest.raises(ValueError, match="min_lr_ratio must be in"):
        OptimizerConfig(schedule="linear", min_lr_ratio=1.5)


def test_config_round_trips_through_its_dict():
    cfg = OptimizerConfig(lr=2e-5, betas=(0.9, 0.95), warmup_steps=3, schedule="linear")
    saved = asdict(cfg)
    saved["betas"] = list(saved["betas"])  # YAML / checkpoint round trips give lists
    assert as_config(OptimizerConfig, saved) == cfg
    with pytest.raises(TypeError):
        as_config(OptimizerConfig, 3)
