"""How the colour model's guidance scale trades the guided form's lean to large objects for accuracy: `guided(red +
circle)`, `guided(green + square)` and `guided(blue + triangle)`, 64 samples each (seed 0) with the models' own
sampling settings, read by the bundled classifier (joint accuracy and the share drawn large), at each SCALE.

    PYTHONPATH=. python benchmarks/screens/color_scale.py FOLDER SCALE [SCALE ...]

FOLDER: a folder of model folders (``FOLDER/shapes-<attribute>``, as ``snapshot_model.py`` writes them), or
``bundled``; a model missing from it is the bundled one.
"""
import dataclasses
import sys
from pathlib import Path

import torch

import composable_ebm as cebm
from benchmarks._shapes import shapes_models
from composable_ebm.persistence import load_model

PAIRS = (("red", "circle"), ("green", "square"), ("blue", "triangle"))
COLORS, SHAPES = ("red", "green", "blue"), ("circle", "square", "triangle")


def main() -> None:
    torch.set_num_threads(1)
    folder, scales = Path(sys.argv[1]), [float(s) for s in sys.argv[2:]]
    classifier = load_model("shapes-classifier").eval()
    models = shapes_models(folder)
    for scale in scales:
        models["color"].sampler_config = dataclasses.replace(models["color"].sampler_config, guidance_scale=scale)
        cells = []
        for color, shape in PAIRS:
            x = cebm.guided(models["color"].condition(color=color) + models["shape"].condition(shape=shape)).sample(64, seed=0)
            read = classifier.predict(x)
            joint = ((read["color"] == COLORS.index(color)) & (read["shape"] == SHAPES.index(shape))).float().mean()
            cells.append(f"{color} + {shape}: joint {joint:.2f}, large {(read['size'] == 1).float().mean():.2f}")
        print(f"colour guidance scale {scale}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
