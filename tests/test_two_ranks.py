"""The code paths taken only with several processes, checked for their values on 2 gloo ranks.

two_ranks_worker.py runs every check, as one part of the suite's two-process launch
(tests/ppo/two_process_worker.py, the ``two_process_run`` fixture); each test reads the part it is about. The whole-run checks (one PPO update on 2 processes equal to 1 process, the KL
controller, the data position, the logged metrics) are in tests/ppo/test_strategies.py and
tests/ppo/test_ddp.py.
"""

from __future__ import annotations

import pytest
import torch
from two_ranks_worker import RANK_ROWS, whitening_inputs

from rlhf_lit.stages.ppo.config import PPOConfig, RewardConfig
from rlhf_lit.stages.ppo.estimator import AdvantageEstimator


@pytest.fixture(scope="module")
def ranks(two_process_run):
    return [torch.load(two_process_run / "two-ranks" / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.slow
def test_whitening_through_the_strategy_is_that_of_one_process_on_the_whole_batch(ranks):
    """GAE, REINFORCE++ and score whitening with the stage's reducer (Lightning's all-reduce): the
    two ranks' rows together equal one process on all 6 rows (float32: a few ulps of values ~1)."""
    full = whitening_inputs()
    ended = torch.ones(6, dtype=torch.bool)
    expected = {
        "gae": AdvantageEstimator(PPOConfig(estimator="gae"))(full["rewards"], full["values"], full["mask"])[0],
        "reinforce_pp": AdvantageEstimator(PPOConfig(estimator="reinforce_pp"))(full["rewards"], None, full["mask"])[0],
        "scores": RewardConfig(whiten="scores").shape(full["raw_scores"], ended),
    }
    for name, whole in expected.items():
        for rank, record in enumerate(ranks):
            torch.testing.assert_close(
                record["whitening"][name], whole[RANK_ROWS[rank]], rtol=1e-6, atol=1e-6, msg=name
            )
    # Whitening rank 0's two short rows by themselves gives another result.
    alone = AdvantageEstimator(PPOConfig(estimator="gae"))(
        *(full[k][RANK_ROWS[0]] for k in ("rewards", "values", "mask"))
    )[0]
    assert (alone - expected["gae"][RANK_ROWS[0]]).abs().max() > 0.1
    for rank, record in enumerate(ranks):
        assert record["whitening"]["rank_scope_reducer"] is None  # ppo.whiten_scope: rank sums nothing
        # The reducer: [1, 2] + [1, 3] on both ranks; its argument kept (Lightning's all-reduce is in place).
        assert record["whitening"]["reduced"].tolist() == [2.0, 5.0]
        assert record["whitening"]["given"].tolist() == [1.0, 2.0 + rank]


@pytest.mark.slow
def test_token_weights_metrics_and_nonfinite_rollouts_over_ranks(ranks):
    # rank_token_weight = n_rank * world / n_all: 3 * 2 / 8 and 5 * 2 / 8
    assert [r["ppo"]["token_weight"] for r in ranks] == [0.75, 1.25]
    # reduce_over_ranks: the mean of rank 0's (1, 10) and rank 1's (3, -2)
    for record in ranks:
        assert record["ppo"]["metrics"] == {"objective/x": 2.0, "objective/y": 4.0}
        # NaN scores on rank 1 only (and an inf off the response mask on rank 0): both ranks skip.
        assert record["ppo"]["nonfinite"] == ["reward scores"]


@pytest.mark.slow
def test_sharded_verdicts_are_shared_over_the_ranks(ranks):
    rank0, rank1 = (r["sharded"] for r in ranks)
    assert rank0["any_rank_none"] is rank1["any_rank_none"] is False
    assert rank0["any_rank_one"] is rank1["any_rank_one"] is True  # True on rank 1 only, shared
    assert (rank0["any_rank_plain"], rank1["any_rank_plain"]) == (False, True)  # no DTensor: no collective
    # A NaN gradient in rank 1's shard: both ranks drop the step.
    assert rank0["gradients_finite"] is rank1["gradients_finite"] is False
    assert rank0["assert_finite"] == "the policy holds non-finite weights (on another rank); not written"
    assert rank1["assert_finite"] == "the policy holds non-finite weights (w); not written"


@pytest.mark.slow
def test_samplers_take_the_world_and_rank_of_the_process_group(ranks):
    order = torch.randperm(11, generator=torch.Generator().manual_seed(1)).tolist()  # epoch 0, seed 1
    passes = torch.randperm(7, generator=torch.Generator().manual_seed(0)).tolist()  # pass 0, seed 0
    for rank, record in enumerate(ranks):
        assert record["samplers"]["resumable"] == order[rank:10:2]  # every 2nd of the order, remainder dropped
        assert record["samplers"]["resumable_len"] == 5
        assert record["samplers"]["pass"] == passes[rank:6:2]


@pytest.mark.slow
def test_reward_normalisation_pools_the_reference_scores_of_both_ranks(ranks):
    """Each rank scored half of the reference batches; gain and bias are those of all 8 scores."""
    scores = ranks[0]["reward_normalization"]["every_score"].double()
    assert torch.equal(scores, ranks[1]["reward_normalization"]["every_score"].double())  # one model
    mean, std = scores.mean(), scores.std(correction=0)  # the population std, as documented
    for record in ranks:
        norm = record["reward_normalization"]
        assert norm["gain"] == pytest.approx(float(1 / std), rel=1e-5)
        assert norm["bias"] == pytest.approx(float(-mean / std), rel=1e-5)
