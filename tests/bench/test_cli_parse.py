"""A smoke run of bench/cli_parse.py (rlhf-lit's one subcommand parser against Lightning's four); no
timing is asserted."""

from __future__ import annotations

import re

import cli_forked
from assets_paths import ROOT


def test_the_parse_benchmark_times_both_ways_and_prints_their_ratio():
    result = cli_forked.run_script(ROOT / "bench" / "cli_parse.py", "--repeats", "1", cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.fullmatch(
        r"fit --print_config: one subcommand parser \d+\.\d{3} s, Lightning's four \d+\.\d{3} s "
        r"\(ratio \d+\.\d{2}, median of 1\)\n",
        result.stdout,
    ), result.stdout
