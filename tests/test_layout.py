"""The house's layout rules, checked on the source: imports run one way through the layers (the
ladder as tight as the code, the parts that never import each other, both equal to docs/CONTRACTS.md's
"Layers"), no import circle inside a package (``rlhf_lit/`` and ``demo/``), and no two modules share
a file name for different things.

``tests/functional/test_imports.py`` holds the stricter rule of ``functional/`` (torch only).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rlhf_lit"
CONTRACTS = ROOT / "docs" / "CONTRACTS.md"

LAYERS: tuple[frozenset[str], ...] = (
    frozenset(
        {
            "",
            "functional",
            "artifacts",
            "callable_specs",
            "child_runs",
            "config_files",
            "option_values",
            "expected_warnings",
            "integrity",
            "run_seed",
        }
    ),
    frozenset({"sources", "rewards"}),
    frozenset({"tokenizer", "models"}),
    frozenset({"data"}),
    frozenset({"evaluation"}),
    frozenset({"stages"}),
    frozenset({"callbacks", "strategies", "commands"}),
    frozenset({"cli"}),
)
"""The part of the package each top-level module or subpackage (by name; ``""`` is
``rlhf_lit/__init__.py``) belongs to, lowest first. A module may import from its own layer's
packages only within the same package, and from lower layers freely: never upwards. The ladder is
as tight as the code: every part sits one rung above the highest part it imports
(:func:`test_the_ladder_is_as_tight_as_the_code`), and docs/CONTRACTS.md's table is this one."""

NEVER: dict[str, frozenset[str]] = {"stages": frozenset({"data"}), "data": frozenset({"models"})}
"""What a part never imports although the ladder alone would let it, or would let it after a part
moved: the stages duck-type the data module; ``models`` and ``data`` know nothing of each other.
docs/CONTRACTS.md lists the same. (The demo, outside the package, has its own rule:
tests/demo/test_demo_imports.py.)"""

SAME_CONCEPT_NAMES = frozenset({"__init__", "__main__", "base", "sft", "dpo", "bonbon"})
"""File names allowed in several packages because they hold one concept at different layers
(e.g. ``data/sft.py`` the SFT data, ``stages/sft.py`` the SFT stage, ``functional/dpo.py`` the DPO
loss, and the BoNBoN loss and stage likewise)."""


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _component(module: str) -> str:
    """``rlhf_lit.stages.ppo.module`` -> ``stages``; ``rlhf_lit`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(component: str) -> int:
    for i, members in enumerate(LAYERS):
        if component in members:
            return i
    raise AssertionError(f"rlhf_lit/{component or '__init__'} belongs to no layer: add it to LAYERS in {__file__}")


def imports_of(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``rlhf_lit`` import in ``path``, deferred ones (inside a function) included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name == "rlhf_lit" or name.startswith("rlhf_lit.")]
    return found


def layer_violations(package: Path = PACKAGE) -> list[str]:
    """Every import in ``package`` that goes to a higher layer, sideways into another package of the
    same layer, or to a part its :data:`NEVER` entry names."""
    bad = []
    for path in sorted(package.rglob("*.py")):
        source = _component(_module_name(path, package))
        for line, target in imports_of(path):
            to = _component(target)
            if to == source:
                continue
            where = f"{path.relative_to(package.parent)}:{line} imports {target}"
            if to in NEVER.get(source, ()):
                bad.append(f"{where} (rlhf_lit.{source} never imports rlhf_lit.{to})")
            elif _layer(to) >= _layer(source):
                bad.append(f"{where} (layer {_layer(to)} from layer {_layer(source)})")
    return bad


def test_every_import_runs_down_the_layers():
    assert layer_violations() == []


def test_the_layer_check_catches_an_upward_a_deferred_a_sideways_and_a_never_import(tmp_path):
    fake = tmp_path / "rlhf_lit"
    (fake / "models").mkdir(parents=True)
    (fake / "stages").mkdir()
    (fake / "models" / "bad.py").write_text(
        "from rlhf_lit.functional import gae\n"
        "import rlhf_lit.tokenizer\n"
        "def f():\n    from rlhf_lit.stages.ppo import PPOModule\n",
        encoding="utf-8",
    )
    (fake / "stages" / "bad.py").write_text("import rlhf_lit.evaluation\nimport rlhf_lit.data\n", encoding="utf-8")
    assert layer_violations(fake) == [
        "rlhf_lit/models/bad.py:2 imports rlhf_lit.tokenizer (layer 2 from layer 2)",
        "rlhf_lit/models/bad.py:4 imports rlhf_lit.stages.ppo (layer 5 from layer 2)",
        "rlhf_lit/stages/bad.py:2 imports rlhf_lit.data (rlhf_lit.stages never imports rlhf_lit.data)",
    ]


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = ("rlhf_lit", "demo")) -> dict[str, list[str]]:
    """Each module of ``packages`` (under ``root``) -> ``"<file>:<line> imports <module>"`` for every
    import of another of their modules: at the top, inside a function, under ``TYPE_CHECKING``,
    relative or absolute. ``from a import b`` imports the module ``a.b`` when there is one, else ``a``;
    a package's ``__init__`` is a module like the others (importing ``a.b`` does not count as
    importing ``a``: every package's ``__init__`` would otherwise sit in a circle with its modules)."""
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, list[str]] = {}
    for module, path in files.items():
        here = module if path.stem == "__init__" else module.rpartition(".")[0]
        graph[module] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # ``from ..x import y``: up level - 1 packages from this module's own
                    anchor = ".".join(here.split(".")[: len(here.split(".")) - node.level + 1])
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            where = f"{path.relative_to(root)}:{node.lineno} imports "
            graph[module] += sorted({where + t for t in targets if t in files and t != module})
    return graph


