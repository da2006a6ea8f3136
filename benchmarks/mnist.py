"""The mnist models on real handwriting over the whole table: each model alone, every conjunction, the held-out triple.

    python -m benchmarks.mnist --models runs/mnist [--classifier runs/mnist/mnist-classifier] [--n 64]

On two cores, as two one-thread shards and a merge::

    python -m benchmarks.mnist --shard 0/2 --threads 1 & python -m benchmarks.mnist --shard 1/2 --threads 1
    python -m benchmarks.mnist --merge

``--only INDEX ...`` measures some rows (a part of the table, as a shard is); ``--merge`` reads every part in
``--out`` and checks that together they cover the table once.

Reads ``MODELS/mnist-<attribute>/model`` for digit, thickness and slant (or the bundled models, ``--models
bundled``), samples every row as a user does (``energy.sample(n, seed=...)``, the models' own settings: a model alone
guided at its scale, a sum in its guided form) and reads the samples: the digit by the digit classifier, thickness and
slant by the functions that labelled the data (`composable_ebm.data.mnist.measure`). Rows:

- alone: every value of every model; accuracy, and FID ratio in the classifier's features against real digits of
  that value (over the floor of as many other real digits);
- every conjunction of 2 and 3 attributes, every value (20 + 20 + 4 pairs, 40 triples), guided: joint accuracy (every
  conditioned attribute read right at once) and FID ratio against real digits of that combination; a thick,
  left-leaning 7 is held out of every model's data;
- OR: ``mnist-digit[digit=3] | mnist-digit[digit=8]``, each digit's share.

Contact sheets put samples beside real digits of the same row; the table goes into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
import tomllib
from pathlib import Path

import torch

from benchmarks._report import machine, write_section
from benchmarks.faces import model_loader
from composable_ebm import load, save_image_grid
from composable_ebm.data import MNIST_ATTRIBUTES, combination_mask, mnist
from composable_ebm.data.mnist import measure
from composable_ebm.evaluation.realism import contact_sheet, realism
from composable_ebm.expression import parse_expression

ROOT = Path(__file__).resolve().parents[1]
ATTRIBUTES = tuple(MNIST_ATTRIBUTES)
LEARNING = ROOT / "docs" / "benchmarks" / "learning-mnist-slant-triples.md"
"""The learning curves of the slant recipe and its variants in the triples (`benchmarks.learning report`)."""
HELD_OUT, = tomllib.loads((ROOT / "recipes" / "mnist-base.toml").read_text())["data"]["holdout"]
SHEET_SAMPLES = 8


def term(attribute: str, value: str) -> str:
    return f"mnist-{attribute}[{attribute}={value}]"


def jobs() -> list[dict]:
    """Every row, in a fixed order (its index seeds its samples)."""
    out: list[dict] = []
    for a in ATTRIBUTES:
        for v in MNIST_ATTRIBUTES[a]:
            out.append({"kind": "alone", "expression": term(a, v), "target": {a: v}})
    for arity in (2, 3):
        for names in itertools.combinations(ATTRIBUTES, arity):
            for values in itertools.product(*(MNIST_ATTRIBUTES[a] for a in names)):
                target = dict(zip(names, values, strict=True))
                out.append({"kind": "conjunction", "arity": arity, "target": target, "held_out": target == HELD_OUT,
                            "expression": " + ".join(term(a, v) for a, v in target.items())})
    out.append({"kind": "or", "expression": f"{term('digit', '3')} | {term('digit', '8')}", "target": {},
                "shares": ("3", "8")})
    return [dict(job, index=i) for i, job in enumerate(out)]


def read(samples: torch.Tensor, classifier) -> dict[str, torch.Tensor]:
    """Each sample's digit (the classifier), thickness and slant (the measuring functions), as value indices."""
    return {"digit": classifier.predict(samples)["digit"].cpu(), **measure(samples)}


def matching(labels: dict[str, torch.Tensor], target: dict[str, str]) -> torch.Tensor:
    """Which digits have every value of ``target``, ``(N,)`` bool."""
    return combination_mask(labels, MNIST_ATTRIBUTES, [target])


