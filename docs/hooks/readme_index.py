"""mkdocs hook: the site's landing page is the README, so the two never disagree.

``docs/index.md`` holds only a pointer; this hook replaces its markdown with ``README.md``'s, with
the README's links into ``docs/`` made relative to the site and its links to files outside the
site (the assets' licences, the changelog) written as plain file names.
"""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
_OUTSIDE = re.compile(r"\[([^\]]+)\]\(((?!docs/|https?://|#)[^)]+)\)")


def site_markdown(readme: str) -> str:
    """``readme`` with ``](docs/X)`` links as ``](X)`` and links outside ``docs/`` as code spans."""
    text = _OUTSIDE.sub(lambda m: m.group(1) if m.group(1).startswith("`") else f"{m.group(1)} (`{m.group(2)}`)", readme)
    return text.replace("](docs/", "](")


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Serve the README as the landing page."""
    if page.file.src_uri == "index.md":
        return site_markdown(README.read_text(encoding="utf-8"))
    return markdown
