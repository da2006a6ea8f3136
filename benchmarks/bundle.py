"""Copy trained Shapes runs into the package (``composable_ebm/bundled``) with model cards that carry
their measured quality.

    python -m benchmarks.bundle --runs runs/shapes [--device "2-core CPU"]
    python -m benchmarks.bundle --cards-only --realism runs/realism/realism-bundled.json \
        --composition runs/composition-bundled/composition.json    # new cards for the models already bundled
    python -m benchmarks.bundle --sync-cards    # after a recipe or config edit: the cards' recipe and config blocks

Reads ``RUNS/<attribute>/model`` (from ``cebm train``), ``runs/realism/realism-<label>.json`` (from
``benchmarks.realism``), ``runs/composition/composition.json`` (from ``benchmarks.composition``, when it
exists) and ``runs/realism/curve-<attribute>.json`` (from ``benchmarks.realism_curve``, when it exists).
Writes each model's card into ``model_cards/`` (the one source of the cards) and from there into its folder
(``README.md``); tests/test_bundled.py checks that the two agree. The bundled classifier is left as it is.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
from pathlib import Path

import torch

from benchmarks._shapes import ATTRIBUTES, ROOT
from composable_ebm.models import BUNDLED_DIR, load_model, save_model
from composable_ebm.model_cards import model_card, recipe_text
from composable_ebm.recipes import load_recipe
from composable_ebm.training import read_log

CARDS_DIR = ROOT / "model_cards"  # the cards of the bundled models, as rendered into each model folder
FINE_TUNED = {"color": "shapes-color-palette.toml"}
"""Bundled models made in two stages: ``recipes/shapes-<attribute>.toml``, then this recipe from its weights
(``cebm train RECIPE --init FIRST/model --allow-config-change``)."""


def _training_minutes(run: Path, until: int | None = None) -> float:
    """Wall time of the run's first ``until`` steps (all of them by default), estimated from the logged per-step
    times."""
    records = [r for r in read_log(run) if "seconds" in r and (until is None or r["step"] <= until)]
    steps = until or max(r["step"] for r in records)
    return sum(r["seconds"] for r in records) / len(records) * steps / 60


def _stages(old_card: str) -> tuple[int, float, int | None, float | None]:
    """A bundled card's training facts: the first stage's iterations and minutes, then the fine-tune's (None when
    the model had one stage)."""
    staged = re.search(r"first stage, (\d+) iterations in about (\d+) minutes; then (\d+) iterations of the"
                       r" fine-tune in about (\d+) minutes", old_card)
    if staged:
        a, b, c, d = staged.groups()
        return int(a), float(b), int(c), float(d)
    steps = int(re.search(r"Trained for (\d+) iterations", old_card).group(1))
    return steps, float(re.search(r"in about (\d+) minutes", old_card).group(1)), None, None


def classifier_card_text(classifier, images, labels: dict, dataset: str, about: str, measured_on: str,
                         location: str, license: str = "mit") -> tuple[str, dict[str, float]]:
    """A bundled classifier's card (what it is for, how to use it, its accuracy on ``images``, fresh renders in
    [0, 1]) and that accuracy per attribute."""
    pred = classifier.predict(images)
    accuracy = {a: float((pred[a] == labels[a]).float().mean()) for a in labels}
    notes = "\n".join([
        "## What it is for", "", about, "",
        "## Measured quality", "", measured_on, "",
        "| attribute | accuracy |", "| --- | --- |",
        *(f"| {a} | {v:.3f} |" for a, v in accuracy.items()),
    ])
    evals = [{"task": "image-classification", "dataset": dataset, "metric": "accuracy", "value": round(v, 3),
              "name": f"{a} accuracy"} for a, v in accuracy.items()]
    card = model_card(classifier, notes=notes, location=location, license=license, metrics=["accuracy"],
                      eval_results=evals)
    return card, accuracy


def bundle_classifier_as(classifier, name: str, images, labels: dict, dataset: str, about: str, measured_on: str,
                         license: str = "mit") -> dict[str, float]:
    """Bundle a trained classifier under ``name``: its card (`classifier_card_text`, the accuracy on ``images``) in
    its folder and in model_cards/; returns that accuracy per attribute."""
    import dataclasses

    classifier.config = dataclasses.replace(classifier.config, name=name)
    card, accuracy = classifier_card_text(classifier, images, labels, dataset, about, measured_on, name,
                                          license=license)
    save_model(classifier, BUNDLED_DIR / name, card=card)
    CARDS_DIR.mkdir(exist_ok=True)
    (CARDS_DIR / f"{name}.md").write_text(card)
    print(f"bundled {name}: " + ", ".join(f"{a} {v:.3f}" for a, v in accuracy.items()))
    return accuracy


def classifier_card() -> None:
    """The bundled classifier's card: what it predicts, how to use it, its accuracy on fresh renders."""
    from composable_ebm.data import shapes

    classifier = load_model(BUNDLED_DIR / "shapes-classifier")
    data = shapes(2000, 16, seed=123, split="all")
    about = "\n".join([
        "Reads the four attributes of a 16x16 Shapes image; the benchmarks score samples and compositions with it,",
        "and its penultimate features are the space of their FID ratio. It reads only what it was trained on:",
        "clean renders. Artefacts in samples (speckle, stripes) can still be read as an attribute, so look at the",
        "samples too (the benchmarks put contact sheets beside every table)."])
    card, _ = classifier_card_text(
        classifier, data.images, data.labels, "shapes", about,
        "Accuracy on 2,000 fresh renders (every combination, seed 123; `python -m benchmarks.bundle --cards-only`):",
        "shapes-classifier")
    (BUNDLED_DIR / "shapes-classifier" / "README.md").write_text(card)
    CARDS_DIR.mkdir(exist_ok=True)
    (CARDS_DIR / "shapes-classifier.md").write_text(card)
    print("card of shapes-classifier")


