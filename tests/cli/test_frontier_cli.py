"""``rlhf-lit frontier`` in this process (``cli_in_process.run_main``): points from evaluate and best-of-n
results (written here by hand), the table, the plot, the JSON, and the refusals."""

from __future__ import annotations

import json
import math

import pytest
from cli_helpers import error_line, run_main


def _evaluation(path, judges, kls, rms=None) -> str:
    samples = [
        {"judge": j, "kl": k, **({} if rms is None else {"rm": rms[i]})} for i, (j, k) in enumerate(zip(judges, kls))
    ]
    path.write_text(json.dumps({"written_by": "rlhf-lit evaluate", "metrics": {}, "samples": samples}))
    return path.name


def test_the_frontier_of_checkpoints_and_best_of_n_table_plot_and_json(tmp_path):
    _evaluation(tmp_path / "sft.json", [0.0, 0.2], [0.0, 0.0], rms=[0.0, 0.0])
    _evaluation(tmp_path / "rollout=10.json", [0.4, 0.6], [1.0, 3.0], rms=[1.0, 1.0])  # '=' in a file name
    _evaluation(tmp_path / "r20.json", [0.8, 0.8], [4.0, 6.0], rms=[2.0, 2.0])
    bon = {
        "config": {"num_samples": 4, "num_prompts": 2, "estimator": "subsets"},
        "rows": [
            {
                "n": 4,
                "kl_analytic": math.log(4) - 0.75,
                "judge_mean": 0.5,
                "judge_stderr": 0.05,
                "rm_mean": 1.5,
                "rm_stderr": 0.2,
            }
        ],
    }
    (tmp_path / "bon.json").write_text(json.dumps(bon))
    done = run_main(
        "frontier",
        "--eval",
        "SFT=sft.json",
        "PPO:rollout 10=rollout=10.json",
        "--eval",
        "PPO:rollout 20=r20.json",
        "--best-of-n",
        "bon.json",
        "--plot",
        "f.png",
        "--out",
        "f.json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "| method | setting | KL to SFT (nats) | judge score +- s.e. | n | note |"
    # rollout 10: judges 0.4, 0.6 -> mean 0.5, sample std 0.1414, s.e. 0.1; KL (1 + 3) / 2 = 2
    assert lines[3] == "| PPO | rollout 10 | 2.00 | 0.500 +- 0.100 | 2 |  |"
    assert (
        lines[5]
        == "| best-of-N | N 4 | 0.64 (analytic) | 0.500 +- 0.050 | 2 | 4 samples per prompt, exact mean over N-subsets |"
    )
    assert (tmp_path / "f.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "f.json").read_text())
    assert saved["written_by"] == "rlhf-lit frontier" and [p["setting"] for p in saved["points"]] == [
        "-",
        "rollout 10",
        "rollout 20",
        "N 4",
    ]
    assert saved["points"][1]["score"] == 0.5

    # The reward-KL frontier of the same results; a file without a label is a method named by the file.
    done = run_main(
        "frontier", "--eval", "r20.json", "--score", "rm", "--reference-name", "the base model", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.splitlines()[0]
        == "| method | setting | KL to the base model (nats) | RM score +- s.e. | n | note |"
    )
    assert done.stdout.splitlines()[2] == "| r20 | - | 5.00 | 2.000 +- 0.000 | 2 |  |"


def test_one_setting_on_several_seeds_is_their_mean_with_the_standard_error_over_seeds(tmp_path):
    for seed, (judge, kl) in enumerate([(0.4, 2.0), (0.6, 4.0), (0.8, 3.0)]):
        _evaluation(tmp_path / f"seed{seed}.json", [judge, judge], [kl, kl])
    specs = [f"PPO:final=seed{s}.json" for s in range(3)]
    done = run_main("frontier", "--eval", *specs, "--out", "f.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # means 0.6 and 3.0; per-seed scores 0.4, 0.6, 0.8: sample std 0.2, s.e. 0.2 / sqrt(3)
    (point,) = json.loads((tmp_path / "f.json").read_text())["points"]
    assert (point["kl"], point["n"], point["note"]) == (3.0, 3, "mean over 3 runs")
    assert point["score"] == pytest.approx(0.6) and point["score_se"] == pytest.approx(0.2 / math.sqrt(3))
    assert "| PPO | final | 3.00 | 0.600 +- 0.115 | 3 | mean over 3 runs |" in done.stdout


def test_refusals_name_the_file_and_write_nothing(tmp_path):
    _evaluation(tmp_path / "a.json", [0.1], [1.0])
    (tmp_path / "taken.png").write_bytes(b"mine")
    (tmp_path / "nokl.json").write_text(json.dumps({"samples": [{"judge": 0.1}]}))
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    cases = [
        (["--eval", "a.json", "--plot", "taken.png"], 2, "--plot taken.png exists; it is never replaced"),
        (
            ["--eval", "a.json", "--score", "rm"],
            1,
            "--eval a.json: the evaluation of a has no 'rm' per sample (evaluate with --reward-model)",
        ),
        (
            ["--eval", "nokl.json"],
            1,
            "--eval nokl.json: the evaluation of nokl has no 'kl' per sample (evaluate with --reference)",
        ),
        (["--eval", "other.json"], 1, "--eval other.json: not an rlhf-lit evaluate result (no samples)"),
        (["--eval", "=a.json"], 2, "--eval '=a.json': give [METHOD[:SETTING]=]FILE"),
        ([], 2, "give at least one --eval result or a --best-of-n result"),
        # --overwrite takes a file an rlhf-lit command wrote: an input of this run is one, and was replaced
        (["--eval", "A=a.json", "--out", "./a.json", "--overwrite"], 2, "--out ./a.json is the file --eval reads"),
        (["--eval", "a.json", "--plot", "f.png", "--out", "f.png"], 2, "--out f.png is --plot too, which it would"),
    ]
    before = (tmp_path / "a.json").read_bytes()
    for args, status, message in cases:
        done = run_main("frontier", *args, cwd=tmp_path)
        assert done.returncode == status and error_line(done).startswith(f"rlhf-lit: error: {message}"), (
            args,
            done.stderr,
        )
    assert (tmp_path / "taken.png").read_bytes() == b"mine"
    assert (tmp_path / "a.json").read_bytes() == before and not (tmp_path / "f.png").exists()


GOOD = [{"judge": 0.1, "kl": 1.0}, {"judge": 0.3, "kl": 2.0}]


def _with(i: int, **fields) -> list:
    """:data:`GOOD` with sample ``i``'s ``fields`` set (a field given None: removed)."""
    samples = [dict(s) for s in GOOD]
    samples[i].update({k: v for k, v in fields.items() if v is not None})
    for key in (k for k, v in fields.items() if v is None):
        samples[i].pop(key)
    return samples


BON = {
    "config": {"num_samples": 4, "num_prompts": 2},
    "rows": [{"n": 4, "kl_analytic": 0.6, "judge_mean": 0.5, "judge_stderr": 0.1}],
}


@pytest.mark.parametrize(
    ("option", "text", "named"),
    [
        (
            "--eval",
            json.dumps({"samples": _with(1, kl="high")}),
            "bad.json: samples[1]: field 'kl' must be a number, got str",
        ),
        ("--eval", json.dumps({"samples": _with(1, judge=None)}), "bad.json: samples[1]: field 'judge' missing"),
        ("--eval", json.dumps({"samples": [GOOD[0], 3]}), "bad.json: samples[1] must be a JSON object, got int"),
        ("--eval", json.dumps({"samples": [3, GOOD[0]]}), "bad.json: samples[0] must be a JSON object, got int"),
        (
            "--eval",
            json.dumps({"samples": _with(0, judge=True)}),
            "bad.json: samples[0]: field 'judge' must be a number, got bool",
        ),
        (
            "--eval",
            '{"samples": [{"judge": 0.1, "kl": NaN}]}',
            "bad.json: samples[0]: field 'kl' is nan, not a finite number",
        ),
        (
            "--eval",
            '{"samples": [{"judge": Infinity, "kl": 1}]}',
            "bad.json: samples[0]: field 'judge' is inf, not a finite number",
        ),
        ("--eval", '{"samples": [{"judge": 0.1, ', "bad.json: cut short"),
        ("--eval", "[1]", "bad.json: expected a JSON object, found list"),
        ("--eval", None, "adir: a directory, not a file; give the JSON file rlhf-lit evaluate wrote"),
        ("--best-of-n", json.dumps({**BON, "rows": [3]}), "bad.json: rows[0] must be a JSON object, got int"),
        (
            "--best-of-n",
            json.dumps({**BON, "config": {"num_samples": 4}}),
            "bad.json: config: field 'num_prompts' missing",
        ),
        (
            "--best-of-n",
            json.dumps({**BON, "rows": [{**BON["rows"][0], "judge_stderr": "x"}]}),
            "bad.json: rows[0]: field 'judge_stderr' must be a number, got str",
        ),
        (
            "--best-of-n",
            json.dumps({**BON, "rows": [{**BON["rows"][0], "kl_analytic": None}]}),
            "bad.json: rows[0]: field 'kl_analytic' must be a number, got NoneType",
        ),
        ("--best-of-n", None, "adir: a directory, not a file; give the JSON file rlhf-lit best-of-n wrote"),
    ],
)
def test_a_malformed_result_is_one_line_naming_the_option_the_file_and_the_field(tmp_path, option, text, named):
    (tmp_path / "adir").mkdir()
    if text is not None:
        (tmp_path / "bad.json").write_text(text, encoding="utf-8")
    done = run_main("frontier", option, "bad.json" if text is not None else "adir", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert error_line(done).startswith(f"rlhf-lit: error: {option} {named}"), done.stderr  # one line, no traceback
    assert done.stdout == ""  # no table of what was read before
