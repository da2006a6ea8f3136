"""Bundle the faces tables' second judges, ``faces-judge`` (16-px pixel-art) and ``faces64-judge`` (64-px lorelei),
with cards that give their accuracy on fresh renders beside the first classifier's.

A second judge is another network (``--architecture residual``) trained on renders of another seed over a flat
background colour drawn per face (``--background random``), so it reads a face and not its background, and its
mistakes are not the first classifier's. Nothing in the recipes, the samplers or their defaults is chosen by it:
`benchmarks.faces` reads every row with both and lists the rows they read apart. Made by::

    cebm data faces --background random --seed 7 -n 20000 --out data/faces-judge16
    cebm --threads 1 train-classifier data/faces-judge16 --out runs/judge/faces-judge --size 16 \\
        --architecture residual --seed 7 --name faces-judge --steps 3000
    cebm data faces --style lorelei --size 64 --background random --seed 7 -n 20000 --out data/faces64-judge
    cebm --threads 1 train-classifier data/faces64-judge --out runs/judge/faces64-judge --size 64 \\
        --architecture residual --pooling flatten --width 16 --seed 7 --name faces64-judge --steps 3000
    python -m benchmarks.bundle_judges --style pixel-art --run runs/judge/faces-judge --minutes M
    python -m benchmarks.bundle_judges --style lorelei --run runs/judge/faces64-judge --minutes M
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from benchmarks.bundle import CARDS_DIR
from benchmarks.faces import TABLES, FacesTable
from composable_ebm.data import faces
from composable_ebm.data.faces import STYLES
from composable_ebm.evaluation.classifier import attribute_accuracy
from composable_ebm.model_cards import model_card
from composable_ebm.models import BUNDLED_DIR, load_model, save_model

MEASURED_ON = 2000
"""Fresh renders (seed 123, every combination) each judge's card is measured on, per background."""


def accuracies(classifier, t: FacesTable, background: str) -> dict[str, float]:
    """Per attribute, how often ``classifier`` reads `MEASURED_ON` fresh renders of ``t`` over ``background`` right."""
    data = faces(MEASURED_ON, seed=123, size=t.size, style=t.style, background=background)
    return attribute_accuracy(classifier, data.images, data.labels)


def card_notes(t: FacesTable, minutes: float, command: str, judge: dict[str, dict[str, float]],
               first: dict[str, dict[str, float]]) -> str:
    """What the judge is for, how it was made, and its accuracy beside the first classifier's."""
    rows = [f"| {a} | {judge['fixed'][a]:.3f} | {judge['random'][a]:.3f} | {first['fixed'][a]:.3f} |"
            f" {first['random'][a]:.3f} |" for a in judge["fixed"]]
    return "\n".join([
        "## What it is for", "",
        f"The second judge of the {t.size}-px {t.style} faces table (`python -m benchmarks.faces"
        + ("" if t.style == "pixel-art" else f" --style {t.style}") + f"`): it reads every row beside {t.classifier},"
        " and the table lists the rows the two read more than 0.05 apart. It is another network (residual blocks,"
        " ReLU, stride-2 convs, against the classifier's plain conv stages) trained on renders of another seed, each"
        " face over a flat background colour drawn for it, so it reads the face and not the background. No recipe,"
        " sampler setting or default of this project was chosen by reading it.", "",
        f"Faces: {STYLES[t.style].generator}.", "",
        "## How it was made", "",
        f"`{command}` (about {minutes:.0f} minutes on one thread of a 2-core CPU, beside other runs), on 20,000"
        " renders of seed 7 over random backgrounds"
        " (`cebm data faces --background random --seed 7`), 10% of them kept aside.", "",
        "## Measured quality", "",
        f"Accuracy on {MEASURED_ON:,} fresh renders of seed 123 (every combination; `python -m benchmarks.bundle_judges"
        f" --style {t.style}`), over the background the models draw (fixed) and over random ones, beside"
        f" {t.classifier} on the same renders:", "",
        f"| attribute | judge, fixed | judge, random | {t.classifier}, fixed | {t.classifier}, random |",
        "| --- | --- | --- | --- | --- |", *rows])


def bundle(t: FacesTable, run: str, minutes: float, command: str) -> None:
    """Copy the judge of ``run`` into the package under ``t.judge`` with its card (also in model_cards/)."""
    judge = load_model(run)
    judge.config = dataclasses.replace(judge.config, name=t.judge)
    first = load_model(t.classifier)
    measured = {who: {bg: accuracies(model, t, bg) for bg in ("fixed", "random")}
                for who, model in (("judge", judge), ("first", first))}
    notes = card_notes(t, minutes, command, measured["judge"], measured["first"])
    evals = [{"task": "image-classification", "dataset": "faces", "metric": "accuracy", "value": round(v, 3),
              "name": f"{a} accuracy"} for a, v in measured["judge"]["fixed"].items()]
    card = model_card(judge, notes=notes, location=t.judge, license="mit", metrics=["accuracy"], eval_results=evals)
    save_model(judge, BUNDLED_DIR / t.judge, card=card, overwrite=True)
    CARDS_DIR.mkdir(exist_ok=True)
    (CARDS_DIR / f"{t.judge}.md").write_text(card)
    print(f"bundled {t.judge}: " + ", ".join(f"{a} {v:.3f}" for a, v in measured["judge"]["fixed"].items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--style", choices=sorted(TABLES), required=True)
    parser.add_argument("--run", required=True, help="the judge's folder (cebm train-classifier --out)")
    parser.add_argument("--minutes", type=float, required=True, help="minutes it trained (for its card)")
    parser.add_argument("--command", default=None, help="the command that trained it (default: the docstring's)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t = TABLES[args.style]
    size = "--size 16" if t.size == 16 else "--size 64 --pooling flatten --width 16"
    folder = "data/faces-judge16" if t.size == 16 else "data/faces64-judge"
    command = args.command or (f"cebm --threads 1 train-classifier {folder} --out {args.run} {size} --architecture"
                               f" residual --seed 7 --name {t.judge} --steps 3000")
    bundle(t, args.run, args.minutes, command)


if __name__ == "__main__":
    main()
