"""Composition of the bundled Shapes models over the whole space: every conjunction of 2, 3 and 4 attributes.

Every sample is drawn the way a user draws it: ``energy.sample(n, seed=...)`` on the composite, with
the settings the composite derives from its parts. The bundled attribute classifier reads the
samples; joint accuracy counts a sample right when every conditioned attribute is read right.
Red circles (every size and position) are held out of every model's training split, so each
composite naming both red and circle is a held-out combination.

- 37 conjunctions of 2 attributes, 60 of 3, 36 of 4 (every choice of attributes and values), in
  the plain form (``a + b``) and the guided form (``guided(a + b)``, :class:`composable_ebm.Guided`);
- realism of the composites: FID ratio in the classifier's features against renders of the same
  combination, and the high-frequency ratio (``benchmarks/realism.py`` explains both);
- the other operators of the algebra: ``python -m benchmarks.algebra``.

    python -m benchmarks.composition                  # the whole table, 64 samples per composite, both forms
    python -m benchmarks.composition --quick          # 16 samples per composite, for screening

On two cores, run the table as two one-thread shards and merge them::

    python -m benchmarks.composition --shard 0/2 --threads 1 & python -m benchmarks.composition --shard 1/2 --threads 1
    python -m benchmarks.composition --merge 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import time
from pathlib import Path

import torch

from benchmarks._report import machine, write_section
from benchmarks._shapes import ROOT
from composable_ebm import compositional_accuracy, shapes
from composable_ebm.data import SHAPES_ATTRIBUTES
from composable_ebm.energy import value_index
from composable_ebm.evaluation.realism import contact_sheet, realism
from composable_ebm.expression import parse_expression
from composable_ebm.models import BUNDLED_DIR, load_model
from composable_ebm.images import save_image, to_pil

ATTRIBUTES = ("shape", "color", "size", "position")
FORMS = ("plain", "guided")


def conjunctions(arity: int) -> list[dict[str, str]]:
    """Every target of ``arity`` attributes: each choice of attributes, each combination of their values."""
    out = []
    for attrs in itertools.combinations(ATTRIBUTES, arity):
        for values in itertools.product(*(SHAPES_ATTRIBUTES[a] for a in attrs)):
            out.append(dict(zip(attrs, values, strict=True)))
    return out


def expression(target: dict[str, str], form: str) -> str:
    text = " + ".join(f"{a}[{a}={v}]" for a, v in target.items())
    return f"guided({text})" if form == "guided" else text


def held_out(target: dict[str, str]) -> bool:
    return target.get("color") == "red" and target.get("shape") == "circle"


def renders(target: dict[str, str], n: int, seed: int) -> torch.Tensor:
    """``n`` fresh renders of exactly this combination (the other attributes uniform)."""
    pool = shapes(max(300 * n, 2000), 16, seed=seed, split="all")  # a 4-attribute combination is 1 in 36
    keep = torch.ones(len(pool), dtype=torch.bool)
    for a, v in target.items():
        keep &= pool.labels[a] == value_index(SHAPES_ATTRIBUTES, a, v)
    images = pool.images[keep]
    if images.shape[0] < n:
        raise RuntimeError(f"only {images.shape[0]} renders of {target}; raise the pool")
    return images[:n]


def table(every: int = 1) -> list[tuple[int, dict[str, str]]]:
    """Every ``every``-th composite of the whole table (2, 3 and 4 attributes) with its index, which seeds its
    samples and renders."""
    targets = [t for arity in (2, 3, 4) for t in conjunctions(arity)]
    return [(i, t) for i, t in enumerate(targets) if i % every == 0]


def table_renders(target: dict[str, str], index: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The realism measure's renders for composite ``index`` read from ``n`` samples: 500 reference renders and
    ``4 n`` real ones, each from a seed of its own."""
    return renders(target, 500, seed=300 + index), renders(target, 4 * n, seed=400 + index)


def read_composite(samples: torch.Tensor, target: dict[str, str], index: int, classifier, reference=None):
    """Compositional accuracy and realism of one composite's samples, as the table reads them; ``reference``:
    its `table_renders`, when already drawn."""
    ref, real = reference or table_renders(target, index, samples.shape[0])
    return compositional_accuracy(samples, classifier, target), realism(samples, real, ref, classifier.features)


