"""The suite runs in the environment it sets itself, whatever the caller exported (tests/suite_env.py)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from assets_paths import ROOT
from suite_env import FIXED, controlled, subprocess_env

HOSTILE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "RLHF_LIT_DEBUG": "1",
    "OMP_NUM_THREADS": "4",
    "PL_GLOBAL_SEED": "99",
    "HF_ENDPOINT": "http://127.0.0.1:9",
    "SLURM_NTASKS": "2",
    "HTTPS_PROXY": "http://127.0.0.1:9",
}
"""Switches a caller may have exported that once changed test results (``HF_HUB_OFFLINE`` did)."""


def test_the_callers_switches_are_dropped_threads_fixed_and_the_rest_kept():
    env = controlled(
        {**HOSTILE, "PATH": "/bin", "PYTHONPATH": "/src", "ATEN_CPU_CAPABILITY": "default"},
        extra={"HF_HUB_OFFLINE": "1"},
    )
    assert env == {
        "PATH": "/bin",
        "PYTHONPATH": "/src",
        "ATEN_CPU_CAPABILITY": "default",
        **FIXED,
        "HF_HUB_OFFLINE": "1",
    }  # what a test asks for is given
    assert FIXED["OMP_NUM_THREADS"] == "1"


def _process_calls_without_env(path) -> list[int]:
    """Lines of ``path`` that call ``subprocess.run`` / ``subprocess.Popen`` without ``env=``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("run", "Popen")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "subprocess"
            and not any(k.arg == "env" for k in node.keywords)
        ):
            lines.append(node.lineno)
    return lines


def test_every_process_a_test_starts_gets_an_explicit_environment():
    # (An env built from os.environ by hand would pass this; the helpers use suite_env.subprocess_env.)
    missing = {
        str(p.relative_to(ROOT)): lines
        for p in sorted((ROOT / "tests").rglob("*.py"))
        if (lines := _process_calls_without_env(p))
    }
    assert missing == {}


def test_this_process_and_the_processes_it_starts_run_in_the_suite_environment():
    """Trivially true in a plain run; the point is the run below, with :data:`HOSTILE` exported."""
    import huggingface_hub.constants

    child = subprocess.run(
        [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=subprocess_env(),
    )
    for env in (dict(os.environ), json.loads(child.stdout)):
        assert sorted((set(HOSTILE) - set(FIXED)) & set(env)) == []
        assert {k: env[k] for k in FIXED} == FIXED
        assert os.path.basename(env["HF_HOME"]).startswith("rlhf-lit-tests-hf-home-")  # the session's own cache
    # read by huggingface_hub once, at import: the suite's environment was set before that
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False
    assert huggingface_hub.constants.ENDPOINT == "https://huggingface.co"


def test_the_environment_sensitive_tests_pass_with_the_callers_switches_exported(tmp_path):
    """The hub error (it once failed under an exported ``HF_HUB_OFFLINE``) and the check above, run by
    pytest with :data:`HOSTILE` exported."""
    tests = [
        "tests/cli/test_reliability.py::test_a_hub_model_without_network_fails_at_once_with_the_cause",
        "tests/test_suite_env.py::test_this_process_and_the_processes_it_starts_run_in_the_suite_environment",
    ]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "--basetemp",
            str(tmp_path / "inner"),
            *tests,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=subprocess_env(HOSTILE),
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "2 passed" in result.stdout
