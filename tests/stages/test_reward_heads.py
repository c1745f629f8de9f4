"""The reward-head seam (rlhf_lit/stages/reward_heads/): the settings choose one head in one place, the
stage never asks which head it holds, no head imports the stage, and the losses every head is built
from against values worked by hand. Each head's training through the stage is tested beside its
feature (test_reward*.py, test_reward_ensemble.py, test_length_debias.py, test_reward_checkpoints.py)."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import get_args

import pytest
import torch
from assets_paths import ROOT

from rlhf_lit.stages import RewardModelModule
from rlhf_lit.stages.reward_heads.ensemble_head import EnsembleConfig, EnsembleHead, bootstrap_weight, member_losses
from rlhf_lit.stages.reward_heads.head import TrainingStep, preference_loss
from rlhf_lit.stages.reward_heads.odin_head import LengthDebiasConfig, OdinHead
from rlhf_lit.stages.reward_heads.plain_head import PlainHead
from rlhf_lit.stages.reward_heads.registry import HEADS, HeadKind, build_head, head_kind

STAGE = ROOT / "rlhf_lit" / "stages" / "reward_model.py"
HEAD_PACKAGE = ROOT / "rlhf_lit" / "stages" / "reward_heads"
ODIN = LengthDebiasConfig(method="odin")


def softplus(x: float) -> float:
    """``-log sigmoid(-x)``, the Bradley-Terry loss of a pair whose score difference is ``-x``."""
    return math.log1p(math.exp(x))


# ----- the choice -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ensemble, length_debias, kind, head",
    [
        (EnsembleConfig(), LengthDebiasConfig(), "plain", PlainHead),
        (EnsembleConfig(members=3), LengthDebiasConfig(), "ensemble", EnsembleHead),
        (EnsembleConfig(), ODIN, "odin", OdinHead),
    ],
)
def test_the_settings_choose_one_head(ensemble, length_debias, kind, head):
    assert set(HEADS) == set(get_args(HeadKind))
    assert head_kind(ensemble, length_debias) == kind
    built = build_head(ensemble, length_debias, lora=False)
    assert type(built) is head
    assert built.normalization_shape == ((3,) if kind == "ensemble" else ())


def test_combinations_no_head_trains_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^length_debias.method odin is not supported with ensemble.members > 1"):
        head_kind(EnsembleConfig(members=2), ODIN)
    with pytest.raises(ValueError, match=r"^length_debias.method odin is not supported with lora \(the length"):
        build_head(EnsembleConfig(), ODIN, lora=True)
    assert type(build_head(EnsembleConfig(members=2), LengthDebiasConfig(), lora=True)) is EnsembleHead
    assert type(build_head(EnsembleConfig(), LengthDebiasConfig(), lora=True)) is PlainHead


def test_odin_is_refused_under_fsdp_before_any_step(stories_path):
    module = RewardModelModule(stories_path, normalize="none", length_debias=ODIN)
    module._device_mesh = object()  # what the fsdp / fsdp2 strategy gives the module
    with pytest.raises(ValueError, match=r"^length_debias.method odin is not supported under fsdp / fsdp2; .*ddp$"):
        module.configure_model()


# ----- the seam's shape -------------------------------------------------------------------------------

KIND_WORDS = {"ensemble", "length_debias", "members", "method", "enabled", "RewardEnsemble", "head_kind"}
"""What a branch on the head's kind would read: the settings that choose it, or the model's type."""


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def test_the_stage_never_asks_which_head_it_holds():
    tree = ast.parse(STAGE.read_text(encoding="utf-8"))
    tests = [n.test for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp, ast.While, ast.Assert))]
    tests += [c for n in ast.walk(tree) if isinstance(n, ast.comprehension) for c in n.ifs]
    asked = {ast.unparse(test) for test in tests if _names(test) & KIND_WORDS}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "isinstance"]
    asked |= {ast.unparse(call) for call in calls if ast.unparse(call.args[-1]) != "torch.Tensor"}
    assert asked == set()
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not imported & {"PlainHead", "EnsembleHead", "OdinHead", "RewardEnsemble", "head_kind", "HEADS"}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, under ``TYPE_CHECKING`` and inside functions included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_no_head_imports_the_stage():
    files = sorted(HEAD_PACKAGE.glob("*.py"))
    assert len(files) >= 6
    for path in files:
        stage = {m for m in _imports(path) if m in ("rlhf_lit.stages", "rlhf_lit.stages.reward_model")}
        stage |= {m for m in _imports(path) if m.startswith("rlhf_lit.stages.reward_model.")}
        assert stage == set(), path.name


# ----- the losses the heads are built from, by hand --------------------------------------------------


def _pairs(B: int) -> dict[str, torch.Tensor]:
    """A pair batch's keys (the values are never read: the scores are given)."""
    ids = torch.ones(B, 3, dtype=torch.long)
    return {f"{side}_{key}": ids for side in ("chosen", "rejected") for key in ("input_ids", "attention_mask")}


