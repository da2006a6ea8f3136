"""What a guided term costs against a plain one: time of one sampler step (energy and gradient).

    python -m benchmarks.guided_cost [--n 64] [--repeats 30] [--models composable_ebm/bundled]

Times ``energy_and_grad`` of ``red + circle + large`` (plain) and ``guided(red + circle + large)`` on the
models in ``--models`` (they need a null condition), batch ``--n``, and prints the ratio. A guided term evaluates its conditioned and its
unconditional energy in one call on a batch of ``2n``, so on a device where a batch of ``2n`` costs
little more than one of ``n`` (a GPU at these sizes) the ratio nears 1; on a CPU, whose time grows with
the batch, it nears 2.
"""

from __future__ import annotations

import argparse
import json

import torch

from benchmarks._report import machine, write_section
from benchmarks.sampling import step_seconds
from composable_ebm import guided, load

EXPRESSION = "red + circle + large"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--models", default="composable_ebm/bundled", help="folder holding shapes-<attribute> models")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    color, shape, size = (load(f"{args.models}/shapes-{a}", device=args.device) for a in ("color", "shape", "size"))
    plain = color.condition(color="red") + shape.condition(shape="circle") + size.condition(size="large")
    forms = {"plain": plain, "guided": guided(plain)}
    x = torch.rand(args.n, 3, 16, 16, device=args.device)
    seconds = {name: step_seconds(e, x, reps=args.repeats, warmup=3) for name, e in forms.items()}
    seconds["plain_2n"] = step_seconds(plain, torch.cat([x, x]), reps=args.repeats, warmup=3)
    ratio = seconds["guided"] / seconds["plain"]
    print(json.dumps({"seconds": seconds, "ratio": ratio}), flush=True)
    on_gpu = torch.device(args.device).type == "cuda"
    where = (f"a plain step on a batch of {2 * args.n} takes {1000 * seconds['plain_2n']:.1f} ms here"
             f" ({seconds['plain_2n'] / seconds['plain']:.2f}x the batch of {args.n}).")
    write_section("guided_cost_cuda" if on_gpu else "guided_cost", "\n".join([
        "## Cost of a guided term" + (" on a GPU" if on_gpu else ""),
        "",
        f"`python -m benchmarks.guided_cost --n {args.n} --models {args.models} --device {args.device}` on {machine()}: one sampler step (energy and gradient) of",
        f"`{EXPRESSION}` on a batch of {args.n}: plain {1000 * seconds['plain']:.1f} ms, guided"
        f" {1000 * seconds['guided']:.1f} ms, **{ratio:.2f}x**. Each guided term is one network call on a batch of",
        f"{2 * args.n} (conditioned and unconditional halves), except for a model whose condition enters through a"
        " pixel-set head (the bundled colour model), which runs its towers once; " + where,
    ]))


if __name__ == "__main__":
    main()
