"""The environment every test runs in, whatever the caller exported.

rlhf-lit and the libraries under it read switches from the environment: ``RLHF_LIT_DEBUG``
(tracebacks instead of the one error line), the Hugging Face offline flags, endpoint and cache
(how a hub name is loaded and what an error says), Lightning's seed (the seeds derived from
``seed_everything``), a launcher's or a cluster's process variables (Lightning would join their
job), thread counts. A test that passes only in the caller's environment tests that environment, not
rlhf-lit; so the suite runs in one it sets itself:

- ``tests/conftest.py`` calls :func:`control_this_process` before anything imports the Hugging Face
  libraries (they read their switches once, at import);
- every helper that starts a process passes ``env=subprocess_env(...)``, and the in-process runs of
  ``rlhf_lit.cli.main`` (``tests/cli_in_process.py``) run in ``subprocess_env(...)`` too, so what an
  earlier test left in ``os.environ`` (``seed_everything`` sets ``PL_GLOBAL_SEED``) does not leak;
- a test that needs a switch passes it (``env={"HF_HUB_OFFLINE": "1"}``).

``tests/test_suite_env.py`` runs the test that once depended on the caller's ``HF_HUB_OFFLINE`` with
every switch below exported.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Mapping

REMOVED = (
    "RLHF_LIT_DEBUG",  # rlhf-lit: tracebacks instead of one error line
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",  # hub names from the cache only
    "HF_ENDPOINT",  # where the hub (and rlhf-lit's reachability probe) is
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "TRANSFORMERS_CACHE",
    "HF_DATASETS_CACHE",
    "HF_ASSETS_CACHE",
    "HF_TOKEN",
    "HF_TOKEN_PATH",
    "HUGGING_FACE_HUB_TOKEN",  # the caller's cache and credentials
    "TRANSFORMERS_VERBOSITY",
    "HF_HUB_VERBOSITY",
    "PYTHONWARNINGS",  # more (or fewer) lines on stderr
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",  # no hub probe behind one
    "PL_GLOBAL_SEED",
    "PL_SEED_WORKERS",  # Lightning's seed (rlhf-lit derives unset seeds from it)
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",  # a launcher's process group: Lightning would join it
)
"""Variables removed from every test's environment (a test that needs one passes it)."""
REMOVED_PREFIXES = ("SLURM_", "TORCHELASTIC_", "LSB_", "OMPI_", "PMI_")
"""Cluster schedulers' and launchers' variables: Lightning detects those clusters by them."""
FIXED = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""Set in every test's environment: one thread per process (two threads under load on two cores were
measured 10-50x slower), no tokenizer thread pool in processes that fork."""
HF_HOME = "HF_HOME"
"""Set to an empty folder of this test session (:func:`control_this_process`): no hub name is in its cache."""


def controlled(environ: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` without :data:`REMOVED` and :data:`REMOVED_PREFIXES`, with :data:`FIXED`, then ``extra``.

    Everything else is kept: ``PATH``, ``PYTHONPATH`` (the checkout under test), ``HF_HOME`` as the
    session set it, ``ATEN_CPU_CAPABILITY`` (the portable-kernel run), ``TMPDIR``.
    """
    env = {k: v for k, v in environ.items() if k not in REMOVED and not k.startswith(REMOVED_PREFIXES)}
    env.update(FIXED)
    env.update(extra or {})
    return env


def subprocess_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process a test starts: this process's, :func:`controlled`, plus ``extra``."""
    return controlled(os.environ, extra)


def control_this_process() -> None:
    """Make this process's environment :func:`controlled`, with ``HF_HOME`` an empty folder of its own.

    Call it before anything imports ``huggingface_hub`` or ``transformers``: they read their switches
    (offline mode, endpoint, cache folders) once, when imported. The folder is removed at exit.
    """
    env = controlled(os.environ)
    home = tempfile.mkdtemp(prefix="rlhf-lit-tests-hf-home-")
    atexit.register(shutil.rmtree, home, True)
    env[HF_HOME] = home
    os.environ.clear()
    os.environ.update(env)
