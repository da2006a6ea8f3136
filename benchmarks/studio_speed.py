"""How long the studio's Generate takes: 16 samples of a 3-term composite, sampling only (models loaded).

    python -m benchmarks.studio_speed [--repeat 5] [--threads 2]

Runs `composable_ebm.studio.generate` (what the page's Generate button calls) on red + circle + large
with the composite's own sampler settings, after one warm-up, and reports the median and the slowest
sampling time. Target: under 10 s on a 2-core CPU. Writes the ``studio-speed`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

from benchmarks._report import machine, write_section
from composable_ebm import studio
from composable_ebm.pipeline import plan

EXPRESSION = "guided(shapes-color[color=red] + shapes-shape[shape=circle] + shapes-size[size=large])"  # the page's start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = studio.ModelCache("cpu")
    out = tempfile.mkdtemp(prefix="cebm-studio-bench-")
    studio.generate(models, EXPRESSION, n=args.n, seed=0, out_dir=out, form="plain")  # warm-up: loads the models
    steps = plan(models.energy(EXPRESSION), "plain").config.total_steps
    times = [studio.generate(models, EXPRESSION, n=args.n, seed=s, out_dir=out, form="plain").seconds
             for s in range(args.repeat)]
    median, worst = statistics.median(times), max(times)
    print(f"sampling {args.n} samples of {EXPRESSION}: median {median:.2f} s, slowest {worst:.2f} s "
          f"over {args.repeat} seeds ({torch.get_num_threads()} threads)")
    if not args.no_doc:
        write_section("studio-speed", "\n".join([
            "## Studio: time of one Generate",
            "",
            f"`python -m benchmarks.studio_speed --repeat {args.repeat} --threads {args.threads}` on {machine()}:",
            f"{args.n} samples of `{EXPRESSION}` as the page samples it, with its own sampler settings ({steps} Langevin"
            " steps), sampling only",
            f"(models loaded once): median **{median:.2f} s**, slowest {worst:.2f} s over {args.repeat} seeds"
            " (target: under 10 s on a 2-core CPU).",
        ]))


if __name__ == "__main__":
    main()
