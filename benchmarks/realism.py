"""Do the Shapes models' samples look like the data? Realism and attribute reading, per model and value.

For every value of every given model: ``--n`` samples with the model's default settings (what
``model.condition(attr=value).sample(n)`` gives a user), against fresh renders of that value from
the model's training split:

- FID ratio: FID in the bundled classifier's penultimate features of the samples against a
  reference of 1000 renders, over the floor (``--n`` other fresh renders against the same
  reference); 1 is "as real as real images";
- high-frequency ratio: mean |discrete Laplacian| of the samples over the renders';
- accuracy: how often the classifier reads the value asked for; coverage: the largest gap
  between the samples' and the data's distribution of each other attribute;
- a contact sheet per model (samples left, renders right, one row per value).

    python -m benchmarks.realism                                   # the bundled models
    python -m benchmarks.realism --models runs/screen/a/model --label a --no-doc
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path

import torch

from benchmarks._report import machine, write_section
from benchmarks._shapes import load_run
from composable_ebm import shapes
from composable_ebm.evaluation.conditional import max_deviation, value_distribution
from composable_ebm.evaluation.realism import contact_sheet, realism
from composable_ebm.models import load_model
from composable_ebm.images import save_image, to_pil

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ("shapes-shape", "shapes-color", "shapes-size", "shapes-position")
HOLDOUT = [{"color": "red", "shape": "circle"}]


def renders_of(attribute: str, index: int, n: int, seed: int, split: str = "train"):
    """``n`` fresh 16x16 renders whose ``attribute`` has value ``index`` (with their labels)."""
    pool = shapes(max(20 * n, 800), 16, seed=seed, holdout=HOLDOUT, split=split)
    keep = torch.nonzero(pool.labels[attribute] == index).squeeze(1)[:n]
    if keep.numel() < n:
        raise RuntimeError(f"only {keep.numel()} renders of {attribute} = {index} in the pool; raise its size")
    return pool.images[keep], {a: v[keep] for a, v in pool.labels.items()}


def blind_training_mix(attribute: str, index: int, attributes: dict[str, tuple[str, ...]], seed: int) -> dict:
    """The other attributes' distribution under ``attribute`` = value ``index`` in the training split (red circles
    held out) as a channel-blind network sees it: averaged over the colour permutations it cannot tell apart,
    so colour is uniform and independent, and a colour value stands for every colour (its mix is the whole
    split's). It is the best such a model trained on that split can draw: a circle is 2 of the split's 8
    shape-and-colour combinations (0.25), not the 1 in 3 of every combination."""
    pool = shapes(20000, 16, seed=seed, holdout=HOLDOUT, split="train")
    keep = torch.ones(len(pool), dtype=torch.bool) if attribute == "color" else pool.labels[attribute] == index
    mix = {a: value_distribution(pool.labels[a][keep], vs) for a, vs in attributes.items() if a != attribute}
    if "color" in mix:
        mix["color"] = {v: 1 / len(attributes["color"]) for v in attributes["color"]}
    return mix


def measure_model(model, classifier, n: int, seed: int, sampler_overrides: dict, split: str = "train",
                  coverage_n: int | None = None) -> list[dict]:
    """One row per value of the model's (single) attribute, against renders of ``split`` (``train``: the
    training split, red circles held out; ``all``: every combination).

    FID and HF ratio come from ``n`` samples. Accuracy and coverage are read from ``coverage_n`` samples
    (those ``n`` and more, drawn with other seeds; default ``n``): with 64 the coverage gap of a perfect
    model is about 0.08 by chance alone, too coarse for a 0.10 target. The data's distribution of the
    other attributes is read from the labels of the 1000 reference renders (``coverage_gap``); the gap to what
    a channel-blind model of the training split can draw at best is ``coverage_gap_blind`` (`blind_training_mix`).
    """
    (attribute, values), = model.attributes.items()
    coverage_n = max(coverage_n or n, n)
    rows = []
    for index, value in enumerate(values):
        reference, reference_labels = renders_of(attribute, index, 1000, seed=100 + index, split=split)
        real, _ = renders_of(attribute, index, 4 * n, seed=200 + index, split=split)
        conditioned = model.condition(**{attribute: value})
        samples = conditioned.sample(n, seed=seed + index, **sampler_overrides)
        score = realism(samples, real, reference, classifier.features)
        read = samples
        if coverage_n > n:
            more = conditioned.sample(coverage_n - n, seed=seed + 1000 + index, **sampler_overrides)
            read = torch.cat([samples, more])
        pred = classifier.predict(read)
        drawn = {a: value_distribution(pred[a], vs) for a, vs in classifier.config.attributes.items()}
        others = {a: max_deviation(drawn[a], value_distribution(reference_labels[a], vs))
                  for a, vs in classifier.config.attributes.items() if a != attribute}
        blind = blind_training_mix(attribute, index, classifier.config.attributes, seed=700 + index)
        blind_gap = {a: max_deviation(drawn[a], mix) for a, mix in blind.items()}
        rows.append({
            "model": model.name, "attribute": attribute, "value": value, "n": n, "coverage_n": coverage_n,
            "fid": score.fid, "fid_floor": score.fid_floor, "fid_ratio": score.fid_ratio,
            "hf_ratio": score.hf_ratio, "accuracy": float((pred[attribute] == index).float().mean()),
            "coverage_gap": others, "coverage_gap_blind": blind_gap,
            "distribution": drawn,
            "samples": samples, "real": real[:n],
        })
        print(f"{model.name} {value}: FID ratio {score.fid_ratio:.1f} (FID {score.fid:.3g}, floor {score.fid_floor:.3g}),"
              f" HF ratio {score.hf_ratio:.2f}, accuracy {rows[-1]['accuracy']:.3f},"
              f" coverage gap {max(others.values()):.2f} (blind training mix {max(blind_gap.values()):.2f};"
              f" {coverage_n} samples)", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(BUNDLED), help="bundled names or model folders")
    parser.add_argument("--n", type=int, default=64, help="samples per value")
    parser.add_argument("--coverage-n", type=int, default=256,
                        help="samples per value for accuracy and coverage (the --n ones and more)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="bundled", help="names the sheets and the JSON")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "realism")
    parser.add_argument("--sheets", type=Path, default=None, help="where the contact sheets go (default: --out)")
    parser.add_argument("--no-doc", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument("--section", default="realism", help="docs/benchmarks.md section to write")
    parser.add_argument("--title", default="Realism of each model's samples")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--recipe", type=Path, default=None,
                        help="for run folders (cebm train --out): their recipe; an unfinished run is read from its checkpoint")
    parser.add_argument("--split", choices=("train", "all"), default="train",
                        help="renders to compare with: the training split (red circles held out) or every combination")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="sampler overrides, e.g. steps=200")
    parser.add_argument("--names", nargs="*", default=None,
                        help="what the table calls each of --models (default: each model's name)")
    args = parser.parse_args()
    if args.names is not None and len(args.names) != len(args.models):
        raise SystemExit(f"--names gives {len(args.names)} names for {len(args.models)} models")
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    classifier = load_model("shapes-classifier").eval()
    sheets = args.sheets or (args.out if args.no_doc else ROOT / "docs" / "images")
    sheets.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    all_rows = []
    for i, name in enumerate(args.models):
        model = (load_run(Path(name), args.recipe) if args.recipe else load_model(name)).eval()
        rows = measure_model(model, classifier, args.n, args.seed, overrides, args.split, args.coverage_n)
        shown = args.names[i] if args.names is not None else model.name
        for r in rows:
            r["model"] = shown
        sheet = contact_sheet([(r["samples"], r["real"]) for r in rows], per_row=8, scale=4)
        save_image(to_pil(sheet), sheets / f"realism-{args.label}-{shown}.png")
        all_rows += rows
    fid = [r["fid_ratio"] for r in all_rows]
    hf = [r["hf_ratio"] for r in all_rows]
    summary = {"fid_ratio_median": statistics.median(fid), "fid_ratio_worst": max(fid),
               "hf_ratio_median": statistics.median(hf), "hf_ratio_worst": max(hf),
               "accuracy_mean": statistics.mean(r["accuracy"] for r in all_rows),
               "accuracy_worst": min(r["accuracy"] for r in all_rows),
               "coverage_gap_worst": max(max(r["coverage_gap"].values()) for r in all_rows),
               "coverage_gap_blind_worst": max(max(r["coverage_gap_blind"].values()) for r in all_rows)}
    print(json.dumps(summary, indent=1), flush=True)
    keep = [{k: v for k, v in r.items() if k not in ("samples", "real")} for r in all_rows]
    (args.out / f"realism-{args.label}.json").write_text(json.dumps({"summary": summary, "rows": keep}, indent=1))
    if args.no_doc:
        return
    lines = [
        f"## {args.title}",
        "",
        f"`python -m benchmarks.realism --n {args.n} --coverage-n {args.coverage_n} --label {args.label} --split {args.split}"
        + (f" --models {' '.join(args.models)} --names {' '.join(args.names)}" if args.names is not None else "")
        + (f" --section {args.section} --title {shlex.quote(args.title)}" if args.section != "realism" else "") + "`"
        f" on {machine()}. {args.n} samples"
        " per value with the model's",
        "default settings against fresh renders of that value ("
        + ("the model's training split, red circles held out" if args.split == "train" else "every combination, red circles included")
        + ").",
        "",
        f"**Median FID ratio {summary['fid_ratio_median']:.1f}** (worst {summary['fid_ratio_worst']:.1f}); "
        f"HF ratio median {summary['hf_ratio_median']:.2f} (worst {summary['hf_ratio_worst']:.2f}); "
        f"accuracy mean {summary['accuracy_mean']:.3f} (worst {summary['accuracy_worst']:.3f}); "
        f"worst coverage gap {summary['coverage_gap_worst']:.2f} (to the blind training mix:"
        f" {summary['coverage_gap_blind_worst']:.2f}).",
        "",
        "FID ratio: FID in the",
        "bundled classifier's penultimate features against 1000 renders, over the floor (as many other fresh",
        "renders against the same reference, the mean of 4 such sets). HF ratio: mean |discrete Laplacian| of the samples over the renders'.",
        f"Accuracy and coverage are read from {args.coverage_n} samples per value (those {args.n} and more). Coverage gap: the",
        "largest difference between the samples' distribution of another attribute, as the classifier reads it, and the",
        "1000 reference renders' labels. Targets: median FID ratio <= 3, worst <= 6; HF ratio <= 1.5; accuracy >= 0.95;",
        "coverage gap <= 0.10. The last column's gap is to what a channel-blind network trained on the training split",
        "can draw at best (the split averaged over colour permutations: colour uniform, circles 0.25 of every mix, as",
        "2 of the split's 8 shape-and-colour combinations are circles; `blind_training_mix` in `benchmarks/realism.py`):",
        "a model that drew exactly its training data, red circles aside, would read about 0.08 in the `shape` gaps of",
        "the columns before it.",
        "",
        "| model | value | FID ratio | FID / floor | HF ratio | accuracy | coverage gap (other attributes) |"
        " gap to the blind training mix |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *(f"| {r['model']} | {r['value']} | {r['fid_ratio']:.1f} | {r['fid']:.3g} / {r['fid_floor']:.3g} |"
          f" {r['hf_ratio']:.2f} | {r['accuracy']:.3f} | "
          + ", ".join(f"{a} {d:.2f}" for a, d in r["coverage_gap"].items()) + " | "
          + ", ".join(f"{a} {d:.2f}" for a, d in r["coverage_gap_blind"].items()) + " |" for r in all_rows),
        "",
        "Samples (left, 8 per value) beside renders of the same value (right), 4x nearest-neighbour:",
        "",
        *(f"![{m}](images/realism-{args.label}-{m}.png)" for m in dict.fromkeys(r["model"] for r in all_rows)),
        "",
        f"Raw numbers: `runs/realism/realism-{args.label}.json` after a run.",
    ]
    write_section(args.section, "\n".join(lines))


if __name__ == "__main__":
    main()
