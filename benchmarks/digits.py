"""Do models of handwritten digits draw the digit they are asked for, and do the digits look like the data?

For every digit of each model conditioned on ``digit`` (scikit-learn's bundled handwritten digits, 16x16 grey), ``--n``
samples with the model's own settings (what ``model.condition(digit=d).sample(n)`` gives a user), read by a
classifier trained here on 80% of the digits (its accuracy on the other 20% is printed and written):

- accuracy: how often the classifier reads the digit asked for;
- FID ratio: FID in the classifier's penultimate features of the samples against that digit's images, over the
  floor (``--n`` other images of that digit against the same reference); 1 is "as real as real images";
- high-frequency ratio: mean |discrete Laplacian| of the samples over the images';
- a contact sheet per model (samples left, real digits right, one row per digit).

    python -m benchmarks.digits --models runs/digits/model
    python -m benchmarks.digits --models runs/cd runs/dsm --names cd dsm --no-doc   # two runs, finished or not
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks._report import machine, shown, write_section
from composable_ebm.data.digits import digits
from composable_ebm.energy import guided
from composable_ebm.evaluation.classifier import AttributeClassifier, fit_classifier
from composable_ebm.evaluation.realism import contact_sheet, realism
from composable_ebm.images import save_image, to_pil
from composable_ebm.models import load_model
from composable_ebm.runs import load_run

ROOT = Path(__file__).resolve().parents[1]


def digits_classifier(data, seed: int, steps: int) -> tuple[AttributeClassifier, float]:
    """A classifier of ``digit`` trained on 80% of ``data`` (drawn with ``seed``), and its accuracy on the rest."""
    classifier, accuracy = fit_classifier(data, "digits-classifier", held_out=0.2, steps=steps, seed=seed, width=16)
    return classifier.eval(), accuracy["digit"]


def digit_sets(data, index: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The images of digit ``index``, shuffled (a fixed seed per digit) and split: ``n`` for the floor, the rest the
    reference."""
    mine = torch.nonzero(data.labels["digit"] == index).squeeze(1)
    mine = mine[torch.randperm(mine.numel(), generator=torch.Generator().manual_seed(300 + index))]
    if mine.numel() < 2 * n:
        raise SystemExit(f"digit {data.attributes['digit'][index]} has {mine.numel()} images, too few for a floor of"
                         f" {n} and a reference as large; lower --n")
    return data.images[mine[:n]], data.images[mine[n:]]


def measure(model, classifier, data, n: int, seed: int, scale: float | None = None) -> list[dict]:
    """One row per digit; with ``scale``, each digit is drawn in the guided form at that guidance scale."""
    rows = []
    for index, value in enumerate(model.attributes["digit"]):
        real, reference = digit_sets(data, index, n)
        conditioned = model.condition(digit=value)
        if scale is not None:
            conditioned = guided(conditioned, scales=lambda _: scale)
        samples = conditioned.sample(n, seed=seed + index)
        score = realism(samples, real, reference, classifier.features)
        accuracy = float((classifier.predict(samples)["digit"] == index).float().mean())
        rows.append({"digit": value, "n": n, "accuracy": accuracy, "fid": score.fid, "fid_floor": score.fid_floor,
                     "fid_ratio": score.fid_ratio, "hf_ratio": score.hf_ratio, "reference": reference.shape[0],
                     "samples": samples, "real": real, "reference_images": reference})
        print(f"digit {value}: accuracy {accuracy:.3f}, FID ratio {score.fid_ratio:.1f} (FID {score.fid:.3g},"
              f" floor {score.fid_floor:.3g}), HF ratio {score.hf_ratio:.2f}", flush=True)
    return rows


def pooled(rows: list[dict], classifier) -> dict[str, float]:
    """Realism of every digit's samples together against every digit's reference, with the floor sets together."""
    score = realism(torch.cat([r["samples"] for r in rows]), torch.cat([r["real"] for r in rows]),
                    torch.cat([r["reference_images"] for r in rows]), classifier.features)
    return {"fid": score.fid, "fid_floor": score.fid_floor, "fid_ratio": score.fid_ratio, "hf_ratio": score.hf_ratio}


def summarise(rows: list[dict]) -> dict[str, float | str]:
    worst_acc = min(rows, key=lambda r: r["accuracy"])
    worst_fid = max(rows, key=lambda r: r["fid_ratio"])
    return {"accuracy_mean": statistics.mean(r["accuracy"] for r in rows),
            "accuracy_worst": worst_acc["accuracy"], "accuracy_worst_digit": worst_acc["digit"],
            "fid_ratio_median": statistics.median(r["fid_ratio"] for r in rows),
            "fid_ratio_worst": worst_fid["fid_ratio"], "fid_ratio_worst_digit": worst_fid["digit"],
            "hf_ratio_median": statistics.median(r["hf_ratio"] for r in rows),
            "hf_ratio_worst": max(r["hf_ratio"] for r in rows)}