def import_circles(graph: dict[str, list[str]]) -> list[str]:
    """Every import circle of ``graph``: a strongly connected component of more than one module
    (Tarjan), as its modules and the imports that close it."""
    targets = {m: [edge.rpartition(" imports ")[2] for edge in edges] for m, edges in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in targets[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while not component or module not in component:
                component.add(stack.pop())
            if len(component) > 1:
                inside = [e for m in sorted(component) for e in graph[m] if e.rpartition(" imports ")[2] in component]
                circles.append(f"{' <-> '.join(sorted(component))}: {'; '.join(inside)}")

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles)


def test_no_import_circle_inside_a_package():
    """Type-only imports included: a circle under ``TYPE_CHECKING`` is the same knot for a reader, and
    one moved out of it is an import error. Move the shared name down, or pass the object in."""
    circles = import_circles(import_graph())
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_circle_check_catches_type_only_deferred_relative_and_submodule_circles(tmp_path):
    files = {
        "pkg/__init__.py": "from pkg.a import A\n",  # a package and its modules: no circle
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\nA = 1\n",
        "pkg/b.py": "import os\n\ndef f():\n    from . import a\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from pkg.sub import d\n",
        "pkg/sub/d.py": "from ..sub.e import E\n",
        "pkg/sub/e.py": "import pkg.sub.c\nimport pkg.a\nE = 2\n",
        "pkg/sub/f.py": "from pkg import a, sub\nfrom pkg.sub import c\n",  # into circles, in none
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert import_circles(import_graph(tmp_path, ("pkg",))) == [
        "pkg.a <-> pkg.b: pkg/a.py:3 imports pkg.b; pkg/b.py:4 imports pkg.a",
        "pkg.sub.c <-> pkg.sub.d <-> pkg.sub.e: pkg/sub/c.py:1 imports pkg.sub.d; "
        "pkg/sub/d.py:1 imports pkg.sub.e; pkg/sub/e.py:1 imports pkg.sub.c",
    ]


def _imported_parts() -> dict[str, set[str]]:
    """Each part of the package -> the other parts it imports."""
    found: dict[str, set[str]] = {}
    for path in _modules():
        source = _component(_module_name(path))
        found.setdefault(source, set()).update(_component(t) for _, t in imports_of(path))
        found[source].discard(source)
    return found


def test_the_ladder_is_as_tight_as_the_code():
    """No part could move a rung down: each sits one above the highest part it imports (layer 0 when
    it imports none), so a rung left empty, or a part kept higher than its imports need, fails here."""
    loose = {
        part: (_layer(part), 1 + max((_layer(t) for t in targets), default=-1))
        for part, targets in _imported_parts().items()
    }
    assert {part: (at, lowest) for part, (at, lowest) in loose.items() if at != lowest} == {}, (
        "(layer, lowest possible)"
    )
    assert set().union(*LAYERS) == set(loose), "a part in LAYERS that no longer exists"


def _documented_layers() -> tuple[frozenset[str], ...]:
    """The "Layers" table of docs/CONTRACTS.md, its packages column as part names (``functional/`` and
    ``artifacts.py`` -> ``functional``, ``artifacts``; ``__init__.py`` -> ``""``)."""
    section = CONTRACTS.read_text(encoding="utf-8").split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    layers = []
    for i, (layer, packages) in enumerate(rows):
        assert int(layer) == i, f"docs/CONTRACTS.md's layer table: row {i} is numbered {layer.strip()}"
        names = re.findall(r"`([^`]+)`", packages)
        layers.append(frozenset("" if n == "__init__.py" else n.removesuffix("/").removesuffix(".py") for n in names))
    return tuple(layers)


def _documented_never() -> dict[str, frozenset[str]]:
    """The "never imports" lines of docs/CONTRACTS.md's "Layers" section: ``- `a` never imports `b`, `c` ...``."""
    section = CONTRACTS.read_text(encoding="utf-8").split("## Layers", 1)[1].split("\n## ", 1)[0]
    never = {}
    for line in section.splitlines():
        found = re.match(r"- `(\w+)/?` never imports ((?:`\w+/?`(?:, | or )?)+)", line)
        if found:
            never[found[1]] = frozenset(n.removesuffix("/") for n in re.findall(r"`(\w+/?)`", found[2]))
    return never


def test_the_documented_layers_are_the_enforced_ones():
    assert _documented_layers() == LAYERS
    assert _documented_never() == NEVER


def test_every_package_part_is_in_a_layer():
    for path in _modules():
        _layer(_component(_module_name(path)))


@pytest.mark.parametrize("name", sorted(SAME_CONCEPT_NAMES - {"__init__", "__main__"}))
def test_a_shared_file_name_is_still_in_use(name):
    assert len([p for p in _modules() if p.stem == name]) >= 2, f"{name}.py is no longer shared: drop it from the list"


def test_no_two_modules_share_a_file_name_for_different_things():
    counts = Counter(p.stem for p in _modules())
    shared = {
        name: sorted(str(p.relative_to(PACKAGE)) for p in _modules() if p.stem == name)
        for name, n in counts.items()
        if n > 1 and name not in SAME_CONCEPT_NAMES
    }
    assert shared == {}


MAX_LINES = 450


def test_no_source_file_is_over_450_lines():
    """A file a reader takes in at one sitting: split a longer one by job (re-exporting what it held)."""
    lines = {str(p.relative_to(PACKAGE)): len(p.read_text(encoding="utf-8").splitlines()) for p in _modules()}
    assert {path: n for path, n in lines.items() if n > MAX_LINES} == {}
