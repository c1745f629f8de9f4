"""Link the installed distributions that ``rlhf-lit[demo]`` declares, and nothing else, into a folder.

``python .ci/declared_dependencies.py PYPROJECT OUT``, run by the checkout's ``.venv`` interpreter
(.ci/check_install): from the ``[project]`` table of PYPROJECT, the requirements of the package and
of its ``demo`` extra, then theirs, and so on (each with the extras asked of it, markers evaluated);
every distribution of that closure found installed in this environment gets its top-level files and
folders, its ``.dist-info`` included, linked into OUT. A fresh virtual environment that reads OUT
through a path file then imports those and only those: a module the package imports without
declaring it fails there as in a user's environment, while nothing is downloaded or unpacked again.
(A namespace folder that several distributions share is linked whole, with the parts of the others.)

Exits 3, writing nothing, when a declared distribution is not installed here: the caller then
installs everything into the fresh environment instead.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def _applies(requirement: Requirement, extras: set[str]) -> bool:
    """Whether ``requirement`` holds for a distribution asked with ``extras`` (and without any)."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras | {""})


def declared_closure(pyproject: Path, extra: str) -> dict[str, metadata.Distribution]:
    """The installed distributions the project and its ``extra`` require, transitively, by name."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    queue = [Requirement(r) for r in project["dependencies"]]
    queue += [r for r in map(Requirement, project["optional-dependencies"][extra]) if _applies(r, set())]
    asked: dict[str, set[str]] = {}
    found: dict[str, metadata.Distribution] = {}
    while queue:
        requirement = queue.pop()
        name, extras = canonicalize_name(requirement.name), set(requirement.extras)
        if name in asked and extras <= asked[name]:
            continue
        asked[name] = asked.get(name, set()) | extras
        found[name] = metadata.distribution(requirement.name)  # PackageNotFoundError: not installed here
        queue += [r for r in map(Requirement, found[name].requires or []) if _applies(r, asked[name])]
    return found


def link_top_levels(distributions: dict[str, metadata.Distribution], out: Path) -> int:
    """Link each distribution's top-level entries of site-packages into ``out``; returns how many."""
    out.mkdir(parents=True)
    for distribution in distributions.values():
        site = Path(distribution.locate_file(""))
        for top in {Path(f).parts[0] for f in distribution.files or []} - {".."}:  # '..': scripts, data
            link = out / top
            if not link.exists() and (site / top).exists():
                link.symlink_to(site / top)
    return sum(1 for _ in out.iterdir())


def main() -> int:
    pyproject, out = Path(sys.argv[1]), Path(sys.argv[2])
    try:
        distributions = declared_closure(pyproject, "demo")
    except metadata.PackageNotFoundError as missing:
        print(f"declared_dependencies: {missing.name} is not installed in {sys.prefix}", file=sys.stderr)
        return 3
    entries = link_top_levels(distributions, out)
    print(f"declared_dependencies: {len(distributions)} distributions, {entries} entries linked into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
