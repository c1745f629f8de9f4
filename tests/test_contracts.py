"""Contracts of docs/CONTRACTS.md that are one definition each, checked on the source: nothing in
``rlhf_lit`` writes the value or the test again instead of importing the one definition."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from rlhf_lit.functional import IGNORE_INDEX, sft_loss

PACKAGE = Path(__file__).resolve().parents[1] / "rlhf_lit"


def _trees() -> list[tuple[str, ast.AST]]:
    return [
        (str(p.relative_to(PACKAGE.parent)), ast.parse(p.read_text(encoding="utf-8")))
        for p in sorted(PACKAGE.rglob("*.py"))
    ]


def _minus_100(tree: ast.AST) -> list[int]:
    """Lines of every ``-100`` literal in code (docstrings and comments are text, not literals)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and node.operand.value == 100
    ]


def test_ignore_index_is_written_once():
    found = [f"{path}:{line}" for path, tree in _trees() for line in _minus_100(tree)]
    assert [f.split(":")[0] for f in found] == ["rlhf_lit/functional/losses.py"], (
        f"{found}: import IGNORE_INDEX from rlhf_lit.functional instead"
    )


def test_ignore_index_is_what_the_data_modules_write_and_the_loss_skips():
    from rlhf_lit.data import IGNORE_INDEX as data_ignore_index
    from rlhf_lit.data.encoding import IGNORE_INDEX as encoding_ignore_index

    assert IGNORE_INDEX == data_ignore_index == encoding_ignore_index == -100
    logits = torch.zeros(1, 3, 4)
    assert torch.isnan(sft_loss(logits, torch.full((1, 3), IGNORE_INDEX)))  # no label counts


RANKING_KEYS = frozenset({"group", "responses_per_prompt"})


def _ranking_tests(path: str, tree: ast.AST) -> list[tuple[str, int]]:
    """``("<path> tests 'group' in", line)`` for every membership test of a ranking key and every
    definition of ``is_ranking_batch`` in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Compare)
            and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
            and isinstance(node.left, ast.Constant)
            and node.left.value in RANKING_KEYS
        ):
            found.append((f"{path} tests {node.left.value!r} in", node.lineno))
        elif isinstance(node, ast.FunctionDef) and node.name == "is_ranking_batch":
            found.append((f"{path} defines is_ranking_batch", node.lineno))
    return found


def test_the_ranking_batch_predicate_is_written_once():
    found = sorted(f for path, tree in _trees() for f in _ranking_tests(path, tree))
    assert [what for what, _ in found] == sorted(
        ["rlhf_lit/functional/ranking.py defines is_ranking_batch", "rlhf_lit/functional/ranking.py tests 'group' in"]
    ), f"{found}: call rlhf_lit.functional.is_ranking_batch (or batch_examples) instead"


def test_the_predicate_and_the_examples_of_each_batch_kind():
    from rlhf_lit.data.collate import RankingCollator
    from rlhf_lit.functional import batch_examples, is_ranking_batch

    ids = [[5, 6], [5, 7, 8], [5, 9]]
    items = [
        {"input_ids": ids, "rank": [0, 1, 1], "prompt_length": 1},
        {"input_ids": ids[:2], "rank": [0, 1], "prompt_length": 1},
    ]
    ranking = RankingCollator(pad_token_id=0)(items)
    assert is_ranking_batch(ranking) and batch_examples(ranking) == 2 and ranking["input_ids"].shape[0] == 5
    pair = {
        "chosen_input_ids": torch.ones(3, 4),
        "rejected_input_ids": torch.ones(3, 5),
        "prompt_length": torch.ones(3),
    }
    sft = {"input_ids": torch.ones(4, 6), "labels": torch.ones(4, 6)}
    assert not is_ranking_batch(pair) and batch_examples(pair) == 3
    assert not is_ranking_batch(sft) and batch_examples(sft) == 4


def test_each_format_option_offers_the_registry_formats_of_its_kind():
    """The data modules' format options take their choices from ``data.adapters.ADAPTERS``: auto and
    every format that gives the examples the option reads (the CLI checks and lists these)."""
    from typing import get_args, get_type_hints

    from rlhf_lit.data import PreferenceDataModule, PromptDataModule, SFTDataModule
    from rlhf_lit.data.adapters import ADAPTERS

    def registry(kind):
        return {"auto", *(name for name, (_, kinds) in ADAPTERS.items() if kind in kinds)}

    options = {
        (SFTDataModule, "format"): "sft",
        (PreferenceDataModule, "format"): "preference",
        (PreferenceDataModule, "reference_format"): "sft",
        (PromptDataModule, "format"): "prompt",
        (PromptDataModule, "ptx_format"): "sft",
    }
    for (module, option), kind in options.items():
        choices = get_args(get_type_hints(module.__init__)[option])
        assert len(choices) == len(set(choices)) and set(choices) == registry(kind), (module.__name__, option)
    assert {
        option
        for module in (SFTDataModule, PreferenceDataModule, PromptDataModule)
        for option in get_type_hints(module.__init__)
        if option.endswith("format")
    } == {o for _, o in options}


def test_each_format_option_points_to_the_registry_instead_of_listing_it():
    """The formats are described once, in ``data.adapters`` (the registry and its docstring): a format
    option's documentation (its ``--help``) names the registry and at most the few formats it reads
    its own way."""
    import re

    from rlhf_lit.data import PreferenceDataModule, PromptDataModule, SFTDataModule
    from rlhf_lit.data.adapters import ADAPTERS

    options = {
        SFTDataModule: ("format",),
        PreferenceDataModule: ("format", "reference_format"),
        PromptDataModule: ("format", "ptx_format"),
    }
    for module, names in options.items():
        for option in names:
            entry = re.search(rf"\n {{8}}{option}: (.*?)(?=\n {{8}}\w+:|\Z)", module.__doc__, re.S)
            assert entry, (module.__name__, option)
            text = entry.group(1)
            listed = [name for name in ADAPTERS if f"``{name}``" in text]
            assert "rlhf_lit.data.adapters.ADAPTERS" in text and len(listed) <= 2, (module.__name__, option, listed)
