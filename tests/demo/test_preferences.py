"""Preference generation: labelling judged samples, and the command end to end on stories260K."""

from __future__ import annotations

import json
import random

import pytest

from demo.__main__ import main
from demo.preferences import count_pairs, label_pairs, label_rankings, make_preferences
from rlhf_lit.data.adapters import Fields
from rlhf_lit.data.preference import PreferenceDataModule
from rlhf_lit.tokenizer import load_tokenizer


def test_label_pairs_argmax_best_worst_drops_ties():
    prompts = ["p0", "p0", "p1", "p1", "p2", "p2"]
    responses = ["a", "b", "c", "d", "e", "f"]
    scores = [0.5, 0.1, 0.2, 0.2, -0.3, 0.4]
    records, ties, empty = label_pairs(
        [10, 11, 12], prompts, responses, scores, 2, "argmax", "best_worst", 0.25, random.Random(0)
    )
    assert ties == 1  # prompt p1: 0.2 vs 0.2
    assert records == [
        {"prompt": "p0", "chosen": "a", "rejected": "b", "chosen_score": 0.5, "rejected_score": 0.1, "paragraph": 10},
        {"prompt": "p2", "chosen": "f", "rejected": "e", "chosen_score": 0.4, "rejected_score": -0.3, "paragraph": 12},
    ]


def test_label_pairs_all_pairs_of_three():
    scores = [0.1, 0.7, 0.1]
    records, ties, empty = label_pairs(
        [5], ["p"] * 3, ["x", "y", "z"], scores, 3, "argmax", "all_pairs", 0.25, random.Random(0)
    )
    # pairs (0,1): y wins; (0,2): tie, dropped; (1,2): y wins
    assert ties == 1
    assert [(r["chosen"], r["rejected"]) for r in records] == [("y", "x"), ("y", "z")]


def test_label_pairs_bradley_terry_keeps_ties_as_coin_flips():
    # random.Random(7) draws 0.3238, 0.1508: both below 0.5, so A (index 0) wins both equal pairs.
    records, ties, empty = label_pairs(
        [0, 1],
        ["p", "p", "q", "q"],
        ["a", "b", "c", "d"],
        [0.3] * 4,
        2,
        "bradley_terry",
        "best_worst",
        0.25,
        random.Random(7),
    )
    assert ties == 0
    assert [(r["chosen"], r["rejected"]) for r in records] == [("a", "b"), ("c", "d")]


def test_label_pairs_checks_lengths():
    with pytest.raises(ValueError, match="K entries per paragraph"):
        label_pairs([0, 1], ["p"] * 3, ["a"] * 3, [0.0] * 3, 2, "argmax", "best_worst", 0.25, random.Random(0))


def test_incompatible_settings_raise(stories_path, tinystories, tmp_path):
    with pytest.raises(ValueError, match="samples_per_prompt must be >= 2"):
        make_preferences(stories_path, tinystories, str(tmp_path / "p.jsonl"), samples_per_prompt=1)
    with pytest.raises(ValueError, match="bt_temperature only applies to labeler='bradley_terry'"):
        make_preferences(stories_path, tinystories, str(tmp_path / "p.jsonl"), bt_temperature=0.5)


