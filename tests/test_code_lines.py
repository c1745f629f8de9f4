"""scripts/code_lines.py counts the lines that hold code: docstrings, comments and blank lines left out."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from assets_paths import ROOT
from suite_env import subprocess_env

SCRIPT = ROOT / "scripts" / "code_lines.py"

SOURCE = '''"""A module docstring
over two lines."""

import os  # a comment after code counts as code


def f(a):
    """One line of docstring."""
    # a comment alone
    text = """a string over
two lines"""
    return (a,
            text)


class C:
    """Doc."""

    x = 1
'''
# Code by hand: import (4), def (7), text = (10), its second line (11), return (12), its tail (13),
# class (16), x = 1 (19): 8 lines. Not code: both docstring lines (1, 2), line 8, the comment (9),
# the class docstring (17), blank lines.


def _module():
    spec = importlib.util.spec_from_file_location("code_lines", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_counts_code_not_docstrings_comments_or_blank_lines():
    assert _module().code_lines(SOURCE) == 8


def test_the_command_prints_the_total_of_a_tree(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(SOURCE)
    (tmp_path / "pkg" / "b.py").write_text("x = 1\n\n# comment\n")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "pkg")], capture_output=True, text=True, env=subprocess_env()
    )
    assert out.returncode == 0 and out.stdout.split() == ["9"]
