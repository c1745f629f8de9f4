"""Contracts of docs/CONTRACTS.md that are one definition each, checked on the source: nothing in
``rlhf_lit`` writes the value or the test again instead of importing the one definition."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from rlhf_lit.functional import IGNORE_INDEX, sft_loss

PACKAGE = Path(__file__).resolve().parents[1] / "rlhf_lit"


def _trees() -> list[tuple[str, ast.AST]]:
    return [(str(p.relative_to(PACKAGE.parent)), ast.parse(p.read_text(encoding="utf-8")))
            for p in sorted(PACKAGE.rglob("*.py"))]  # fmt: skip


def _minus_100(tree: ast.AST) -> list[int]:
    """Lines of every ``-100`` literal in code (docstrings and comments are text, not literals)."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant) and node.operand.value == 100]  # fmt: skip


def test_ignore_index_is_written_once():
    found = [f"{path}:{line}" for path, tree in _trees() for line in _minus_100(tree)]
    assert found == ["rlhf_lit/functional/losses.py:12"], "import IGNORE_INDEX from rlhf_lit.functional instead"


def test_ignore_index_is_what_the_data_modules_write_and_the_loss_skips():
    from rlhf_lit.data import IGNORE_INDEX as data_ignore_index
    from rlhf_lit.data.encoding import IGNORE_INDEX as encoding_ignore_index

    assert IGNORE_INDEX == data_ignore_index == encoding_ignore_index == -100
    logits = torch.zeros(1, 3, 4)
    assert torch.isnan(sft_loss(logits, torch.full((1, 3), IGNORE_INDEX)))  # no label counts
