"""bench/rm_length_bias.py on the session's offline reward model (tests/offline_chain.py): it scores the
held-out pairs the data module holds out, and its figures are those computed by hand from its own scores."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from assets_paths import HH_RLHF, ROOT
from suite_env import subprocess_env

from rlhf_lit.data import PreferenceDataModule
from rlhf_lit.tokenizer import load_tokenizer

sys.path.insert(0, str(ROOT / "bench"))
from rm_length_bias import length_bias, pearson  # noqa: E402

DATA = [
    "--train-path",
    str(HH_RLHF),
    "--format",
    "hh_rlhf",
    "--max-records",
    "32",
    "--val-fraction",
    "0.25",
    "--seed",
    "3",
    "--max-length",
    "64",
    "--max-prompt-length",
    "48",
]
"""The offline chain's RM data (tests/offline_chain.py), with an explicit split seed."""


def by_hand_pearson(x: list[float], y: list[float]) -> float:
    """Pearson's r in plain Python floats: sum of co-deviations over the root of the two sums of squares."""
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy)


def test_the_figures_are_those_of_its_own_scores_on_the_held_out_pairs(offline_chain, tmp_path):
    rm = offline_chain.export("reward_model")
    out = tmp_path / "bias.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "rm_length_bias.py"),
            f"first={rm}",
            str(rm),
            *DATA,
            "--batch-size",
            "3",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert list(report["reward_models"]) == ["first", str(rm)]  # NAME=DIR, or the directory as its name
    first = report["reward_models"]["first"]

    # The pairs are the data module's held-out ones, with response = real tokens - prompt_length.
    data = PreferenceDataModule(
        tokenizer=load_tokenizer(str(rm), padding_side="right"),
        train_path=str(HH_RLHF),
        format="hh_rlhf",
        max_records=32,
        val_fraction=0.25,
        seed=3,
        max_length=64,
        max_prompt_length=48,
    )
    data.setup("fit")
    pairs = first["pairs"]
    assert first["n_pairs"] == len(data.val_dataset) == len(pairs["chosen_score"]) == 8
    assert pairs["chosen_length"] == [len(i["chosen_input_ids"]) - i["prompt_length"] for i in data.val_dataset]
    assert pairs["rejected_length"] == [len(i["rejected_input_ids"]) - i["prompt_length"] for i in data.val_dataset]

    # The figures, by hand from the scores it wrote.
    c, r = pairs["chosen_score"], pairs["rejected_score"]
    cl, rl = pairs["chosen_length"], pairs["rejected_length"]
    assert first["pearson_score_length"] == pytest.approx(by_hand_pearson(c + r, cl + rl), abs=1e-12)
    assert first["pearson_margin_length_diff"] == pytest.approx(
        by_hand_pearson([a - b for a, b in zip(c, r)], [a - b for a, b in zip(cl, rl)]), abs=1e-12
    )
    assert first["accuracy"] == sum(a > b for a, b in zip(c, r)) / 8
    unequal = [i for i in range(8) if cl[i] != rl[i]]
    assert first["n_unequal_length"] == len(unequal)
    if unequal:
        rm_longer = [(c[i] > r[i]) if cl[i] > rl[i] else (r[i] > c[i]) for i in unequal]
        assert first["rm_prefers_longer"] == pytest.approx(sum(rm_longer) / len(unequal))
        assert first["human_prefers_longer"] == pytest.approx(sum(cl[i] > rl[i] for i in unequal) / len(unequal))
    # The same export scored twice gives the same figures (batches of 3: a last, smaller batch).
    second = report["reward_models"][str(rm)]
    assert second["pairs"] == pairs
    assert "r(score, length)" in result.stdout


def test_the_figures_of_known_scores():
    # Three pairs: the RM prefers the longer response on two of the two unequal-length pairs.
    chosen, rejected = np.array([2.0, 0.5, 1.0]), np.array([1.0, 1.5, 1.0])
    chosen_len, rejected_len = np.array([10, 3, 5]), np.array([4, 8, 5])
    got = length_bias(chosen, rejected, chosen_len, rejected_len)
    assert got["n_pairs"] == 3 and got["n_unequal_length"] == 2
    assert got["accuracy"] == pytest.approx(1 / 3)  # the tie (1.0, 1.0) counts as wrong
    assert got["rm_prefers_longer"] == 1.0 and got["human_prefers_longer"] == 0.5
    assert got["accuracy_longer_chosen"] == 1.0 and got["accuracy_shorter_chosen"] == 0.0
    assert got["pearson_score_length"] == pytest.approx(by_hand_pearson([2, 0.5, 1, 1, 1.5, 1], [10, 3, 5, 4, 8, 5]))
    assert pearson(np.array([1.0, 1.0]), np.array([1.0, 2.0])) is None  # constant: undefined
