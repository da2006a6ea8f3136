"""How long `cebm --help` takes to start: the import time of the command line and its wall time.

    python -m benchmarks.cli_startup [--repeat 5]

Import time is ``python -X importtime``'s cumulative figure for ``composable_ebm.cli`` (the interpreter's own
start is not counted); wall time is the whole ``cebm --help`` process. Writes the ``cli-startup`` section of
docs/benchmarks.md. Target: under 1 s of import time, no torch imported.
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import subprocess
import sys
import time

from benchmarks._report import write_section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    imports, walls = [], []
    for _ in range(args.repeat):
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import composable_ebm.cli"],
                             capture_output=True, text=True, check=True)
        line = [x for x in out.stderr.splitlines() if re.search(r"\|\s+composable_ebm\.cli$", x)][-1]
        imports.append(int(line.split("|")[1]) / 1e6)
        assert not re.search(r"\|\s+torch$", out.stderr, re.M), "the command line imported torch"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "composable_ebm", "--help"], capture_output=True, check=True)
        walls.append(time.perf_counter() - t0)
    torch_loaded = subprocess.run([sys.executable, "-c", "import sys, composable_ebm.cli; print('torch' in sys.modules)"],
                                  capture_output=True, text=True, check=True).stdout.strip()
    body = "\n".join([
        "## Command-line start-up",
        "",
        f"`python -m benchmarks.cli_startup --repeat {args.repeat}` on {platform.machine()} ({platform.python_version()}),"
        " median of the runs:",
        "",
        f"- import time of `composable_ebm.cli`: **{statistics.median(imports):.3f} s** (target < 1 s)",
        f"- wall time of `python -m composable_ebm --help` (interpreter start included):"
        f" {statistics.median(walls):.2f} s",
        f"- torch imported by the command line itself: {torch_loaded} (commands import it when they run)",
    ])
    print(body)
    write_section("cli-startup", body)


if __name__ == "__main__":
    main()
