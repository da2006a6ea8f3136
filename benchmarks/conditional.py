"""Does each Shapes attribute model produce its attribute, cover the others, and ignore the held-out pair?

For each attribute model (``recipes/shapes-<attribute>.toml``, red circles held out of its data):
sample every value with the model's default settings and read the samples with the Shapes
attribute classifier (conditioned accuracy; distribution of the other attributes against the
data's); and the held-out energy gap: mean energy of rendered red circles minus that of seen
images with the same conditioned value, in units of the seen spread.

    python -m benchmarks.conditional --train                      # train every recipe, then evaluate
    python -m benchmarks.conditional --runs runs/shapes           # evaluate runs/shapes/<attribute>
    python -m benchmarks.conditional --runs runs/ablation --recipes "recipes/ablations/shapes-{attribute}-no-kl.toml" \
        --attributes shape --label no-kl

Runs are ``cebm train`` run folders; an unfinished run is read from its latest checkpoint's EMA.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks._report import machine, shown, write_section
from benchmarks._shapes import ATTRIBUTES, HOLDOUT, ROOT, load_run, shapes_classifier, train_run
from composable_ebm import shapes
from composable_ebm.evaluation import conditional_report, heldout_energy_gap
from composable_ebm.recipes import load_recipe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "shapes", help="folder of <attribute> run folders")
    parser.add_argument("--attributes", nargs="+", default=list(ATTRIBUTES), choices=ATTRIBUTES)
    parser.add_argument("--recipes", default="recipes/shapes-{attribute}.toml", help="recipe path template")
    parser.add_argument("--train", action="store_true", help="train each recipe into RUNS/<attribute> first")
    parser.add_argument("--classifier", type=Path, default=ROOT / "runs" / "shapes-classifier")
    parser.add_argument("--n", type=int, default=256, help="samples per value")
    parser.add_argument("--label", default="after", help="row label in the table")
    parser.add_argument("--section", default="conditional", help="docs/benchmarks.md section to write")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    classifier, clf_acc = shapes_classifier(args.classifier)
    print("classifier accuracy on 2000 clean renders:", {a: round(v, 4) for a, v in clf_acc.items()}, flush=True)
    heldout = shapes(600, 16, seed=5, holdout=HOLDOUT, split="heldout")
    seen = shapes(3000, 16, seed=6, holdout=HOLDOUT, split="train")
    out = args.runs / f"conditional-{args.label}.json"
    # a run over some attributes keeps the other attributes' rows from the last run with this label
    kept = {a: r for a, r in json.loads(out.read_text())["results"].items() if a not in args.attributes} if out.exists() else {}
    results = {}
    for attribute in args.attributes:
        recipe = ROOT / args.recipes.format(attribute=attribute)
        run = args.runs / attribute
        wall = train_run(attribute, run, recipe=recipe) if args.train else None
        spec = load_recipe(recipe)
        model = load_run(run, recipe)
        train = shapes(spec.data.n, spec.data.size, spec.data.seed, holdout=spec.data.holdout)
        reports = conditional_report(model, attribute, classifier, train.labels, args.n, seed=0)
        gaps = {g.value: g for g in heldout_energy_gap(model, attribute, heldout.images, heldout.labels,
                                                        seen.images, seen.labels)}
        aug = spec.trainer.data_augment
        changes = sorted(aug.changes()) if aug is not None else []
        makes_heldout = "hue" in changes  # a colour change of a green or blue circle draws a red circle
        rows = []
        for r in reports:
            dev = r.coverage_deviation
            gap = gaps.get(r.value)
            rows.append(
                f"| {args.label} | {attribute} | {r.value} | {r.accuracy:.3f} | "
                + ", ".join(f"{a} {d:.2f}" for a, d in dev.items())
                + f" | {max(dev.values()):.2f} | {'' if gap is None else f'{gap.gap:+.2f}'} | "
                + f"{', '.join(changes) or 'none'} | {'yes' if makes_heldout else 'no'} |"
            )
            print(rows[-1], flush=True)
        results[attribute] = {
            "rows": rows,
            "wall_seconds": wall,
            "values": {r.value: {"accuracy": r.accuracy, "other": r.other, "data_other": r.data_other,
                                 "coverage_deviation": r.coverage_deviation} for r in reports},
            "gaps": {v: {"gap": g.gap, "heldout_mean": g.heldout_mean, "seen_mean": g.seen_mean,
                         "seen_std": g.seen_std} for v, g in gaps.items()},
        }
    results = {a: results.get(a) or kept[a] for a in ATTRIBUTES if a in results or a in kept}
    rows = [row for r in results.values() for row in r.get("rows", [])]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"classifier_accuracy": clf_acc, "results": results}, indent=2))
    lines = [
        f"## Conditional attribute models on Shapes ({args.label})",
        "",
        f"`python -m benchmarks.conditional --runs {shown(args.runs)}"
        f" --label {args.label}"
        f"{' --recipes ' + args.recipes if args.recipes != parser.get_default('recipes') else ''}` on {machine()}.",
        f"{args.n} samples per value with each model's default sampler settings, read by the Shapes attribute",
        "classifier (accuracy on 2000 clean 16x16 renders: "
        + ", ".join(f"{a} {v:.3f}" for a, v in clf_acc.items()) + ").",
        "Coverage: largest gap between the samples' and the training data's distribution of each other",
        "attribute. Gap: held-out (red circle) minus seen mean energy under the same value, in seen spreads.",
        *([f"Measured in this run: {', '.join(args.attributes)}; the other rows are kept from the last run with this label."]
          if kept else []),
        "",
        "| run | attribute | value | accuracy | coverage gap per other attribute | max | energy gap |"
        " positives' augmentation changes | can draw a red circle |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *rows,
    ]
    write_section(args.section, "\n".join(lines))


if __name__ == "__main__":
    main()
