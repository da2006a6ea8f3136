"""2-D toy benchmark: MLP energies trained with the Trainer, with and without the KL loss.

For each density, trains the toy recipe (recipes/toy-8gaussians.toml, its density replaced) twice
(identical settings and seed, KL loss on / off) and reports the exact KL(data || model) on a 200x200 grid over [-4, 4]^2, with the
model normalised numerically on that grid, plus the final energy difference
E(x+) - E(x-) and its largest magnitude over training. Writes the table and the
energy-difference traces to docs/benchmarks.md.

    python benchmarks/toy2d.py [--steps 2000] [--densities 8gaussians rings checkerboard 2spirals]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch

from benchmarks._report import machine, write_section
from composable_ebm.data.toy2d import TOY_DENSITIES, grid, kl_on_grid, toy_log_density
from composable_ebm.recipes import build_dataset, build_model, load_recipe
from composable_ebm.training import Trainer

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "toy-8gaussians.toml"


def train(name: str, kl: bool, steps: int, seed: int) -> tuple[float, list[dict], float]:
    """The toy recipe (recipes/toy-8gaussians.toml) on density ``name``, with the KL loss on or off."""
    spec = load_recipe(RECIPE)
    spec = dataclasses.replace(
        spec,
        model={**spec.model, "name": f"toy-{name}"},
        data=dataclasses.replace(spec.data, density=name, seed=seed),
        trainer=dataclasses.replace(spec.trainer, steps=steps, seed=seed, kl_opt=kl, kl_ent=kl, log_every=25,
                                    checkpoint_every=10**9),
    )
    data = build_dataset(spec.data)
    model = build_model(spec, data)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(model, data, spec.trainer, out_dir=out)
        t = time.perf_counter()
        trainer.fit()
        seconds = time.perf_counter() - t
        log = [json.loads(line) for line in (Path(out) / "log.jsonl").read_text().splitlines()]
    points, _ = grid(200)
    with torch.no_grad():
        log_q = -trainer.ema(points.float()).double()
    return kl_on_grid(toy_log_density(name, points), log_q), log, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="training iterations (default: the recipe's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--densities", nargs="+", default=list(TOY_DENSITIES), choices=TOY_DENSITIES)
    args = parser.parse_args()
    args.steps = args.steps if args.steps is not None else load_recipe(RECIPE).trainer.steps
    torch.set_num_threads(max(1, torch.get_num_threads()))
    points, _ = grid(200)
    rows, traces = [], []
    for name in args.densities:
        uniform = kl_on_grid(toy_log_density(name, points), torch.zeros(points.shape[0], dtype=torch.float64))
        result = {}
        for kl in (True, False):
            value, log, seconds = train(name, kl, args.steps, args.seed)
            diffs = [r["e_diff"] for r in log if "e_diff" in r]
            result[kl] = (value, diffs, seconds)
            print(f"{name:12s} KL loss {'on ' if kl else 'off'}: KL(data||model) = {value:.3f}"
                  f"  (uniform: {uniform:.3f})  final e_diff {diffs[-1]:+.3f}  max |e_diff| {max(map(abs, diffs)):.3f}"
                  f"  {seconds:.0f} s", flush=True)
            traces.append((name, kl, [(r["step"], r["e_diff"]) for r in log if "e_diff" in r]))
        rows.append((name, uniform, result))
    lines = [
        "## 2-D toy densities: exact KL(data || model), with and without the KL loss",
        "",
        f"`python benchmarks/toy2d.py --steps {args.steps} --seed {args.seed}` on {machine()}.",
        "The toy recipe (recipes/toy-8gaussians.toml) with its density replaced: MLP energy (3 x 128, Swish), batch 256,",
        "40 Langevin steps (step 0.005, noise sqrt(0.01)), replay buffer 10000 with 5% fresh starts, L2 energy regulariser",
        "0.1, gradient clipping at 0.5, EMA 0.99 (evaluated). KL on a 200x200 grid over",
        "[-4, 4]^2 with both densities normalised on the grid; 'uniform' is the KL of a flat model, for scale.",
        "One seed per cell: read small differences with care.",
        "",
        "| density | uniform | KL loss on | KL loss off | final E(x+)-E(x-) on / off | max abs diff on / off |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, uniform, r in rows:
        on, off = r[True], r[False]
        lines.append(
            f"| {name} | {uniform:.3f} | {on[0]:.3f} | {off[0]:.3f} | {on[1][-1]:+.3f} / {off[1][-1]:+.3f}"
            f" | {max(map(abs, on[1])):.3f} / {max(map(abs, off[1])):.3f} |"
        )
    lines += ["", "Energy-difference traces (step: E(x+) - E(x-)), every 25th step, subsampled to 12 points:", ""]
    for name, kl, trace in traces:
        stride = max(1, len(trace) // 12)
        pts = ", ".join(f"{s}: {d:+.2f}" for s, d in trace[::stride])
        lines.append(f"- {name}, KL loss {'on' if kl else 'off'}: {pts}")
    write_section("toy2d", "\n".join(lines))


if __name__ == "__main__":
    main()
