"""The forked ``rlhf-lit`` of tests/cli_forked.py is a process as the console script starts one: its
own exit status and output, stdin on /dev/null, Python's default signal handling, none of the test
process's exit handlers, and a refusal of what a fork cannot reset."""

from __future__ import annotations

import atexit
import os
import signal
import time

import cli_forked
import pytest
import torch
from cli_helpers import error_line, rlhf_lit


def test_an_option_error_reads_as_the_console_scripts(tmp_path):
    forked = cli_forked.run("fit", "--no-such-option", "1", cwd=tmp_path)
    real = rlhf_lit("fit", "--no-such-option", "1", cwd=tmp_path)
    assert forked.returncode == real.returncode == 2
    assert error_line(forked) == error_line(real) and "--no-such-option" in error_line(forked)
    assert forked.stdout == real.stdout


def test_the_fork_starts_clean_and_leaves_the_test_process_alone(tmp_path):
    marker = tmp_path / "parent-exit-handler-ran"
    atexit.register(marker.write_text, "x")  # the test process's own: a fork must not run it
    try:
        help_run = cli_forked.start(["fit", "--help"], cwd=tmp_path, stdout=tmp_path / "out", stderr=tmp_path / "err")
        assert help_run.wait(60) == 0
        # stdin is /dev/null, not the test process's: an empty config, refused at once
        from_stdin = cli_forked.start(["fit", "--config", "/dev/stdin"], cwd=tmp_path, stdout=tmp_path / "out2")
        assert from_stdin.wait(60) != 0
    finally:
        atexit.unregister(marker.write_text)
    assert "usage:" in (tmp_path / "out").read_text() and not marker.exists()
    assert os.getcwd() != str(tmp_path)  # the fork's chdir is its own


def test_the_fork_starts_with_nothing_compiled_as_a_new_interpreter_does(tmp_path):
    """The test process compiled a graph and counted it (an earlier compiled test on the same worker);
    a script forked from it counts from 0 and compiles its own graph, as in a new interpreter (the
    benchmark's eager runs read these totals: CI's failure on an empty compile cache)."""
    from rlhf_lit.models import compiled_generation

    double = torch.compile(lambda x: x * 2, backend="eager")
    double(torch.ones(2))
    saved = vars(compiled_generation.COMPILE_STATS).copy()
    compiled_generation.COMPILE_STATS.graphs += 1
    script = tmp_path / "totals.py"
    script.write_text(
        "import torch\n"
        "from torch._dynamo.utils import counters\n"
        "from rlhf_lit.models.compiled_generation import compile_stats\n"
        "print(compile_stats().graphs, counters['stats']['unique_graphs'])\n"
    )
    try:
        forked = cli_forked.run_script(script, cwd=tmp_path)
    finally:
        vars(compiled_generation.COMPILE_STATS).update(saved)
    assert forked.returncode == 0, forked.stderr
    assert forked.stdout.split() == ["0", "0"]


def test_a_crash_in_the_fork_is_reported_with_its_python_stack(tmp_path, capfd):
    """A fork killed by SIGSEGV (CI lost rank 0 of an fsdp2 run so, its stack nowhere to read) writes
    Python's crash report into its own stderr, and the test's stderr repeats it (a test's message
    quotes the end of the output, where the other rank's lost-connection error comes last)."""
    script = tmp_path / "crash.py"
    script.write_text(
        "import ctypes\nimport resource\n\nresource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file\n\n\n"
        "def read_address_zero():\n    ctypes.string_at(0)\n\n\nread_address_zero()\n"
    )
    forked = cli_forked.run_script(script, cwd=tmp_path)
    assert forked.returncode == -signal.SIGSEGV
    report = forked.stderr[forked.stderr.index("Fatal Python error: Segmentation fault") :]
    assert "read_address_zero" in report and "crash.py" in report
    assert "the run ended with status -11, and a process of it crashed" in capfd.readouterr().err


