"""Copy the trained mnist runs and the digit classifier into the package (``composable_ebm/bundled``) with model
cards that carry their measured quality.

    python -m benchmarks.bundle_mnist --run digit=runs/mnist/mnist-digit@"one thread of a 2-core CPU" ... \
        --classifier runs/mnist/mnist-classifier --table runs/mnist-bench/table.json

``--run ATTRIBUTE=RUN@DEVICE`` names each of digit, thickness and slant's run (``cebm train
recipes/mnist-<attribute>.toml --out RUN``: its ``model/`` and its log) and where it trained. Each model's
``[sampling]`` settings are its recipe's as they stand. The cards give the rows of ``python -m benchmarks.mnist
--models bundled`` (its merged ``table.json``); before that table exists they say nothing measured, so bundle,
measure, then bundle again (``--cards-only``: the bundled weights kept, the training facts read from the old cards).
The classifier is read on the digits ``cebm train-classifier`` kept out of its training (its ``--seed`` split of
the folder ``cebm data mnist`` writes). Writes each card into ``model_cards/`` and into the model's folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from benchmarks.bundle import CARDS_DIR, bundle_classifier_as
from benchmarks.bundle_faces import Stage, _guidance, _trained_from_card, _trained_from_runs
from benchmarks.mnist import ATTRIBUTES, HELD_OUT
from composable_ebm.data import mnist
from composable_ebm.data.mnist import LICENSE, SOURCE, THRESHOLDS
from composable_ebm.model_cards import model_card, recipe_text
from composable_ebm.models import BUNDLED_DIR, load_model, save_model
from composable_ebm.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[1]
CLASSIFIER = "mnist-classifier"
READ_BY = {"digit": f"`{CLASSIFIER}`", "thickness": "`stroke_width`", "slant": "`slant`"}
MEANING = {
    "digit": "the digit its writer was asked for (MNIST's label)",
    "thickness": "`thin` or `thick`: the mean stroke width (`composable_ebm.data.mnist.stroke_width`, twice the ink's"
                 " area over its perimeter) below or above its median over the 10,000 digits,"
                 f" {THRESHOLDS['thickness']:.2f} pixels",
    "slant": "`left` or `right`: the shear (`composable_ebm.data.mnist.slant`, how far the ink moves right per row up)"
             f" below or above its median over the 10,000 digits, {THRESHOLDS['slant']:.3f}",
}


def held_out_split(n: int, share: float = 0.1, seed: int = 0) -> torch.Tensor:
    """The rows `cebm train-classifier --held-out SHARE --seed SEED` keeps out of training
    (`composable_ebm.evaluation.classifier.fit_classifier`'s split)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:int(round(share * n))]


def bundle_classifier(source: Path) -> None:
    """Copy the digit classifier under its short name with a card giving its accuracy on held-out real digits."""
    classifier = load_model(source).eval()
    data = mnist()
    test = held_out_split(len(data))
    bundle_classifier_as(
        classifier, CLASSIFIER, data.images[test].float() / 255, {"digit": data.labels["digit"][test]}, "mnist",
        f"Reads the digit of a 28x28 grey handwritten digit ({SOURCE}); `benchmarks/mnist.py` scores the mnist"
        " models' samples and compositions with it, and its penultimate features are the space of their FID ratio."
        " Thickness and slant are not its to read: the functions that labelled the data measure them"
        " (`composable_ebm.data.mnist.measure`). It reads only what it was trained on: real digits. Artefacts in"
        " samples can still be read as a digit, so look at the samples too.",
        f"Accuracy on the {len(test):,} digits `cebm train-classifier` kept out of its training (`cebm data mnist`,"
        " then `cebm train-classifier DATA -a digit --size 28`, its default 10% split, seed 0; `python -m"
        " benchmarks.bundle_mnist`):", license=LICENSE)


def _rows(table: Path) -> list[dict]:
    if not table.exists():
        print(f"no {table} (`python -m benchmarks.mnist --merge`): cards without measured quality")
        return []
    return json.loads(table.read_text())["rows"]


def _quality(attribute: str, rows: list[dict]) -> list[str]:
    """The card's measured section: the model alone per value, and the composites that name its attribute."""
    alone = [r for r in rows if r["kind"] == "alone" and attribute in r["target"]]
    if not alone:
        return ["## Measured quality", "", "Not measured yet (`python -m benchmarks.mnist --models bundled`)."]
    lines = ["## Measured quality", "",
             f"`python -m benchmarks.mnist --models bundled` ({alone[0]['n']} samples per row with the model's own"
             f" sampler settings; the digit read by `{CLASSIFIER}`, thickness and slant by the functions that labelled"
             " the data). FID ratio: FID in the classifier's features against real digits of the value, over the"
             " floor of as many other real digits (1 = as close as real handwriting); HF ratio: high-frequency energy"
             " over the real digits'.", "",
             "| value | read right | FID ratio | HF ratio |", "| --- | --- | --- | --- |",
             *(f"| {r['target'][attribute]} | {r['joint']:.3f} | {r['fid_ratio']:.1f} | {r['hf_ratio']:.2f} |"
               for r in alone)]
    named = [r for r in rows if r["kind"] == "conjunction" and attribute in r["target"]]
    if named:
        lines += ["", "Every conjunction with the other mnist models that names this model's attribute, guided:", ""]
        for arity in (2, 3):
            joint = [r["joint"] for r in named if r["arity"] == arity]
            lines.append(f"- {arity} attributes: {len(joint)} composites, mean joint accuracy"
                         f" {statistics.mean(joint):.3f}, worst {min(joint):.3f}")
        held = next(r for r in named if r.get("held_out"))
        lines.append(f"- the held-out thick, left-leaning 7: {held['joint']:.3f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", default=[], metavar="ATTRIBUTE=RUN@DEVICE",
                        help="each model's run (cebm train --out RUN) and where it trained")
    parser.add_argument("--classifier", type=Path, default=ROOT / "runs" / "mnist" / "mnist-classifier")
    parser.add_argument("--table", type=Path, default=ROOT / "runs" / "mnist-bench" / "table.json",
                        help="the merged table of python -m benchmarks.mnist --models bundled")
    parser.add_argument("--cards-only", action="store_true",
                        help="keep the bundled weights and classifier; write the models' cards again (training facts"
                             " from the old cards, settings from the recipes, quality from --table)")
    args = parser.parse_args()
    runs: dict[str, Stage] = {}
    for item in args.run:
        attribute, _, rest = item.partition("=")
        run, _, device = rest.partition("@")
        if attribute not in ATTRIBUTES or not run or not device:
            raise SystemExit(f"--run {item!r}: write ATTRIBUTE=RUN@DEVICE with ATTRIBUTE one of {list(ATTRIBUTES)}")
        runs[attribute] = Stage(Path(run), device, None)
    if args.cards_only == bool(runs) or (runs and set(runs) != set(ATTRIBUTES)):
        raise SystemExit(f"give one --run for each of {list(ATTRIBUTES)}, or --cards-only")
    rows = _rows(args.table)
    if not args.cards_only:
        bundle_classifier(args.classifier)
    held = ", ".join(f"{a} {v}" for a, v in HELD_OUT.items())
    for attribute in ATTRIBUTES:
        name = f"mnist-{attribute}"
        if args.cards_only:
            model = load_model(BUNDLED_DIR / name)
            steps, trained, reproduce = _trained_from_card((CARDS_DIR / f"{name}.md").read_text())
        else:
            model = load_model(runs[attribute].run / "model")
            steps, trained, reproduce = _trained_from_runs(name, [runs[attribute]])
        recipe = ROOT / "recipes" / f"{name}.toml"
        spec = load_recipe(recipe)
        model.sampling_defaults = spec.sampling  # the recipe's [sampling] as it stands (its guidance scale)
        notes = "\n".join([
            "## Data and limitations", "",
            f"Trained on the mnist dataset (`cebm data mnist`: {SOURCE}), 28x28 grey, every digit but the"
            f" combination held out ({held}: no mnist model saw one); conditioned on `{attribute}`:"
            f" {MEANING[attribute]}. A noise-conditioned energy (docs/diffusion.md): sampled down a ladder of noise"
            " levels. Label dropout trained its unconditional energy, so sums with the other mnist models sample in"
            " the guided form by default. " + _guidance(spec.sampling), "",
            trained + " Small, briefly trained models: check the accuracies below before relying on a combination.",
            "", "## Reproduce", "", "```bash", *reproduce, "```", "",
            *_quality(attribute, rows),
        ])
        evals = [{"task": "unconditional-image-generation", "dataset": "mnist", "metric": "accuracy",
                  "value": round(r["joint"], 3), "name": f"{r['target'][attribute]} read right by"
                  f" {READ_BY[attribute].strip('`')}"}
                 for r in rows if r["kind"] == "alone" and attribute in r["target"]]
        card = model_card(model, recipe=recipe_text(recipe), recipe_name=recipe.name, steps=steps, notes=notes,
                          metrics=["accuracy"], location=name, license=LICENSE, datasets=None, eval_results=evals)
        CARDS_DIR.mkdir(exist_ok=True)
        (CARDS_DIR / f"{name}.md").write_text(card)
        save_model(model, BUNDLED_DIR / name, card=card)
        print(f"bundled {name}")


if __name__ == "__main__":
    main()