def measure_row(job: dict, load_one, classifier, data, n: int) -> tuple[dict, torch.Tensor]:
    energy = parse_expression(job["expression"], load_one)
    t0 = time.perf_counter()
    samples = energy.sample(n, seed=job["index"]).cpu()
    seconds = time.perf_counter() - t0
    got = read(samples, classifier)
    row = {k: job[k] for k in ("index", "kind", "expression", "target", "arity", "held_out") if k in job}
    row.update({"n": n, "seconds": seconds})
    if job["kind"] == "or":
        row["shares"] = {d: float((got["digit"] == int(d)).float().mean()) for d in job["shares"]}
        return row, samples[:SHEET_SAMPLES]
    hits = torch.stack([got[a] == MNIST_ATTRIBUTES[a].index(v) for a, v in job["target"].items()])
    row["joint"] = float(hits.all(0).float().mean())
    row["per_attribute"] = {a: float(h.float().mean()) for a, h in zip(job["target"], hits, strict=True)}
    pool = data.images[matching(data.labels, job["target"])].float() / 255
    real, reference = pool[:n], pool[n:n + 500]  # the floor's real digits, then the reference
    score = realism(samples, real, reference, classifier.features)
    row.update({"fid_ratio": score.fid_ratio, "hf_ratio": score.hf_ratio, "n_reference": int(reference.shape[0])})
    return row, samples[:SHEET_SAMPLES]


def sheet(rows: list[dict], samples: dict[str, torch.Tensor], data, path: Path) -> None:
    pairs = [(samples[str(r["index"])], data.images[matching(data.labels, r["target"])][:SHEET_SAMPLES].float() / 255)
             for r in rows]
    save_image_grid(contact_sheet(pairs, per_row=SHEET_SAMPLES, scale=1)[None], path, scale=3)


