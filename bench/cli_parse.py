"""How long does ``rlhf-lit`` take to parse a command line? One parser against Lightning's four.

``rlhf-lit fit`` builds only the ``fit`` subcommand's parser (:meth:`rlhf_lit.cli.RLHFCLI.subcommands`);
LightningCLI builds ``fit``, ``validate``, ``test`` and ``predict``, each with the signatures of the
trainer, every stage and every data module. This script times ``rlhf-lit fit --config CONFIG
--print_config`` through the CLI's entry function in this process (parse, then print the config; no
model is built), alternating the two ways ``--repeats`` times after one warm-up call each, and prints
the median of each and their ratio (measured in the same run, so the machine's speed cancels).

Command (from the project root)::

    python bench/cli_parse.py --config configs/offline/ppo.yaml --repeats 8
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import time

from lightning.pytorch.cli import LightningCLI

from rlhf_lit.cli import RLHFCLI, main


def parse_once(config: str) -> float:
    """Seconds of one ``rlhf-lit fit --config CONFIG --print_config`` in this process (its output dropped)."""
    argv = sys.argv
    sys.argv = ["rlhf-lit", "fit", "--config", config, "--print_config"]  # as the console script sees it
    try:
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main()
        return time.perf_counter() - start
    finally:
        sys.argv = argv


def time_both(config: str, repeats: int) -> dict[str, float]:
    """Median seconds per parse with rlhf-lit's one parser and with Lightning's four, alternated."""
    own = RLHFCLI.subcommands
    times: dict[str, list[float]] = {"one": [], "four": []}
    try:
        for k in range(repeats + 1):  # the first round warms up (imports, caches) and is dropped
            for way in ("one", "four"):
                RLHFCLI.subcommands = own if way == "one" else staticmethod(LightningCLI.subcommands)
                seconds = parse_once(config)
                if k:
                    times[way].append(seconds)
    finally:
        RLHFCLI.subcommands = own
    return {way: statistics.median(values) for way, values in times.items()}


def main_bench() -> None:
    """Parse the options, time both ways, print the medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/offline/ppo.yaml", help="an rlhf-lit fit config")
    parser.add_argument("--repeats", type=int, default=8, help="timed calls of each way (after one warm-up)")
    options = parser.parse_args()
    medians = time_both(options.config, options.repeats)
    print(
        f"fit --print_config: one subcommand parser {medians['one']:.3f} s, Lightning's four "
        f"{medians['four']:.3f} s (ratio {medians['one'] / medians['four']:.2f}, median of {options.repeats})"
    )


if __name__ == "__main__":
    main_bench()
