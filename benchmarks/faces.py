"""Faces attribute models: each alone, and composed over the whole table of smiling, glasses and hat.

    python -m benchmarks.faces --models runs --classifier runs/faces-classifier [--n 64] [--label trained]

Reads ``MODELS/faces-<attribute>/model`` for smiling, glasses, hat and hair (or a checkpoint's EMA, via
``cebm export``), samples every value with the model's own settings and reads the samples with the faces classifier:

- alone: accuracy per value, how far the other attributes' mix is from the data's, FID ratio (in the classifier's
  features, over the floor of as many fresh renders) and high-frequency ratio against renders of that value;
- composed: every conjunction of 2 and 3 of smiling, glasses and hat, every value (12 pairs, 8 triples), in the
  guided form: joint accuracy (every conditioned attribute read right at once), with the held-out triple
  (smiling + glasses + hat) marked;

and writes a contact sheet of samples beside renders for each row. The table goes into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

from benchmarks._report import machine, write_section
from composable_ebm import load, save_image_grid
from composable_ebm.data import FACES_ATTRIBUTES, faces
from composable_ebm.evaluation.conditional import max_deviation, value_distribution
from composable_ebm.evaluation.realism import contact_sheet, realism

ROOT = Path(__file__).resolve().parents[1]
ATTRIBUTES = ("smiling", "glasses", "hat", "hair")
COMPOSED = ("smiling", "glasses", "hat")
HELD_OUT = {"smiling": "yes", "glasses": "yes", "hat": "yes"}


def _matches(labels: dict[str, torch.Tensor], target: dict[str, str]) -> torch.Tensor:
    keep = torch.ones(next(iter(labels.values())).shape[0], dtype=torch.bool)
    for a, v in target.items():
        keep &= labels[a] == FACES_ATTRIBUTES[a].index(v)
    return keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / "runs")
    parser.add_argument("--classifier", default=str(ROOT / "runs" / "faces-classifier"))
    parser.add_argument("--n", type=int, default=64, help="samples per value and per composite")
    parser.add_argument("--label", default="trained")
    args = parser.parse_args()
    start = time.perf_counter()
    classifier = load(args.classifier)
    data = faces(20000, seed=0, size=16)  # the training renders (all of them: held-out faces included)
    fresh = faces(4000, seed=1, size=16)  # renders no model saw, for the floor and the sheets
    fresh_images = fresh.images.float() / 255
    reference = data.images[:2000].float() / 255
    labels = {a: v for a, v in data.labels.items()}
    features = classifier.features
    models = {a: load(args.models / f"faces-{a}" / "model") for a in ATTRIBUTES}
    rows, sheet_rows = [], []
    for a, model in models.items():
        for value in FACES_ATTRIBUTES[a]:
            samples = model.condition(**{a: value}).sample(args.n, seed=0)
            read = classifier.predict(samples)
            accuracy = float((read[a] == FACES_ATTRIBUTES[a].index(value)).float().mean())
            want = _matches(labels, {a: value})
            gaps = {b: max_deviation(value_distribution(read[b], FACES_ATTRIBUTES[b]),
                                     value_distribution(labels[b][want], FACES_ATTRIBUTES[b]))
                    for b in ATTRIBUTES if b != a}
            real = fresh_images[_matches(fresh.labels, {a: value})]
            score = realism(samples, real[: args.n * (real.shape[0] // args.n)][: 4 * args.n],
                            reference[_matches({k: v[:2000] for k, v in labels.items()}, {a: value})], features)
            rows.append({"model": f"faces-{a}", "value": value, "accuracy": accuracy, "fid_ratio": score.fid_ratio,
                         "hf_ratio": score.hf_ratio, "gaps": gaps})
            sheet_rows.append((samples, real))
    composites = []
    for arity in (2, 3):
        for names in itertools.combinations(COMPOSED, arity):
            for values in itertools.product(*(FACES_ATTRIBUTES[a] for a in names)):
                target = dict(zip(names, values))
                energy = sum(models[a].condition(**{a: v}) for a, v in target.items())
                samples = energy.sample(args.n, seed=1)
                read = classifier.predict(samples)
                hits = torch.stack([read[a] == FACES_ATTRIBUTES[a].index(v) for a, v in target.items()]).all(dim=0)
                composites.append({"target": target, "arity": arity, "joint": float(hits.float().mean()),
                                   "held_out": target == HELD_OUT})
                if target == HELD_OUT:
                    sheet_rows.append((samples, fresh_images[_matches(fresh.labels, HELD_OUT)]))
    minutes = (time.perf_counter() - start) / 60
    out = ROOT / "docs" / "images" / f"faces-{args.label}.png"
    save_image_grid(contact_sheet(sheet_rows, per_row=8, scale=1)[None], out, scale=4)
    (ROOT / "runs").mkdir(exist_ok=True)
    (ROOT / "runs" / f"faces-{args.label}.json").write_text(json.dumps({"rows": rows, "composites": composites}, indent=2))
    fid = sorted(r["fid_ratio"] for r in rows)
    lines = [
        f"## Faces models ({args.label})", "",
        f"`python -m benchmarks.faces --n {args.n} --label {args.label}` on {machine()} ({minutes:.1f} min). Each model"
        f" alone: {args.n} samples per value with its own settings, read by the faces classifier (`cebm"
        " train-classifier` on the 20,000 training renders); the largest gap between the other attributes' mix and"
        " the data's under that value; FID ratio in the classifier's features against fresh renders of that value;"
        " high-frequency ratio. Targets: every value >= 0.95, gaps <= 0.10, median FID ratio <= 3 (worst <= 6), HF"
        " ratio <= 1.5.", "",
        f"Median FID ratio **{fid[len(fid) // 2]:.1f}** (worst {fid[-1]:.1f}); accuracy mean"
        f" {sum(r['accuracy'] for r in rows) / len(rows):.3f} (worst {min(r['accuracy'] for r in rows):.3f}).", "",
        "| model | value | accuracy | FID ratio | HF ratio | largest gap (other attributes) |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {r['model']} | {r['value']} | {r['accuracy']:.3f} | {r['fid_ratio']:.1f} | {r['hf_ratio']:.2f} |"
          f" {max(r['gaps'], key=r['gaps'].get)} {max(r['gaps'].values()):.2f} |" for r in rows),
        "",
        "Guided composites of smiling, glasses and hat (every value; targets: mean joint >= 0.95 / 0.92 for 2 / 3"
        " attributes, worst >= 0.75, the held-out triple >= 0.85):", "",
        "| attributes | composites | mean joint | worst |", "| --- | --- | --- | --- |",
    ]
    for arity in (2, 3):
        joint = [c["joint"] for c in composites if c["arity"] == arity]
        lines.append(f"| {arity} | {len(joint)} | {sum(joint) / len(joint):.3f} | {min(joint):.3f} |")
    held = next(c for c in composites if c["held_out"])
    lines += ["", f"Held-out triple `faces-smiling[smiling=yes] + faces-glasses[glasses=yes] + faces-hat[hat=yes]`:"
              f" joint {held['joint']:.3f}.", "",
              f"Samples (left) beside fresh renders (right), one row per value of each model, then the held-out triple:", "",
              f"![faces, {args.label}](images/{out.name})"]
    write_section(f"faces-{args.label}", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
