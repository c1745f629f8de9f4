"""What an iteration's PPO run of ``rlhf-lit iterate`` logged: the summary's PPO columns, read from its
TensorBoard events (:mod:`rlhf_lit.commands.iterate_steps` adds them to the iteration's row)."""

from __future__ import annotations

import os
from typing import Any

PPO_SIGNALS = ("ppo_proxy", "ppo_judge", "ppo_kl", "guard_fired")
"""The summary's columns read from the iteration's PPO logs (:func:`ppo_log_signals`)."""


def ppo_log_signals(paths: Any) -> dict:
    """What the iteration's PPO run logged to TensorBoard (its ``ppo/version_N`` of the highest N holding event
    files; rlhf-lit's default logger under ``--run_dir``): the last rollout's ``objective/scores`` (the proxy
    while training), ``objective/judge`` and ``objective/kl``, and the over-optimisation guard's signals that
    held at some rollout (``guard/<signal>/holds``), comma-separated; None where not logged."""
    import glob

    out: dict = dict.fromkeys(PPO_SIGNALS)
    found = glob.glob(os.path.join(paths.dir, "ppo", "version_*", "events.out.tfevents.*"))
    if not found:
        return out
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    newest = max({os.path.dirname(p) for p in found}, key=lambda d: int(d.rsplit("_", 1)[1]))
    events = EventAccumulator(newest, size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for key, tag in (("ppo_proxy", "objective/scores"), ("ppo_judge", "objective/judge"), ("ppo_kl", "objective/kl")):
        if tag in tags:
            out[key] = float(events.Scalars(tag)[-1].value)
    held = [t.split("/")[1] for t in sorted(tags) if t.startswith("guard/") and t.endswith("/holds")]
    if held:
        fired = [name for name in held if any(e.value > 0 for e in events.Scalars(f"guard/{name}/holds"))]
        out["guard_fired"] = ",".join(fired) or "none"
    return out
