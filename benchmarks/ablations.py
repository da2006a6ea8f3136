"""Ablations of the KL loss on the shape model at one budget: without it, and with its entropy term.

Each variant is ``cebm train`` of its recipe for the same number of steps (the shipped shape recipe's settings
except the ablated part, from the same seed): the recipe as written (``L_opt``, no entropy term), without the KL
loss (neither term), and with the whole KL loss (``L_opt`` and the nearest-neighbour entropy ``L_ent``, as the
paper trains). For each: the shape read from the model's own samples (every value) and joint accuracy composed
with the bundled colour and size models, all with default sampler settings and read by the bundled classifier.
Train the variants first (two at a time on two cores, ``OMP_NUM_THREADS=1``), then measure accuracy here and
realism with ``benchmarks.realism``:

    cebm train recipes/shapes-shape.toml --out runs/abl-recipe/shape --steps 1200
    cebm train recipes/ablations/shapes-shape-no-kl.toml --out runs/abl-no-kl/shape --steps 1200
    cebm train recipes/ablations/shapes-shape-entropy.toml --out runs/abl-entropy/shape --steps 1200
    python -m benchmarks.ablations [--n 256]
    python -m benchmarks.realism --n 64 --coverage-n 256 --split all --label ablations \\
        --models runs/abl-recipe/shape/model runs/abl-no-kl/shape/model runs/abl-entropy/shape/model \\
        --names recipe no-kl entropy --section realism-ablations \\
        --title "Ablations of the KL loss: realism (shape model, 1,200 iterations)"
"""

from __future__ import annotations

import argparse
import functools
import json
import operator
import time

import torch

from benchmarks._report import machine, write_section
from benchmarks._shapes import ROOT, load_run
from composable_ebm import compositional_accuracy
from composable_ebm.data import SHAPES_ATTRIBUTES
from composable_ebm.models import load_model
from composable_ebm.training import read_log

# label, run folder, recipe
VARIANTS = [
    ("the recipe (L_opt)", "runs/abl-recipe/shape", "recipes/shapes-shape.toml"),
    ("without the KL loss", "runs/abl-no-kl/shape", "recipes/ablations/shapes-shape-no-kl.toml"),
    ("with the entropy term (L_opt + L_ent)", "runs/abl-entropy/shape", "recipes/ablations/shapes-shape-entropy.toml"),
]
COMPOSED = [
    ("color[color=red] + shape[shape=circle] + size[size=large]", {"color": "red", "shape": "circle", "size": "large"}),
    ("color[color=blue] + shape[shape=square]", {"color": "blue", "shape": "square"}),
    ("color[color=green] + shape[shape=triangle]", {"color": "green", "shape": "triangle"}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="samples per value and per composition")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    classifier = load_model("shapes-classifier")
    color, size = load_model("shapes-color"), load_model("shapes-size")
    results, rows = {}, []
    t0 = time.perf_counter()
    for label, run, recipe in VARIANTS:
        shape = load_run(ROOT / run, ROOT / recipe)
        alone = {}
        for i, value in enumerate(SHAPES_ATTRIBUTES["shape"]):
            samples = shape.condition(shape=value).sample(args.n, seed=i)
            alone[value] = compositional_accuracy(samples, classifier, {"shape": value}).joint
        composed = {}
        for j, (text, target) in enumerate(COMPOSED):
            parts = {"color": color, "size": size, "shape": shape}
            energy = functools.reduce(operator.add, [parts[a].condition(**{a: v}) for a, v in target.items()])
            composed[text] = compositional_accuracy(energy.sample(args.n, seed=10 + j), classifier, target).joint
        log = [r for r in read_log(ROOT / run) if "e_diff" in r]
        last = log[-1]
        lost = next((r["step"] for r in log if r["e_diff"] < -0.5), None)  # data far below every chain's end
        results[label] = {"run": run, "recipe": recipe, "alone": alone, "composed": composed, "e_diff_below_half": lost,
                          "final_log": {k: last[k] for k in ("step", "e_diff", "langevin_grad_norm", "rollbacks")}}
        rows.append(f"| {label} (`{recipe}`) | " + " | ".join(f"{alone[v]:.3f}" for v in alone) + " | "
                    + " | ".join(f"{composed[t]:.3f}" for t, _ in COMPOSED)
                    + f" | {last['e_diff']:+.2f} | {lost if lost is not None else 'never'} | {last['rollbacks']} |")
        print(rows[-1], flush=True)
    seconds = time.perf_counter() - t0
    (ROOT / "runs" / "ablations.json").write_text(json.dumps(results, indent=2))
    steps = " / ".join(f"{s:,}" for s in sorted({r["final_log"]["step"] for r in results.values()}))
    write_section("ablations", "\n".join([
        f"## Ablations of the KL loss, shape model (same budget: {steps} iterations)",
        "",
        f"`python -m benchmarks.ablations --n {args.n}` on {machine()} ({seconds / 60:.1f} min of sampling).",
        f"{args.n} samples per cell with default sampler settings, read by the bundled classifier. Alone: the",
        "fraction of `shape[shape=v]` samples read as `v`. Composed: joint accuracy with the bundled colour and",
        "size models, in the guided form a sum of them samples by default (red + circle + large is held out of",
        "every training split). Energy difference: the run's last logged `E(x+) - E(x-)`, data against the chains'",
        "samples, and the first logged step where it fell below -0.5 (the data's energy far below where every",
        "chain ends: the chains no longer reach the data). Rollbacks: how often the run went back to its last",
        "checkpoint after a fault.",
        "",
        "| shape model | alone: circle | alone: square | alone: triangle | red + circle + large (held out) |"
        " blue + square | green + triangle | energy difference, last | below -0.5 from step | rollbacks |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
    ]))


if __name__ == "__main__":
    main()
