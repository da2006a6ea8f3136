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
FID ratio median and worst) and keeps them in ``OUT/<recipe>/curve.json``.
"""

from __future__ import annotations

import argparse
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


def measure(recipe: Path, variants: list[str], out: Path, n: int, classifier: str) -> list[dict]:
    """Each variant's snapshots drawn alone, every value, as the mnist table draws them (`benchmarks.mnist`)."""
    spec = load_recipe(recipe)
    attribute, = spec.data.attributes
    name = f"mnist-{attribute}"
    rows = [j for j in jobs() if j["kind"] == "alone" and set(j["target"]) == {attribute}]
    reader, data = load(classifier).eval(), mnist()
    points = []
    for variant in variants:
        run = out / recipe.stem / variant
        for snapshot in sorted(p for p in (run / "snapshots").glob("minute-*") if p.is_dir()):
            model = load(str(snapshot))
            step = json.loads((snapshot.parent / f"{snapshot.name}.json").read_text())["step"]
            scores = [measure_row(job, lambda asked: model if asked == name else load(asked), reader, data, n)[0]
                      for job in rows]
            accuracy = [r["joint"] for r in scores]
            fid = [r["fid_ratio"] for r in scores]
            point = {"variant": variant, "snapshot": snapshot.name, "step": step,
                     "minutes": seconds_at(run, step) / 60,
                     "accuracy_mean": statistics.mean(accuracy), "accuracy_worst": min(accuracy),
                     "fid_median": statistics.median(fid), "fid_worst": max(fid),
                     "values": {r["expression"]: {"accuracy": r["joint"], "fid_ratio": r["fid_ratio"]} for r in scores}}
            points.append(point)
            print(f"{variant:>12} {snapshot.name}  step {step}  accuracy {point['accuracy_mean']:.3f}"
                  f" ({point['accuracy_worst']:.3f})  FID ratio {point['fid_median']:.2f} ({point['fid_worst']:.2f})",
                  flush=True)
    (out / recipe.stem / "curve.json").write_text(json.dumps({"n": n, "points": points}, indent=1))
    return points


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
    for verb in (t, m):
        verb.add_argument("--out", type=Path, default=ROOT / "runs" / "learning")
        verb.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.verb == "train":
        train(args.recipe, args.variant, args.settings, args.minutes, args.every, args.out)
    else:
        measure(args.recipe, args.variants, args.out, args.n, args.classifier)


if __name__ == "__main__":
    main()
