"""The house's layout rules, checked on the source: imports run one way through the layers, and no
two modules share a file name for different things.

``tests/functional/test_imports.py`` holds the stricter rule of ``functional/`` (torch only).
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlhf_lit"

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"", "functional", "artifacts", "callable_specs", "expected_warnings", "integrity", "run_seed"}),
    frozenset({"sources"}),
    frozenset({"tokenizer"}),
    frozenset({"models", "data"}),
    frozenset({"evaluation", "rewards"}),
    frozenset({"stages"}),
    frozenset({"callbacks", "strategies"}),
    frozenset({"commands"}),
    frozenset({"cli"}),
)
"""The part of the package each top-level module or subpackage (by name; ``""`` is
``rlhf_lit/__init__.py``) belongs to, lowest first. A module may import from its own layer's
packages only within the same package, and from lower layers freely: never upwards."""

SAME_CONCEPT_NAMES = frozenset({"__init__", "__main__", "base", "sft", "dpo"})
"""File names allowed in several packages because they hold one concept at different layers
(e.g. ``data/sft.py`` the SFT data, ``stages/sft.py`` the SFT stage, ``functional/dpo.py`` the DPO
loss)."""


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
    """Every import in ``package`` that goes to a higher layer, or sideways into another package of the same layer."""
    bad = []
    for path in sorted(package.rglob("*.py")):
        source = _component(_module_name(path, package))
        for line, target in imports_of(path):
            to = _component(target)
            if to == source:
                continue
            if _layer(to) >= _layer(source):
                bad.append(f"{path.relative_to(package.parent)}:{line} imports {target} "
                           f"(layer {_layer(to)} from layer {_layer(source)})")  # fmt: skip
    return bad


def test_every_import_runs_down_the_layers():
    assert layer_violations() == []


def test_the_layer_check_catches_an_upward_a_deferred_and_a_sideways_import(tmp_path):
    fake = tmp_path / "rlhf_lit"
    (fake / "models").mkdir(parents=True)
    (fake / "models" / "bad.py").write_text(
        "from rlhf_lit.functional import gae\n"
        "def f():\n    from rlhf_lit.stages.ppo import PPOModule\n",
        encoding="utf-8",
    )
    (fake / "evaluation.py").write_text("import rlhf_lit.rewards.functions\n", encoding="utf-8")
    assert layer_violations(fake) == [
        "rlhf_lit/evaluation.py:1 imports rlhf_lit.rewards.functions (layer 4 from layer 4)",
        "rlhf_lit/models/bad.py:3 imports rlhf_lit.stages.ppo (layer 5 from layer 3)",
    ]


def test_every_package_part_is_in_a_layer():
    for path in _modules():
        _layer(_component(_module_name(path)))


@pytest.mark.parametrize("name", sorted(SAME_CONCEPT_NAMES - {"__init__", "__main__"}))
def test_a_shared_file_name_is_still_in_use(name):
    assert len([p for p in _modules() if p.stem == name]) >= 2, f"{name}.py is no longer shared: drop it from the list"


def test_no_two_modules_share_a_file_name_for_different_things():
    counts = Counter(p.stem for p in _modules())
    shared = {name: sorted(str(p.relative_to(PACKAGE)) for p in _modules() if p.stem == name)
              for name, n in counts.items() if n > 1 and name not in SAME_CONCEPT_NAMES}  # fmt: skip
    assert shared == {}
