"""Paragraph reading, prompt openings and the disjoint demo ranges."""

from __future__ import annotations

import pytest
import torch
from assets_paths import CONFIGS

from demo.story_prompts import RANGES, READ_AS_EXAMPLES, load_prompts, opening_words, read_paragraphs, write_splits
from rlhf_lit.data.prompt_source import config_data_module, hh_reading


@pytest.fixture
def small_file(tmp_path):
    path = tmp_path / "stories.txt"
    # Paragraph 1 spans two lines; a whitespace-only line separates paragraphs 1 and 2;
    # several blank lines before paragraph 3 and none at the end of the file.
    path.write_text(
        "\n  One day  a cat sat.\nIt was happy.\n   \nTom ran home fast to see his mom and dad today.\n\n\n\nThe end."
    )
    return str(path)


def test_read_paragraphs(small_file):
    assert read_paragraphs(small_file) == [
        "One day  a cat sat.\nIt was happy.",
        "Tom ran home fast to see his mom and dad today.",
        "The end.",
    ]


def test_opening_words_keep_spacing():
    assert opening_words("One day  a cat sat.\nIt was happy.", 3) == "One day  a"
    assert opening_words("One day  a cat sat.\nIt was happy.", 6) == "One day  a cat sat.\nIt"


def test_short_paragraph_is_whole_prompt():
    assert opening_words("The end.", 8) == "The end."


def test_opening_words_needs_a_word():
    with pytest.raises(ValueError, match="num_words must be >= 1"):
        opening_words("abc", 0)


def test_load_prompts_range(small_file):
    assert load_prompts(small_file, 1, 2, 4) == ([1, 2], ["Tom ran home fast", "The end."])


@pytest.mark.parametrize("start, count", [(2, 2), (-1, 1), (0, 0)])
def test_load_prompts_bad_range(small_file, start, count):
    with pytest.raises(ValueError, match="start|count|has only 3"):
        load_prompts(small_file, start, count, 4)


def test_demo_ranges_disjoint_and_inside_tinystories(tinystories):
    spans = sorted((s, s + c) for s, c in RANGES.values())
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start
    assert spans[-1][1] <= len(read_paragraphs(tinystories)) == 4302
    assert RANGES["eval"] == (3000, 256)


def test_write_splits(small_file, tmp_path):
    written = write_splits(small_file, str(tmp_path / "out"), {"a": (0, 1), "b": (1, 2)})
    assert read_paragraphs(written["a"]) == ["One day  a cat sat.\nIt was happy."]
    assert read_paragraphs(written["b"]) == ["Tom ran home fast to see his mom and dad today.", "The end."]


def test_write_splits_rejects_overlap(small_file, tmp_path):
    with pytest.raises(ValueError, match="'a' and 'b' overlap"):
        write_splits(small_file, str(tmp_path / "out"), {"a": (0, 2), "b": (1, 2)})


def test_split_command_writes_the_demo_ranges(tinystories, tmp_path, capsys):
    from demo.__main__ import main

    assert main(["split", "--paragraphs", tinystories, "--out-dir", str(tmp_path)]) == 0
    assert "eval: paragraphs [3000, 3256)" in capsys.readouterr().out
    every = read_paragraphs(tinystories)
    for stage, (start, count) in RANGES.items():
        expected = every[start : start + count]
        if stage == "sft":  # without the paragraphs of at most 8 words, which SFT's paragraphs format skips
            expected = [p for p in expected if len(p.split()) > 8]
        assert read_paragraphs(str(tmp_path / f"{stage}.txt")) == expected


def test_the_demo_sft_holds_out_the_examples_a_split_of_its_examples_draws(tinystories, tmp_path, monkeypatch):
    """configs/demo/sft.yaml's val_fraction split is drawn by record position: sft.txt holds only the paragraphs
    the stage reads, so it holds out the examples a seeded permutation of the examples themselves picks, the
    held-out set docs/DEMO.md's SFT figures were measured with."""
    start, count = RANGES["sft"]
    paragraphs = read_paragraphs(tinystories)[start : start + count]
    examples = [p for p in paragraphs if len(p.split()) > 8]  # paragraphs with prompt_words 8 reads these
    assert len(examples) < len(paragraphs)  # the range holds paragraphs SFT skips: the file must leave them out
    data = tmp_path / "logs" / "demo" / "data"
    write_splits(tinystories, str(data), {"sft": RANGES["sft"]})
    monkeypatch.chdir(tmp_path)  # the config names logs/demo/data/sft.txt relative to the working folder
    module = config_data_module(str(CONFIGS / "demo" / "sft.yaml"))
    assert module.prompt_words == READ_AS_EXAMPLES["sft"] == 8
    train, val, _ = module.read_splits(hh_reading(module.hh_render, None, "hh_render"))
    # the rule of a split over the examples: a permutation of them seeded with the config's seed 0, the first
    # round(0.05 * n) held out
    n_val = round(module.val_fraction * len(examples))
    held = set(torch.randperm(len(examples), generator=torch.Generator().manual_seed(0))[:n_val].tolist())
    assert [e.prompt + e.response for e in val] == [p for i, p in enumerate(examples) if i in held]
    assert [e.prompt + e.response for e in train] == [p for i, p in enumerate(examples) if i not in held]