def test_preferences_end_to_end(stories_path, tinystories, tmp_path, capsys):
    out = tmp_path / "prefs" / "pairs.jsonl"
    rankings_out = tmp_path / "prefs" / "rankings.jsonl"
    status = main(
        [
            "preferences",
            "--model",
            stories_path,
            "--paragraphs",
            tinystories,
            "--out",
            str(out),
            "--start",
            "1000",
            "--count",
            "4",
            "--samples-per-prompt",
            "2",
            "--max-new-tokens",
            "8",
            "--labeler",
            "bradley_terry",
            "--seed",
            "1",
            "--rankings-out",
            str(rankings_out),
        ]
    )
    assert status == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["prompts"] == 4 and stats["samples"] == 8 and stats["ties"] == 0
    assert stats["rankings"] == 4
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == stats["pairs"] == 4  # bradley_terry keeps every best-worst pair
    assert [r["paragraph"] for r in records] == [1000, 1001, 1002, 1003]
    for r in records:
        assert set(r) == {"prompt", "chosen", "rejected", "chosen_score", "rejected_score", "paragraph"}
        assert len(r["prompt"].split()) == 8
        assert -1.0 <= r["chosen_score"] <= 1.0 and -1.0 <= r["rejected_score"] <= 1.0
        assert r["chosen"] and r["rejected"]
    assert records[0]["prompt"] == "Tommy learned something new. He learned that rolling"

    # The rankings of the same samples and judge scores: with K = 2 each holds its prompt's pair,
    # in a Plackett-Luce order of its own (the draw is the same, the probability is sample 0's).
    rankings = [json.loads(line) for line in rankings_out.read_text().splitlines()]
    assert [(r["prompt"], r["paragraph"], r["ranks"]) for r in rankings] == [
        (p["prompt"], p["paragraph"], [0, 1]) for p in records
    ]
    for r, p in zip(rankings, records):
        scored = {p["chosen"]: p["chosen_score"], p["rejected"]: p["rejected_score"]}
        assert dict(zip(r["responses"], r["scores"])) == scored

    # The data module reads the rankings with format "rankings" (ties through fields.ranks): one
    # batch element per prompt, its 2 responses, the best first.
    ranked = PreferenceDataModule(
        tokenizer=load_tokenizer(stories_path),
        train_path=str(rankings_out),
        format="rankings",
        fields=Fields(ranks="ranks"),
        batch_size=4,
    )
    ranked.setup("fit")
    batch = next(iter(ranked.train_dataloader()))
    assert batch["responses_per_prompt"].tolist() == [2, 2, 2, 2]
    assert batch["rank"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]  # position-major: every best, then every second

    # The preference data module reads the file as format "fields".
    data = PreferenceDataModule(
        tokenizer=load_tokenizer(stories_path), train_path=str(out), format="fields", batch_size=4
    )
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert batch["chosen_input_ids"].shape[0] == 4
    assert batch["rejected_input_ids"].shape == batch["chosen_input_ids"].shape


def test_label_pairs_drops_pairs_with_an_empty_response():
    # Prompt 0: samples "" (0.9) and "ok" (0.1) -> the best-vs-worst pair has an empty side: dropped.
    # Prompt 1: samples "fine" (0.2) and "good" (0.6) -> kept, "good" chosen.
    records, ties, empty = label_pairs(
        [0, 1],
        ["p", "p", "q", "q"],
        ["", "ok", "fine", "good"],
        [0.9, 0.1, 0.2, 0.6],
        2,
        "argmax",
        "best_worst",
        0.25,
        random.Random(0),
    )
    assert (ties, empty) == (0, 1)
    assert [(r["chosen"], r["rejected"]) for r in records] == [("good", "fine")]


def test_label_rankings_argmax_by_hand():
    # Prompt p (paragraph 7): "a" 0.2, "b" 0.9, "" (empty, leaves), "d" 0.2 -> b, then a and d tied.
    # Prompt q (paragraph 8): all three non-empty responses score 0.5 -> no comparison: dropped as a tie.
    # Prompt r (paragraph 9): one non-empty response -> dropped as empty.
    # Prompt s (paragraph 10): "i" twice (a repeat leaves) and empty twice -> one response: dropped as empty.
    prompts = ["p"] * 4 + ["q"] * 4 + ["r"] * 4 + ["s"] * 4
    responses = ["a", "b", " ", "d", "e", "f", "g", "", "h", "", "", "", "i", "", "i", ""]
    scores = [0.2, 0.9, 0.7, 0.2, 0.5, 0.5, 0.5, 0.1, 0.3, 0.0, 0.0, 0.0, 0.4, 0.0, 0.4, 0.0]
    records, ties, empty = label_rankings([7, 8, 9, 10], prompts, responses, scores, 4, "argmax", 1.0, random.Random(0))
    assert (ties, empty) == (1, 2)
    assert records == [
        {"prompt": "p", "responses": ["b", "a", "d"], "ranks": [0, 1, 1], "scores": [0.9, 0.2, 0.2], "paragraph": 7}
    ]
    assert count_pairs(records[0]) == 2  # b > a, b > d; a = d is no pair