def _load(path: Path, recipe: Path | None):
    model = (load_model(path) if (path / "config.json").is_file() else load_run(path, recipe)).eval()
    if "digit" not in model.attributes:
        raise SystemExit(f"{path}: a digits model conditions on `digit`; this one on {sorted(model.attributes)}")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, nargs="+", required=True,
                        help="model folders, or run folders (cebm train --out; an unfinished run is read from its"
                             " latest checkpoint)")
    parser.add_argument("--names", nargs="*", default=None, help="what the table calls each of --models")
    parser.add_argument("--recipe", type=Path, default=None, help="for a run folder without network.json: its recipe")
    parser.add_argument("--n", type=int, default=64, help="samples per digit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=None,
                        help="draw each digit in the guided form at this guidance scale instead of the models' own"
                             " settings (to choose a recipe's [sampling] guidance_scale for guided_alone)")
    parser.add_argument("--classifier-steps", type=int, default=1500)
    parser.add_argument("--label", default="digits", help="names the sheets, the JSON and the docs section")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "digits")
    parser.add_argument("--no-doc", action="store_true", help="write neither docs/benchmarks.md nor docs/images")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    names = args.names if args.names is not None else [p.name for p in args.models]
    if len(names) != len(args.models):
        raise SystemExit(f"--names gives {len(names)} names for {len(args.models)} models")
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    models = [_load(path, args.recipe) for path in args.models]
    shapes = {m.input_shape for m in models}
    if len(shapes) != 1:
        raise SystemExit(f"the models read different inputs {sorted(shapes)}; benchmark them one at a time")
    (channels, size, _), = shapes
    data = digits(size, channels)
    classifier, held_out = digits_classifier(data, args.seed, args.classifier_steps)
    print(f"digits classifier: {held_out:.3f} right on {len(data) // 5} held-out digits", flush=True)
    results = {}
    for name, model in zip(names, models, strict=True):
        rows = measure(model, classifier, data, args.n, args.seed, args.scale)
        summary = summarise(rows) | {"all_digits": pooled(rows, classifier)}
        print(name, json.dumps(summary, indent=1), flush=True)
        results[name] = (rows, summary)
    minutes = (time.perf_counter() - start) / 60
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.label}.json").write_text(json.dumps({"classifier_held_out_accuracy": held_out, "models": {
        name: {"summary": summary, "rows": [{k: v for k, v in r.items() if k not in ("samples", "real",
                                                                                      "reference_images")}
                                            for r in rows]}
        for name, (rows, summary) in results.items()}}, indent=1))
    sheets = args.out if args.no_doc else ROOT / "docs" / "images"
    sheets.mkdir(parents=True, exist_ok=True)
    for name, (rows, _) in results.items():
        sheet = contact_sheet([(r["samples"], r["real"]) for r in rows], per_row=8, scale=4)
        save_image(to_pil(sheet), sheets / f"{args.label}-{name}.png")
    if args.no_doc:
        return
    command = ("python -m benchmarks.digits --models " + " ".join(shown(p.resolve()) for p in args.models)
               + (" --names " + " ".join(names) if args.names is not None else "")
               + (f" --recipe {shown(args.recipe.resolve())}" if args.recipe else "")
               + (f" --n {args.n}" if args.n != 64 else "")
               + (f" --scale {args.scale:g}" if args.scale is not None else "")
               + (f" --label {args.label}" if args.label != "digits" else ""))
    how = ("with the model's own settings (what `model.condition(digit=d).sample(n)` gives)" if args.scale is None
           else f"in the guided form at guidance scale {args.scale:g}")
    reference = sorted({r["reference"] for rows, _ in results.values() for r in rows})
    lines = [
        "## Digits: models of scikit-learn's handwritten digits",
        "",
        f"`{command}` on {machine()}, {minutes:.0f} minutes. {args.n} samples per digit {how}, read by a classifier"
        f" trained on 80% of the digits ({held_out:.3f} right on the other {len(data) // 5}). Accuracy: the digit"
        " asked for read right. FID ratio: FID in that classifier's penultimate features against the digit's other"
        f" images ({reference[0]}-{reference[-1]}), over the floor ({args.n} images of the digit against the same"
        " reference); `all digits`: every digit's samples together against every digit's images. HF ratio:"
        " high-frequency energy over the images'.",
        "",
        "| model | accuracy: mean | worst | FID ratio: median | worst | all digits | HF ratio: median | worst |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *(f"| {name} | {s['accuracy_mean']:.3f} | {s['accuracy_worst']:.3f} (`{s['accuracy_worst_digit']}`) |"
          f" {s['fid_ratio_median']:.1f} | {s['fid_ratio_worst']:.1f} (`{s['fid_ratio_worst_digit']}`) |"
          f" {s['all_digits']['fid_ratio']:.1f} | {s['hf_ratio_median']:.2f} | {s['hf_ratio_worst']:.2f} |"
          for name, (_, s) in results.items()),
        "",
        "| digit | " + " | ".join(f"{name}: accuracy | FID ratio" for name in results) + " |",
        "| --- | " + " | ".join("--- | ---" for _ in results) + " |",
        *(f"| {value} | " + " | ".join(f"{rows[i]['accuracy']:.3f} | {rows[i]['fid_ratio']:.1f}"
                                        for rows, _ in results.values()) + " |"
          for i, value in enumerate(models[0].attributes["digit"])),
        "",
        *(line for name in results for line in (
            f"![digits, {name}](images/{args.label}-{name}.png)", "",
            f"{name}: samples (left) beside images of the same digit (right), one row per digit, 0 to 9.", "")),
    ]
    write_section(args.label, "\n".join(lines))


if __name__ == "__main__":
    main()
