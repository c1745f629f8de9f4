"""Suite-wide test settings and the fixtures shared by several test areas (the offline assets)."""

import os

from suite_env import FIXED, control_this_process

# The suite's own environment, whatever the caller exported (one thread per process, no debug
# switch, no Hugging Face offline flags, an empty cache: tests/suite_env.py), set before the
# Hugging Face libraries are imported: they read their switches once, at import.
control_this_process()

import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

# Warnings the tests provoke on purpose, or that come from how a test builds its own Trainer (not
# through rlhf-lit's CLI, whose own silenced list is rlhf_lit/expected_warnings.py = pyproject.toml's): a resume
# mid-epoch, a Trainer without max_epochs, a checkpoint folder reused, ModelCheckpoint under PPO's
# manual optimisation, LightningCLI called with args from Python, peft asking transformers for a
# deprecated attribute, the tiny data sets of the CLI runs made in process (an empty validation list),
# a NaN reward's skipped update that steps the LR schedule without the optimizer (on purpose).
# A user of `make test` cannot act on any of them.
TEST_SETUP_WARNINGS = (
    r"Be aware that when using `ckpt_path`, callbacks used to create the checkpoint",
    r"`max_epochs` was not set",
    r"You're resuming from a checkpoint that ended before the epoch ended",
    r"Checkpoint directory .* exists and is not empty",
    r"The dirpath has changed from",
    r"Using ModelCheckpoint with manual optimization",
    r"You defined a `validation_step` but have no `val_dataloader`",
    r"Total length of `(DataLoader|list)` across ranks is zero",
    r"LightningCLI's args parameter is intended to run from within Python",
    r"`is_gradient_checkpointing` is deprecated",
    r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`",
)


def pytest_configure(config):
    """Ignore :data:`TEST_SETUP_WARNINGS` (by message) in every test."""
    for message in TEST_SETUP_WARNINGS:
        config.addinivalue_line("filterwarnings", f"ignore:{message}")


# ---------------------------------------------------------------- pytest-xdist (make test, make test-all: -n 2)
from xdist_units import longest_units_first, xdist_scope  # noqa: E402


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with :func:`xdist_units.xdist_scope` as the scope (other modes as pytest-xdist has them).

    The units are sent in the order :func:`pytest_collection_modifyitems` gives them: pytest-xdist's
    own reordering (``--loadscope-reorder``, on by default: the units with the most tests first)
    is turned off, as it would send the two-process runs, the suite's longest unit, among the last.

    (``--dist loadgroup`` cannot do this here: pytest-xdist 3.8 marks groups by rewriting a node id
    attribute that pytest 9.2 no longer reads, so its groups are ignored.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ModuleScopeScheduling(LoadScopeScheduling):
        """Load-scope scheduling whose scopes are :func:`xdist_units.xdist_scope`'s."""

        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return ModuleScopeScheduling(config, log)


COMMAND_DIRS = ("tests/cli/", "tests/bench/")
"""The folders whose tests run a command end to end (``rlhf-lit``, the benchmark script) and assert
what it does: exit status, messages, files, and runs equal to runs on the same kernels. They carry
the ``command`` marker, which ``make test-portable`` leaves out unless a test is also ``kernels``:
none of them bounds a float32 difference between two summation orders."""


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Mark the tests in :data:`COMMAND_DIRS` ``command`` before ``-m`` selects by markers (a wrapper:
    this part runs before pytest's own hook), then order the tests ``-m`` and ``-k`` kept by
    :func:`xdist_units.longest_units_first`: two workers then start on the long runs and end on short
    tests (pytest-xdist sends the units in this order, :func:`pytest_xdist_make_scheduler`). The order
    differs from the files' with or without xdist; results must not depend on it."""
    for item in items:
        if item.nodeid.startswith(COMMAND_DIRS):
            item.add_marker(pytest.mark.command)
    result = yield
    items[:] = longest_units_first(items)
    return result


# The offline assets shipped with the project (see assets/README.md), named in one module.
from assets_paths import GPT2_TOKENIZER, STORIES260K, TINYSTORIES  # noqa: E402


@pytest.fixture(scope="session")
def two_layer_stories(tmp_path_factory) -> str:
    """stories260K with 2 of its 5 decoder layers (:func:`generation_helpers.truncated_stories`), for the tests
    whose cost is compiling the model (``ppo.forward`` / ``sampling.decode: compiled``): what passes
    from one layer to the next, and gradient checkpointing's recompute of more than one block, is
    still there, with 3 decoder layers fewer for TorchInductor to lower. One copy per worker."""
    from generation_helpers import truncated_stories

    return truncated_stories(tmp_path_factory.mktemp("stories-2-layers"), layers=2)


@pytest.fixture(autouse=True)
def no_run_seed_left_over():
    """Each test starts without a run seed: ``seed_everything`` in an earlier test of this worker set
    ``PL_GLOBAL_SEED``, which the seed options left unset would follow (:mod:`rlhf_lit.run_seed`)."""
    os.environ.pop("PL_GLOBAL_SEED", None)
    yield
    os.environ.pop("PL_GLOBAL_SEED", None)


@pytest.fixture(autouse=True)
def suite_switches_kept():
    """After each test, the suite's fixed switches (:data:`suite_env.FIXED`) as set at the start: a
    library may change one in this process (transformers' compiled ``generate`` sets
    ``TOKENIZERS_PARALLELISM=0``), which later tests of this worker would otherwise inherit."""
    yield
    os.environ.update(FIXED)


@pytest.fixture(scope="session")
def stories_path() -> str:
    """The real 260K-parameter Llama (vocab 512, pad 0 = <unk>, bos 1, eos 2)."""
    assert (STORIES260K / "model.safetensors").exists(), f"missing asset {STORIES260K}"
    return str(STORIES260K)


@pytest.fixture(scope="session")
def tinystories() -> str:
    """TinyStories validation paragraphs, blank-line separated (4,302 paragraphs)."""
    assert TINYSTORIES.exists(), f"missing asset {TINYSTORIES}"
    return str(TINYSTORIES)


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory) -> str:
    """A tiny random GPT-2 LM with the real GPT-2 tokenizer files (no pad token: one is added)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("tiny-gpt2")
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=128, vocab_size=50257)
    GPT2LMHeadModel(config).save_pretrained(path)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2_TOKENIZER / name, path / name)
    return str(path)


@pytest.fixture(scope="session")
def offline_chain(tmp_path_factory):
    """The session's SFT -> RM -> PPO chain through ``rlhf-lit fit --run_dir`` (tests/offline_chain.py).

    Built once: under pytest-xdist the workers share one build in the session's common temporary
    folder (the parent of each worker's own), guarded by a file lock; without xdist it lives in this
    session's temporary folder. Read-only: copy it (``offline_chain.copy_to(tmp_path / ...)``) to write.
    """
    from offline_chain import shared_chain

    if os.environ.get("PYTEST_XDIST_WORKER"):  # gw0, gw1, ...: one folder for the whole xdist session
        root = tmp_path_factory.getbasetemp().parent / "offline-chain"
    else:
        root = tmp_path_factory.getbasetemp() / "offline-chain"
    chain = shared_chain(root)
    for stage, result in chain.results.items():
        assert result.returncode == 0, f"the chain's {stage} stage failed:\n{result.stderr[-4000:]}"
    return chain


@pytest.fixture(scope="session")
def two_process_run(tmp_path_factory) -> Path:
    """The folder of the suite's one two-process launch (tests/ppo/two_process_worker.py): every part's
    ``<part>/rank<r>.pt``. Started once per session, on the worker that runs the two-process tests
    (:data:`xdist_units.MULTIPROCESS_MODULES`, one xdist scope); a failed or hung launch fails each test reading it."""
    import signal
    import subprocess
    import sys

    from suite_env import subprocess_env

    out = tmp_path_factory.mktemp("two-processes")
    tests = Path(__file__).resolve().parent
    worker = tests / "ppo" / "two_process_worker.py"
    # the parts' helpers: tests/ppo (ppo_helpers) and tests/ (assets_paths, two_ranks_worker)
    path = os.pathsep.join([str(tests / "ppo"), str(tests), os.environ.get("PYTHONPATH", "")])
    # Its own session, so a hung run's rank-1 process (started by rank 0) is killed with it.
    proc = subprocess.Popen(
        [sys.executable, str(worker), str(out)],
        cwd=out,
        env=subprocess_env({"PYTHONPATH": path}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=1500)  # ~1-2 min on 2 idle cores
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(
            f"the two-process launch hung (a rank waited in a collective for a rank that had stopped):\n"
            f"{stderr[-4000:]}"
        )
    assert proc.returncode == 0, stderr[-6000:]
    return out
