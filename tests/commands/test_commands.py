"""The evaluate / best-of-n commands in process: --out refusals, the sweep, early errors (their prompts:
tests/data/test_prompt_source.py, tests/cli/test_prompt_sources_cli.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhf_lit.commands import COMMANDS, run_command
from rlhf_lit.commands.best_of_n_command import parse_n_list, powers_of_two
from rlhf_lit.commands.options import OptionError, check_out, write_json
from rlhf_lit.evaluation.best_of_n_sweep import sweep


def test_out_never_replaces_a_file_rlhf_lit_did_not_write(tmp_path):
    mine, theirs = tmp_path / "mine.json", tmp_path / "theirs.json"
    write_json(str(mine), {"written_by": "rlhf-lit evaluate", "x": 1})
    theirs.write_text('{"results": 1}', encoding="utf-8")
    check_out(str(tmp_path / "new.json"), overwrite=False)  # a new file: fine
    with pytest.raises(OptionError, match="exists; pass --overwrite"):
        check_out(str(mine), overwrite=False)
    check_out(str(mine), overwrite=True)  # an earlier run's: replaced with --overwrite
    with pytest.raises(OptionError, match="not written by rlhf-lit"):
        check_out(str(theirs), overwrite=True)
    with pytest.raises(OptionError, match="is a directory"):
        check_out(str(tmp_path), overwrite=True)
    assert json.loads(theirs.read_text()) == {"results": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json", "theirs.json"]  # no temporary left


def test_n_lists():
    assert powers_of_two(64) == [1, 2, 4, 8, 16, 32, 64]
    assert powers_of_two(1) == [1]
    assert powers_of_two(48) == [1, 2, 4, 8, 16, 32, 48]
    assert parse_n_list("4,1, 2,4") == [1, 2, 4]
    with pytest.raises(OptionError, match="integers >= 1"):
        parse_n_list("0,2")


def test_sweep_follows_the_reward_argmax_with_hand_values():
    rm = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]], dtype=torch.float64)
    judge = torch.tensor([[10.0, 20.0, 30.0, 40.0], [10.0, 20.0, 30.0, 40.0]], dtype=torch.float64)
    rows = sweep(rm, [1, 2, 4], judge_scores=judge, lengths=torch.ones(2, 4), ended=torch.zeros(2, 4))
    assert [r["n"] for r in rows] == [1, 2, 4]
    # N = 1: every sample, judge 25 for both prompts; RM 1.5
    assert rows[0]["judge_mean"] == pytest.approx(25.0) and rows[0]["judge_stderr"] == 0.0
    assert rows[0]["rm_mean"] == pytest.approx(1.5)
    # N = 2: weight (rank - 1) / 6 by rank. Prompt 0 ranks 1..4: (20 + 2*30 + 3*40) / 6 = 200/6;
    # prompt 1 ranks 4..1: (3*10 + 2*20 + 30) / 6 = 100/6. Mean 25, std (ddof 1) of the two
    # = |200/6 - 100/6| / sqrt(2), stderr = that / sqrt(2) = 100/12.
    assert rows[1]["judge_mean"] == pytest.approx(25.0)
    assert rows[1]["judge_stderr"] == pytest.approx(100 / 12)
    # RM of the pick, both prompts: (1 + 2*2 + 3*3) / 6 = 14/6
    assert rows[1]["rm_mean"] == pytest.approx(14 / 6)
    # N = 4: the argmax by RM, judge 40 (prompt 0) and 10 (prompt 1); an argmin pick would give 10 and 40
    assert rows[2]["judge_mean"] == pytest.approx(25.0) and rows[2]["judge_stderr"] == pytest.approx(15.0)
    assert rows[2]["rm_mean"] == 3.0 and rows[2]["length_mean"] == 1.0 and rows[2]["ended_fraction"] == 0.0
    assert rows[1]["kl_analytic"] == pytest.approx(math.log(2) - 0.5)
    only_first = sweep(rm[:1], [4], judge_scores=judge[:1])
    assert only_first[0]["judge_mean"] == 40.0  # the RM argmax's judge score, not the argmin's (10)


def test_errors_before_any_model_is_loaded(tmp_path, stories_path, monkeypatch, capsys):
    import rlhf_lit.evaluation.policy_metrics as ev

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the options and files were checked")

    monkeypatch.setattr(ev, "load_models", no_loading)  # best-of-n loads through evaluate_policy too
    prompts = tmp_path / "p.txt"
    prompts.write_text("Once upon a time\n", encoding="utf-8")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n\n{"prompt" "b"}\n', encoding="utf-8")
    (tmp_path / "taken.json").write_text("{}", encoding="utf-8")
    judge = "rlhf_lit.evaluation.judges:vader"
    pairs = tmp_path / "pairs.jsonl"  # what --pairs-out wrote, read back as prompts
    pairs.write_text('{"written_by": "rlhf-lit best-of-n", "prompt": "a", "chosen": "b", "rejected": "c"}\n')
    base = ["--policy", stories_path, "--prompts", str(prompts)]
    cases = [
        ("evaluate", [*base, "--judge", "no_such_module:judge"], 1, "judge spec 'no_such_module:judge': no module"),
        ("evaluate", ["--policy", stories_path, "--prompts", str(bad)], 1, "bad.jsonl line 3: not valid JSON"),
        (
            "evaluate",
            [*base, "--reference", str(tmp_path / "nope")],
            1,
            "--reference " + str(tmp_path / "nope") + ": no such directory",
        ),
        ("evaluate", [*base, "--out", str(tmp_path / "taken.json")], 2, "exists; pass --overwrite"),
        ("evaluate", [*base, "--temperature", "-1"], 2, "--temperature must be > 0"),
        ("evaluate", [*base, "--batch-size", "0"], 2, "--batch-size must be >= 1"),
        (
            "best-of-n",
            [*base, "--judge", judge, "--pick-by", "judge", "--pairs-out", "b.jsonl", "--out", "b.jsonl"],
            2,
            "--out b.jsonl is --pairs-out too, which it would replace; give it a file of its own",
        ),
        (
            "best-of-n",
            [
                *base[:2],
                "--prompts",
                str(pairs),
                "--judge",
                judge,
                "--pick-by",
                "judge",
                "--pairs-out",
                str(pairs),
                "--overwrite",
            ],
            2,
            f"--pairs-out {pairs} is the file --prompts reads; give it a file of its own",
        ),
        ("evaluate", [*base, "--temperature", "inf"], 2, "--temperature must be a finite number, got inf"),
        ("evaluate", [*base, "--device", "nonsense"], 2, "--device 'nonsense': Expected one of cpu, cuda"),
        ("evaluate", [*base, "--device", "cuda:99"], 2, "--device 'cuda:99': this machine has "),
        ("evaluate", [*base, "--device", "meta"], 2, "--device 'meta': a meta tensor holds no values to sample with"),
        (
            "best-of-n",
            [*base, "--reward-model", stories_path, "--seed", str(2**64)],
            2,
            f"--seed must be in [{-(2**63)}, {2**63 - 1}], got {2**64}",
        ),
        ("evaluate", ["--prompts", str(prompts)], 2, "the following arguments are required: --policy"),
        ("best-of-n", [*base, "--reward-model", stories_path, "--n", "2,x"], 2, "--n '2,x'"),
        (
            "best-of-n",
            [*base, "--reward-model", stories_path, "--n-max", "8", "--num-samples", "4"],
            2,
            "--num-samples 4 is below the largest N (8)",
        ),
    ]
    for command, argv, status, message in cases:
        assert run_command(command, argv) == status, (command, argv)
        err = capsys.readouterr().err
        assert err.startswith("rlhf-lit: error: ") and message in err, err
        assert "Traceback" not in err
    with pytest.raises(ValueError, match="no module"):  # --debug: the error itself, for its traceback
        run_command("evaluate", [*base, "--judge", "no_such_module:judge"], debug=True)


def test_rlhf_lit_help_lists_the_commands(capsys):
    from rlhf_lit.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS) and "fit" in out  # ours, then LightningCLI's help
