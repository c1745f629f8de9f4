"""RewardModelModule on ranking batches (K ranked responses per prompt, docs/CONTRACTS.md).

Ranking batches are built here by hand, following the batch contract: rows position-major, right
padded to the longest row, ``group`` / ``rank`` / ``responses_per_prompt`` / ``prompt_length``.
"""

from __future__ import annotations

import math
import random

import lightning.pytorch as pl
import pytest
import torch

from rlhf_lit.functional import concat_pairs
from rlhf_lit.models.memory import train_mode
from rlhf_lit.stages import RewardModelModule
from rlhf_lit.stages.optim import OptimizerConfig
from rlhf_lit.stages.reward_heads.head import preference_loss


def ranking_batch(helpers, tokenizer, records: list[tuple]) -> dict[str, torch.Tensor]:
    """Records ``(prompt, [response best first, ...])`` or ``(prompt, responses, ranks)`` as one batch."""
    per_prompt = []
    for record in records:
        prompt, responses = record[0], record[1]
        ranks = record[2] if len(record) > 2 else list(range(len(responses)))
        rows = []
        for response in responses:
            p, r = helpers.encode_pair(tokenizer, prompt, response)
            rows.append((p + r, len(p)))
        per_prompt.append((rows, ranks))
    ids, group, rank, prompt_length = [], [], [], []
    for position in range(max(len(rows) for rows, _ in per_prompt)):  # position-major
        for b, (rows, ranks) in enumerate(per_prompt):
            if position < len(rows):
                ids.append(rows[position][0])
                prompt_length.append(rows[position][1])
                group.append(b)
                rank.append(ranks[position])
    input_ids, attention_mask = helpers.pad_rows(ids, tokenizer.pad_token_id)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "group": torch.tensor(group),
        "rank": torch.tensor(rank),
        "responses_per_prompt": torch.tensor([len(r) for r, _ in per_prompt]),
        "prompt_length": torch.tensor(prompt_length),
    }


def rule_records(names, places, template, words):
    """Responses that differ in one word only, ranked in the order of ``words``."""
    return [(f"{n} went to the {p}.", [template.format(n=n, p=p, w=w) for w in words]) for n in names for p in places]


PAIRS = [
    ("Tom went out.", " He was happy.", " He was sad and cried a lot."),
    ("Lily", " smiled.", " frowned."),
    ("The dog", " wagged its tail at the boy.", " bit."),
]


def fresh_module(stories_path, **kwargs) -> RewardModelModule:
    torch.manual_seed(0)
    return RewardModelModule(
        stories_path, optimizer=OptimizerConfig(lr=1e-3, schedule="linear"), normalize="none", **kwargs
    )


# ----- K = 2: the pair batch, bit for bit -------------------------------------------------------------


def test_k2_ranking_batch_trains_as_the_pair_batch_bit_for_bit(stories_path, helpers, tmp_path):
    module = fresh_module(stories_path)
    tok = module.tokenizer
    pairs = helpers.preference_batch(tok, PAIRS)
    ranking = ranking_batch(helpers, tok, [(p, [c, r]) for p, c, r in PAIRS])
    # The contract: the K = 2 rows are concat_pairs(chosen, rejected) of the same records.
    expected_ids, expected_mask = concat_pairs(
        pairs["chosen_input_ids"],
        pairs["chosen_attention_mask"],
        pairs["rejected_input_ids"],
        pairs["rejected_attention_mask"],
        tok.pad_token_id,
    )
    assert torch.equal(ranking["input_ids"], expected_ids) and torch.equal(ranking["attention_mask"], expected_mask)

    def loss_and_grads(batch):
        module.zero_grad(set_to_none=True)
        with train_mode(module.model):
            scores = module.raw_scores(*module.batch_sequences(batch))
        loss, accuracy = preference_loss(scores, batch)
        loss.backward()
        return loss, accuracy, {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}

    pair_loss, pair_accuracy, pair_grads = loss_and_grads(pairs)
    loss, accuracy, grads = loss_and_grads(ranking)
    assert torch.equal(loss, pair_loss) and torch.equal(accuracy, pair_accuracy)
    assert grads.keys() == pair_grads.keys() and len(grads) == len(list(module.parameters()))
    assert all(torch.equal(grads[n], pair_grads[n]) for n in grads)
    assert any(float(g.abs().max()) > 0 for g in grads.values())

    # Through Lightning: three steps on pairs and three on the same rankings end on the same weights.
    def train(batch, name):
        trained = fresh_module(stories_path, export_dir=str(tmp_path / name))
        trainer = helpers.cpu_trainer(tmp_path, max_steps=3)
        trainer.fit(trained, datamodule=helpers.BatchListDataModule(train=[batch]))
        return trained, float(trainer.callback_metrics["train/loss"])

    on_pairs, pair_logged = train(pairs, "pairs")
    on_rankings, ranking_logged = train(ranking, "rankings")
    assert ranking_logged == pair_logged
    moved = [n for n, p in on_pairs.named_parameters() if not torch.equal(p, module.state_dict()[n])]
    assert moved  # the steps changed the weights (the module above took no step)
    assert all(torch.equal(p, dict(on_rankings.named_parameters())[n]) for n, p in on_pairs.named_parameters())


