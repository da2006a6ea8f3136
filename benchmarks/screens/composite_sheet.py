"""A contact sheet of guided composites from one or more folders of models: for each folder and composite, a row of
8 samples (seed 0) beside 8 renders of the same combination (seed 1), upscaled 6x.

    PYTHONPATH=. python benchmarks/screens/composite_sheet.py OUT.png FOLDER [FOLDER ...] \
        --composites shape=circle,color=red,size=small,position=right shape=triangle,color=green

FOLDER: a folder of model folders (``FOLDER/shapes-<attribute>``, as ``snapshot_model.py`` writes them), or
``bundled``; a model missing from it is the bundled one. Rows come folder by folder, composites in the given order.
"""
import argparse
from pathlib import Path

import torch

from benchmarks._shapes import shapes_models
from benchmarks.composition import expression, renders
from composable_ebm.evaluation.realism import contact_sheet
from composable_ebm.expression import parse_expression
from composable_ebm.images import save_image, to_pil


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--composites", nargs="+", required=True, help="attribute=value pairs joined by ','")
    args = parser.parse_args()
    torch.set_num_threads(1)
    targets = [dict(pair.split("=", 1) for pair in text.split(",")) for text in args.composites]
    rows = []
    for folder in args.folders:
        models = shapes_models(None if folder == "bundled" else Path(folder))
        for target in targets:
            text = expression(target, "guided")
            energy = parse_expression(text, models.__getitem__)
            rows.append((energy.sample(8, seed=0), renders(target, 8, seed=1)))
            print(f"{folder}: {text}", flush=True)
    save_image(to_pil(contact_sheet(rows, scale=6)), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
