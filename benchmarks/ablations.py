"""Ablations of the shape model at the same budget: without the KL loss, without augmentation transitions.

Each variant is ``cebm train`` of its recipe (1,200 steps, the shipped shape recipe's settings except
the ablated part). For each: the shape read from the model's own samples (every value) and joint
accuracy composed with the bundled colour and size models, all with default sampler settings and read
by the bundled classifier. Train the variants first:

    cebm train recipes/ablations/shapes-shape-no-kl.toml --out runs/abl-no-kl/shape
    cebm train recipes/ablations/shapes-shape-no-augment.toml --out runs/abl-no-augment/shape
    python -m benchmarks.ablations [--n 256]
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
from composable_ebm.persistence import load_model
from composable_ebm.training import read_log

# label, run folder, recipe
VARIANTS = [
    ("shipped recipe", "runs/shapes/shape", "recipes/shapes-shape.toml"),
    ("without the KL loss", "runs/abl-no-kl/shape", "recipes/ablations/shapes-shape-no-kl.toml"),
    ("without augmentation transitions", "runs/abl-no-augment/shape", "recipes/ablations/shapes-shape-no-augment.toml"),
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
        last = [r for r in read_log(ROOT / run) if "e_diff" in r][-1]
        results[label] = {"run": run, "recipe": recipe, "alone": alone, "composed": composed,
                          "final_log": {k: last[k] for k in ("step", "e_diff", "langevin_grad_norm", "rollbacks")}}
        rows.append(f"| {label} (`{recipe}`) | " + " | ".join(f"{alone[v]:.3f}" for v in alone) + " | "
                    + " | ".join(f"{composed[t]:.3f}" for t, _ in COMPOSED) + f" | {last['rollbacks']} |")
        print(rows[-1], flush=True)
    seconds = time.perf_counter() - t0
    (ROOT / "runs" / "ablations.json").write_text(json.dumps(results, indent=2))
    write_section("ablations", "\n".join([
        "## Ablations of the shape model (same budget: 1,200 steps)",
        "",
        f"`python -m benchmarks.ablations --n {args.n}` on {machine()} ({seconds / 60:.1f} min of sampling).",
        f"{args.n} samples per cell with default sampler settings, read by the bundled classifier. Alone: the",
        "fraction of `shape[shape=v]` samples read as `v`. Composed: joint accuracy with the bundled colour and",
        "size models (red + circle + large is held out of every training split).",
        "",
        "| shape model | alone: circle | alone: square | alone: triangle | red + circle + large (held out) |"
        " blue + square | green + triangle | rollbacks |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
    ]))


if __name__ == "__main__":
    main()
