"""Every picture of the documentation site, from the bundled models and two short real training runs.

    PYTHONPATH=. python docs/make_figures.py            # all figures (about 10 minutes on 2 CPU cores)
    PYTHONPATH=. python docs/make_figures.py --skip-training

Writes ``docs/images/op_*.png`` (one per algebra operator), ``docs/images/faces_smiling_glasses_hat.png`` (the
README's main job: 16 samples, seed 0), ``docs/images/red_large_circles.png`` (its Shapes counterpart),
``docs/images/chain.png`` (a chain from noise to red large
circles) and ``docs/images/health_*.png`` (training health of the shape recipe, with and without the KL
loss, from runs written under ``runs/docs``). Every 16-pixel sample is shown 64 pixels wide.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import composable_ebm as cebm
from composable_ebm.expression import parse_expression
from composable_ebm.images import save_chain_strip, save_image_grid
from composable_ebm.runs import train_recipe

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"

OPERATORS = {
    "sum": ("red + circle, plain form", lambda m: m["red"] + m["circle"]),
    "guided": ("guided(red + circle)", lambda m: cebm.guided(m["red"] + m["circle"])),
    "weighted": ("green + 3 * triangle", lambda m: m["green"] + 3 * m["triangle"]),
    "negation": ("blue - 0.5 * square", lambda m: m["blue"] - 0.5 * m["square"]),
    "disjunction": ("red | blue", lambda m: m["red"] | m["blue"]),
    "condition": ("shape.condition(shape='circle')", lambda m: m["circle"]),
}
README_EXPRESSION = "faces-smiling[smiling=yes] + faces-glasses[glasses=yes] + faces-hat[hat=yes]"
SHAPES_EXPRESSION = "shapes-color[color=red] + shapes-shape[shape=circle] + shapes-size[size=large]"


def algebra_figures() -> None:
    color, shape = cebm.load("shapes-color"), cebm.load("shapes-shape")
    m = {c: color.condition(color=c) for c in ("red", "green", "blue")}
    m |= {s: shape.condition(shape=s) for s in ("circle", "square", "triangle")}
    for key, (text, build) in OPERATORS.items():
        if key == "guided" and not (color.has_null_condition and shape.has_null_condition):
            print("skipped op_guided.png: the bundled models have no null condition (no label dropout)", flush=True)
            continue
        form = "plain" if key == "sum" else "auto"  # the plain sum; the others as `.sample` draws them by default
        save_image_grid(build(m).sample(16, seed=0, form=form), IMAGES / f"op_{key}.png", nrow=8)
        print(f"op_{key}.png: {text}", flush=True)
    # temperature: one row each of circle / 0.5, circle, circle / 2, from the same starting noise
    rows = [(m["circle"] / t).sample(8, seed=0) for t in (0.5, 1.0, 2.0)]
    save_image_grid(torch.cat(rows), IMAGES / "op_temperature.png", nrow=8)
    print("op_temperature.png: circle / 0.5, circle, circle / 2", flush=True)
    faces = parse_expression(README_EXPRESSION, cebm.load)
    save_image_grid(faces.sample(16, seed=0), IMAGES / "faces_smiling_glasses_hat.png")  # what `cebm compose` writes
    print("faces_smiling_glasses_hat.png", flush=True)
    readme = parse_expression(SHAPES_EXPRESSION, cebm.load)
    save_image_grid(readme.sample(16, seed=0), IMAGES / "red_large_circles.png")  # what `cebm compose ... --seed 0` writes
    print("red_large_circles.png", flush=True)
    result = readme.sample_result(8, seed=0, keep_every=10)
    save_chain_strip(result.chain, IMAGES / "chain.png")
    print("chain.png", flush=True)


def health_figures(steps: int) -> None:
    runs = ROOT / "runs" / "docs"
    for label, recipe in (("healthy", "recipes/shapes-shape.toml"),
                          ("no_kl", "recipes/ablations/shapes-shape-no-kl.toml")):
        out = runs / label
        train_recipe(ROOT / recipe, out, steps=steps, echo=print)
        cebm.evaluation.plot_training_health(out, IMAGES / f"health_{label}.png", title=f"{Path(recipe).stem}, "
                                             f"{steps} steps")
        print(f"health_{label}.png", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-training", action="store_true", help="only the pictures of the bundled models")
    parser.add_argument("--steps", type=int, default=200, help="steps of each short training run")
    args = parser.parse_args()
    IMAGES.mkdir(parents=True, exist_ok=True)
    algebra_figures()
    if not args.skip_training:
        health_figures(args.steps)


if __name__ == "__main__":
    main()