def test_label_rankings_bradley_terry_draws_k_minus_one_per_kept_prompt():
    prompts = ["p"] * 3 + ["q"] * 3
    responses = ["a", "b", "c", "", "", "x"]  # q keeps one response: dropped before any draw
    scores = [0.1, 0.5, -0.2, 0.0, 0.0, 0.3]
    rng = random.Random(5)
    records, ties, empty = label_rankings([0, 1], prompts, responses, scores, 3, "bradley_terry", 0.25, rng)
    twin = random.Random(5)
    [twin.random() for _ in range(2)]  # K - 1 = 2 draws for prompt p, none for q
    assert rng.random() == twin.random()
    assert (ties, empty) == (0, 1)
    assert len(records) == 1 and sorted(records[0]["responses"]) == ["a", "b", "c"]
    assert records[0]["ranks"] == [0, 1, 2]
    by_response = dict(zip(responses[:3], scores[:3]))
    assert records[0]["scores"] == [by_response[r] for r in records[0]["responses"]]


def test_preferences_from_a_file_of_conversations_sample_inside_the_chat_template(tmp_path, capsys, monkeypatch):
    from assets_paths import STORIES260K_CHAT

    from rlhf_lit.models import generation
    from rlhf_lit.tokenizer import load_tokenizer

    prompts = tmp_path / "label.jsonl"
    asked = ["Tell a story about a cat.", "Tell a story about a dog."]
    prompts.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": q}]}) + "\n" for q in asked))
    seen = []
    original = generation.sample_batches

    def spy(model, tokenizer, inputs, *args, **kwargs):
        seen.extend(inputs)
        return original(model, tokenizer, inputs, *args, **kwargs)

    monkeypatch.setattr("demo.preferences.sample_batches", spy)
    out, rankings_out = tmp_path / "pairs.jsonl", tmp_path / "rankings.jsonl"
    args = ["preferences", "--model", str(STORIES260K_CHAT), "--prompts", str(prompts), "--out", str(out)]
    args += ["--samples-per-prompt", "3", "--max-new-tokens", "8", "--seed", "2", "--rankings-out", str(rankings_out)]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == 6
    tok = load_tokenizer(str(STORIES260K_CHAT))
    rendered = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True) for q in asked]
    rendered = [r["input_ids"] if hasattr(r, "keys") else r for r in rendered]
    assert seen == [rendered[0]] * 3 + [rendered[1]] * 3  # ids in the template, not the raw request
    for path in (out, rankings_out):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            assert record["prompt"] == [{"role": "user", "content": asked[record["paragraph"]]}]


def test_preferences_sample_at_the_precision_asked(stories_path, tinystories, tmp_path, capsys):
    import torch
    from autocast_probe import model_forwards, precisions

    def run(name: str, *extra: str) -> tuple[dict, list[dict], dict]:
        out = tmp_path / f"{name}.jsonl"
        args = ["preferences", "--model", stories_path, "--paragraphs", tinystories, "--out", str(out)]
        args += ["--start", "1000", "--count", "3", "--samples-per-prompt", "2", "--max-new-tokens", "6", *extra]
        with model_forwards() as seen:
            assert main(args) == 0
        stats = json.loads(capsys.readouterr().out)
        return stats, [json.loads(line) for line in out.read_text().splitlines()], precisions(seen)

    default, default_records, default_ran = run("default")
    explicit, explicit_records, _ = run("explicit", "--precision", "32-true")
    assert default_ran == {"sampling": {None}} and default["precision"] == explicit["precision"] == "32-true"
    assert explicit_records == default_records  # the default samples as it did before the option
    bf16, _, bf16_ran = run("bf16", "--precision", "bf16-mixed")
    assert bf16_ran == {"sampling": {torch.bfloat16}} and bf16["precision"] == "bf16-mixed"

    with pytest.raises(SystemExit) as refused:
        main(["preferences", "--model", stories_path, "--out", str(tmp_path / "x.jsonl"), "--precision", "fp16"])
    assert refused.value.code == 2
    assert "argument --precision: invalid choice: 'fp16'" in capsys.readouterr().err
