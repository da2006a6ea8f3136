"""Copy trained Shapes runs into the package (``composable_ebm/bundled``) with model cards that carry
their measured quality.

    python -m benchmarks.bundle --runs runs/shapes [--device "2-core CPU"]

Reads ``RUNS/<attribute>/model`` (from ``cebm train``), ``RUNS/conditional-after.json`` (from
``benchmarks.conditional``) and ``runs/composition.json`` (from ``benchmarks.composition``, when it
exists), ``runs/ablations.json`` (from ``benchmarks.ablations``, when it exists) and the classifier
from ``runs/shapes-classifier``. Writes each model's card into its
folder (``README.md``) and into ``model_cards/``.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from benchmarks._shapes import ATTRIBUTES, ROOT
from composable_ebm.hub import BUNDLED_DIR, load_model, save_model
from composable_ebm.model_cards import model_card
from composable_ebm.training import read_log

CARDS_DIR = ROOT / "model_cards"  # the cards of the bundled models, as rendered into each model folder


def _training_minutes(run: Path) -> float:
    """Wall time of the run, estimated from the logged per-step times."""
    records = [r for r in read_log(run) if "seconds" in r]
    steps = max(r["step"] for r in records)
    return sum(r["seconds"] for r in records) / len(records) * steps / 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "shapes")
    parser.add_argument("--device", default=f"{platform.machine()} CPU, {torch.get_num_threads()} threads")
    args = parser.parse_args()
    conditional = json.loads((args.runs / "conditional-after.json").read_text())
    composition_path = ROOT / "runs" / "composition.json"
    composition = json.loads(composition_path.read_text()) if composition_path.is_file() else None
    ablations_path = ROOT / "runs" / "ablations.json"
    ablations = json.loads(ablations_path.read_text()) if ablations_path.is_file() else None
    for attribute in ATTRIBUTES:
        run = args.runs / attribute
        model = load_model(run / "model")
        recipe = ROOT / "recipes" / f"shapes-{attribute}.toml"
        result = conditional["results"][attribute]
        quality = ["## Measured quality", "", "`python -m benchmarks.conditional` (256 samples per value, default"
                   " sampler settings, read by `shapes-classifier`):", "",
                   "| value | accuracy | largest coverage gap (other attributes) | held-out energy gap |",
                   "| --- | --- | --- | --- |"]
        for value, r in result["values"].items():
            gap = result["gaps"].get(value)
            quality.append(f"| {value} | {r['accuracy']:.3f} | {max(r['coverage_deviation'].values()):.2f} | "
                           f"{'' if gap is None else format(gap['gap'], '+.2f')} |")
        if composition is not None:
            rows = [c for c in composition["conjunctions"] if attribute in c["expression"]]
            quality += ["", "Composed with the other bundled models (`python -m benchmarks.composition`):", "",
                        "| expression | combination | joint accuracy |", "| --- | --- | --- |"]
            quality += [f"| `{c['expression']}` | {'held out' if c['held_out'] else 'seen'} | {c['joint']:.3f} |"
                        for c in rows]
        if attribute == "shape" and ablations is not None:
            quality += ["", "Ablations at the same budget (`python -m benchmarks.ablations`; alone: samples read as"
                        " the value asked for; composed: joint accuracy):", "",
                        "| shape model | circle | square | triangle | " + " | ".join(
                            f"`{t}`" for t in next(iter(ablations.values()))["composed"]) + " |",
                        "| --- " * (4 + len(next(iter(ablations.values()))["composed"])) + "|"]
            quality += [f"| {label} | " + " | ".join(f"{v:.3f}" for v in r["alone"].values()) + " | "
                        + " | ".join(f"{v:.3f}" for v in r["composed"].values()) + " |"
                        for label, r in ablations.items()]
        notes = "\n".join([
            "## Data and limitations", "",
            "Trained on the procedural Shapes dataset (16x16, `composable_ebm.shapes`, training split) with every red"
            " circle held out. See the recipe's comments for which augmentations its positives had: channel"
            " permutations (shape, size and position models) can draw a red circle from a green or blue one.",
            f"Trained on {args.device} in about {_training_minutes(run):.0f} minutes (from the logged step times),"
            " one thread, sharing the machine's two cores with other training runs and benchmarks. Small, briefly"
            " trained models: check the accuracies below before relying on a combination.",
            "", "## Reproduce", "", "```bash", f"cebm train recipes/shapes-{attribute}.toml --out runs/{attribute}",
            "```", "", *quality,
        ])
        card = model_card(model, recipe=recipe.read_text(), recipe_name=recipe.name,
                          steps=max(r["step"] for r in read_log(run) if "step" in r), notes=notes, metrics=["accuracy"])
        save_model(model, BUNDLED_DIR / f"shapes-{attribute}", card=card)
        CARDS_DIR.mkdir(exist_ok=True)
        (CARDS_DIR / f"shapes-{attribute}.md").write_text(card)
        print(f"bundled shapes-{attribute}")
    classifier = load_model(ROOT / "runs" / "shapes-classifier")
    acc = conditional["classifier_accuracy"]
    card = model_card(classifier, notes=(
        "Reads shape, colour, size and position of 16x16 Shapes images; trained on every combination"
        " (`benchmarks/_shapes.py`). Accuracy on 2000 fresh clean renders: "
        + ", ".join(f"{a} {v:.3f}" for a, v in acc.items()) + "."), metrics=["accuracy"])
    save_model(classifier, BUNDLED_DIR / "shapes-classifier", card=card)
    (CARDS_DIR / "shapes-classifier.md").write_text(card)
    print("bundled shapes-classifier")


if __name__ == "__main__":
    main()
