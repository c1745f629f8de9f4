"""The ways a file rlhf-lit reads back is found damaged after a crash, a full disk or a failed copy: cut
short, zero bytes, another format, JSON that does not parse, a missing tensor record, gone."""

from __future__ import annotations

import zipfile
from pathlib import Path

NOT_THE_FORMAT = b"<html><body>502 Bad Gateway</body></html>\n"
"""What a failed download saves under the file's name: another format altogether."""


def cut_in_half(data: bytes) -> bytes:
    """The first half of ``data``: a copy cut short."""
    return data[: len(data) // 2]


DAMAGES = {
    "truncated": cut_in_half,
    "empty": lambda data: b"",
    "not_the_format": lambda data: NOT_THE_FORMAT,
    "unparsable": lambda data: data.replace(b"{", b"{,", 1),
}
"""Each damage as bytes -> bytes (``unparsable``: a JSON file with one stray comma)."""


def drop_a_tensor(data: bytes, path: Path) -> None:
    """Write ``data`` (a torch zip) to ``path`` without one of its tensor records: a missing member."""
    source = path.with_suffix(".whole")
    source.write_bytes(data)
    with zipfile.ZipFile(source) as whole, zipfile.ZipFile(path, "w") as part:
        dropped = [n for n in whole.namelist() if "/data/" in n][-1]
        for name in whole.namelist():
            if name != dropped:
                part.writestr(name, whole.read(name))
    source.unlink()


def damage_file(path: Path, damage: str) -> None:
    """Damage the file at ``path`` in place (``missing``: delete it; ``missing_member``: drop a tensor)."""
    data = path.read_bytes()
    if damage == "missing":
        path.unlink()
    elif damage == "missing_member":
        drop_a_tensor(data, path)
    else:
        path.write_bytes(DAMAGES[damage](data))