# ----- one forward, each response once ----------------------------------------------------------------


def test_each_response_goes_through_one_forward(stories_path, helpers, tmp_path):
    module = fresh_module(stories_path)
    tok = module.tokenizer
    records = [
        ("Tom went out.", [" He was happy.", " He was sad.", " He slept."]),
        ("Lily", [" smiled.", " frowned.", " sang a song.", " left."]),
        ("The dog", [" wagged its tail.", " bit."]),
    ]
    batch = ranking_batch(helpers, tok, records)
    assert batch["input_ids"].shape[0] == 9
    rows = []
    hook = module.model.get_input_embeddings().register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[0]))
    trainer = helpers.cpu_trainer(tmp_path, max_steps=2)
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=[batch, batch]))
    assert rows == [9, 9]  # one call per step, 3 + 4 + 2 rows
    rows.clear()
    trainer.validate(module, datamodule=helpers.BatchListDataModule(train=[], val=[batch]), verbose=False)
    hook.remove()
    assert rows == [9]


# ----- validation metrics and their weighting ----------------------------------------------------------


def nll(x: float) -> float:
    return math.log1p(math.exp(-x))


def test_validation_metrics_pool_pairs_and_prompts_over_batches(stories_path, helpers, tmp_path):
    module = fresh_module(stories_path)
    with torch.no_grad():
        module.reward_gain.fill_(2.0)  # validation reads the normalised scores
        module.reward_bias.fill_(-0.3)
    tok = module.tokenizer
    val = [
        ranking_batch(helpers, tok, [("Tom went out.", [" He was happy.", " He was sad.", " He slept."])]),
        ranking_batch(
            helpers,
            tok,
            [
                ("Lily", [" smiled.", " frowned.", " sang a song.", " left."], [0, 1, 1, 2]),
                ("The dog", [" wagged its tail.", " bit."]),
                ("A cat", [" sat.", " ran off fast.", " hissed at me.", " purred.", " ate."]),
            ],
        ),
    ]
    trainer = helpers.cpu_trainer(tmp_path, max_steps=1)
    trainer.validate(module, datamodule=helpers.BatchListDataModule(train=[], val=val), verbose=False)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}

    # By hand: every prompt's scores (gain 2, bias -0.3), then loops over prompts and pairs.
    losses, taus, exact, wins, margins = [], [], [], [], []
    for batch in val:
        with torch.no_grad():
            scores = (2.0 * module.raw_scores(batch["input_ids"], batch["attention_mask"]) - 0.3).tolist()
        for b in range(len(batch["responses_per_prompt"])):
            rows = [i for i in range(len(scores)) if int(batch["group"][i]) == b]
            s = [scores[i] for i in rows]
            r = [int(batch["rank"][i]) for i in rows]
            pairs = [(i, j) for i in range(len(s)) for j in range(len(s)) if r[i] < r[j]]
            losses.append(sum(nll(s[i] - s[j]) for i, j in pairs) / len(pairs))
            wins += [s[i] > s[j] for i, j in pairs]
            margins += [s[i] - s[j] for i, j in pairs]
            taus.append(sum((s[i] > s[j]) - (s[i] < s[j]) for i, j in pairs) / len(pairs))
            exact.append(all(s[i] > s[j] for i, j in pairs))
    assert len(losses) == 4 and len(wins) == 3 + 5 + 1 + 10
    assert logged["val/loss"] == pytest.approx(sum(losses) / 4, rel=1e-5)
    assert logged["val/accuracy"] == pytest.approx(sum(wins) / len(wins), rel=1e-6)
    assert logged["val/margin"] == pytest.approx(sum(margins) / len(margins), rel=1e-5)
    assert logged["val/kendall_tau"] == pytest.approx(sum(taus) / 4, rel=1e-6, abs=1e-7)
    assert logged["val/ranking_exact"] == pytest.approx(sum(exact) / 4, abs=1e-7)
    # the scores of an untrained head leave these in the middle: not a vacuous 0 or 1
    assert 0 < sum(wins) < len(wins) and len(set(taus)) > 1


