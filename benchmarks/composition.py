"""Composition quality of the bundled Shapes models: conjunctions of 2-4 attributes, disjunction, negation.

Every sample is drawn the way a user draws it: ``energy.sample(n, seed=...)`` on the composite, with
the settings the composite derives from its parts. The bundled attribute classifier reads the
samples. Red circles (every size and position) are held out of every model's training split.

    python -m benchmarks.composition [--n 256] [--models composable_ebm/bundled]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks._report import machine, write_section
from benchmarks._shapes import ROOT
from composable_ebm import compositional_accuracy, save_image_grid
from composable_ebm.data.datasets import SHAPES_ATTRIBUTES
from composable_ebm.energy import value_index
from composable_ebm.expression import parse_expression
from composable_ebm.hub import BUNDLED_DIR, load_model

# (expression over short names, target, held out?)
CONJUNCTIONS = [
    ("color[color=blue] + shape[shape=square]", {"color": "blue", "shape": "square"}, False),
    ("color[color=green] + shape[shape=triangle]", {"color": "green", "shape": "triangle"}, False),
    ("shape[shape=circle] + size[size=large]", {"shape": "circle", "size": "large"}, False),
    ("color[color=red] + shape[shape=circle]", {"color": "red", "shape": "circle"}, True),
    ("color[color=blue] + shape[shape=square] + size[size=large]", {"color": "blue", "shape": "square", "size": "large"},
     False),
    ("color[color=green] + shape[shape=circle] + position[position=left]",
     {"color": "green", "shape": "circle", "position": "left"}, False),
    ("color[color=red] + shape[shape=circle] + size[size=large]", {"color": "red", "shape": "circle", "size": "large"},
     True),
    ("color[color=green] + shape[shape=triangle] + size[size=small] + position[position=left]",
     {"color": "green", "shape": "triangle", "size": "small", "position": "left"}, False),
    ("color[color=red] + shape[shape=circle] + size[size=large] + position[position=right]",
     {"color": "red", "shape": "circle", "size": "large", "position": "right"}, True),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=BUNDLED_DIR, help="folder holding shapes-<attribute> models")
    parser.add_argument("--n", type=int, default=256, help="samples per combination")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    models = {a: load_model(args.models / f"shapes-{a}") for a in ("shape", "color", "size", "position")}
    classifier = load_model(args.models / "shapes-classifier")

    def parse(text: str):
        return parse_expression(text, lambda name: models[name])

    rows, results = [], []
    t0 = time.perf_counter()
    for i, (text, target, held) in enumerate(CONJUNCTIONS):
        energy = parse(text)
        samples = energy.sample(args.n, seed=i)
        score = compositional_accuracy(samples, classifier, target)
        per = ", ".join(f"{a} {v:.2f}" for a, v in score.per_attribute.items())
        rows.append(f"| {len(target)} | `{text}` | {'held out' if held else 'seen'} | {per} | {score.joint:.3f} |")
        print(rows[-1], flush=True)
        results.append({"expression": text, "attributes": len(target), "held_out": held, "per_attribute":
                        score.per_attribute, "joint": score.joint, "n": score.n})
        if held and len(target) == 3:
            save_image_grid(torch.nn.functional.interpolate(samples[:16], scale_factor=4), ROOT / "docs" / "images" /
                            "red_large_circles.png", nrow=4)
    # disjunction: either side, and the balance between the two
    either = parse("color[color=red] | color[color=blue]").sample(args.n, seed=100)
    pred = classifier.predict(either)["color"]
    red, blue = (float((pred == value_index(SHAPES_ATTRIBUTES, "color", v)).float().mean()) for v in ("red", "blue"))
    # negation relative to a base: blue objects that are not squares
    base = parse("color[color=blue]").sample(args.n, seed=101)
    negated = parse("color[color=blue] - 0.5 * shape[shape=square]").sample(args.n, seed=101)
    square = value_index(SHAPES_ATTRIBUTES, "shape", "square")
    square_base = float((classifier.predict(base)["shape"] == square).float().mean())
    square_neg = float((classifier.predict(negated)["shape"] == square).float().mean())
    blue_neg = float((classifier.predict(negated)["color"] == value_index(SHAPES_ATTRIBUTES, "color", "blue")).float().mean())
    # a weight on the weaker model: the same green triangles with the shape model's energy counted three times
    weighted_text = "color[color=green] + 3 * shape[shape=triangle]"
    weighted = compositional_accuracy(parse(weighted_text).sample(args.n, seed=102), classifier,
                                      {"color": "green", "shape": "triangle"})
    seconds = time.perf_counter() - t0
    out = ROOT / "runs" / "composition.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"conjunctions": results, "disjunction": {"red": red, "blue": blue},
                               "negation": {"square_base": square_base, "square_negated": square_neg,
                                            "blue_negated": blue_neg},
                               "weighted": {"expression": weighted_text, "per_attribute": weighted.per_attribute,
                                            "joint": weighted.joint}}, indent=2))
    lines = [
        "## Composition of the bundled Shapes models",
        "",
        f"`python -m benchmarks.composition --n {args.n}` on {machine()} ({seconds / 60:.1f} min of sampling).",
        f"{args.n} samples per row, each composite's default settings (`energy.sample(n)`), read by the bundled",
        "classifier. Model names are short: `color` is `shapes-color`, and so on. Red circles of every size and",
        "position are held out of every model's training split; but the shape, size and position models' positives",
        "were augmented with RGB channel permutations, which draw red circles from green and blue ones, so",
        "\"held out\" rows are held out of the data, not of those three models' augmented positives (the colour",
        "model's augmentations cannot draw a red circle).",
        "",
        "| attributes | expression | combination | per-attribute accuracy | joint accuracy |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"Disjunction `color[color=red] | color[color=blue]`: {red + blue:.3f} of samples are red or blue"
        f" (red {red:.3f}, blue {blue:.3f}).",
        f"Negation `color[color=blue] - 0.5 * shape[shape=square]`: squares in {square_neg:.3f} of samples against"
        f" {square_base:.3f} for `color[color=blue]` alone; blue in {blue_neg:.3f}.",
        f"Weights: `{weighted_text}` reads green {weighted.per_attribute['color']:.3f}, triangle"
        f" {weighted.per_attribute['shape']:.3f}, joint {weighted.joint:.3f} (the unweighted sum is in the table).",
        "",
        "![red + circle + large, 16 samples](images/red_large_circles.png)",
    ]
    write_section("composition", "\n".join(lines))


if __name__ == "__main__":
    main()
