"""PPO on 2 CPU processes under ddp and fsdp2 against one process on the same global batch.

strategy_worker.py runs one greedy rollout and one update (a policy and a critic optimizer step)
on 8 prompts: in one process, or split over 2 where rank 0's responses end after 3-8 tokens and
rank 1's run to the full 10 (the ranks stop generating at different steps and hold different
numbers of tokens: under FSDP every forward pass is a collective, so this would hang if a rank
stopped stepping early). The update must be the single process's: scores and advantages are
whitened over the rows of both ranks (``ppo.whiten_scope: global``) and the loss is the token mean
over the minibatch of all ranks, so the reduced gradients equal the single run's. Under ddp the
compiled decode path (``sampling.decode: compiled``) draws the eager tokens on each rank.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ppo_helpers import worker_env
from transformers import AutoModelForCausalLM

HERE = Path(__file__).resolve().parent


def _run(out: Path, mode: str, decode: str = "eager") -> dict[int, dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = worker_env()
    # Its own session, so a hung run's rank-1 process (started by rank 0) is killed with it.
    proc = subprocess.Popen([sys.executable, str(HERE / "strategy_worker.py"), str(out), mode, decode], cwd=out, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=300)  # ~15 s when it works
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{mode}: the run hung (a rank waited in a collective for a rank that had stopped)")
    assert proc.returncode == 0, stderr[-4000:]
    return {r: torch.load(p, weights_only=False) for r in (0, 1) if (p := out / f"rank{r}.pt").exists()}


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("single"), "single")[0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_processes_make_the_single_process_update(mode, single, tmp_path):
    ranks = _run(tmp_path / mode, mode)
    rank0, rank1 = ranks[0], ranks[1]
    # The ranks generated the single run's responses, and stopped at different lengths.
    width0, width1 = rank0["responses"][0].shape[1], rank1["responses"][0].shape[1]
    assert width0 == 8 < width1 == 10
    assert torch.equal(rank0["responses"][0], single["responses"][0][:4, :width0])
    assert torch.equal(rank1["responses"][0], single["responses"][0][4:, :width1])
    assert torch.equal(single["responses"][0][:4, width0:], torch.zeros(4, 2, dtype=torch.long))  # pad after EOS

    # Whitening is over both ranks' rows (ppo.whiten_scope: global): the scores and advantages each
    # rank holds are the single run's rows. float32: the raw scores already differ by up to ~2.5e-7
    # (the reward model read rows padded to another width); whitening each rank's rows by its own
    # would move the scores by up to 0.77.
    (r0, r1, rs) = (rank0["rollout"], rank1["rollout"], single["rollout"])
    torch.testing.assert_close(torch.cat([r0["scores"], r1["scores"]]), rs["scores"], rtol=1e-5, atol=4e-6)
    assert torch.equal(rs["response_mask"][:4, :width0], r0["response_mask"])
    torch.testing.assert_close(r0["advantages"], rs["advantages"][:4, :width0], rtol=1e-5, atol=4e-6)
    torch.testing.assert_close(r1["advantages"], rs["advantages"][4:], rtol=1e-5, atol=4e-6)

    # Losses: each rank's token mean, weighted by its tokens, is the single run's token mean.
    (mb0,), (mb1,), (mbs,) = rank0["minibatches"], rank1["minibatches"], single["minibatches"]
    assert mb0["tokens"] + mb1["tokens"] == mbs["tokens"] and mb0["tokens"] < mb1["tokens"]
    for loss in ("policy", "value"):
        pooled = (mb0[loss] * mb0["tokens"] + mb1[loss] * mb1["tokens"]) / mbs["tokens"]
        assert pooled == pytest.approx(mbs[loss], rel=1e-5, abs=1e-7), loss
        assert (mb0[loss] + mb1[loss]) / 2 != pytest.approx(mbs[loss], rel=1e-2)  # an unweighted mean would not be

    # Gradients after the all-reduce (ddp) or reduce-scatter (fsdp2): the single run's, both optimizers.
    assert len(rank0["grads"]) == len(single["grads"]) == 2
    for step, (g0, g1, gs) in enumerate(zip(rank0["grads"], rank1["grads"], single["grads"])):
        assert g0.keys() == gs.keys()
        for name in gs:
            assert torch.equal(g0[name], g1[name]), (step, name)  # one gradient on both ranks
            scale = float(gs[name].abs().max())
            torch.testing.assert_close(g0[name], gs[name], rtol=2e-5, atol=1e-5 * scale, msg=f"{step} {name}")

    # Clipped to the norm of the whole gradient, not of each rank's shard: the single run's again.
    for step, (c0, cs, gs) in enumerate(zip(rank0["clipped"], single["clipped"], single["grads"])):
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gs.values()]))
        assert norm > 0.02 * 1.5, step  # the clip is active
        for name in cs:
            torch.testing.assert_close(cs[name], gs[name] * (0.02 / (norm + 1e-6)), rtol=1e-5, atol=1e-9)
            scale = float(cs[name].abs().max())
            torch.testing.assert_close(c0[name], cs[name], rtol=2e-5, atol=1e-5 * scale, msg=f"{step} {name}")

    # After the update: one policy on both ranks, the single run's (Adam's first step is ~lr * sign(g)).
    policy = rank0["policy"]
    if mode == "ddp":
        for name, value in policy.items():
            assert torch.equal(value, rank1["policy"][name]), name
    else:  # each rank held half of the policy; rank 0 gathered it whole
        assert rank0["own_numel"] + rank1["own_numel"] == rank0["full_numel"]
        assert rank0["own_numel"] < rank0["full_numel"]
    for name, value in single["policy"].items():
        torch.testing.assert_close(policy[name], value, rtol=0, atol=1e-6, msg=name)
    assert any(not torch.equal(policy[n], v) for n, v in single["policy"].items())

    # The export (rank 0) is the whole updated policy, loadable by plain transformers.
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / mode / "export").state_dict()
    for name, value in policy.items():
        assert torch.equal(exported[name], value), name


@pytest.mark.slow
def test_compiled_decoding_under_ddp_draws_the_eager_tokens_on_each_rank(single, tmp_path):
    """``sampling.decode: compiled`` under ddp: each process compiles its own decode step (one graph,
    the rollout's batch size), draws the tokens the eager path draws in the same process, and the
    logged ``compile/decode_graphs`` says so (mean over the ranks). (fsdp2 is refused:
    tests/cli/test_compiled_decode_cli.py.)"""
    ranks = _run(tmp_path / "ddp-compiled", "ddp", "compiled")
    for rank, record in ranks.items():
        (compiled,), (eager,) = record["responses"], record["eager_responses"]
        assert torch.equal(compiled, eager), rank
        assert record["compile_stats"]["graphs"] == 1 and record["compile_stats"]["calls"] == 1, rank
        assert record["metrics"]["compile/decode_graphs"] == 1.0
        assert record["metrics"]["compile/decode_s"] > 0
    # and the eager single process's responses: rank 0 the 4 shortest, rank 1 the rest
    width0 = ranks[0]["responses"][0].shape[1]
    assert torch.equal(ranks[0]["responses"][0], single["responses"][0][:4, :width0])
    assert torch.equal(ranks[1]["responses"][0], single["responses"][0][4:])
