"""Choose a run's checkpoint on a validation seed: realism and accuracy of every kept EMA snapshot
(``benchmarks.realism_curve --watch`` keeps them) between two steps, measured with a seed the reported
benchmarks do not use (they use 0), so the choice is not fitted to the numbers we publish.

    PYTHONPATH=. python benchmarks/screens/select_checkpoint.py RUN RECIPE FIRST LAST [EVERY] [SEED]

Prints one row per snapshot: median FID ratio, median HF ratio, the worst value's accuracy; then the step
with the best worst-value accuracy (ties: the lower median FID ratio).
"""
import statistics
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from benchmarks._shapes import snapshot_path
from benchmarks.realism import measure_model
from composable_ebm.persistence import load_model
from composable_ebm.recipes import build_dataset, build_model, load_recipe

torch.set_num_threads(1)
run, recipe = Path(sys.argv[1]), load_recipe(sys.argv[2])
first, last = int(sys.argv[3]), int(sys.argv[4])
every = int(sys.argv[5]) if len(sys.argv) > 5 else 100
seed = int(sys.argv[6]) if len(sys.argv) > 6 else 1
model = build_model(recipe, build_dataset(recipe.data)).eval()
classifier = load_model("shapes-classifier").eval()
rows = []
for step in range(first, last + 1, every):
    model.load_state_dict(load_file(snapshot_path(run, step)), strict=True)
    measured = measure_model(model, classifier, 64, seed=seed, sampler_overrides={}, split="all")
    row = (step, statistics.median(r["fid_ratio"] for r in measured), statistics.median(r["hf_ratio"] for r in measured),
           min(r["accuracy"] for r in measured))
    rows.append(row)
    print(f"step {row[0]}: FID ratio median {row[1]:.2f}, HF ratio median {row[2]:.2f}, worst accuracy {row[3]:.3f}",
          flush=True)
best = max(rows, key=lambda r: (r[3], -r[1]))
print(f"chosen: step {best[0]} (seed {seed})")
