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


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section delimited by ``<!-- name -->`` markers."""
    text = DOC.read_text() if DOC.exists() else HEADER
    block = f"<!-- {name} -->\n{body.strip()}\n<!-- /{name} -->"
    pattern = re.compile(rf"<!-- {re.escape(name)} -->.*?<!-- /{re.escape(name)} -->", re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
