"""``rlhf-lit iterate``: the loop's data, its typed choices, labels from files, early errors, resuming.

The tests swap the stage runner (``iterate_command.run_fit``) for ``iterate_helpers.FakeFits``, which records
each ``rlhf-lit fit`` command line and writes a stand-in export (a copy of a tiny model with the export
marker): the loop's own decisions are checked in a second or two, without training. The real stages:
test_iterate_real_stages.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from assets_paths import CONFIGS, STORIES260K, STORIES260K_CHAT
from iterate_helpers import JUDGE, FakeFits, error_line, iterate, jsonl, loop_config

from rlhf_lit.commands.iterate_config import IterateConfig, read_config

# ------------------------------------------------------------------------------------------ set-up


def labels(run: Path, t: int) -> dict:
    return json.loads((run / f"iter_{t}" / "labels.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------- the loop's decisions


@pytest.mark.parametrize("data", ["all", "latest"])
def test_reward_data_accumulates_as_configured(tmp_path, monkeypatch, tiny_rm, data):
    fits = FakeFits(tiny_rm)
    result = iterate(loop_config(tmp_path, reward_model={"data": data}), fits, monkeypatch, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    first, second = labels(run, 1), labels(run, 2)
    # By hand: 4 prompts an iteration, a quarter (1) held out; the rest trains.
    assert (len(first["train"]), len(first["held_out"])) == (3, 1)
    assert {r["iteration"] for r in first["train"]} == {1} and {r["iteration"] for r in second["train"]} == {2}
    assert jsonl(run / "iter_1" / "reward_data.jsonl") == first["train"]
    expected = first["train"] + second["train"] if data == "all" else second["train"]
    assert jsonl(run / "iter_2" / "reward_data.jsonl") == expected
    # the reward-model fit reads that file, as rankings records
    options = next(o for (t, s, o) in fits.calls if (t, s) == (2, "reward_model"))
    assert options["--data.init_args.train_path"] == str(run / "iter_2" / "reward_data.jsonl")
    assert options["--data.init_args.format"] == "rankings"
    # a ranking: best first by the judge (longer), its ranks dense
    for record in first["train"]:
        assert record["scores"] == sorted(record["scores"], reverse=True)
        assert record["ranks"][0] == 0 and record["ranks"] == sorted(record["ranks"])
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert [row["iteration"] for row in summary["rows"]] == [0, 1, 2]
    assert summary["rows"][2]["rm_train_records"] == len(expected)
    assert summary["rows"][2]["rm_acc_before"] is not None and summary["rows"][1]["rm_acc_before"] is None
    assert (run / "summary.csv").read_text(encoding="utf-8").startswith("iteration,labelled_prompts,")


@pytest.mark.parametrize(
    ("group", "value"), [("reward_model", "previous"), ("reward_model", "sft"), ("ppo", "restart"), ("ppo", "continue")]
)
def test_each_start_choice_starts_where_it_says(tmp_path, monkeypatch, tiny_rm, group, value):
    fits = FakeFits(tiny_rm)
    key = "init" if group == "reward_model" else "start"
    result = iterate(loop_config(tmp_path, **{group: {key: value}}), fits, monkeypatch, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    assert fits.starts(1, group) == str(STORIES260K)  # iteration 1 starts from the SFT model either way
    previous = str(run / "iter_1" / group / "model")
    assert fits.starts(2, group) == (previous if value in ("previous", "continue") else str(STORIES260K))
    if group == "ppo":  # the policy iteration 2 samples is iteration 1's PPO export, whichever the start
        assert fits.starts(2, "reward_model") == str(run / "iter_1" / "reward_model" / "model")


@pytest.mark.parametrize("data", ["all", "latest"])
def test_initial_data_and_model_come_before_iteration_one(tmp_path, monkeypatch, tiny_rm, data):
    initial = tmp_path / "initial.jsonl"
    initial.write_text(
        '{"prompt": "Tom", "chosen": "ran home.", "rejected": "sat."}\n'
        '{"prompt": "Sue", "responses": ["sang.", "ate.", "slept."]}\n',
        encoding="utf-8",
    )
    fits = FakeFits(tiny_rm)
    config = loop_config(
        tmp_path, iterations=1, reward_model={"data": data, "initial_data": str(initial), "initial_model": str(tiny_rm)}
    )
    result = iterate(config, fits, monkeypatch, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    train = labels(run, 1)["train"]
    kept = [
        {"prompt": "Tom", "responses": ["ran home.", "sat."], "ranks": [0, 1]},
        {"prompt": "Sue", "responses": ["sang.", "ate.", "slept."], "ranks": [0, 1, 2]},
    ]
    assert jsonl(run / "iter_1" / "reward_data.jsonl") == (kept + train if data == "all" else train)
    assert fits.starts(1, "reward_model") == str(tiny_rm)  # `previous` at t = 1: the initial model
    rows = json.loads((run / "summary.json").read_text(encoding="utf-8"))["rows"]
    assert rows[1]["rm_acc_before"] is not None and rows[0]["proxy"] is not None  # the initial model measured


def test_a_reward_model_labels_by_its_scores(tmp_path, monkeypatch, tiny_rm):
    from rlhf_lit.evaluation.reward_judge import RewardModelScorer

    config = loop_config(tmp_path, iterations=1, labeler={"kind": "reward_model", "source": str(tiny_rm)})
    assert iterate(config, FakeFits(tiny_rm), monkeypatch, tmp_path).returncode == 0
    samples = {r["prompt"]: r for r in jsonl(tmp_path / "run" / "iter_1" / "samples.jsonl")}
    scorer = RewardModelScorer(str(tiny_rm))
    for record in labels(tmp_path / "run", 1)["train"]:
        sample = samples[record["prompt"]]
        scores = scorer([sample["prompt_text"]] * len(record["responses"]), record["responses"])
        assert scores == pytest.approx(record["scores"], abs=1e-5) and scores == sorted(scores, reverse=True)


def test_a_chat_policy_is_labelled_as_it_read_its_prompts(tmp_path, monkeypatch, chat_rm):
    """stories260K-chat samples inside its chat template: its labels keep the conversation, so the reward model
    trains on the rendering PPO later scores, and the summary's accuracies read that rendering too."""
    from transformers import AutoTokenizer

    from rlhf_lit.data import Fields, PreferenceDataModule, RankingCollator
    from rlhf_lit.evaluation.reward_judge import RewardModelScorer

    initial = tmp_path / "initial.jsonl"
    initial.write_text('{"prompt": "Tom", "chosen": "ran home.", "rejected": "sat."}\n', encoding="utf-8")
    config = loop_config(
        tmp_path, iterations=1, sft_model=str(STORIES260K_CHAT), reward_model={"initial_data": str(initial)}
    )
    fits = FakeFits(chat_rm, policy=STORIES260K_CHAT)
    result = iterate(config, fits, monkeypatch, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "run"
    # PPO samples its string prompts in the template too, whatever its config says.
    (ppo,) = [options for (_, stage, options) in fits.calls if stage == "ppo"]
    assert ppo["--data.init_args.chat_template"] == "always"
    samples = {s["prompt"]: s for s in jsonl(run / "iter_1" / "samples.jsonl")}
    data = jsonl(run / "iter_1" / "reward_data.jsonl")
    tom = [{"role": "user", "content": "Tom"}]
    answers = [[{"role": "assistant", "content": "ran home."}], [{"role": "assistant", "content": "sat."}]]
    assert data[0] == {"prompt": tom, "responses": answers, "ranks": [0, 1]}  # the initial data, rendered alike
    tokenizer = AutoTokenizer.from_pretrained(str(STORIES260K_CHAT))
    # By hand from the shipped template: "<s>User: {prompt}\nAssistant:", then " {response}</s>".
    rendered = []
    for record in data + labels(run, 1)["held_out"]:
        (turn,) = record["prompt"]
        assert turn["role"] == "user"
        if turn["content"] != "Tom":  # the policy's own samples: what it read
            assert samples[turn["content"]]["prompt_text"] == f"<s>User: {turn['content']}\nAssistant:"
        for response in record["responses"]:
            (answer,) = response
            assert answer["role"] == "assistant"
            text = f"<s>User: {turn['content']}\nAssistant: {answer['content']}</s>"
            rendered.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    # What the reward model trains on: the data module reads the file into those rows.
    module = PreferenceDataModule(
        tokenizer=tokenizer,
        train_path=str(run / "iter_1" / "reward_data.jsonl"),
        format="rankings",
        fields=Fields(ranks="ranks"),
        val_fraction=0.0,
    )
    module.setup("fit")
    batch = RankingCollator(module.pad_token_id)(module.train_dataset)
    trained = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    assert sorted(trained) == sorted(rendered[: len(trained)])
    # What the summary's accuracies read: the same rows.
    scorer = RewardModelScorer(str(chat_rm))
    pairs = [(r["prompt"], x) for r in data + labels(run, 1)["held_out"] for x in r["responses"]]
    assert scorer.rows(*zip(*pairs)) == rendered


def test_a_raw_policy_s_ppo_samples_raw_prompts_and_ppo_options_cannot_change_the_rendering(
    tmp_path, monkeypatch, tiny_rm
):
    fits = FakeFits(tiny_rm)
    assert iterate(loop_config(tmp_path, iterations=1), fits, monkeypatch, tmp_path).returncode == 0
    (ppo,) = [options for (_, stage, options) in fits.calls if stage == "ppo"]
    assert ppo["--data.init_args.chat_template"] == "never"
    for name, option in enumerate(
        ["--data.init_args.chat_template=always", "--data.init_args.apply_chat_template=true", "--data.chat_template"]
    ):
        fits = FakeFits(tiny_rm)
        (tmp_path / str(name)).mkdir()
        result = iterate(loop_config(tmp_path / str(name), ppo={"options": [option]}), fits, monkeypatch, tmp_path)
        assert f"ppo.options {option}: iterate sets the PPO data's chat_template" in error_line(result)
        assert fits.calls == []


def test_a_run_whose_labels_were_rendered_otherwise_is_refused(tmp_path, monkeypatch, chat_rm):
    """A run written before the rendering was recorded holds raw-text labels: a chat policy may not add chats."""
    config = loop_config(tmp_path, iterations=1, sft_model=str(STORIES260K_CHAT))
    fits = FakeFits(chat_rm, policy=STORIES260K_CHAT)
    assert iterate(config, fits, monkeypatch, tmp_path).returncode == 0
    snapshot = tmp_path / "run" / "iterate.json"
    kept = json.loads(snapshot.read_text(encoding="utf-8"))
    assert kept["chat_rendered"] is True
    del kept["chat_rendered"]
    snapshot.write_text(json.dumps(kept), encoding="utf-8")
    config = loop_config(tmp_path, iterations=2, sft_model=str(STORIES260K_CHAT))
    fits = FakeFits(chat_rm, policy=STORIES260K_CHAT)
    line = error_line(iterate(config, fits, monkeypatch, tmp_path))
    assert "holds labels rendered as raw text" in line and "reads prompts as chats now" in line, line
    assert fits.calls == []


def test_a_judge_reads_the_prompt_as_the_chat_policy_read_it_and_the_response_text():
    from transformers import AutoTokenizer

    from rlhf_lit.commands.iterate_labels import JudgeScorer, as_policy_read

    read = as_policy_read({"prompt": "Tom ran", "responses": ["Fast.", "Home now."]}, chat=True)
    tokenizer = AutoTokenizer.from_pretrained(str(STORIES260K_CHAT))
    both = JudgeScorer(JUDGE, "query_response", tokenizer)([read["prompt"]] * 2, read["responses"])
    # By hand: "<s>User: Tom ran\nAssistant:" is 27 characters, then the response's text (5, 9).
    assert both == [32.0, 36.0]
    assert JudgeScorer(JUDGE)([read["prompt"]] * 2, read["responses"]) == [5.0, 9.0]


def test_a_judge_may_be_a_reward_model_export_reading_the_prompt_and_the_response(offline_chain):
    from rlhf_lit.commands.iterate_labels import JudgeScorer
    from rlhf_lit.evaluation.reward_judge import RewardModelScorer

    rm = str(offline_chain.export("reward_model"))  # an rlhf-lit reward-model export, trained on plain prompts
    prompts, responses = ["Tom ran", "Sue sang"], [" home.", " a song."]
    judged = JudgeScorer(rm)(prompts, responses)  # judge_reads left at response: a reward model reads the prompt
    assert judged == RewardModelScorer(rm)(prompts, responses)
    assert judged != RewardModelScorer(rm)(["", ""], responses)


def test_the_summary_s_gold_scorer_reads_the_chat_policy_s_samples_as_it_read_them(monkeypatch):
    """The held-out rows reach a gold reward model as the labels do: the prompt as messages, the response as the
    assistant's turn (not the rendered prompt text glued to the response); the policy samples in its template."""
    from rlhf_lit.commands.iterate_steps import evaluate
    from rlhf_lit.evaluation import policy_metrics

    rows = [{"prompt": "Tom ran", "prompt_text": "<s>User: Tom ran\nAssistant:", "response": "Fast."}]
    asked = {}

    def evaluate_policy(policy, prompts, **options):
        asked.update(options)
        return {"metrics": {"length_mean": 3.0}, "samples": rows}

    monkeypatch.setattr(policy_metrics, "evaluate_policy", evaluate_policy)
    read = []

    def gold(prompts, responses):
        read.append((list(prompts), list(responses)))
        return [0.5]

    assert evaluate(IterateConfig(), "policy", None, gold, ["Tom ran"], chat=True)["gold"] == 0.5
    assert read == [([({"role": "user", "content": "Tom ran"},)], [({"role": "assistant", "content": "Fast."},)])]
    assert asked["chat_template"] == "always"


def test_a_labelling_reward_model_must_read_the_chat_policy_s_template(tmp_path, monkeypatch, tiny_rm):
    fits = FakeFits(tiny_rm)
    config = loop_config(
        tmp_path, sft_model=str(STORIES260K_CHAT), labeler={"kind": "reward_model", "source": str(tiny_rm)}
    )
    line = error_line(iterate(config, fits, monkeypatch, tmp_path))
    assert f"labeler.source {tiny_rm}: its tokenizer has no chat template, but the policy" in line, line
    assert fits.calls == [] and not (tmp_path / "run").exists()


def test_pairwise_accuracy_counts_every_labelled_pair_and_an_equal_score_as_one_half():
    from rlhf_lit.commands.iterate_labels import pairwise_accuracy

    records = [
        {"prompt": "p", "responses": ["a", "b", "c"], "ranks": [0, 1, 1]},  # a > b, a > c; b = c is no pair
        {"prompt": "q", "responses": ["d", "e"], "ranks": [0, 1]},  # d > e
        {"prompt": "r", "responses": ["f", "g"], "ranks": [0, 0]},  # a tie: no pair
    ]
    scores = {"a": 2.0, "b": 3.0, "c": 1.0, "d": 0.5, "e": 0.5, "f": 9.0, "g": 0.0}
    calls = []

    def scorer(prompts, responses):
        calls.append((list(prompts), list(responses)))
        return [scores[r] for r in responses]

    # a > b scored 2 < 3: 0; a > c: 1; d > e scored equal: 1/2. (0 + 1 + 0.5) / 3 pairs.
    assert pairwise_accuracy(scorer, records) == (0.5, 3)
    assert calls == [(["p", "p", "p", "q", "q", "r", "r"], ["a", "b", "c", "d", "e", "f", "g"])]  # one call
    assert pairwise_accuracy(scorer, []) == (None, 0) and len(calls) == 1  # nothing to score: no call


def test_the_default_policy_start_is_restart_from_sft():
    assert IterateConfig().ppo.start == "restart"  # Wolf, Kirk and Musolesi 2025: the robust choice


def test_the_shipped_loop_config_reads():
    config = read_config(str(CONFIGS / "offline" / "iterate.yaml"))
    assert config.iterations >= 2 and config.labeler.kind == "judge"


def test_labels_from_files_of_either_shape(tmp_path, monkeypatch, tiny_rm):
    (tmp_path / "labels").mkdir()
    pairs = [{"prompt": f"Tom went to the {w}", "chosen": "park and smiled.", "rejected": "rain."} for w in "abcd"]
    rankings = [
        {"prompt": "Sue had a cat", "responses": ["x y", "z", "w v u"], "ranks": [0, 1, 1]},
        {"prompt": "The sun was", "responses": ["hot.", "up."]},
    ]
    (tmp_path / "labels" / "iter_1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs), encoding="utf-8")
    (tmp_path / "labels" / "iter_2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rankings), encoding="utf-8")
    config = loop_config(
        tmp_path,
        labeler={"kind": "file", "source": str(tmp_path / "labels" / "iter_{t}.jsonl")},
        evaluation={"judge": JUDGE},
    )
    result = iterate(config, FakeFits(tiny_rm), monkeypatch, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = labels(tmp_path / "run", 1), labels(tmp_path / "run", 2)
    assert sorted(r["prompt"] for r in first["train"] + first["held_out"]) == sorted(r["prompt"] for r in pairs)
    assert all(r["responses"] == ["park and smiled.", "rain."] and r["ranks"] == [0, 1] for r in first["train"])
    got = {r["prompt"]: r for r in second["train"] + second["held_out"]}
    assert got["Sue had a cat"]["ranks"] == [0, 1, 1] and got["The sun was"]["ranks"] == [0, 1]  # ties kept


def test_a_missing_labels_file_asks_for_it_after_writing_the_samples(tmp_path, monkeypatch, tiny_rm):
    wanted = tmp_path / "labels" / "iter_1.jsonl"
    fits = FakeFits(tiny_rm)
    result = iterate(
        loop_config(tmp_path, labeler={"kind": "file", "source": str(tmp_path / "labels" / "iter_{t}.jsonl")}),
        fits,
        monkeypatch,
        tmp_path,
    )
    assert result.returncode == 1
    line = error_line(result)
    samples = tmp_path / "run" / "iter_1" / "samples.jsonl"
    assert str(samples) in line and str(wanted) in line
    assert [len(r["responses"]) for r in jsonl(samples)] == [3, 3, 3, 3] and fits.calls == []


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (
            '{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", "chosen": "b"}\n',
            "line 2: field 'rejected' missing",
        ),
        ('{"prompt": "a", "responses": ["b", "c"], "ranks": [1, 0]}\n', "line 1: field 'ranks[1]' is 0"),
        ('{"prompt": "a", "text": "b"}\n', "line 1: neither a rankings record"),
        ('{"prompt": "a", "responses": ["b", "c"]}\n{"prompt": \n', "line 2"),
    ],
)
def test_a_bad_labels_file_is_one_line_before_any_fit(tmp_path, monkeypatch, tiny_rm, content, named):
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "iter_2.jsonl").write_text(content, encoding="utf-8")  # iteration 2's: checked first
    fits = FakeFits(tiny_rm)
    result = iterate(
        loop_config(tmp_path, labeler={"kind": "file", "source": str(tmp_path / "labels" / "iter_{t}.jsonl")}),
        fits,
        monkeypatch,
        tmp_path,
    )
    line = error_line(result)
    assert str(tmp_path / "labels" / "iter_2.jsonl") in line and named in line, line
    assert fits.calls == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("groups", "named"),
    [
        ({"reward_model": {"data": "some"}}, "reward_model.data must be one of all, latest, got 'some'"),
        ({"ppo": {"start": "resume"}}, "ppo.start must be one of restart, continue"),
        ({"reward_model": {"init": "sft", "lr": 1}}, "unknown key 'reward_model.lr'"),
        ({"sampling": {"responses_per_prompt": 1}}, "sampling.responses_per_prompt must be >= 2"),
        ({"sampling": {"temperature": float("inf")}}, "sampling.temperature must be a finite number > 0, got inf"),
        ({"seed": -1}, "seed -1: a run seed must be in [0, 4294967295] (the seeds numpy takes)"),
        ({"labeler": {"kind": "judge", "source": "no_such_module:judge"}}, "no_such_module"),
        ({"ppo": {"config": str(CONFIGS / "offline/iterate/reward_model.yaml")}}, "ppo.config"),
        ({"sft_model": "./no/such/model"}, "sft_model ./no/such/model: no such model directory"),
        ({"labeler": {"kind": "reward_model", "source": str(STORIES260K)}}, "not a reward model"),
    ],
)
def test_a_bad_option_is_one_line_before_any_fit(tmp_path, monkeypatch, tiny_rm, groups, named):
    fits = FakeFits(tiny_rm)
    result = iterate(loop_config(tmp_path, **groups), fits, monkeypatch, tmp_path)
    line = error_line(result)
    assert named in line, line
    assert fits.calls == [] and not (tmp_path / "run").exists()


