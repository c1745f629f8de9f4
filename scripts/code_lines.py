"""Count the lines of a Python tree that hold code: not blank, not only a comment, not a docstring.

``python scripts/code_lines.py rlhf_lit`` prints the total; ``--files`` lists every file's count,
largest first. A line counts when a token other than a comment or a line break lies on it (a string
spanning several lines counts each of its lines), except the lines of a module's, class's or function's
docstring. Run it on formatted code (``make lint`` passes), so that a count measures code, not packing.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path

NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def docstring_lines(tree: ast.AST) -> set[int]:
    """The line numbers of every module, class and function docstring in ``tree``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source: str) -> int:
    """The number of lines of ``source`` that hold code."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstring_lines(ast.parse(source)))


def main(argv: list[str] | None = None) -> None:
    """Print the code lines of the trees given (and of each file with ``--files``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="folders or files")
    parser.add_argument("--files", action="store_true", help="list each file's count, largest first")
    args = parser.parse_args(argv)
    counts = {
        path: code_lines(path.read_text())
        for root in args.paths
        for path in sorted(root.rglob("*.py") if root.is_dir() else [root])
    }
    if args.files:
        for path, n in sorted(counts.items(), key=lambda item: -item[1]):
            print(f"{n:6d}  {path}")
    print(sum(counts.values()))


if __name__ == "__main__":
    main()
