"""Why a composite's FID ratio is high: how far its samples spread in what the composite leaves free, beside renders.

For each composite (``attribute=value`` pairs joined by ``,``) and form, 64 samples (seed 0) of the bundled models
and 64 renders of the same combination: the standard deviation of the object's centre (pixels, rows and
columns) and the mean and spread of its area (pixels that differ from the corner's background by more than 0.15).

    PYTHONPATH=. python benchmarks/screens/composite_spread.py shape=circle,color=red size=small,position=right ...
"""
import sys

import torch

import composable_ebm as cebm
from benchmarks.composition import renders


def centre_and_area(x: torch.Tensor):
    """Row and column of each image's object centre (weighted by its difference to the background), and its area."""
    diff = (x - x[:, :, :1, :1]).abs().sum(1)
    weight = torch.where(diff > 0.15, diff, torch.zeros_like(diff))
    rows, cols = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    total = weight.sum((1, 2)).clamp_min(1e-6)
    return (weight * rows).sum((1, 2)) / total, (weight * cols).sum((1, 2)) / total, (weight > 0).float().sum((1, 2))


def main() -> None:
    torch.set_num_threads(2)
    models = {a: cebm.load(f"shapes-{a}") for a in ("shape", "color", "size", "position")}
    for item in sys.argv[1:]:
        spread(models, item)


def spread(models, item: str) -> None:
    target = dict(pair.split("=") for pair in item.split(","))
    terms = [models[a].condition(**{a: v}) for a, v in target.items()]
    real = renders(target, 64, seed=400)
    forms = ("alone",) if len(terms) == 1 else ("guided", "plain")
    for form in forms:
        energy = terms[0] if form == "alone" else sum(terms[1:], terms[0])
        x = energy.sample(64, seed=0, **({} if form == "alone" else {"form": form}))
        (ys, xs, area), (yr, xr, ar) = centre_and_area(x), centre_and_area(real)
        print(f"{item} ({form}): centre spread rows / columns {ys.std():.2f} / {xs.std():.2f} px, area"
              f" {area.mean():.1f} +- {area.std():.1f}; renders {yr.std():.2f} / {xr.std():.2f} px, area"
              f" {ar.mean():.1f} +- {ar.std():.1f}", flush=True)


if __name__ == "__main__":
    main()
