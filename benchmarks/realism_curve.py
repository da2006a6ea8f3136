"""Realism against training time: one point per saved checkpoint of a run.

``--watch`` runs beside ``cebm train``: every time the run writes ``checkpoint.pt`` it keeps the
EMA weights as ``RUN/snapshots/ema-<step>.safetensors`` (the trainer overwrites its checkpoint).
Without ``--watch`` it measures every snapshot (``--n`` samples per value, as ``benchmarks/realism.py``)
and prints one row per step with the run's logged training time. Several runs of one recipe (trained side by side,
say in float32 and in bfloat16) share one table, a row per run and snapshot, to compare quality at equal time.

    python -m benchmarks.realism_curve --run runs/shapes/shape --watch &
    python -m benchmarks.realism_curve --run runs/shapes/shape --recipe recipes/shapes-shape.toml [--every 200]
    python -m benchmarks.realism_curve --run runs/a runs/b --recipe recipes/shapes-shape.toml --label a-against-b
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from benchmarks._report import machine, shown, write_section
from benchmarks._shapes import ROOT, snapshot_path
from benchmarks.realism import measure_model
from composable_ebm.models import load_model
from composable_ebm.recipes import build_dataset, build_model, load_recipe
from composable_ebm.training import load_checkpoint, read_log


def watch(run: Path, poll: float) -> None:
    """Keep each new checkpoint's EMA weights until the run writes its model folder (a folder left by an
    earlier, resumed run does not count)."""
    (run / "snapshots").mkdir(parents=True, exist_ok=True)
    seen = None
    started = time.time()
    while True:
        path = run / "checkpoint.pt"
        if path.is_file() and path.stat().st_mtime != seen:
            seen = path.stat().st_mtime
            state = load_checkpoint(path)  # written atomically (temporary file + rename), never half
            out = snapshot_path(run, state["step"])
            save_file({k: v.contiguous() for k, v in state["ema"].items()}, out)
            print(f"kept {out}", flush=True)
        done = run / "model" / "config.json"
        if done.is_file() and done.stat().st_mtime > started:
            return
        time.sleep(poll)


def seconds_at(run: Path) -> dict[int, float]:
    """Cumulative training seconds at each logged step (from the run's log)."""
    total, out = 0.0, {}
    last = 0
    for record in read_log(run / "log.jsonl"):
        if "seconds" in record and "step" in record:
            total += record["seconds"] * (record["step"] - last)  # the logged step's time stands for the interval
            last = record["step"]
            out[record["step"]] = total
    return out


def curve(run: Path, model, classifier, n: int, every: int, split: str) -> list[dict]:
    """One point per kept snapshot of ``run`` whose step is a multiple of ``every``."""
    clock = seconds_at(run)
    points = []
    for snap in sorted((run / "snapshots").glob("ema-*.safetensors")):
        step = int(snap.stem.split("-")[1])
        if step == 0 or step % every:
            continue
        model.load_state_dict(load_file(snap), strict=True)
        rows = measure_model(model, classifier, n, seed=0, sampler_overrides={}, split=split)
        point = {"run": shown(run), "step": step, "minutes": clock.get(step, float("nan")) / 60,
                 "fid_ratio_median": statistics.median(r["fid_ratio"] for r in rows),
                 "hf_ratio_median": statistics.median(r["hf_ratio"] for r in rows),
                 "accuracy_mean": statistics.mean(r["accuracy"] for r in rows)}
        points.append(point)
        print(json.dumps(point), flush=True)
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, nargs="+", required=True,
                        help="a run folder (cebm train --out), or several runs of one recipe to compare")
    parser.add_argument("--recipe", type=Path, default=None)
    parser.add_argument("--watch", action="store_true")
    parser.add_argument("--poll", type=float, default=15.0)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--every", type=int, default=1, help="measure the snapshots whose step is a multiple of this")
    parser.add_argument("--split", choices=("train", "all"), default="train",
                        help="renders to compare with (as benchmarks/realism.py --split)")
    parser.add_argument("--label", default=None,
                        help="names runs/realism/curve-LABEL.json and the docs section (default: the run folder's name)")
    args = parser.parse_args()
    runs = [run.resolve() for run in args.run]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.watch:
        if len(runs) > 1:
            raise SystemExit("--watch follows one run; start one watcher per run")
        watch(runs[0], args.poll)
        return
    if args.recipe is None:
        raise SystemExit("--recipe is needed to measure: the recipe the runs trained (it builds the network)")
    spec = load_recipe(args.recipe)
    model = build_model(spec, build_dataset(spec.data)).eval()
    classifier = load_model("shapes-classifier").eval()
    points = [p for run in runs for p in curve(run, model, classifier, args.n, args.every, args.split)]
    label = args.label or runs[0].name
    out = ROOT / "runs" / "realism" / f"curve-{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(points, indent=1))
    several = len(runs) > 1
    write_section(f"realism-curve-{label}", "\n".join([
        f"## Realism against training time: {model.name} ({args.recipe.as_posix()})"
        + (", " + " against ".join(run.name for run in runs) if several else ""),
        "",
        f"`python -m benchmarks.realism_curve --run {' '.join(shown(run) for run in runs)}"
        f" --recipe {args.recipe} --every {args.every} --n {args.n} --split {args.split}"
        + (f" --label {args.label}" if args.label else "") + f"` on {machine()}: the EMA weights of every"
        f" {args.every}th-step checkpoint, {args.n} samples per value with the recipe's sampling settings (as"
        " `benchmarks/realism.py`). Minutes: the run's logged step times (one thread, the machine's two cores shared"
        " with other runs).",
        "",
        ("| run " if several else "") + "| step | minutes | median FID ratio | median HF ratio | mean accuracy |",
        ("| --- " if several else "") + "| --- | --- | --- | --- | --- |",
        *((f"| {p['run']} " if several else "") + f"| {p['step']} | {p['minutes']:.0f} | {p['fid_ratio_median']:.1f} |"
          f" {p['hf_ratio_median']:.2f} | {p['accuracy_mean']:.3f} |" for p in points),
    ]))


if __name__ == "__main__":
    main()
