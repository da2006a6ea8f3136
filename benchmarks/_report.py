"""Write a benchmark's table into its own section of docs/benchmarks.md (other sections are kept)."""

from __future__ import annotations

import platform
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
HEADER = "# Benchmarks\n\nEach section is written by the script it names; rerun the script to refresh it.\n"


def machine() -> str:
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or platform.machine()
    return f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, device: {dev}"


def shown(path: Path) -> str:
    """A path as a command in docs/benchmarks.md gives it: from the repository's root when it lies inside."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


DETAILS = ROOT / "docs" / "benchmarks"
"""One page per section with its whole tables and contact sheets; docs/benchmarks.md keeps each section's headline."""


NOTES = "## Notes\n"
"""The heading of a section page's hand-written part, which a rerun of the section's script keeps."""
SUMMARY_ROWS = 4
"""Tables of at most this many rows are a section's summary and stay in docs/benchmarks.md; longer ones are detail."""


def headline(body: str) -> str:
    """A section's headline: its heading, its command (the first paragraph), its summary tables (at most
    `SUMMARY_ROWS` rows) and its bold-led summary paragraphs; long tables, pictures and the prose around them are
    the section's own page."""
    blocks = [b.strip() for b in re.split(r"\n\s*\n", body.strip()) if b.strip()]
    kept = blocks[:2]
    for block in blocks[2:]:
        rows = len(block.splitlines()) - 2  # a table's header and rule
        if (block.startswith("|") and rows <= SUMMARY_ROWS) or block.startswith("**"):
            kept.append(block)
    return "\n\n".join(kept)


def link_joint(short: str) -> str:
    """What goes between a headline and the link to its whole section: a space after a paragraph (the link is its
    last sentence), a blank line after a heading, a table or a picture."""
    last = short.rstrip().rsplit("\n\n", 1)[-1]
    return "\n\n" if last.startswith(("#", "|", "!")) else " "


def write_section(name: str, body: str, short: str | None = None, page_only: bool = False) -> None:
    """Write a section: its whole text to ``docs/benchmarks/<name>.md``, and its headline (``short`` where given,
    else `headline`) with a link there between the ``<!-- name -->`` markers of docs/benchmarks.md (other sections
    are kept). ``page_only``: the page alone, for a section another section's headline links to."""
    body = body.strip()
    DETAILS.mkdir(parents=True, exist_ok=True)
    page = (body.replace("](images/", "](../images/").replace("](benchmarks.md", "](../benchmarks.md")
            .replace("](benchmarks/", "]("))  # a page beside this one
    detail = DETAILS / f"{name}.md"
    notes = detail.read_text().partition(NOTES)[2] if detail.exists() else ""  # written by hand: kept
    detail.write_text(page + "\n" + (f"\n{NOTES}{notes}" if notes.strip() else ""))
    if page_only:
        return
    short = headline(body) if short is None else short.strip()
    if short != body:
        title = body.splitlines()[0].lstrip("# ").strip()
        short += link_joint(short) + f"The whole section: [{title}](benchmarks/{name}.md)."
    text = DOC.read_text() if DOC.exists() else HEADER
    block = f"<!-- {name} -->\n{short}\n<!-- /{name} -->"
    pattern = re.compile(rf"<!-- {re.escape(name)} -->.*?<!-- /{re.escape(name)} -->", re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