def recipe_of(name: str) -> Path:
    """The recipe a bundled model was made with (the last stage's, for a model made in two)."""
    attribute = name.removeprefix("shapes-")
    return ROOT / "recipes" / (FINE_TUNED[attribute] if attribute in FINE_TUNED else f"{name}.toml")


def sync_cards() -> None:
    """Write each card's recipe and config blocks again from the recipes and config.json as they stand, then copy
    ``model_cards/NAME.md`` to the bundled folder's README.md: the measured text of a card stays its own."""
    from composable_ebm.model_cards import refresh_card
    from composable_ebm.persistence import read_config

    for card_path in sorted(CARDS_DIR.glob("*.md")):
        name = card_path.stem
        folder = BUNDLED_DIR / name
        recipe = None if name.endswith("-classifier") else recipe_text(recipe_of(name))
        card = refresh_card(card_path.read_text(), recipe, read_config(folder)["config"])
        card_path.write_text(card)
        (folder / "README.md").write_text(card)
        print(f"card of {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sync-cards", action="store_true",
                        help="only write the cards' recipe and config blocks again and copy them to the bundled folders")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "shapes")
    parser.add_argument("--realism", type=Path, default=ROOT / "runs" / "realism" / "realism-bundled.json")
    parser.add_argument("--device", default=f"{platform.machine()} CPU, {torch.get_num_threads()} threads")
    parser.add_argument("--composition", type=Path, default=ROOT / "runs" / "composition" / "composition.json")
    parser.add_argument("--curves", default=str(ROOT / "runs" / "realism" / "curve-{attribute}.json"),
                        help="each run's realism curve (benchmarks.realism_curve --label), {attribute} filled in")
    parser.add_argument("--cards-only", action="store_true",
                        help="keep the bundled weights; write their cards (training facts read from the old cards)")
    parser.add_argument("--fine-tune", nargs="*", default=[], metavar="ATTRIBUTE=RUN:STEP",
                        help="with --cards-only: the bundled model is the fine-tune of FINE_TUNED, whose run is RUN and"
                             " whose weights are its STEP-th; the first stage's facts are read from the old card")
    args = parser.parse_args()
    if args.sync_cards:
        sync_cards()
        return
    realism = json.loads(args.realism.read_text())["rows"]
    composition = json.loads(args.composition.read_text()) if args.composition.is_file() else None
    fine_tunes = {}
    for item in args.fine_tune:
        attribute, _, where = item.partition("=")
        run, _, step = where.rpartition(":")
        if attribute not in FINE_TUNED or not run or not step.isdigit():
            raise SystemExit(f"--fine-tune {item!r}: write ATTRIBUTE=RUN:STEP with ATTRIBUTE one of {sorted(FINE_TUNED)}")
        fine_tunes[attribute] = (Path(run), int(step))
    if args.cards_only:
        classifier_card()
    for attribute in ATTRIBUTES:
        run = args.runs / attribute
        name = f"shapes-{attribute}"
        model = load_model(BUNDLED_DIR / name if args.cards_only else run / "model")
        first_recipe = ROOT / "recipes" / f"shapes-{attribute}.toml"
        recipe = ROOT / "recipes" / FINE_TUNED[attribute] if attribute in FINE_TUNED else first_recipe
        tune_steps = tune_minutes = None
        if args.cards_only:
            old = (BUNDLED_DIR / name / "README.md").read_text()
            first_steps, first_minutes, tune_steps, tune_minutes = _stages(old)
            if attribute in fine_tunes:
                tune_run, tune_steps = fine_tunes[attribute]
                tune_minutes = _training_minutes(tune_run, tune_steps)
            device = re.search(r"Trained on (.*?) in about", old).group(1)
        else:
            if attribute in FINE_TUNED:
                raise SystemExit(f"shapes-{attribute} is made in two stages: bundle it with --cards-only --fine-tune")
            first_minutes = _training_minutes(run)
            first_steps = max(r["step"] for r in read_log(run) if "step" in r)
            device = args.device
        staged = tune_steps is not None
        if staged != (attribute in FINE_TUNED):
            raise SystemExit(f"shapes-{attribute}: its card and FINE_TUNED disagree on whether it was fine-tuned;"
                             f" pass --fine-tune {attribute}=RUN:STEP")
        steps = first_steps + (tune_steps or 0)
        minutes = first_minutes + (tune_minutes or 0)
        rows = [r for r in realism if r["attribute"] == attribute]
        counts = {(r["n"], r.get("coverage_n", r["n"])) for r in rows}
        (n, coverage_n), = counts
        quality = ["## Measured quality", "", f"`python -m benchmarks.realism` ({n} samples per value with the default"
                   " sampler settings, against fresh renders of that value, every combination; read by `shapes-classifier`). FID ratio:"
                   " FID in the classifier's features over the floor of as many fresh renders (1 = as close as real"
                   " images); HF ratio: high-frequency energy over the renders'. Accuracy and the coverage gap (the largest"
                   " difference between the samples' and the data's distribution of another attribute) are read from"
                   f" {coverage_n} samples per value.", "",
                   "| value | accuracy | FID ratio | HF ratio | largest coverage gap (other attributes) |"
                   " largest gap to the blind training mix |",
                   "| --- | --- | --- | --- | --- | --- |"]
        quality += [f"| {r['value']} | {r['accuracy']:.3f} | {r['fid_ratio']:.1f} | {r['hf_ratio']:.2f} |"
                    f" {max(r['coverage_gap'].values()):.2f} |"
                    + (f" {max(r['coverage_gap_blind'].values()):.2f} |" if "coverage_gap_blind" in r else " |")
                    for r in rows]
        quality += [] if not all("coverage_gap_blind" in r for r in rows) else ["", "The blind training mix is what a channel-blind network trained on the training split can draw at"
                    " best (the split averaged over colour permutations: colour uniform, circles 0.25 of every mix;"
                    " `blind_training_mix` in `benchmarks/realism.py`)."]
        curve_path = Path(args.curves.format(attribute=attribute))
        if curve_path.is_file() and not args.cards_only:  # the curve belongs to the runs, not the bundled weights
            quality += ["", "Against training time (`python -m benchmarks.realism_curve`, the saved checkpoints):", "",
                        "| step | minutes | median FID ratio | median HF ratio | mean accuracy |",
                        "| --- | --- | --- | --- | --- |"]
            quality += [f"| {p['step']} | {p['minutes']:.0f} | {p['fid_ratio_median']:.1f} | {p['hf_ratio_median']:.2f} |"
                        f" {p['accuracy_mean']:.3f} |" for p in json.loads(curve_path.read_text())]
        elif args.cards_only:  # the old card's curve, of the runs that made the weights (or the first stage's)
            curve = re.search(r"\n((?:The first stage a|A)gainst training time \(.*?\n\n(?:\|.*\n)+)", old)
            if curve:
                text = curve.group(1).rstrip("\n")
                if staged and "first stage" not in text:
                    text = text.replace("Against training time", "The first stage against training time", 1)
                quality += ["", *text.split("\n")]
        if composition is not None:
            for form, summary in composition["summaries"].items():
                picked = [c for c in composition["rows"][form] if attribute in c["target"]]
                quality += ["", f"Every conjunction with the other bundled models that names this model's attribute"
                            f" (`python -m benchmarks.composition`, {form} form, {picked[0]['n']} samples each):", ""]
                for arity in (2, 3, 4):
                    joint = [c["joint"] for c in picked if c["arity"] == arity]
                    if joint:
                        quality.append(f"- {arity} attributes: {len(joint)} composites, mean joint accuracy"
                                       f" {sum(joint) / len(joint):.3f}, worst {min(joint):.3f}")
        recipe_settings = load_recipe(recipe)
        if recipe_settings.sampling is not None and not args.cards_only:
            model.sampling_defaults = recipe_settings.sampling  # the recipe's [sampling] as it stands (guidance_scale)
        scale = model.sampling_defaults.guidance_scale if model.sampling_defaults is not None else 1.0
        data = recipe_settings.trainer
        permuted = data.data_augment is not None and data.data_augment.channel_permute_prob > 0
        notes = "\n".join([
            "## Data and limitations", "",
            "Trained on the procedural Shapes dataset (16x16, `composable_ebm.shapes`, training split) with every red"
            " circle held out. " + ("Its positives were augmented with RGB channel permutations, which draw red"
                                    " circles from green and blue ones: held out of the data, not of the augmented"
                                    " positives." if permuted else "No augmentation of its positives can draw one.")
            + (f" {100 * (1 - data.reinit_prob):.0f}% of its training chains continue from a replay buffer."
               if data.reinit_prob < 1 else " Every training chain starts from noise.")
            + (" Trained with label dropout, so the unbound model is its unconditional energy (`guided(...)`"
               " composition uses it)." if data.label_dropout > 0 else " Trained without label dropout: bind its"
               " attribute (it has no unconditional energy, so no `guided(...)` form).")
            + (f" Its guidance scale is {scale:g} (`[sampling] guidance_scale`): in a guided composite its term's"
               f" weight is multiplied by {scale:g}, so `guided(a + {name}[...])` pulls towards its value"
               f" {scale:g} times as hard as the weight reads."
               if scale != 1 else ""),
            f"Trained on {device} in about {minutes:.0f} minutes (from the logged step times"
            + (f"; the first stage, {first_steps} iterations in about {first_minutes:.0f} minutes; then {tune_steps}"
               f" iterations of the fine-tune in about {tune_minutes:.0f} minutes" if staged else "")
            + "), one thread, sharing the machine's two cores with other training runs. Small, briefly"
            " trained models: check the accuracies below before relying on a combination.",
            "", "## Reproduce", "", "```bash",
            *([f"cebm train recipes/shapes-{attribute}.toml --out runs/{attribute}"] if not staged else [
                f"cebm train recipes/shapes-{attribute}.toml --out runs/{attribute}-base",
                f"cebm train recipes/{recipe.name} --out runs/{attribute} --init runs/{attribute}-base/model"
                " --allow-config-change"]),
            "```", "", *quality,
        ])
        evals = [{"task": "unconditional-image-generation", "dataset": "shapes", "metric": "accuracy",
                  "value": round(r["accuracy"], 3), "name": f"{r['value']} read right by shapes-classifier"}
                 for r in rows]
        card = model_card(model, recipe=recipe_text(recipe), recipe_name=recipe.name, steps=steps, notes=notes,
                          metrics=["accuracy"], location=name, license="mit", datasets=None, eval_results=evals)
        CARDS_DIR.mkdir(exist_ok=True)
        (CARDS_DIR / f"shapes-{attribute}.md").write_text(card)
        if args.cards_only:
            (BUNDLED_DIR / name / "README.md").write_text(card)
        else:
            save_model(model, BUNDLED_DIR / name, card=card)
        print(f"bundled shapes-{attribute}")


if __name__ == "__main__":
    main()