def leak_note(folder: Path) -> str:
    """Whether the measured models' recipes (in ``folder``) let an augmentation of their positives draw a held-out
    red circle (an RGB channel permutation of a green or blue circle does)."""
    from composable_ebm.recipes import load_recipe

    leaky = []
    for a in ATTRIBUTES:
        cfg = load_recipe(folder / f"shapes-{a}.toml").trainer.data_augment
        if cfg is not None and cfg.channel_permute_prob > 0:
            leaky.append(a)
    if not leaky:
        return "No model's augmentations can draw one."
    return (f"The {', '.join(leaky)} models' positives were augmented with RGB channel permutations, which draw red"
            " circles from green and blue ones, so held-out rows are held out of the data, not of those models'"
            " augmented positives.")


def summarise(rows: list[dict]) -> dict:
    """Mean and worst joint accuracy per arity, seen and held out apart, and the realism medians."""
    out: dict = {}
    for arity in (2, 3, 4):
        for kind, held in (("seen", False), ("held_out", True)):
            joint = [r["joint"] for r in rows if r["arity"] == arity and r["held_out"] == held]
            if joint:
                out[f"{arity}_{kind}"] = {"mean": statistics.mean(joint), "worst": min(joint), "count": len(joint)}
        joint = [r["joint"] for r in rows if r["arity"] == arity]
        if joint:
            out[f"{arity}_all"] = {"mean": statistics.mean(joint), "worst": min(joint), "count": len(joint)}
    held = [r["joint"] for r in rows if r["held_out"]]
    out["held_out_mean"] = statistics.mean(held)
    out["worst"] = min(r["joint"] for r in rows)
    out["fid_ratio_median"] = statistics.median(r["fid_ratio"] for r in rows)
    out["fid_ratio_worst"] = max(r["fid_ratio"] for r in rows)
    out["hf_ratio_median"] = statistics.median(r["hf_ratio"] for r in rows)
    out["hf_ratio_worst"] = max(r["hf_ratio"] for r in rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=BUNDLED_DIR, help="folder holding shapes-<attribute> models")
    parser.add_argument("--recipes", type=Path, default=ROOT / "recipes", help="folder of the recipes that made the models")
    parser.add_argument("--n", type=int, default=64, help="samples per composite")
    parser.add_argument("--quick", action="store_true", help="16 samples per composite, no document")
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    parser.add_argument("--arities", nargs="+", type=int, default=[2, 3, 4], choices=[2, 3, 4])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "composition")
    parser.add_argument("--no-doc", action="store_true", help="do not write docs/benchmarks.md or docs/images")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--shard", default=None, metavar="I/K", help="measure every K-th composite from the I-th only")
    parser.add_argument("--merge", type=int, default=None, metavar="K", help="merge K shards' rows, then report")
    parser.add_argument("--shards-from", type=Path, nargs="+", default=None,
                        help="with --merge: the --out folders of the shard runs (default: --out)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n = 16 if args.quick else args.n
    write_doc = not (args.quick or args.no_doc)
    models = {a: load_model(args.models / f"shapes-{a}") for a in ATTRIBUTES}
    classifier = load_model(args.models / "shapes-classifier").eval()
    args.out.mkdir(parents=True, exist_ok=True)

    def parse(text: str):
        return parse_expression(text, lambda name: models[name])

    targets = [t for arity in args.arities for t in conjunctions(arity)]
    shard, shards = (int(v) for v in args.shard.split("/")) if args.shard else (0, 1)
    if args.merge:  # shards of one or more runs (e.g. the plain form at 64 samples, the guided at 16)
        parts = [json.loads((folder / f"composition-shard{i}of{args.merge}.json").read_text())
                 for folder in (args.shards_from or [args.out]) for i in range(args.merge)]
        seconds = sum(p["seconds"] for p in parts)
        forms = dict.fromkeys(form for p in parts for form in p["rows"])
        results = {form: sorted((r for p in parts for r in p["rows"].get(form, [])), key=lambda r: r["index"])
                   for form in forms}
        for form, rows in results.items():
            if [r["index"] for r in rows] != list(range(len(targets))):
                raise SystemExit(f"the {form} shards do not cover the table: run every shard with the same --arities")
        report(args, parse, classifier, targets, results, max(p["n"] for p in parts), seconds, write_doc)
        return
    reference = {}
    results: dict[str, list[dict]] = {}
    t0 = time.perf_counter()
    for form in args.forms:
        rows = []
        for i, target in enumerate(targets):
            if i % shards != shard:
                continue
            text = expression(target, form)
            samples = parse(text).sample(n, seed=i, form="plain")  # as written: the guided rows say guided(...)
            key = json.dumps(target, sort_keys=True)
            if key not in reference:
                reference[key] = table_renders(target, i, n)
            score, r = read_composite(samples, target, i, classifier, reference[key])
            rows.append({"index": i, "expression": text, "target": target, "arity": len(target),
                         "held_out": held_out(target), "per_attribute": score.per_attribute, "joint": score.joint,
                         "n": n, "fid_ratio": r.fid_ratio, "hf_ratio": r.hf_ratio})
            print(f"{form} | {text} | {'held out' if held_out(target) else 'seen'} | joint {score.joint:.3f} |"
                  f" FID ratio {r.fid_ratio:.1f} | HF ratio {r.hf_ratio:.2f}", flush=True)
        results[form] = rows
    seconds = time.perf_counter() - t0
    if shards > 1:
        (args.out / f"composition-shard{shard}of{shards}.json").write_text(
            json.dumps({"n": n, "seconds": seconds, "rows": results}, indent=1))
        return
    report(args, parse, classifier, targets, results, n, seconds, write_doc)


def table_picture(rows: list[dict], path: Path, title: str) -> None:
    """Every composite's joint accuracy as a grid of cells, one row of cells per choice of attributes (the
    held-out combinations outlined), so the whole table reads at a glance."""
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, ...], list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row["target"]), []).append(row)
    width = max(len(g) for g in groups.values())
    fig, ax = plt.subplots(figsize=(0.62 * width + 2.6, 0.5 * len(groups) + 0.9))
    grid = torch.full((len(groups), width), float("nan"))
    for r, group in enumerate(groups.values()):
        for c, row in enumerate(group):
            grid[r, c] = row["joint"]
            label = "".join(v[0] for v in row["target"].values())  # e.g. "crl" = circle, red, large
            ax.text(c, r, f"{label}\n{row['joint']:.2f}", ha="center", va="center", fontsize=5.5)
            if row["held_out"]:
                ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, lw=1.5, ec="black"))
    image = ax.imshow(grid.numpy(), cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    ax.set_yticks(range(len(groups)), [" + ".join(k) for k in groups], fontsize=7)
    ax.set_xticks([])
    ax.set_title(title, fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01).ax.tick_params(labelsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def report(args, parse, classifier, targets: list[dict], results: dict[str, list[dict]], n: int, seconds: float,
           write_doc: bool) -> None:
    """Summaries, the pictures and the document section."""
    summaries = {form: summarise(rows) for form, rows in results.items()}
    with_null = all(parse(a).has_null_condition for a in ATTRIBUTES)  # guided forms need each model's null condition
    best = max(summaries, key=lambda f: sum(summaries[f][f"{a}_all"]["mean"] for a in args.arities))

    print(json.dumps({"summaries": summaries}, indent=1), flush=True)
    (args.out / ("composition-quick.json" if args.quick else "composition.json")).write_text(
        json.dumps({"n": n, "seconds": seconds, "summaries": summaries, "rows": results}, indent=1))
    for form in results:
        table_picture(results[form], args.out / f"composition-table-{form}.png",
                      f"{form} form: joint accuracy of every composite ({results[form][0]['n']} samples each;"
                      " cells: first letters of the values, held-out combinations outlined)")
        if write_doc:
            shutil.copyfile(args.out / f"composition-table-{form}.png",
                            ROOT / "docs" / "images" / f"composition-table-{form}.png")
        pairs = [t for t in targets if len(t) == 2]
        if pairs:  # every 2-attribute composite again, 6 samples each, beside renders of that combination
            sheet = [(parse(expression(t, form)).sample(6, seed=2000 + i, form="plain"), renders(t, 6, seed=500 + i))
                     for i, t in enumerate(pairs)]
            image = to_pil(contact_sheet(sheet, per_row=6, scale=3))
            save_image(image, args.out / f"composition-pairs-{form}.png")
            if write_doc:
                save_image(image, ROOT / "docs" / "images" / f"composition-pairs-{form}.png")
    if not write_doc:
        return

    def headline(s: dict) -> list[str]:
        return [f"| {a} | {s[f'{a}_all']['count']} | {s[f'{a}_all']['mean']:.3f} | {s[f'{a}_all']['worst']:.3f} |"
                f" {s[f'{a}_seen']['mean']:.3f} / {s[f'{a}_seen']['worst']:.3f} |"
                f" {s[f'{a}_held_out']['mean']:.3f} / {s[f'{a}_held_out']['worst']:.3f} |" for a in args.arities]

    lines = [
        "## Composition of the bundled Shapes models: the whole table",
        "",
        f"`python -m benchmarks.composition --n {n}` (sharded, see the script) on {machine()} ({seconds / 60:.1f} min of"
        " sampling). " + ", ".join(f"{results[f][0]['n']} samples per composite in the {f} form" for f in results)
        + "; each composite's default settings (`energy.sample(n)`), read by the bundled",
        "classifier. Every conjunction of 2, 3 and 4 attributes (37, 60 and 36 composites); model names are short",
        "(`color` is `shapes-color`). Red circles of every size and position are held out of every model's training",
        "split. " + leak_note(args.recipes) + " Joint: every conditioned attribute read right at once.",
        "Targets: mean joint >= 0.95 / 0.92 / 0.90 for 2 / 3 / 4 attributes, worst composite >= 0.75, held-out mean",
        ">= 0.85, composites' median FID ratio <= 4.",
        "",
    ]
    for form, s in summaries.items():
        lines += [
            f"**{form} form** (`{expression({'color': 'red', 'shape': 'circle'}, form)}`, {results[form][0]['n']}"
            f" samples per composite): worst composite"
            f" {s['worst']:.3f}, held-out mean {s['held_out_mean']:.3f}; composites' FID ratio median"
            f" {s['fid_ratio_median']:.1f} (worst {s['fid_ratio_worst']:.1f}), HF ratio median {s['hf_ratio_median']:.2f}"
            f" (worst {s['hf_ratio_worst']:.2f}).",
            "",
            "| attributes | composites | mean joint | worst | seen: mean / worst | held out: mean / worst |",
            "| --- | --- | --- | --- | --- | --- |",
            *headline(s),
            "",
            f"![every composite, {form} form](images/composition-table-{form}.png)",
            "",
        ]
    if len(summaries) > 1:
        which = f"The {best} form scores higher on the mean over arities."
    else:
        which = (f"Only the {best} form was measured" + ("" if with_null else ": these models were trained without"
                 " label dropout, so they have no unconditional energy for the guided form") + ".")
    lines += [
        which + " Rows are sampled as written (`form=\"plain\"`); by default `cebm compose` and `.sample`",
        "draw a sum of models that have a null condition in its guided form (`composable_ebm.sampling.composition_form`).",
        "",
        "Negation, OR, weights and temperature: \"The algebra, both families\" (`python -m benchmarks.algebra`).",
        "",
        "Every 2-attribute composite, 6 samples each (left) beside renders of that combination (right), plain form",
        "then guided form, 3x nearest-neighbour:",
        "",
        *(f"![2-attribute composites, {form} form](images/composition-pairs-{form}.png)" for form in args.forms),
        "",
        "Per composite (joint accuracy, FID ratio, HF ratio):",
        "",
        "| expression | combination | " + " | ".join(f"{f} joint / FID / HF" for f in results) + " |",
        "| --- | --- | " + " | ".join("---" for _ in results) + " |",
    ]
    forms = list(results)
    for i, target in enumerate(targets):
        cells = [f"{results[f][i]['joint']:.2f} / {results[f][i]['fid_ratio']:.1f} / {results[f][i]['hf_ratio']:.2f}"
                 for f in forms]
        lines.append(f"| `{expression(target, 'plain')}` | {'held out' if held_out(target) else 'seen'} | "
                     + " | ".join(cells) + " |")
    write_section("composition", "\n".join(lines))


if __name__ == "__main__":
    main()
