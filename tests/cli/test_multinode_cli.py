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

import socket
import subprocess
import sys
from pathlib import Path

import cli_forked
import pytest
import torch
from cli_helpers import STORIES, ppo_config, rlhf_lit_forked, write_yaml
from suite_env import subprocess_env

TORCHRUN = Path(sys.executable).parent / "torchrun"
CONSTANT_LR = {"lr": 3.0e-4, "eps": 1.0e-5}  # a constant schedule: a resumed run may extend max_rollouts


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
        command = [str(TORCHRUN), "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node_rank),
                   "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "rlhf_lit.cli", *args]  # fmt: skip
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


def fit_on_one_node(*args: str, cwd: Path) -> None:
    """``rlhf-lit fit <args> --trainer.devices 2``: Lightning's launcher starts the second process."""
    result = rlhf_lit_forked("fit", *args, "--trainer.num_nodes", "1", "--trainer.devices", "2", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]


def run_config(root: Path, stories_rm: str, strategy: str, rollouts: int, **overrides) -> Path:
    """A PPO config of ``rollouts`` rollouts under ``strategy`` in ``root`` (4 prompts per process)."""
    config = ppo_config(root, STORIES, stories_rm, max_rollouts=rollouts, optimizer=CONSTANT_LR, **overrides)
    config["trainer"]["strategy"] = strategy
    return write_yaml(root / f"ppo-{rollouts}.yaml", config)


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


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "launcher"), [("ddp", "torchrun"), ("fsdp2", "lightning")])
def test_two_nodes_train_what_one_node_of_two_processes_trains(tmp_path, stories_rm, strategy, launcher):
    """1 node x 2 processes == 2 nodes x 1 process, bit for bit; under fsdp2 also a run stopped after one
    rollout on one node and resumed on two ends where the straight one-node run ends."""
    one, two, moved = tmp_path / "one-node", tmp_path / "two-nodes", tmp_path / "moved"
    fit_on_one_node("--config", str(run_config(one, stories_rm, strategy, 2)), cwd=one)
    fit_on_two_nodes(launcher, "--config", str(run_config(two, stories_rm, strategy, 2)), cwd=two)
    assert_same_run(one, two)
    assert (one / "export" / "model.safetensors").read_bytes() != Path(STORIES, "model.safetensors").read_bytes()
    if strategy == "ddp":
        return  # (a ddp resume is exact in test_preemption_cli.py; across layouts, fsdp2's here)
    fit_on_one_node("--config", str(run_config(moved, stories_rm, strategy, 1)), cwd=moved)
    fit_on_two_nodes(launcher, "--config", str(run_config(moved, stories_rm, strategy, 2, export_existing="replace")),
                     "--ckpt_path", str(moved / "ckpt" / "last.ckpt"), cwd=moved)  # fmt: skip
    assert_same_run(one, moved)
