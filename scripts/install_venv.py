"""Install the project into a virtual environment with uv, from the indexes pip is configured with.

``make install`` runs it with the new environment's Python:
``.venv/bin/python scripts/install_venv.py -c constraints/dev.txt -e '.[test,demo,...]'``. It installs
uv into that environment (pip, from PyPI), translates pip's configuration (``pip config list``:
the index, the extra indexes, the find-links folders, the constraint files, from the environment,
site, user and global files, the first that sets a key winning as in pip) into uv's options, and
runs ``uv pip install`` with them. uv resolves and links the same distributions pip would (the
same pins: ``constraints/dev.txt``) in seconds where pip unpacked them for more than a minute
(docs/development.md). Where uv cannot be installed or fails, it says so in one line and pip
installs instead, so a machine without uv still gets its environment.

No bytecode is written at install: the Makefile lets Python write it as modules are first imported
(only what runs is compiled: ~3,000 files of the ~15,000 installed).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

# pip's option -> uv's; each takes a list in pip's configuration (separated by spaces or newlines).
LIST_OPTIONS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint"}
SCOPE_ORDER = (":env:", "site", "user", "global")
"""pip reads its environment variables over the site, user and global files (the first that sets a key wins)."""


def pip_settings() -> dict[str, str]:
    """``{key: value}`` from ``pip config list``, each key from the first scope of :data:`SCOPE_ORDER` setting it."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    found: dict[str, dict[str, str]] = {}
    for line in out.stdout.splitlines():
        name, sep, value = line.partition("=")
        scope, dot, key = name.rpartition(".")
        if sep and dot:  # pip prints each value's repr: a list set over several lines is 'a\\nb'
            found.setdefault(key, {})[scope] = ast.literal_eval(value.strip())
    ranked = {scope: i for i, scope in enumerate(SCOPE_ORDER)}
    return {key: min(scopes.items(), key=lambda s: ranked.get(s[0], len(ranked)))[1] for key, scopes in found.items()}


def uv_options(settings: dict[str, str]) -> list[str]:
    """uv's options for pip's ``settings``: where to find distributions, with pip's choice among indexes
    (the best version over all of them, ``unsafe-best-match``) rather than uv's first index."""
    options = ["--index-strategy", "unsafe-best-match"]
    if "index-url" in settings:
        options += ["--index-url", settings["index-url"]]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    for key, flag in LIST_OPTIONS.items():
        for value in settings.get(key, "").split():
            options += [flag, value]
    return options


def install(args: list[str]) -> int:
    """``uv pip install <args>`` into this Python's environment, or ``pip install <args>`` where uv fails."""
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", *args]
    try:
        settings = pip_settings()
        subprocess.run([sys.executable, "-m", "pip", "install", "-qq", "uv"], check=True)
        env = dict(os.environ)
        if "cert" in settings:
            env.setdefault("SSL_CERT_FILE", settings["cert"])
        uv = [sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", sys.executable]
        subprocess.run([*uv, *uv_options(settings), *args], check=True, env=env)
        return 0
    except (subprocess.CalledProcessError, OSError, ValueError, SyntaxError) as error:  # (a value pip printed oddly)
        print(f"install_venv: uv did not install ({error}); installing with pip", file=sys.stderr)
    return subprocess.run(pip).returncode


if __name__ == "__main__":
    sys.exit(install(sys.argv[1:]))
