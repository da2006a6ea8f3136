"""Copy trained Shapes runs into the package (``composable_ebm/bundled``) with model cards that carry
their measured quality.

    python -m benchmarks.bundle --runs runs/shapes [--device "2-core CPU"]

Reads ``RUNS/<attribute>/model`` (from ``cebm train``), ``runs/realism/realism-<label>.json`` (from
``benchmarks.realism``), ``runs/composition/composition.json`` (from ``benchmarks.composition``, when it
exists) and ``runs/realism/curve-<attribute>.json`` (from ``benchmarks.realism_curve``, when it exists).
Writes each model's card into its folder (``README.md``) and into ``model_cards/``. The bundled
classifier is left as it is.
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
    parser.add_argument("--realism", type=Path, default=ROOT / "runs" / "realism" / "realism-bundled.json")
    parser.add_argument("--device", default=f"{platform.machine()} CPU, {torch.get_num_threads()} threads")
    args = parser.parse_args()
    realism = json.loads(args.realism.read_text())["rows"]
    composition_path = ROOT / "runs" / "composition" / "composition.json"
    composition = json.loads(composition_path.read_text()) if composition_path.is_file() else None
    for attribute in ATTRIBUTES:
        run = args.runs / attribute
        model = load_model(run / "model")
        recipe = ROOT / "recipes" / f"shapes-{attribute}.toml"
        rows = [r for r in realism if r["attribute"] == attribute]
        quality = ["## Measured quality", "", "`python -m benchmarks.realism` (64 samples per value with the default"
                   " sampler settings, against fresh renders of that value; read by `shapes-classifier`). FID ratio:"
                   " FID in the classifier's features over the floor of as many fresh renders (1 = as close as real"
                   " images); HF ratio: high-frequency energy over the renders'.", "",
                   "| value | accuracy | FID ratio | HF ratio | largest coverage gap (other attributes) |",
                   "| --- | --- | --- | --- | --- |"]
        quality += [f"| {r['value']} | {r['accuracy']:.3f} | {r['fid_ratio']:.1f} | {r['hf_ratio']:.2f} |"
                    f" {max(r['coverage_gap'].values()):.2f} |" for r in rows]
        curve_path = ROOT / "runs" / "realism" / f"curve-{attribute}.json"
        if curve_path.is_file():
            quality += ["", "Against training time (`python -m benchmarks.realism_curve`, one point per checkpoint):", "",
                        "| step | minutes | median FID ratio | median HF ratio | mean accuracy |",
                        "| --- | --- | --- | --- | --- |"]
            quality += [f"| {p['step']} | {p['minutes']:.0f} | {p['fid_ratio_median']:.1f} | {p['hf_ratio_median']:.2f} |"
                        f" {p['accuracy_mean']:.3f} |" for p in json.loads(curve_path.read_text())]
        if composition is not None:
            for form, summary in composition["summaries"].items():
                quality += ["", f"Every conjunction with the other bundled models that names this model's attribute"
                            f" (`python -m benchmarks.composition`, {form} form, {composition['n']} samples each):", ""]
                picked = [c for c in composition["rows"][form] if attribute in c["target"]]
                for arity in (2, 3, 4):
                    joint = [c["joint"] for c in picked if c["arity"] == arity]
                    if joint:
                        quality.append(f"- {arity} attributes: {len(joint)} composites, mean joint accuracy"
                                       f" {sum(joint) / len(joint):.3f}, worst {min(joint):.3f}")
        notes = "\n".join([
            "## Data and limitations", "",
            "Trained on the procedural Shapes dataset (16x16, `composable_ebm.shapes`, training split) with every red"
            " circle held out; no augmentation of its positives can draw one (flips at most), and every training"
            " chain starts from noise. Trained with label dropout 0.1, so the unbound model is its unconditional"
            " energy (`guided(...)` composition uses it).",
            f"Trained on {args.device} in about {_training_minutes(run):.0f} minutes (from the logged step times),"
            " one thread, sharing the machine's two cores with another training run. Small, briefly"
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


if __name__ == "__main__":
    main()
