"""Screen: how much of a guided composite's FID ratio is colour (the background's tint, the object's shade)?

Every EVERY-th composite of the whole table (``benchmarks/composition.py``'s targets, seeds and renders), 64 guided
samples of the bundled models each, read three times: as sampled (``raw``); with every pixel close to the
sample's own border colour (max channel difference < 0.1) set to the data's exact background (``bg``); and, for a
composite with a colour, with the other pixels also moved onto the line from the background to the target colour
(``bg+hue``: exact colours, the sample's own coverage). Prints each composite's FID ratios and background tint.

    PYTHONPATH=. python benchmarks/screens/colour_fidelity.py EVERY
"""
import statistics
import sys

import torch

from benchmarks._shapes import border_colour, border_tint, shapes_models
from benchmarks.composition import expression, read_composite, table, table_renders
from composable_ebm.data.datasets import _BACKGROUND, _RGB, SHAPES_ATTRIBUTES
from composable_ebm.expression import parse_expression
from composable_ebm.persistence import load_model


def main() -> None:
    every = int(sys.argv[1])
    torch.set_num_threads(1)
    models = shapes_models()
    classifier = load_model("shapes-classifier").eval()
    n, ratios = 64, {"raw": [], "bg": [], "bg+hue": []}
    for i, target in table(every):
        text = expression(target, "guided")
        x = parse_expression(text, lambda name: models[name]).sample(n, seed=i, form="plain")
        reference = table_renders(target, i, n)
        background = (x - border_colour(x)[:, :, None, None]).abs().amax(1, keepdim=True) < 0.1
        versions = {"raw": x, "bg": torch.where(background, torch.full_like(x, _BACKGROUND), x)}
        if "color" in target:
            rgb = _RGB[SHAPES_ATTRIBUTES["color"].index(target["color"])].view(1, 3, 1, 1)
            cover = (((versions["bg"] - _BACKGROUND) * (rgb - _BACKGROUND)).sum(1, keepdim=True)
                     / ((rgb - _BACKGROUND) ** 2).sum()).clamp(0, 1)
            versions["bg+hue"] = _BACKGROUND * (1 - cover) + rgb * cover
        row = {}
        for name, y in versions.items():
            row[name] = read_composite(y, target, i, classifier, reference)[1].fid_ratio
            ratios[name].append(row[name])
        print(f"{i} | {text} | " + " | ".join(f"{k} {v:.1f}" for k, v in row.items()) + f" | tint {border_tint(x):.3f}",
              flush=True)
    print(" | ".join(f"{k}: median {statistics.median(v):.1f} of {len(v)}" for k, v in ratios.items() if v))


if __name__ == "__main__":
    main()
