"""Which colour leads a chain's starting noise, and what the chain draws after it.

Write each image in the coordinates of the data's three colours seen from the background (as `ResNetConfig.palette`
does): in plain uniform noise the green coordinate has the largest mean in about 0.51 of the images, red in 0.41 and
blue in 0.08. This screen samples each value of a model alone from plain uniform noise (the default 60 steps) and
splits the chains by the colour that led their noise: per leading colour, how many chains, the share drawn large,
the share read right and the colours read.

    PYTHONPATH=. python benchmarks/screens/lead_paths.py MODEL [N] [SEED]   # MODEL: a name, folder or RUN:RECIPE
"""
import sys

import torch

from benchmarks._shapes import load_spec
from composable_ebm.persistence import load_model
from composable_ebm.sampling import leading_colour

LEAD = ((0.12, 0.80, 0.15), (0.90, 0.12, 0.12), (0.15, 0.25, 0.95))  # the data's green, red and blue
LEAD_NAMES = ("green", "red", "blue")
BACKGROUND = (0.08, 0.08, 0.08)


def main() -> None:
    torch.set_num_threads(1)
    model = load_spec(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    classifier = load_model("shapes-classifier").eval()
    colours = classifier.config.attributes["color"]
    (attribute, values), = model.attributes.items()
    for index, value in enumerate(values):
        x0 = torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed + index))
        lead = leading_colour(x0, LEAD, BACKGROUND)
        read = classifier.predict(model.condition(**{attribute: value}).sample(n, seed=seed + index, x0=x0))
        large = (read["size"] == 1).float()
        right = (read[attribute] == index).float()
        parts = [f"{value}: large {float(large.mean()):.2f}, read right {float(right.mean()):.2f}"]
        for k, name in enumerate(LEAD_NAMES):
            chains = lead == k
            shares = " / ".join(f"{c} {float((read['color'][chains] == j).float().mean()):.2f}"
                                for j, c in enumerate(colours))
            parts.append(f"{name} led {int(chains.sum())}: large {float(large[chains].mean()):.2f}, read right"
                         f" {float(right[chains].mean()):.2f}, colours read {shares}")
        print(" | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