def report(rows: list[dict], samples: dict[str, torch.Tensor], data, n: int, minutes: float, models: str) -> None:
    images = ROOT / "docs" / "images"
    alone = [r for r in rows if r["kind"] == "alone"]
    conj = [r for r in rows if r["kind"] == "conjunction"]
    disjunction = next(r for r in rows if r["kind"] == "or")
    sheet(alone, samples, data, images / "mnist-alone.png")
    triples = [r for r in conj if r["arity"] == 3]
    sheet([r for r in triples if r["target"]["digit"] in ("3", "7")], samples, data, images / "mnist-triples.png")
    fid = sorted(r["fid_ratio"] for r in alone)
    held = next(r for r in conj if r["held_out"])
    lines = [
        "## Real handwriting: the mnist models",
        "",
        f"`python -m benchmarks.mnist --models {models} --n {n}` (as shards and `--merge`) on {machine()},"
        f" {minutes:.0f} CPU-minutes. {n} samples per row, drawn as a user draws them (the models' own settings; a"
        " sum in its guided form). The digit is read by the digit classifier, thickness and slant by the functions"
        " that labelled the data (`composable_ebm.data.mnist.measure`). FID ratio: FID in the classifier's features"
        " against real digits of the row's values, over the floor of as many other real digits. A thick,"
        " left-leaning 7 is held out of every model's data.",
        "",
        f"**Each model alone** (targets: every value >= 0.95, median FID ratio <= 3, worst <= 6): accuracy mean"
        f" {statistics.mean(r['joint'] for r in alone):.3f} (worst {min(r['joint'] for r in alone):.3f}); median FID"
        f" ratio {statistics.median(fid):.1f} (worst {fid[-1]:.1f}).",
        "",
        "**Every conjunction**, guided (targets: mean joint >= 0.95 / 0.90 for 2 / 3 attributes, worst >= 0.75, the"
        f" held-out triple >= 0.85): the held-out triple reads {held['joint']:.3f} (FID ratio {held['fid_ratio']:.1f})."
        " Each attribute read right over the triples, mean (worst): " + ", ".join(
            f"{a} {statistics.mean(r['per_attribute'][a] for r in triples):.3f}"
            f" ({min(r['per_attribute'][a] for r in triples):.3f})" for a in ATTRIBUTES) + ".",
        "",
        "| attributes | composites | mean joint | worst | median FID ratio |",
        "| --- | --- | --- | --- | --- |",
    ]
    for arity in (2, 3):
        group = [r for r in conj if r["arity"] == arity]
        worst = min(group, key=lambda r: r["joint"])
        lines.append(f"| {arity} | {len(group)} | {statistics.mean(r['joint'] for r in group):.3f} |"
                     f" {worst['joint']:.3f} ({', '.join(f'{a}={v}' for a, v in worst['target'].items())}) |"
                     f" {statistics.median(r['fid_ratio'] for r in group):.1f} |")
    lines += ["", f"**OR** `{disjunction['expression']}`: " + ", ".join(
        f"digit {d} {s:.3f}" for d, s in disjunction["shares"].items()) + " (target: each 0.40-0.60)."
        + (f" What the recipe learns per CPU-minute: [{LEARNING.stem}](benchmarks/{LEARNING.name})."
           if LEARNING.is_file() else ""), "",
        "| row | accuracy (joint) | per attribute | FID ratio | HF ratio |", "| --- | --- | --- | --- | --- |"]
    for r in alone + conj:
        name = " + ".join(f"{a}={v}" for a, v in r["target"].items()) + (" (held out)" if r.get("held_out") else "")
        per = ", ".join(f"{a} {v:.2f}" for a, v in r["per_attribute"].items())
        lines.append(f"| {name} | {r['joint']:.3f} | {per} | {r['fid_ratio']:.1f} | {r['hf_ratio']:.2f} |")
    sheets = ["![mnist models alone](images/mnist-alone.png) ![mnist triples](images/mnist-triples.png)", "",
              "Left: each model alone, one row per value (digits 0-9, thin, thick, left, right). Right: guided triples"
              " of digits 3 and 7 (thin/thick by left/right; the held-out thick, left-leaning 7 is the seventh row)."
              " Each row's samples (left half) beside real digits of its values (right half)."]
    rows_table = lines.index("| row | accuracy (joint) | per attribute | FID ratio | HF ratio |")
    short = "\n".join(lines[:rows_table - 1] + ["", *sheets])  # the per-row table on the section's own page
    write_section("mnist", "\n".join(lines + ["", *sheets]), short=short)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(ROOT / "runs" / "mnist"), help="folder of mnist-<attribute>/model, or"
                        " 'bundled'")
    parser.add_argument("--classifier", default=str(ROOT / "runs" / "mnist" / "mnist-classifier"))
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--only", nargs="+", type=int, default=None, metavar="INDEX")
    parser.add_argument("--shard", default=None, metavar="I/K")
    parser.add_argument("--merge", action="store_true", help="write the table from the parts in --out (every"
                        " shard or --only group, run with the same --n and --models)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "mnist-bench")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from safetensors.torch import load_file, save_file

    args.out.mkdir(parents=True, exist_ok=True)
    data = mnist()  # every real digit with its labels (the held-out triple included: it is real handwriting)
    if args.merge:
        stems = sorted(path.with_suffix("") for path in args.out.glob("mnist-*.json"))
        parts = [json.loads(stem.with_suffix(".json").read_text()) for stem in stems]
        rows = sorted((r for p in parts for r in p["rows"]), key=lambda r: r["index"])
        if [r["index"] for r in rows] != [j["index"] for j in jobs()]:
            raise SystemExit(f"the parts in {args.out} do not cover the table once: run every shard (or --only"
                             " group) into it with the same settings")
        if len({(p["n"], p["models"]) for p in parts}) != 1:
            raise SystemExit(f"the parts in {args.out} differ in --n or --models: run them with the same settings")
        samples = {k: v for stem in stems for k, v in load_file(str(stem.with_suffix(".safetensors"))).items()}
        table = {"n": parts[0]["n"], "models": parts[0]["models"], "minutes": sum(p["minutes"] for p in parts),
                 "rows": rows}
        (args.out / "table.json").write_text(json.dumps(table, indent=1))
        report(rows, samples, data, table["n"], table["minutes"], table["models"])
        return
    shard, shards = (int(v) for v in args.shard.split("/")) if args.shard else (0, 1)
    classifier = load(args.classifier).eval()
    load_one = model_loader(args.models)
    rows, samples = [], {}
    t0 = time.perf_counter()
    for job in jobs():
        if job["index"] % shards != shard or (args.only and job["index"] not in args.only):
            continue
        row, first = measure_row(job, load_one, classifier, data, args.n)
        rows.append(row)
        samples[str(job["index"])] = first.contiguous()
        print(json.dumps({k: row[k] for k in ("expression", "joint", "shares", "fid_ratio") if k in row}), flush=True)
    minutes = (time.perf_counter() - t0) / 60
    if shards > 1 or args.only:
        rows_part = f"-rows{min(args.only)}-{max(args.only)}" if args.only else ""
        stem = args.out / f"mnist-shard{shard}of{shards}{rows_part}"
        stem.with_suffix(".json").write_text(json.dumps({"n": args.n, "minutes": minutes, "models": args.models,
                                                         "rows": rows}, indent=1))
        save_file(samples, str(stem.with_suffix(".safetensors")))
        return
    report(rows, samples, data, args.n, minutes, args.models)


if __name__ == "__main__":
    main()
