"""Learning per CPU-minute: an mnist recipe against variants of it, from the same seeds, on one machine.

Each variant trains the recipe with some settings changed (``--set``, as ``cebm train`` takes them), for ``--minutes``
of training time on one thread, and keeps its model every ``--every`` minutes (``RUN/snapshots/minute-MMM.MM``: the
EMA weights as `cebm train` saves them when stopped by ``--max-minutes``, and ``minute-MMM.MM.json``, its step; the next
segment resumes the checkpoint)::

    python -m benchmarks.learning train --recipe recipes/mnist-slant.toml --variant template --minutes 15 &
    python -m benchmarks.learning train --recipe recipes/mnist-slant.toml --variant edm \\
        --set trainer.levels=log-normal --set trainer.level_mean=-1.7 --set trainer.loss_weighting=edm --minutes 15 &
    wait

Then every kept model is drawn alone, each value of its attribute, as the mnist table draws it (`benchmarks.mnist`:
the same rows and seeds, the models' own sampling settings), and read as that table reads it: accuracy, and FID ratio
against real digits of the value::

    python -m benchmarks.learning measure --recipe recipes/mnist-slant.toml --variants template edm

prints one line per variant and snapshot (training minutes from the run's log, steps, accuracy mean and worst,
FID ratio median and worst) and keeps them in ``OUT/<recipe>/curve-LABEL.json``. ``--rows`` draws other rows of the
table (sums take their other models from the bundled ones), and ``--ema-std`` also draws each snapshot's post-hoc
averages of those lengths (a variant trained with ``--set trainer.posthoc_ema=[0.05,0.1]``).
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import shutil
import statistics
from pathlib import Path

import torch

from benchmarks.faces64 import seconds_at
from benchmarks.mnist import jobs, measure_row
from composable_ebm import load
from composable_ebm.data import mnist
from composable_ebm.recipes import load_recipe
from composable_ebm.runs import train_recipe

ROOT = Path(__file__).resolve().parents[1]
ENOUGH_STEPS = 1_000_000  # a variant stops by time, not by its recipe's step count


def train(recipe: Path, variant: str, settings: list[str], minutes: float, every: float, out: Path) -> Path:
    """Train one variant for ``minutes`` of training time in segments of ``every`` minutes, keeping the model after
    each (resumable: a segment already kept is not trained again)."""
    run = out / recipe.stem / variant
    kept = run / "snapshots"
    kept.mkdir(parents=True, exist_ok=True)
    (run / "variant.json").write_text(json.dumps({"settings": settings}))
    segments = round(minutes / every)
    for i in range(1, segments + 1):
        target = kept / f"minute-{i * every:06.2f}"
        if (target / "config.json").is_file():
            continue
        trained = train_recipe(recipe, run, steps=ENOUGH_STEPS, max_minutes=every, settings=settings)
        if trained.stopped is None:
            raise SystemExit(f"{run} reached {ENOUGH_STEPS} steps before {minutes} minutes")
        shutil.copytree(run / "model", target, dirs_exist_ok=True)
        (kept / f"{target.name}.json").write_text(json.dumps({"step": trained.steps}))
        print(f"kept {target} (step {trained.steps})", flush=True)
    return run


def measure(recipe: Path, variants: list[str], out: Path, n: int, classifier: str, rows: list[int] | None = None,
            ema_stds: list[float] = (), only: list[str] | None = None, label: str = "alone",
            scales: dict[str, float] | None = None, ema_only: bool = False) -> list[dict]:
    """Each variant's snapshots drawn as the mnist table draws them (`benchmarks.mnist`): by default alone, every
    value; ``rows`` picks the table's rows by index instead (a sum takes the other attributes' models from the
    bundled ones). ``ema_stds`` adds, per snapshot, the averages of those relative stds made after training from the
    run's post-hoc averages (a variant trained with ``--set trainer.posthoc_ema=[...]``; ``ema_only``: those alone,
    not the run's own EMA); ``only`` keeps the snapshots so named. The variant ``bundled`` is the bundled model of
    the attribute; ``scales`` (attribute -> scale) replaces the guidance scales of the models of those attributes."""
    from composable_ebm.runs import posthoc_model

    spec = load_recipe(recipe)
    attribute, = spec.data.attributes
    name = f"mnist-{attribute}"
    table = jobs()
    chosen = ([table[i] for i in rows] if rows else
              [j for j in table if j["kind"] == "alone" and set(j["target"]) == {attribute}])
    reader, data = load(classifier).eval(), mnist()

    def scaled(model):  # the guidance scale given for its attribute, over its own
        scale = (scales or {}).get(next(iter(model.attributes), None))
        if scale is not None:
            model.sampling_defaults = dataclasses.replace(model.sampling_defaults, guidance_scale=scale)
        return model

    points = []
    for variant in variants:
        run = out / recipe.stem / variant
        drawn = [(None, None)] if variant == "bundled" else [
            (s, json.loads((s.parent / f"{s.name}.json").read_text())["step"])
            for s in sorted(p for p in (run / "snapshots").glob("minute-*") if p.is_dir())
            if not only or s.name in only]
        for snapshot, step in drawn:
            models = {} if ema_only and snapshot else {variant: load(str(snapshot) if snapshot else name)}
            for std in ema_stds if snapshot else ():
                models[f"{variant}@ema{std:g}"] = posthoc_model(run, std, step)
            for label_, model in models.items():
                scaled(model)
                scores = [measure_row(job, lambda asked, m=model: m if asked == name else scaled(load(asked)), reader,
                                      data, n)[0] for job in chosen]
                accuracy = [r["joint"] for r in scores]
                fid = [r["fid_ratio"] for r in scores]
                point = {"variant": label_, "snapshot": snapshot.name if snapshot else None, "step": step,
                         "minutes": seconds_at(run, step) / 60 if snapshot else None, "scales": scales or {},
                         "accuracy_mean": statistics.mean(accuracy), "accuracy_worst": min(accuracy),
                         "fid_median": statistics.median(fid), "fid_worst": max(fid),
                         "values": {r["expression"]: {"accuracy": r["joint"], "fid_ratio": r["fid_ratio"],
                                                      "per_attribute": r.get("per_attribute")} for r in scores}}
                points.append(point)
                print(f"{label_:>16} {snapshot.name if snapshot else ''}  step {step}  accuracy {point['accuracy_mean']:.3f}"
                      f" ({point['accuracy_worst']:.3f})  FID ratio {point['fid_median']:.2f} ({point['fid_worst']:.2f})",
                      flush=True)
    target = out / recipe.stem / f"curve-{label}.json"
    with open(target.with_suffix(".lock"), "w") as lock:  # two measures of one curve may end at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        before = json.loads(target.read_text())["points"] if target.is_file() else []
        mine = {(p["variant"], p["snapshot"], json.dumps(p["scales"])) for p in points}
        merged = [p for p in before if (p["variant"], p["snapshot"], json.dumps(p.get("scales", {}))) not in mine]
        target.write_text(json.dumps({"n": n, "rows": [j["index"] for j in chosen], "points": merged + points},
                                     indent=1))
    return points


def report(recipe: Path, out: Path, label: str = "alone") -> None:
    """The page ``docs/benchmarks/learning-<recipe>-<label>.md`` from ``curve-LABEL.json``: each variant's accuracy
    and FID ratio at each snapshot, whether the snapshots before the last rank the variants as the last does, and
    the curves as a picture (docs/images/learning-<recipe>-<label>.png). The mnist section links to it."""
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    from benchmarks._report import DETAILS, machine, write_section

    minutes_of = lambda snapshot: f"{float(snapshot.removeprefix('minute-')):g}"  # noqa: E731

    curve = json.loads((out / recipe.stem / f"curve-{label}.json").read_text())
    by_variant: dict[str, dict[str, dict]] = {}
    for point in curve["points"]:
        if point["snapshot"] is None:  # the bundled model: no minutes to plot it at
            continue
        scales = "".join(f", {a} at scale {s:g}" for a, s in point.get("scales", {}).items())
        by_variant.setdefault(point["variant"] + scales, {})[point["snapshot"]] = point
    snapshots = sorted({s for points in by_variant.values() for s in points})
    settings = {}
    for variant in by_variant:
        kept = out / recipe.stem / variant.split("@")[0].split(",")[0] / "variant.json"
        given = json.loads(kept.read_text())["settings"] if kept.is_file() else []
        settings[variant] = ", ".join(f"`{g}`" for g in given) + (
            f" (its average of relative std {variant.split('@ema')[1].split(',')[0]}, made after training)"
            if "@ema" in variant
            else "") or "the recipe as it is"
    cell = lambda p: f"{p['accuracy_mean']:.3f} ({p['accuracy_worst']:.3f}) / {p['fid_median']:.1f}"  # noqa: E731
    lines = [f"## Learning per CPU-minute: {recipe.stem}", "",
             f"`python -m benchmarks.learning train --recipe {recipe} --variant NAME [--set ...] --minutes M --every E`"
             " per variant (one thread each, two at once, on one machine), then `python -m benchmarks.learning measure"
             f" --recipe {recipe} --label {label} ...` on {machine()}. Every snapshot is drawn as the mnist table draws"
             f" its rows ({len(curve['rows'])} rows, table indices {curve['rows']}; {curve['n']} samples each, the"
             " model's own sampling settings); cells give accuracy mean (worst) / FID ratio median. Minutes are the"
             " run's logged training time up to the snapshot.", "",
             "| variant | settings | " + " | ".join(f"{minutes_of(s)} min" for s in snapshots) + " |",
             "| --- | --- | " + " | ".join("---" for _ in snapshots) + " |"]
    for variant, points in by_variant.items():
        lines.append(f"| {variant} | {settings[variant]} | "
                     + " | ".join(cell(points[s]) if s in points else "" for s in snapshots) + " |")
    full = [v for v, points in by_variant.items() if snapshots[-1] in points]  # the variants trained longest
    common = [s for s in snapshots if all(s in by_variant[v] for v in full)]
    if len(full) > 1 and len(common) > 1:
        last = common[-1]
        order = lambda s, key, sign: sorted(full, key=lambda v: sign * by_variant[v][s][key])  # noqa: E731
        agree = {s: (order(s, "accuracy_mean", -1) == order(last, "accuracy_mean", -1),
                     order(s, "fid_median", 1) == order(last, "fid_median", 1)) for s in common[:-1]}
        lines += ["", f"**As proxies** ({', '.join(full)}): their ranking at {minutes_of(last)} minutes, by mean"
                  " accuracy / by median FID ratio, is "
                  + "; ".join(f"{'kept' if a else 'not kept'} / {'kept' if f else 'not kept'} at {minutes_of(s)}"
                              for s, (a, f) in agree.items()) + "."]
    others = sorted(c.stem.removeprefix("curve-") for c in (out / recipe.stem).glob("curve-*.json"))
    others = [o for o in others if o != label and (DETAILS / f"learning-{recipe.stem}-{o}.md").is_file()]
    if others:
        lines += ["", "The same variants drawn otherwise: " + ", ".join(
            f"[{o}](benchmarks/learning-{recipe.stem}-{o}.md)" for o in others) + "."]
    image = ROOT / "docs" / "images" / f"learning-{recipe.stem}-{label}.png"
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for variant, points in by_variant.items():
        xs = [p["minutes"] for p in points.values()]
        order_ = sorted(range(len(xs)), key=xs.__getitem__)
        ps = [list(points.values())[i] for i in order_]
        axes[0].plot([p["minutes"] for p in ps], [p["accuracy_mean"] for p in ps], marker="o", label=variant)
        axes[1].plot([p["minutes"] for p in ps], [p["fid_median"] for p in ps], marker="o", label=variant)
    axes[0].set(xlabel="training minutes (one thread)", ylabel="accuracy, mean over rows")
    axes[1].set(xlabel="training minutes (one thread)", ylabel="FID ratio, median over rows", yscale="log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(image, dpi=110)
    plt.close(fig)
    lines += ["", f"![learning curves of {recipe.stem}](images/{image.name})"]
    # its headline is a line of the mnist section's (benchmarks/mnist.py: LEARNING)
    write_section(f"learning-{recipe.stem}-{label}", "\n".join(lines), page_only=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    t = verbs.add_parser("train")
    t.add_argument("--recipe", type=Path, required=True)
    t.add_argument("--variant", required=True, help="the variant's name (its run folder)")
    t.add_argument("--set", dest="settings", action="append", default=[], metavar="TABLE.KEY=VALUE")
    t.add_argument("--minutes", type=float, default=15.0)
    t.add_argument("--every", type=float, default=5.0)
    m = verbs.add_parser("measure")
    m.add_argument("--recipe", type=Path, required=True)
    m.add_argument("--variants", nargs="+", required=True)
    m.add_argument("--n", type=int, default=64)
    m.add_argument("--classifier", default="mnist-classifier")
    m.add_argument("--rows", nargs="+", type=int, default=None, metavar="INDEX",
                   help="rows of the mnist table by index (default: the recipe's attribute alone)")
    m.add_argument("--ema-std", dest="ema_stds", nargs="+", type=float, default=[],
                   help="also the post-hoc averages of these relative stds at each snapshot's step")
    m.add_argument("--ema-only", action="store_true", help="with --ema-std: those averages, not the run's own EMA")
    m.add_argument("--scales", default=None, metavar="ATTR=S,...",
                   help="guidance scales over the models' own, e.g. slant=5 (every model of that attribute)")
    m.add_argument("--snapshots", nargs="+", default=None, metavar="NAME", help="only these (minute-MMM.MM)")
    m.add_argument("--label", default="alone", help="the curve's file: OUT/<recipe>/curve-LABEL.json (points of the"
                                                   " same variant and snapshot are replaced, others kept)")
    r = verbs.add_parser("report")
    r.add_argument("--recipe", type=Path, required=True)
    r.add_argument("--label", default="alone")
    r.add_argument("--out", type=Path, default=ROOT / "runs" / "learning")
    for verb in (t, m):
        verb.add_argument("--out", type=Path, default=ROOT / "runs" / "learning")
        verb.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(getattr(args, "threads", 1))
    if args.verb == "report":
        report(args.recipe, args.out, args.label)
    elif args.verb == "train":
        train(args.recipe, args.variant, args.settings, args.minutes, args.every, args.out)
    else:
        measure(args.recipe, args.variants, args.out, args.n, args.classifier, args.rows, args.ema_stds,
                args.snapshots, args.label,
                {k: float(v) for k, v in (p.split("=") for p in args.scales.split(","))} if args.scales else None,
                args.ema_only)


if __name__ == "__main__":
    main()