def test_a_stage_config_of_another_stage_or_not_a_mapping_is_refused(tmp_path, monkeypatch, tiny_rm):
    listed = tmp_path / "listed.yaml"
    listed.write_text("- model\n", encoding="utf-8")
    rm_config = CONFIGS / "offline/iterate/reward_model.yaml"
    for ppo_config, named in (
        (listed, f"ppo.config {listed}: not a YAML mapping (it holds a list), not a stage config"),
        (rm_config, f"ppo.config {rm_config}: model.class_path is 'rlhf_lit.stages.RewardModelModule', not PPOModule"),
    ):
        fits = FakeFits(tiny_rm)
        line = error_line(iterate(loop_config(tmp_path, ppo={"config": str(ppo_config)}), fits, monkeypatch, tmp_path))
        assert line.endswith(named), line
        assert fits.calls == [] and not (tmp_path / "run").exists()


def test_a_rerun_with_another_config_is_refused(tmp_path, monkeypatch, tiny_rm):
    assert iterate(loop_config(tmp_path, iterations=1), FakeFits(tiny_rm), monkeypatch, tmp_path).returncode == 0
    result = iterate(
        loop_config(tmp_path, iterations=1, reward_model={"data": "latest"}), FakeFits(tiny_rm), monkeypatch, tmp_path
    )
    assert "was started with another config (reward_model differ" in error_line(result)