# ----- learning a known ranking rule -------------------------------------------------------------------

# Best first: the mood decides, then the food (a score linear in two features orders them exactly).
WORDS = ["happy with a cake", "happy with mud", "sad with a cake", "sad with mud"]


def test_learns_a_known_ranking_rule(stories_path, helpers, tmp_path):
    pl.seed_everything(0)
    module = RewardModelModule(stories_path, optimizer=OptimizerConfig(lr=1e-3, schedule="linear"), normalize="none")
    # A zero head scores every response 0: untrained accuracy, tau and exact rankings are exactly 0.
    with torch.no_grad():
        module.model.score.weight.zero_()
    tok = module.tokenizer
    train = rule_records(
        ["Tom", "Lily", "Ben", "Sue", "Max", "Anna", "Tim", "Mia"],
        ["park", "garden", "school", "shop", "beach", "forest"],
        " {n} was {w} all day.",
        WORDS,
    )
    random.Random(0).shuffle(train)
    # Held out: other names, other places and another sentence.
    held_out = rule_records(
        ["Sam", "Lucy", "Jack", "Emma"], ["farm", "zoo", "river", "house"], " The {p} made {n} feel {w}.", WORDS
    )
    dm = helpers.BatchListDataModule(
        train=[ranking_batch(helpers, tok, train[i : i + 8]) for i in range(0, len(train), 8)],
        val=[ranking_batch(helpers, tok, held_out[i : i + 8]) for i in range(0, len(held_out), 8)],
    )
    trainer = helpers.cpu_trainer(tmp_path, max_steps=24, check_val_every_n_epoch=100)
    trainer.validate(module, datamodule=dm, verbose=False)
    before = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert before["val/accuracy"] == 0.0 and before["val/kendall_tau"] == 0.0 and before["val/ranking_exact"] == 0.0
    trainer.fit(module, datamodule=dm)
    trainer.validate(module, datamodule=dm, verbose=False)
    after = {k: float(v) for k, v in trainer.callback_metrics.items()}
    print(f"held-out ranking after 24 steps: {after}")
    assert after["val/accuracy"] > 0.9  # chance 0.5; measured 0.99
    assert after["val/kendall_tau"] > 0.8  # chance 0; measured 0.98
    assert after["val/ranking_exact"] > 0.5  # chance 1/24; measured 0.94


def test_preference_loss_passes_the_prompt_weight(stories_path, helpers):
    module = fresh_module(stories_path)
    batch = ranking_batch(
        helpers, module.tokenizer, [("Tom", [" ran.", " sat.", " slept."]), ("Lily", [" sang.", " cried."])]
    )
    scores = torch.tensor([0.3, -0.2, 1.0, 0.4, -0.5])  # rows: Tom 1st, Lily 1st, Tom 2nd, Lily 2nd, Tom 3rd
    weight = torch.tensor([3.0, 1.0])
    loss, accuracy = preference_loss(scores, batch, weight=weight)
    tom = (nll(0.3 - 1.0) + nll(0.3 + 0.5) + nll(1.0 + 0.5)) / 3
    lily = nll(-0.2 - 0.4)
    assert_close = torch.testing.assert_close
    assert_close(loss, torch.tensor((3 * tom + lily) / 4))
    assert_close(accuracy, torch.tensor(2 / 4))
    assert_close(preference_loss(scores, batch)[0], torch.tensor((tom + lily) / 2))