def test_a_crash_of_a_process_the_run_started_is_reported_when_the_run_fails(tmp_path, capfd):
    """The other way round: a child sharing the run's stderr crashes (a rank), the run itself exits 1
    (the lost connection); the child's report is repeated on the test's stderr too."""
    script = tmp_path / "child_crash.py"
    script.write_text(
        "import ctypes, os, resource, sys\n\nresource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
        "pid = os.fork()\nif pid == 0:\n    ctypes.string_at(0)\n"
        "os.waitpid(pid, 0)\nsys.exit(1)\n"
    )
    forked = cli_forked.run_script(script, cwd=tmp_path)
    assert forked.returncode == 1
    assert "Fatal Python error: Segmentation fault" in forked.stderr
    assert "the run ended with status 1, and a process of it crashed" in capfd.readouterr().err


def test_sigterm_has_its_default_action_in_the_fork_whatever_the_test_process_installed(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # opening the config blocks until a writer comes: the run waits in its parser
    before = signal.signal(signal.SIGTERM, lambda *_: None)  # a handler a fresh process would not have
    writer = None
    try:
        proc = cli_forked.start(["fit", "--config", str(fifo)], cwd=tmp_path, stdout=tmp_path / "out")
        for _ in range(3000):  # the fork's open() of the config is waiting once a writer can open it
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "out").read_text()
                time.sleep(0.02)
        assert writer is not None, "the fork never opened its config"
        proc.send_signal(signal.SIGTERM)  # the fork now blocks reading a config nobody writes
        assert proc.wait(60) == -signal.SIGTERM  # the default action, as in a fresh interpreter
    finally:
        signal.signal(signal.SIGTERM, before)
        if writer is not None:
            os.close(writer)


def test_a_variable_read_at_import_is_refused(tmp_path):
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE"):
        cli_forked.start(["fit", "--help"], cwd=tmp_path, stdout=tmp_path / "out", env={"HF_HUB_OFFLINE": "1"})


def test_a_logging_handler_left_on_a_closed_stream_by_an_earlier_test_does_not_break_the_fork(tmp_path):
    import logging

    stale = open(tmp_path / "captured", "w")  # noqa: SIM115  (as basicConfig leaves one on a test's capture file)
    handler = logging.StreamHandler(stale)
    logging.getLogger().addHandler(handler)
    stale.close()
    try:
        forked = cli_forked.run("fit", "--no-such-option", "1", cwd=tmp_path)
    finally:
        logging.getLogger().removeHandler(handler)
    assert forked.returncode == 2 and "--no-such-option" in error_line(forked), forked.stderr
    assert handler.stream is stale  # the test process's handler is untouched


@pytest.mark.slow
def test_a_rank_forked_from_rank_0_prints_and_trains_what_a_rank_in_a_new_interpreter_does(tmp_path):
    from cli_helpers import TINYSTORIES, sft_config, write_yaml
    from safetensors.torch import load_file

    runs = {}
    for fork_ranks in (True, False):
        root = tmp_path / f"fork_ranks_{fork_ranks}"
        config = sft_config(root, TINYSTORIES, max_steps=1)
        config["trainer"].update(strategy="ddp", devices=2)
        write_yaml(root / "config.yaml", config)
        result = cli_forked.run("fit", "--config", str(root / "config.yaml"), cwd=root, fork_ranks=fork_ranks)
        assert result.returncode == 0, result.stderr[-3000:]
        lines = [line for line in result.stderr.replace(str(root), "ROOT").splitlines() if line and "it/s]" not in line]
        runs[fork_ranks] = (
            set(lines),
            result.stdout.replace(str(root), "ROOT"),
            load_file(root / "export" / "model.safetensors"),
        )
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in runs[True][0]
    # The same messages (a fork of the test process may print a Lightning message twice: its loggers
    # were set up under pytest's) and the same stdout: rank 0's export line once.
    assert runs[True][:2] == runs[False][:2] and runs[True][1].count("[rlhf-lit] exported") == 1
    assert all(torch.equal(runs[True][2][name], value) for name, value in runs[False][2].items())