RANKING = {  # one prompt, three responses ranked 0 (best), 1, 2
    "input_ids": torch.ones(3, 2, dtype=torch.long),
    "attention_mask": torch.ones(3, 2, dtype=torch.long),
    "group": torch.tensor([0, 0, 0]),
    "rank": torch.tensor([0, 1, 2]),
    "responses_per_prompt": torch.tensor([3]),
}


def test_the_preference_loss_reads_chosen_rows_first_and_ranks_best_first():
    # Pairs: chosen [2, 0], rejected [1, 1]: differences +1 and -1.
    loss, accuracy = preference_loss(torch.tensor([2.0, 0.0, 1.0, 1.0]), _pairs(2))
    assert float(loss) == pytest.approx((softplus(-1) + softplus(1)) / 2, abs=1e-6)  # 0.81326
    assert float(accuracy) == 0.5
    # A pair weight of 2 and 0: twice the first pair's loss, over 2 pairs.
    loss, _ = preference_loss(torch.tensor([2.0, 0.0, 1.0, 1.0]), _pairs(2), torch.tensor([2.0, 0.0]))
    assert float(loss) == pytest.approx(2 * softplus(-1) / 2, abs=1e-6)
    # Ranking [3, 1, 0], best first: its pairs differ by 2, 3 and 1, all ordered right.
    loss, accuracy = preference_loss(torch.tensor([3.0, 1.0, 0.0]), RANKING)
    assert float(loss) == pytest.approx((softplus(-2) + softplus(-3) + softplus(-1)) / 3, abs=1e-6)  # 0.16293
    assert float(accuracy) == 1.0


def test_each_member_is_scored_on_its_own_column_with_its_own_weights():
    # Two members, two pairs: member 0 scores chosen [1, 0], rejected [0, 0]; member 1 the reverse order.
    scores = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # (2B, M)
    losses, accuracies = member_losses(scores, _pairs(2), [torch.tensor([3.0, 1.0]), None])
    # Member 0: pairs differ by +1 and 0, weighted 3 and 1, over 2 pairs; member 1: -1 and 0, unweighted.
    expected = [(3 * softplus(-1) + math.log(2)) / 2, (softplus(1) + math.log(2)) / 2]
    torch.testing.assert_close(losses, torch.tensor(expected), rtol=0, atol=1e-6)
    assert accuracies.tolist() == [0.5, 0.0]


class TwoMembers:
    """What the ensemble head reads of a :class:`~rlhf_lit.models.reward_ensemble.RewardEnsemble`: given scores."""

    size, seeds = 2, [9, 11]

    def raw_scores(self, input_ids, attention_mask) -> torch.Tensor:
        # Member 0: chosen [1, 0], rejected [0, 0.5]; member 1: chosen [0, 2], rejected [1, 0].
        return torch.tensor([[1.0, 0.0], [0.0, 2.0], [0.0, 1.0], [0.5, 0.0]])  # (2B, M)


def test_the_ensemble_loss_is_the_sum_of_each_members_loss_under_its_own_bootstrap_weights():
    head = EnsembleHead(EnsembleConfig(members=2, seeds=[9, 11], data_weights="bootstrap"))
    step = TrainingStep(epoch=1, batch_idx=3, rank=0)
    weights = [bootstrap_weight(seed, 2, 1, 3, 0, "cpu").tolist() for seed in (9, 11)]
    assert weights[0] != weights[1] and weights != [bootstrap_weight(s, 2, 3, 1, 0, "cpu").tolist() for s in (9, 11)]
    loss, stats = head.loss(TwoMembers(), (None, None), _pairs(2), step)
    differences = [[1.0, -0.5], [-1.0, 2.0]]  # chosen - rejected, per member and pair
    expected = [sum(w * softplus(-d) for w, d in zip(weights[m], differences[m])) / 2 for m in range(2)]
    assert float(loss) == pytest.approx(sum(expected), abs=1e-6)
    assert float(stats["loss"]) == pytest.approx(sum(expected) / 2, abs=1e-6)  # logged: the members' mean
    assert [float(stats[f"member_{m}/accuracy"]) for m in range(2)] == [0.5, 0.5]
    assert float(stats["accuracy"]) == 0.5  # the mean score: chosen [0.5, 1], rejected [0.5, 0.25]
