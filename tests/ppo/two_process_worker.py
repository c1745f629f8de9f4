"""Every two-process check of the suite in one launch: ``python two_process_worker.py OUT``.

One interpreter, one torch and Lightning import and one gloo process group for all of them, instead
of one launch each (each paid ~10 s of start-up per process on 2 cores). Rank 0 first makes the
1-process reference run (before any process group exists, so nothing in it can reduce over ranks);
its first two-process Trainer then starts rank 1 (Lightning's subprocess launcher re-runs this
file, which skips the reference run), and both ranks go through the same runs in the same order,
joined by the process group the first Trainer set up (the later Trainers find it and keep it):

=====================  =================================================================  =========================
OUT/<part>/rank<r>.pt  what                                                               read by
=====================  =================================================================  =========================
single                 one greedy rollout + update on 1 process (rank 0 only)            tests/ppo/test_strategies.py
ddp                    3 PPO rollouts under ddp, REINFORCE++ with reward whitening        tests/ppo/test_ddp.py
groups                 one GRPO rollout under ddp, each rank its own prompts             tests/ppo/test_groups_ddp.py
strategy-ddp           the greedy rollout + update of ``single`` on 2 ranks, ddp        tests/ppo/test_strategies.py
strategy-fsdp2         the same under fsdp2                                              tests/ppo/test_strategies.py
two-ranks              the cross-rank functions called by hand (no Trainer)              tests/test_two_ranks.py
ddp-compiled           ``ddp`` with ``ppo.forward: compiled``                            tests/ppo/test_ddp.py
strategy-ddp-compiled  ``strategy-ddp`` with ``sampling.decode: compiled``               tests/ppo/test_strategies.py
=====================  =================================================================  =========================

Each part is the function of its own module (ddp_worker.py, groups_worker.py, strategy_worker.py,
tests/two_ranks_worker.py) and writes only under ``OUT/<part>``. ``ddp`` and ``ddp-compiled`` run
on ``OUT/stories-2-layers``, stories260K with 2 of its 5 decoder layers
(:func:`generation_helpers.truncated_stories`, written by rank 0 before rank 1 starts): what the
compiled part costs is lowering the model, per rank, and the eager part it is compared with must
run the same model. The compiled parts come last, so
the eager parts run as they would in a process of their own (nothing compiled yet). A failing part
ends the launch (both ranks) with its traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

PARTS = (
    "single",
    "ddp",
    "groups",
    "strategy-ddp",
    "strategy-fsdp2",
    "two-ranks",
    "ddp-compiled",
    "strategy-ddp-compiled",
)


def main(out: str) -> None:
    torch.set_num_threads(1)
    root = Path(out)
    for part in PARTS:
        (root / part).mkdir(parents=True, exist_ok=True)
    import ddp_worker
    import groups_worker
    import strategy_worker

    two_layers = root / "stories-2-layers"
    if "LOCAL_RANK" not in os.environ:  # rank 0, before the first two-process Trainer starts rank 1
        from generation_helpers import truncated_stories

        two_layers.mkdir()
        truncated_stories(two_layers, layers=2)
        strategy_worker.main(str(root / "single"), "single")
    ddp_worker.main(str(root / "ddp"), "eager", str(two_layers))  # the first two-process Trainer: starts rank 1
    groups_worker.main(str(root / "groups"))
    strategy_worker.main(str(root / "strategy-ddp"), "ddp")
    strategy_worker.main(str(root / "strategy-fsdp2"), "fsdp2")
    import torch.distributed as dist
    import two_ranks_worker

    two_ranks_worker.run(dist.get_rank(), str(root / "two-ranks"))
    ddp_worker.main(str(root / "ddp-compiled"), "compiled", str(two_layers))
    strategy_worker.main(str(root / "strategy-ddp-compiled"), "ddp", "compiled")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
