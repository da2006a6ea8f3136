"""Choose a run's checkpoint by mode coverage on a validation seed: for every kept EMA snapshot (``benchmarks.realism_curve
--watch`` keeps them), each value's accuracy and largest coverage gap of 256 samples and the FID ratio of 64, measured
with a seed the reported benchmarks do not use (they use 0), so the choice is not fitted to the numbers we publish.

    PYTHONPATH=. python benchmarks/screens/select_coverage.py RECIPE SEED RUN:STEP [RUN:STEP ...] [--steps K]

``--steps K`` samples every snapshot with K Langevin steps instead of its recipe's (a model trained on chains of
varied length can be sampled at any length in that range).

Prints, for every snapshot, each value's mix of the other attributes and one summary row; then the chosen one:
among those whose every value is read right >= 0.95 of the time, the smallest worst coverage gap (ties: the lower
median FID ratio).
"""
import statistics
import sys

import torch
from safetensors.torch import load_file

from benchmarks._shapes import snapshot_path
from benchmarks.realism import measure_model
from composable_ebm.persistence import load_model
from composable_ebm.recipes import build_dataset, build_model, load_recipe

torch.set_num_threads(1)
args = sys.argv[1:]
overrides = {}
if "--steps" in args:
    at = args.index("--steps")
    overrides = {"steps": int(args[at + 1])}
    del args[at:at + 2]
recipe, seed = load_recipe(args[0]), int(args[1])
model = build_model(recipe, build_dataset(recipe.data)).eval()
classifier = load_model("shapes-classifier").eval()
rows = []
for item in args[2:]:
    run, step = item.rsplit(":", 1)
    model.load_state_dict(load_file(snapshot_path(run, step)), strict=True)
    measured = measure_model(model, classifier, 64, seed=seed, sampler_overrides=overrides, split="all", coverage_n=256)
    row = (item, min(r["accuracy"] for r in measured), max(max(r["coverage_gap"].values()) for r in measured),
           statistics.median(r["fid_ratio"] for r in measured), statistics.median(r["hf_ratio"] for r in measured))
    rows.append(row)
    for r in measured:  # where each value's gap lies: the share of each other attribute's values it draws
        print(f"  {r['value']}: " + "; ".join(
            f"{a} " + " / ".join(f"{v} {share:.2f}" for v, share in r["distribution"][a].items())
            + f" (gap {r['coverage_gap'][a]:.2f})" for a in r["coverage_gap"]), flush=True)
    print(f"{row[0]}: worst accuracy {row[1]:.3f}, worst coverage gap {row[2]:.3f}, FID ratio median {row[3]:.2f},"
          f" HF ratio median {row[4]:.2f}", flush=True)
eligible = [r for r in rows if r[1] >= 0.95]
if not eligible:
    print("no snapshot reads every value right >= 0.95 of the time; choosing among all of them")
    eligible = rows
best = min(eligible, key=lambda r: (round(r[2], 2), r[3]))
print(f"chosen: {best[0]} (seed {seed})")
