"""The README's commands are the ones CI runs."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ci_command(name: str) -> str:
    match = re.search(rf"^{name}='(.*)'$", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    assert match, f"{name}= not found in .ci/run"
    return match.group(1)


def test_readme_starts_with_the_install_and_test_commands_that_ci_runs():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.DOTALL)
    assert blocks[0].startswith(ci_command("INSTALL"))
    assert blocks[1] == ci_command("TEST")
    assert f"`{ci_command('FULL')}`" in readme  # the README names the rest of what CI runs


def test_every_marker_ci_runs_is_registered_and_the_default_run_leaves_them_out():
    import tomllib

    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {line.split(":")[0] for line in options["markers"]}
    full = set(re.search(r'-m "(.*)"', ci_command("FULL")).group(1).split(" or "))
    left_out = set(re.search(r"-m 'not \((.*)\)'", options["addopts"]).group(1).split(" or "))
    assert full <= registered and full | {"slow"} == left_out == registered


@pytest.mark.docs
def test_the_docs_site_renders_no_sphinx_roles_and_loads_nothing_from_other_hosts(tmp_path):
    import re
    import subprocess
    import sys

    pytest.importorskip("mkdocs")
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "--site-dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ,
                                                                                      "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stderr
    api = (tmp_path / "api" / "index.html").read_text()
    assert "composable_ebm.energy" in api
    assert not re.findall(r":(?:class|func|meth|attr|data|mod|exc):", api)
    for page in tmp_path.rglob("*.html"):
        html = page.read_text()
        loads = re.findall(r"<(?:script|img|link)\b[^>]*(?:src|href)=\"(https?://[^\"]+)\"", html)
        external = [u for u in loads if not u.startswith(("http://127.0.0.1", "http://localhost"))]
        assert not external, (page.name, external[:3])
        assert "api.github.com" not in html and "fonts.googleapis" not in html


def test_a_benchmark_section_writes_its_headline_here_and_its_whole_text_to_its_own_page(tmp_path, monkeypatch):
    """docs/benchmarks.md keeps a section's heading, command, summary tables and bold summaries; its own page keeps
    everything, and a rerun keeps the page's hand-written notes."""
    from benchmarks import _report

    monkeypatch.setattr(_report, "DOC", tmp_path / "benchmarks.md")
    monkeypatch.setattr(_report, "DETAILS", tmp_path / "benchmarks")
    rows = "\n".join(f"| r{i} | {i} |" for i in range(10))
    body = (f"## Speed\n\n`python -m benchmarks.speed`\n\n| a | b |\n| --- | --- |\n| x | 1 |\n\n**Median 3.2 s.**\n\n"
            f"Some prose.\n\n| row | n |\n| --- | --- |\n{rows}\n\n![sheet](images/s.png)\n\nThe sheet's caption.")
    _report.write_section("speed", body)
    doc = (tmp_path / "benchmarks.md").read_text()
    assert "`python -m benchmarks.speed`" in doc and "| x | 1 |" in doc and "**Median 3.2 s.**" in doc
    assert "| r9 | 9 |" not in doc and "Some prose" not in doc and "s.png" not in doc
    assert "[Speed](benchmarks/speed.md)" in doc
    page = tmp_path / "benchmarks" / "speed.md"
    assert "| r9 | 9 |" in page.read_text() and "](../images/s.png)" in page.read_text()
    page.write_text(page.read_text() + "\n## Notes\n\nWritten by hand.\n")
    _report.write_section("speed", body.replace("3.2", "3.1"))
    assert "Median 3.1 s." in page.read_text() and "Written by hand." in page.read_text()
    assert (tmp_path / "benchmarks.md").read_text().count("<!-- speed -->") == 1


def test_every_benchmark_script_imports():
    """A script in benchmarks/ is one a user or a maintainer reruns: each imports against the package as it is."""
    import importlib

    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if path.stem != "__init__":
            importlib.import_module(f"benchmarks.{path.stem}")
