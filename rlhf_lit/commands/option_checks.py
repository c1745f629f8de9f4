"""Checks of ``evaluate``'s, ``best-of-n``'s and ``frontier``'s options that torch or the file system answer:
``--seed`` and ``--device`` (:func:`check_seed_and_device`), and outputs that would replace an input or each other
(:func:`check_distinct_files`). Each refusal is an :class:`OptionError` naming the
option, before any model is loaded."""

from __future__ import annotations

import os
from collections.abc import Sequence

from rlhf_lit.option_values import check_seed


class OptionError(ValueError):
    """A bad option value: reported as ``rlhf-lit: error: ...`` with exit status 2."""


def check_seed_and_device(seed: int, device: str) -> None:
    """Refuse a ``--seed`` torch's generator cannot take, or a ``--device`` no tensor can be put on (a
    misspelling, CUDA where there is none, an index past the last GPU, ``meta``, which holds no values),
    naming the option: torch answers the first with "Overflow when unpacking long long" once sampling has begun,
    the second with a traceback once the models are loaded."""
    import torch

    try:
        check_seed("--seed", seed)
    except ValueError as error:
        raise OptionError(str(error)) from None
    try:
        place = torch.device(device)
        if place.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("this machine has no CUDA device torch can use")
        if place.type == "cuda" and place.index is not None and place.index >= torch.cuda.device_count():
            raise RuntimeError(f"this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0")
        if place.type == "meta":
            raise RuntimeError("a meta tensor holds no values to sample with")
        torch.empty(1, device=place)
    except (RuntimeError, AssertionError) as error:
        problem = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise OptionError(f"--device {device!r}: {problem}") from None


def check_distinct_files(outputs: dict[str, str | None], inputs: dict[str, Sequence[str | None]] | None = None) -> None:
    """Refuse an output option (``{option: path}``, in the order they are written) naming a file that another
    output or an input option (``{option: paths}``) names too, before any work: :class:`OptionError`.

    :func:`check_out` lets ``--overwrite`` replace a file an rlhf-lit command wrote, meaning an earlier run's
    output; an input of this run (an ``rlhf-lit evaluate`` result given to ``frontier --eval``, ``best-of-n``'s
    pairs read back as ``--prompts``) is such a file, and would be replaced by what is made from it. Two outputs on
    one file leave only the later, while the result still names the other."""
    seen: dict[str, tuple[str, bool]] = {}
    for option, paths in (inputs or {}).items():
        for path in paths:
            if path is not None:
                seen.setdefault(os.path.realpath(os.path.expanduser(path)), (option, True))
    for option, path in outputs.items():
        if path is None:
            continue
        key = os.path.realpath(os.path.expanduser(path))
        if key in seen:
            other, read = seen[key]
            clash = f"the file {other} reads" if read else f"{other} too, which it would replace"
            raise OptionError(f"{option} {path} is {clash}; give it a file of its own")
        seen[key] = (option, False)
