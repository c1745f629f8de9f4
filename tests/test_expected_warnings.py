"""The warnings the CLI silences (rlhf_lit/expected_warnings.py) are the ones pytest ignores (pyproject.toml), and
silencing is by message: an unlisted warning of the same category still shows."""

import warnings

import tomllib
from assets_paths import ROOT

from rlhf_lit.expected_warnings import EXPECTED_WARNINGS, silence_expected_noise


def test_pytest_ignores_exactly_the_warnings_the_cli_silences():
    filters = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["filterwarnings"]
    by_message = sorted(f.removeprefix("ignore:") for f in filters if f.startswith("ignore:") and "::" not in f)
    assert by_message == sorted(message for message, _ in EXPECTED_WARNINGS)


def test_only_the_listed_messages_are_silenced():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        silence_expected_noise()
        warnings.warn(
            "Found 72 module(s) in eval mode at the start of training. This may ...", UserWarning, stacklevel=1
        )
        warnings.warn("Found a checkpoint that does not match", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["Found a checkpoint that does not match"]
