"""scripts/install_venv.py (``make install``): pip's configuration becomes uv's options, the first scope
that sets a key winning as in pip, and pip installs where uv fails."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import pytest
from assets_paths import ROOT


@pytest.fixture
def install_venv(monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ in scripts/
    spec = importlib.util.spec_from_file_location("install_venv", ROOT / "scripts" / "install_venv.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PIP_CONFIG = """\
:env:.find-links='/env/wheels'
global.cert='/etc/ssl/ca.crt'
global.constraint='/etc/pip/constraints.txt'
global.extra-index-url='file:///a/simple file:///b/simple'
global.find-links='/opt/wheels'
user.index-url='https://mirror.example/simple'
global.index-url='https://other.example/simple'
"""


def test_pip_settings_take_each_key_from_the_first_scope_that_sets_it(install_venv, monkeypatch):
    monkeypatch.setattr(install_venv.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=PIP_CONFIG))
    settings = install_venv.pip_settings()
    assert settings == {
        "find-links": "/env/wheels",  # the environment over the global file
        "cert": "/etc/ssl/ca.crt",
        "constraint": "/etc/pip/constraints.txt",
        "extra-index-url": "file:///a/simple file:///b/simple",
        "index-url": "https://mirror.example/simple",  # the user file over the global one
    }
    assert install_venv.uv_options(settings) == [
        "--index-strategy",
        "unsafe-best-match",
        "--index-url",
        "https://mirror.example/simple",
        "--extra-index-url",
        "file:///a/simple",
        "--extra-index-url",
        "file:///b/simple",
        "--find-links",
        "/env/wheels",
        "--constraint",
        "/etc/pip/constraints.txt",
    ]
    assert "--no-index" in install_venv.uv_options({"no-index": "true"})


def test_a_list_set_over_several_lines_gives_one_option_per_line(install_venv, monkeypatch):
    # pip.conf's "find-links =\n    /a\n    /b", as `pip config list` prints it (the value's repr)
    printed = "global.find-links='\\n/a\\n/b'\n"
    monkeypatch.setattr(install_venv.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=printed))
    settings = install_venv.pip_settings()
    assert settings == {"find-links": "\n/a\n/b"}
    assert install_venv.uv_options(settings)[2:] == ["--find-links", "/a", "--find-links", "/b"]


def test_pip_installs_when_uv_fails(install_venv, monkeypatch, capsys):
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        if command[:3] == [sys.executable, "-m", "uv"]:
            raise subprocess.CalledProcessError(2, command)
        return SimpleNamespace(stdout="", returncode=0)

    monkeypatch.setattr(install_venv.subprocess, "run", run)
    assert install_venv.install(["-e", "."]) == 0
    assert calls[-1] == [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "-e", "."]
    assert "uv did not install" in capsys.readouterr().err
