"""Write one EMA snapshot of a run (``benchmarks.realism_curve --watch`` keeps them) as a model folder, with its
recipe's network and sampling settings, so the composition table and ``cebm compose`` can read it:

    PYTHONPATH=. python benchmarks/screens/snapshot_model.py RECIPE RUN STEP OUT

OUT is a folder of model folders (``OUT/<the recipe's model name>``), as ``benchmarks.composition --models`` takes;
the bundled classifier, which that table reads its composites with, is copied in beside them when it is missing.
"""
import shutil
import sys
from pathlib import Path

from safetensors.torch import load_file

from benchmarks._shapes import snapshot_path
from composable_ebm.persistence import BUNDLED_DIR, save_model
from composable_ebm.recipes import build_dataset, build_model, load_recipe

recipe_path, run, step, out = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
recipe = load_recipe(recipe_path)
model = build_model(recipe, build_dataset(recipe.data)).eval()
model.load_state_dict(load_file(snapshot_path(run, step)), strict=True)
save_model(model, out / model.name)
if not (out / "shapes-classifier").is_dir():
    shutil.copytree(BUNDLED_DIR / "shapes-classifier", out / "shapes-classifier")
print(f"{run}:{step} ({recipe_path}) -> {out / model.name}")
