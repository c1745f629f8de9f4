"""bench/chat_unfinished_bias.py: the within-request difference between ended and cut replies, by hand."""

from __future__ import annotations

import json
import sys

import pytest
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from chat_unfinished_bias import ended_minus_cut, summarise  # noqa: E402

# Request 0: ended rm 1 and 3 (mean 2), cut 0.5 -> +1.5. Request 1: ended 0, cut 1 and 2 (mean 1.5) -> -1.5.
# Request 2 has only cut replies and request 3 only ended ones: neither compares, both are left out.
SAMPLES = [
    {"prompt_index": 0, "ended": True, "rm": 1.0, "judge": 0.2, "length": 10},
    {"prompt_index": 0, "ended": True, "rm": 3.0, "judge": 0.4, "length": 20},
    {"prompt_index": 0, "ended": False, "rm": 0.5, "judge": 0.1, "length": 48},
    {"prompt_index": 1, "ended": True, "rm": 0.0, "judge": 0.0, "length": 30},
    {"prompt_index": 1, "ended": False, "rm": 1.0, "judge": 0.5, "length": 48},
    {"prompt_index": 1, "ended": False, "rm": 2.0, "judge": 0.3, "length": 48},
    {"prompt_index": 2, "ended": False, "rm": 9.0, "judge": 0.9, "length": 48},
    {"prompt_index": 3, "ended": True, "rm": -9.0, "judge": -0.9, "length": 5},
]


def test_ended_minus_cut_within_each_request_by_hand():
    rm = ended_minus_cut(SAMPLES, "rm")
    assert rm["requests"] == 2
    assert rm["mean"] == pytest.approx(0.0)
    assert rm["stderr"] == pytest.approx(1.5)  # sqrt((1.5^2 + 1.5^2) / 1) / sqrt(2)
    judge = ended_minus_cut(SAMPLES, "judge")  # request 0: 0.3 - 0.1 = +0.2; request 1: 0 - 0.4 = -0.4
    assert judge["mean"] == pytest.approx(-0.1)
    assert judge["stderr"] == pytest.approx(0.3)  # sample std of (0.2, -0.4) = 0.3 * sqrt(2), over sqrt(2)


def test_one_request_has_no_standard_error_and_none_has_no_mean():
    assert ended_minus_cut(SAMPLES[:3], "rm") == {"requests": 1, "mean": pytest.approx(1.5), "stderr": None}
    assert ended_minus_cut(SAMPLES[6:], "rm") == {"requests": 0, "mean": None, "stderr": None}


def test_summarise_reads_a_finished_folder_and_names_a_missing_one(tmp_path):
    folder = tmp_path / "seed_1" / "best_of_n"
    folder.mkdir(parents=True)
    rows = [{"n": 1, "ended_fraction": 0.5}, {"n": 2, "ended_fraction": 0.25}]
    (folder / "best_of_n.json").write_text(json.dumps({"samples": SAMPLES, "rows": rows}))
    run = summarise(tmp_path / "seed_1")
    assert run["samples"] == 8 and run["ended_fraction"] == pytest.approx(4 / 8)
    assert run["rm"]["mean"] == pytest.approx(0.0) and run["best_of_n_ended"] == {1: 0.5, 2: 0.25}
    assert run["length"]["mean"] == pytest.approx(((15 - 48) + (30 - 48)) / 2)  # ended 15 and 30 tokens, cut 48
    with pytest.raises(SystemExit, match="no best_of_n/best_of_n.json"):
        summarise(tmp_path / "missing")
