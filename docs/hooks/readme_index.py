"""mkdocs hook: the site's landing page is the README followed by the contents of the documentation.

``docs/index.md`` is the contents page (plain markdown that reads on GitHub too); on the site this hook
serves ``README.md``'s markdown in front of it, so README and site never disagree. The README's links
into ``docs/`` are made relative to the site and its links to files outside the site (the assets'
licences, the changelog) written as plain file names; the contents' headings move one level down.
"""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
_OUTSIDE = re.compile(r"\[([^\]]+)\]\(((?!docs/|https?://|#)[^)]+)\)")


def site_markdown(readme: str) -> str:
    """``readme`` with ``](docs/X)`` links as ``](X)`` and links outside ``docs/`` as code spans."""
    text = _OUTSIDE.sub(
        lambda m: m.group(1) if m.group(1).startswith("`") else f"{m.group(1)} (`{m.group(2)}`)", readme
    )
    return text.replace("](docs/", "](")


def contents_markdown(index: str) -> str:
    """``index`` (``docs/index.md``) with every heading one level down, to follow the README's title."""
    return re.sub(r"^(#+) ", r"#\1 ", index, flags=re.MULTILINE)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Serve the README, then the contents, as the landing page."""
    if page.file.src_uri == "index.md":
        return site_markdown(README.read_text(encoding="utf-8")) + "\n\n" + contents_markdown(markdown)
    return markdown
