"""The offline assets ship with the project: every file listed in assets/README.md is there, unchanged,
and nothing in the project reads the development machines' asset sources beside the checkout instead."""

import hashlib
import re
from pathlib import Path

from assets_paths import ASSETS, ROOT

# A path that leaves the checkout for assets: "../<folder>/assets" in a config or doc, or
# "ROOT.parent / "<folder>" / "assets"" (or parents[k]) in code.
SOURCES = re.compile(r"\.\./[\w.-]+/assets|\.parents?(?:\[\d+\])?\s*/\s*[\"'][\w.-]+[\"']\s*/\s*[\"']assets[\"']")
CHECKSUM = re.compile(r"^([0-9a-f]{64})  (\S+)$", re.MULTILINE)


def listed() -> dict[str, str]:
    """``{path: sha256}`` from the checksum block of assets/README.md."""
    return {path: digest for digest, path in CHECKSUM.findall((ASSETS / "README.md").read_text(encoding="utf-8"))}


def test_every_listed_asset_is_shipped_unchanged():
    files = listed()
    assert len(files) >= 9  # the model's 5 files, 4 data files at least, the tokenizer's 2
    for path, digest in files.items():
        data = (ASSETS / path).read_bytes()  # a missing file fails here
        assert hashlib.sha256(data).hexdigest() == digest, f"assets/{path} differs from its source copy"


def test_every_shipped_asset_is_listed_with_a_licence():
    shipped = {str(p.relative_to(ASSETS)) for p in ASSETS.rglob("*") if p.is_file()}
    shipped -= {"README.md"} | {s for s in shipped if s.startswith("licenses/")}
    assert shipped == set(listed())
    text = (ASSETS / "README.md").read_text(encoding="utf-8")
    for licence in re.findall(r"\(licenses/([^)]+)\)", text):
        assert (ASSETS / "licenses" / licence).stat().st_size > 500, licence


def test_nothing_reads_assets_from_outside_the_checkout():
    # Only the optional peer benchmark (bench/ppo_throughput.py) may point beside the checkout (its peer-bench).
    offenders = []
    for folder in ("rlhf_lit", "configs", "tests", "bench", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if (
                path.suffix in {".py", ".yaml", ".md", ".sh", ".toml"}
                and path.name != "ppo_throughput.py"
                and path != Path(__file__).resolve()
            ):
                if SOURCES.search(path.read_text(encoding="utf-8")):
                    offenders.append(str(path.relative_to(ROOT)))
    for name in ("README.md", "Makefile"):
        if SOURCES.search((ROOT / name).read_text(encoding="utf-8")):
            offenders.append(name)
    assert offenders == []