class _MeanBeforeFold(pl.Callback):
    """The normalised scores of every row of the validation batches, before the export folds them."""

    def __init__(self, batches):
        self.batches, self.scores = batches, None

    def on_fit_end(self, trainer, module):
        with torch.no_grad():
            self.scores = torch.cat([module(b["input_ids"], b["attention_mask"]) for b in self.batches])


def test_normalisation_pools_every_response_of_ranking_batches(stories_path, helpers, tmp_path):
    module = fresh_module(stories_path)
    module.normalization = "gain_bias"
    tok = module.tokenizer
    val = [
        ranking_batch(
            helpers,
            tok,
            [
                ("Tom went out.", [" He was happy.", " He was sad.", " He slept."]),
                ("The dog", [" wagged its tail.", " bit."]),
            ],
        ),
        ranking_batch(helpers, tok, [("Lily", [" smiled.", " frowned.", " sang a song.", " left."])]),
    ]
    capture = _MeanBeforeFold(val)
    trainer = helpers.cpu_trainer(tmp_path, max_steps=1, callbacks=[capture], check_val_every_n_epoch=100)
    trainer.fit(module, datamodule=helpers.BatchListDataModule(train=val[:1], val=val))
    assert capture.scores.shape == (9,)  # 5 + 4 responses
    assert abs(float(capture.scores.mean())) < 1e-5
    assert float(capture.scores.std(unbiased=False)) == pytest.approx(1.0, abs=1e-5)


def test_an_ensemble_logs_the_ranking_metrics_of_its_members_mean(stories_path, helpers, tmp_path):
    from rlhf_lit.models import sequence_scores
    from rlhf_lit.stages.reward_heads.ensemble_head import EnsembleConfig

    module = fresh_module(stories_path, ensemble=EnsembleConfig(members=2, seeds=[5, 6]))
    tok = module.tokenizer
    val = [
        ranking_batch(
            helpers,
            tok,
            [
                ("Lily", [" smiled.", " frowned.", " sang a song.", " left."], [0, 1, 1, 2]),
                ("A cat", [" purred.", " hissed at me.", " ran off fast.", " sat."]),
            ],
        )
    ]
    trainer = helpers.cpu_trainer(tmp_path, max_steps=1)
    trainer.validate(module, datamodule=helpers.BatchListDataModule(train=[], val=val), verbose=False)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # By hand: the mean of the two members' scores, loops over each prompt's labelled pairs.
    with torch.no_grad():  # normalize="none": the members' raw scores
        per_member = [sequence_scores(m, val[0]["input_ids"], val[0]["attention_mask"]) for m in module.model.members]
    scores = ((per_member[0] + per_member[1]) / 2).tolist()
    taus, exact = [], []
    for b in range(2):
        rows = [i for i in range(len(scores)) if int(val[0]["group"][i]) == b]
        s, r = [scores[i] for i in rows], [int(val[0]["rank"][i]) for i in rows]
        pairs = [(i, j) for i in range(len(s)) for j in range(len(s)) if r[i] < r[j]]
        taus.append(sum((s[i] > s[j]) - (s[i] < s[j]) for i, j in pairs) / len(pairs))
        exact.append(all(s[i] > s[j] for i, j in pairs))
    assert logged["val/kendall_tau"] == pytest.approx(sum(taus) / 2, rel=1e-6, abs=1e-7)
    assert logged["val/ranking_exact"] == pytest.approx(sum(exact) / 2, abs=1e-7)
    assert len(set(taus)) > 1 and 0 < sum(exact) < 2  # untrained heads: not a vacuous all-right or all-wrong