def test_more_iterations_extend_a_run(tmp_path, monkeypatch, tiny_rm):
    assert iterate(loop_config(tmp_path, iterations=1), FakeFits(tiny_rm), monkeypatch, tmp_path).returncode == 0
    fits = FakeFits(tiny_rm)
    result = iterate(loop_config(tmp_path, iterations=2), fits, monkeypatch, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [(t, s) for (t, s, _) in fits.calls] == [(2, "reward_model"), (2, "ppo")]  # iteration 1 kept


@pytest.mark.parametrize("stage", ["reward_model", "ppo"])
def test_a_kill_in_a_fit_redoes_that_fit_and_skips_what_is_done(tmp_path, monkeypatch, tiny_rm, stage):
    config = loop_config(tmp_path)
    killed = iterate(config, FakeFits(tiny_rm, kill_at=(2, stage)), monkeypatch, tmp_path)
    assert killed.returncode == 1 and "killed during" in killed.stderr
    run = tmp_path / "run"
    samples = (run / "iter_2" / "samples.jsonl").read_text(encoding="utf-8")
    (run / "iter_2" / "samples.jsonl").write_text(samples[:-20], encoding="utf-8")  # a copy cut short: sampled again
    (run / "iter_1" / "metrics.json").write_text(
        '{"written_by": "rlhf-lit iterate", "row": {', encoding="utf-8"
    )  # cut short
    fits = FakeFits(tiny_rm)
    resumed = iterate(config, fits, monkeypatch, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    redone = [(t, s) for (t, s, _) in fits.calls]
    assert redone == ([(2, "reward_model"), (2, "ppo")] if stage == "reward_model" else [(2, "ppo")])
    assert (run / "iter_2" / "samples.jsonl").read_text(
        encoding="utf-8"
    ) == samples  # the same samples again (seed + t)
    assert json.loads((run / "iter_1" / "metrics.json").read_text(encoding="utf-8"))["row"]["iteration"] == 1  # redone
    assert "iteration 1: ppo: done" in resumed.stdout
