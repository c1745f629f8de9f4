"""How ``make test`` and ``make test-all`` share the suite between their 2 pytest-xdist workers: the
units of work (a test module, or a group of modules one worker runs) and the order they are sent in,
longest first. tests/conftest.py hands these to pytest-xdist; tests/test_tiers.py checks them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

CHAIN_GROUP = "offline-chain"
CHAIN_MODULES = (
    "tests/cli/test_run_dir.py",
    "tests/cli/test_commands_cli.py",
    "tests/cli/test_chat_configs.py",
    "tests/bench/test_rm_length_bias.py",
    "tests/demo/test_frontier.py",
)
"""The modules with tests that read the session's SFT -> RM -> PPO chain (conftest's ``offline_chain``):
one xdist scope, so one worker builds the chain while the other goes on with the rest. A reader in
another module still works (the build is shared under a file lock); it may wait for it, though."""

MULTIPROCESS_GROUP = "two-process-runs"
MULTIPROCESS_MODULES = (
    "tests/cli/test_resume_cli.py",
    "tests/cli/test_strategies_cli.py",
    "tests/cli/test_multinode_cli.py",
    "tests/cli/test_lora_fsdp_cli.py",
    "tests/cli/test_preemption_cli.py",
    "tests/cli/test_guard_ddp_cli.py",
    "tests/ppo/test_ddp.py",
    "tests/ppo/test_groups_ddp.py",
    "tests/ppo/test_strategies.py",
    "tests/test_two_ranks.py",
)
"""The modules that launch runs of two processes (ddp, fsdp2 over gloo): one xdist scope, so at most
one such run shares the 2 cores with the other worker's test. Two of them at once (four processes
on two cores) once lost a rank in the fsdp2 kill-and-resume test. In ``make test`` the group holds
their single-process tests only (the killed, signalled and resumed runs), still the longest unit."""


def xdist_scope(nodeid: str) -> str:
    """The unit of work pytest-xdist sends to one worker: the test's module (its module-scoped
    fixtures are then built once), :data:`CHAIN_GROUP` for the modules in :data:`CHAIN_MODULES`, or
    :data:`MULTIPROCESS_GROUP` for those in :data:`MULTIPROCESS_MODULES`."""
    module = nodeid.split("::")[0]
    if module in CHAIN_MODULES:
        return CHAIN_GROUP
    return MULTIPROCESS_GROUP if module in MULTIPROCESS_MODULES else module


def unit_rank(scope: str, items: Sequence[pytest.Item]) -> tuple[int, int]:
    """The longest units first: :data:`MULTIPROCESS_GROUP` (the suite's longest), :data:`CHAIN_GROUP`,
    then the units with slow tests among ``items`` (the most slow tests first), then the rest."""
    slow = sum(1 for item in items if item.get_closest_marker("slow"))
    return {MULTIPROCESS_GROUP: 0, CHAIN_GROUP: 1}.get(scope, 2), -slow


def longest_units_first(items: Sequence[pytest.Item]) -> list[pytest.Item]:
    """``items`` (the selected tests, in collection order) grouped by :func:`xdist_scope` and sorted by
    :func:`unit_rank`; collection order within a unit and between units of one rank. Given the tests
    ``-m`` kept, so a slow test ``make test`` leaves out does not move its module's fast tests ahead."""
    scopes: dict[str, list[pytest.Item]] = {}
    for item in items:
        scopes.setdefault(xdist_scope(item.nodeid), []).append(item)
    ordered = sorted(scopes.items(), key=lambda scope: unit_rank(*scope))  # stable: collection order kept
    return [item for _, unit in ordered for item in unit]
