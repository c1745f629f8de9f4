"""Two "nodes" of one process each on this machine, launched as a cluster launches them.

What a multi-node user runs is the same `rlhf-lit fit` on every node, told by the environment
which node it is: torchrun's variables (``torchrun --nnodes 2 --node-rank R --master-addr ...``,
what a Kubernetes job or an ``srun torchrun`` line sets), or Lightning's own (``NODE_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``; SLURM's ``srun`` sets the equivalent ``SLURM_*`` variables that
Lightning reads the same way). Both are exercised here with PPO, under ``ddp`` and ``fsdp2``, on
the loopback interface: two nodes of one process train exactly what one node of two processes
trains (the same global ranks, the same global batch; bit for bit, as the same float32 kernels run
in the same order), and (under fsdp2) a checkpoint written by one layout resumes in the other to the same end.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import cli_forked
import pytest
import torch
from cli_helpers import STORIES, two_process_ppo
from suite_env import subprocess_env

TORCHRUN = Path(sys.executable).parent / "torchrun"


def free_port() -> int:
    """A TCP port nobody listens on now (the rendezvous port of one two-node run)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(launcher: str, node_rank: int, port: int, args: list[str], log: Path):
    """Node ``node_rank`` of 2 (one process per node), its output into ``log``.

    ``torchrun``: the documented ``torchrun --nnodes 2 --nproc-per-node 1 --node-rank R`` line, which
    starts ``python -m rlhf_lit.cli`` with torchrun's variables (Lightning's TorchElasticEnvironment).
    ``lightning``: ``rlhf-lit`` itself (a forked process: tests/cli_forked.py) with ``NODE_RANK`` /
    ``MASTER_ADDR`` / ``MASTER_PORT`` (Lightning's LightningEnvironment; SLURM's variables take the
    same path through its SLURMEnvironment).
    """
    if launcher == "torchrun":
        command = [
            str(TORCHRUN),
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(node_rank),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "-m",
            "rlhf_lit.cli",
            *args,
        ]
        with open(log, "w") as out:  # one thread per process: the one-node launcher gives each process one core
            return subprocess.Popen(command, cwd=log.parent, env=subprocess_env(), stdout=out, stderr=subprocess.STDOUT)
    env = {"NODE_RANK": str(node_rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    return cli_forked.start(args, cwd=log.parent, stdout=log, env=env)


def fit_on_two_nodes(launcher: str, *args: str, cwd: Path, timeout: int = 600) -> None:
    """``rlhf-lit fit <args> --trainer.num_nodes 2 --trainer.devices 1`` as two nodes; both must succeed."""
    port = free_port()
    full = ["fit", *args, "--trainer.num_nodes", "2", "--trainer.devices", "1"]
    procs = [start_node(launcher, node, port, full, cwd / f"node{node}.log") for node in (0, 1)]
    try:
        codes = [proc.wait(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for node, code in enumerate(codes):
        assert code == 0, f"node {node}: exit {code}\n" + (cwd / f"node{node}.log").read_text()[-3000:]
    ranks = [(cwd / f"node{node}.log").read_text() for node in (0, 1)]
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in ranks[0] and "GLOBAL_RANK: 1, MEMBER: 2/2" in ranks[1]


def final_state(root: Path) -> dict:
    """The last checkpoint of a run: rollouts done, weights, optimizer states, KL controller."""
    return torch.load(root / "ckpt" / "last.ckpt", map_location="cpu", weights_only=True)


def assert_same_run(a: Path, b: Path) -> None:
    """Two runs ended in the same place: the exports byte for byte, the checkpoints tensor for tensor."""
    assert (a / "export" / "model.safetensors").read_bytes() == (b / "export" / "model.safetensors").read_bytes()
    first, second = final_state(a), final_state(b)
    assert first["ppo"]["rollout_index"] == second["ppo"]["rollout_index"]
    assert first["ppo"]["kl_controller"] == second["ppo"]["kl_controller"]
    assert first["state_dict"].keys() == second["state_dict"].keys()
    for key, value in first["state_dict"].items():
        assert torch.equal(value, second["state_dict"][key]), key
    for opt_a, opt_b in zip(first["optimizer_states"], second["optimizer_states"], strict=True):
        for index, state in opt_a["state"].items():
            for name, value in state.items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt_b["state"][index][name])), (index, name)


def kill_after_checkpoint(proc: cli_forked.ForkedProcess, root: Path, rollout: int) -> None:
    """SIGKILL ``proc``'s process group (both ranks: no handler runs) early in the rollout after
    ``rollout``, once ``rollout=<rollout>.ckpt`` and the ``last.ckpt`` replaced after it are on disk."""
    deadline = time.monotonic() + 300
    kept, last = root / "ckpt" / f"rollout={rollout}.ckpt", root / "ckpt" / "last.ckpt"
    try:
        while not (kept.exists() and last.exists() and last.stat().st_mtime_ns >= kept.stat().st_mtime_ns):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its checkpoint"
            time.sleep(0.01)
        time.sleep(0.05)  # into the next rollout (a rollout takes about a second here)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (root / "ckpt" / f"rollout={rollout + 1}.ckpt").exists(), (
        "killed too late: the next rollout had finished"
    )
    assert final_state(root)["ppo"]["rollout_index"] == rollout


@pytest.mark.slow
def test_two_nodes_launched_by_torchrun_train_under_ddp_what_one_node_of_two_processes_trains(
    tmp_path, straight_ddp, stories_rm
):
    """2 nodes x 1 process == 1 node x 2 processes (the shared run, tests/cli/conftest.py), bit for bit."""
    fit_on_two_nodes("torchrun", "--config", str(two_process_ppo(tmp_path, stories_rm, "ddp")), cwd=tmp_path)
    assert_same_run(straight_ddp, tmp_path)
    assert (tmp_path / "export" / "model.safetensors").read_bytes() != Path(STORIES, "model.safetensors").read_bytes()


@pytest.mark.slow
def test_under_fsdp2_two_nodes_train_what_one_node_trains_and_a_run_killed_on_one_node_resumes_on_two(
    tmp_path, straight_fsdp2, stories_rm
):
    """2 nodes x 1 process (Lightning's variables) == 1 node x 2 processes, bit for bit; and a run
    killed mid-rollout on one node (both ranks, SIGKILL) resumed with the README's command on two
    nodes ends where the straight one-node run ends: the checkpoint, written sharded by one layout,
    is read by the other."""
    two, killed = tmp_path / "two-nodes", tmp_path / "killed"
    fit_on_two_nodes("lightning", "--config", str(two_process_ppo(two, stories_rm, "fsdp2")), cwd=two)
    assert_same_run(straight_fsdp2, two)
    assert (two / "export" / "model.safetensors").read_bytes() != Path(STORIES, "model.safetensors").read_bytes()

    config = two_process_ppo(killed, stories_rm, "fsdp2")
    # Its own session: the kill reaches rank 1 too (Lightning's launcher starts it from rank 0).
    proc = cli_forked.start(
        ["fit", "--config", str(config)], cwd=killed, stdout=killed / "output.txt", new_session=True
    )
    kill_after_checkpoint(proc, killed, rollout=2)
    fit_on_two_nodes(
        "lightning", "--config", str(config), "--ckpt_path", str(killed / "ckpt" / "last.ckpt"), cwd=killed
    )
    assert_same_run(straight_fsdp2, killed)
    assert "model.safetensors" in [p.name for p in (killed / "export").iterdir()]
