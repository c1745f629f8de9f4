"""bench/chat_bonbon.py: the pairs of N are the best and the worst of each request's FIRST N samples by the
reward model; the margins are BoNBoN's judge mean minus best-of-N's curve (and DPO's line) at its KL,
worked by hand; a folder that is not a finished chat demo run is refused by name; the fit is the chat
BoNBoN config on the pairs with the run's seed and precision."""

from __future__ import annotations

import argparse
import json
import sys

import pytest
from assets_paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import chat_bonbon  # noqa: E402


def sample(rm: float, text: str) -> dict:
    return {"response": text, "rm": rm}


def test_pairs_of_n_come_from_each_requests_first_n_samples(tmp_path):
    prompts = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "bye"}]]
    # m = 4 samples per request; the 4th of the first request is its best overall, outside its first 2
    samples = [sample(0.2, "a"), sample(0.5, "b"), sample(-0.1, "c"), sample(0.9, "d")]
    samples += [sample(0.1, "e"), sample(-0.3, "f"), sample(0.4, "g"), sample(0.0, "h")]
    path = tmp_path / "pairs.jsonl"
    written = chat_bonbon.write_pairs(prompts, samples, 4, 2, "reward_model rm", path)
    assert written == {"written": 2, "tied": 0, "empty": 0}
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["chosen"], r["rejected"], r["n"]) for r in records] == [("b", "a", 2), ("e", "f", 2)]
    assert records[0]["prompt"] == prompts[0]  # the conversation kept, for the chat template
    assert all(r["written_by"] == chat_bonbon.WRITTEN_BY for r in records)
    chat_bonbon.write_pairs(prompts, samples, 4, 4, "reward_model rm", path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["chosen"], r["rejected"], r["n"]) for r in records] == [("d", "c", 4), ("g", "f", 4)]


def test_margins_are_the_judge_minus_each_curve_at_bonbons_kl():
    run = {
        "base": {"judge_mean": 0.2},
        # best-of-N: N = 1 is the instruction model itself (left to the base point), then 0.5 at KL 1, 0.6 at KL 2
        "sweep": {
            "rows": [
                {"n": 1, "kl_analytic": 0.0, "judge_mean": 0.21},
                {"n": 2, "kl_analytic": 1.0, "judge_mean": 0.5},
                {"n": 4, "kl_analytic": 2.0, "judge_mean": 0.6},
            ]
        },
        "dpo": {"dpo_0.1": {"kl_mean": 2.0, "judge_mean": 0.4}},
    }
    # at KL 1.5: best-of-N 0.55, DPO's line 0.2 + 0.75 * 0.2 = 0.35
    gaps = chat_bonbon.margins(run, {"kl_mean": 1.5, "judge_mean": 0.45})
    assert gaps["best_of_n"] == pytest.approx(-0.1)
    assert gaps["dpo_0.1"] == pytest.approx(0.1)
    # at KL 0.5: best-of-N 0.2 + 0.5 * 0.3 = 0.35 (from the instruction model, not N = 1's own sample)
    assert chat_bonbon.margins(run, {"kl_mean": 0.5, "judge_mean": 0.35})["best_of_n"] == pytest.approx(0.0)
    beyond = chat_bonbon.margins(run, {"kl_mean": 2.5, "judge_mean": 0.7})
    assert beyond == {"best_of_n": None, "dpo_0.1": None}


def test_a_folder_without_a_finished_run_is_refused_by_name(tmp_path):
    (tmp_path / "data").mkdir()
    for name in ("ppo.jsonl", "eval.jsonl"):
        (tmp_path / "data" / name).write_text("")
    (tmp_path / "reward_model" / "model").mkdir(parents=True)
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "instruction.json").write_text(json.dumps({"metrics": {"judge_mean": 0.1}}))
    (tmp_path / "results.json").write_text(json.dumps({"precision": "32-true"}))
    with pytest.raises(SystemExit, match=r"--demo .*: no best_of_n/best_of_n.json \(not a finished `make demo-chat`"):
        chat_bonbon.finished_run(tmp_path)


def test_first_requests_are_taken_in_order_and_too_few_is_refused(tmp_path):
    source = tmp_path / "ppo.jsonl"
    source.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": str(i)}]}) + "\n" for i in range(3)))
    prompts = chat_bonbon.first_requests(source, 2, tmp_path / "out.jsonl")
    assert [p[0]["content"] for p in prompts] == ["0", "1"]
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2
    with pytest.raises(SystemExit, match=r"--prompts 4: .*ppo.jsonl has only 3 requests"):
        chat_bonbon.first_requests(source, 4, tmp_path / "out2.jsonl")


def test_the_fit_is_the_chat_bonbon_config_with_the_runs_seed_and_precision(tmp_path):
    run = {"precision": "bf16-mixed"}
    cmd = chat_bonbon.fit_command("/m", run, tmp_path / "pairs.jsonl", tmp_path / "n_4", 2)
    pairs = dict(zip(cmd, cmd[1:]))
    assert pairs["--config"] == str(ROOT / "configs" / "demo_chat" / "bonbon.yaml")
    assert pairs["--seed_everything"] == "2" and pairs["--trainer.precision"] == "bf16-mixed"
    assert pairs["--data.init_args.train_path"] == str(tmp_path / "pairs.jsonl")
    assert pairs["--model.init_args.model"] == "/m"
    assert pairs["--model.init_args.export_dir"] == str(tmp_path / "n_4" / "model")


@pytest.mark.parametrize("text", ["1,4", "x", ""])
def test_ns_below_two_or_not_integers_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        chat_bonbon.parse_ns(text)
    assert chat_bonbon.parse_ns("16,4,8") == (4, 8, 16)


def test_replies_are_scored_as_the_chat_ppo_config_reads_a_cut_reply(tmp_path):
    """The bench's draw and the demo's best-of-N both pass ``reward.unfinished`` of configs/demo_chat/ppo.yaml
    (read here with yaml, not through the helper they share)."""
    import yaml

    from demo.chat_plan import CHAT_FULL, best_of_n_command
    from demo.plan import Paths

    config = yaml.safe_load((ROOT / "configs" / "demo_chat" / "ppo.yaml").read_text())
    wanted = config["model"]["init_args"]["reward"]["unfinished"]
    run = {"reward_model": tmp_path / "rm", "precision": "32-true"}
    drawn = chat_bonbon.sampling_command("/m", run, tmp_path / "p.jsonl", 16, 0, tmp_path / "s.json")
    demo = best_of_n_command("/m", Paths(tmp_path), CHAT_FULL, "j", 0, "32-true")
    for cmd in (drawn, demo):
        assert cmd[cmd.index("--unfinished") + 1] == wanted
    assert drawn[drawn.index("--n") + 1] == "16"
