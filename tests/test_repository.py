"""The README's commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ci_command(name: str) -> str:
    match = re.search(rf"^{name}='(.*)'$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    assert match, f"{name}= not found in .ci/run"
    return match.group(1)


def test_readme_starts_with_the_install_and_test_commands_that_ci_runs():
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert blocks[0].startswith(ci_command("INSTALL"))
    assert blocks[1] == ci_command("TEST")
