"""What a guided term costs when the shape and size networks take their condition late (timing only).

    PYTHONPATH=. python benchmarks/screens/late_cost.py [--n 64] [--repeats 30] [--threads 1]

Builds the shape and size networks of their recipes with the condition entering everywhere (`film`, as bundled),
in the last residual block only (`film_blocks = 1`) or through a projection head (`condition_head =
"projection"`), freshly initialised (the time of a step does not depend on the weights), beside the bundled colour
model, and times one sampler step of ``red + circle + large`` plain and guided as ``benchmarks.guided_cost`` does.
"""
import argparse
import dataclasses
import json

import torch

from benchmarks.guided_cost import step_seconds
from composable_ebm import ResNetEnergy, guided, load
from composable_ebm.recipes import build_dataset, build_model, load_recipe

VARIANTS = {"film (bundled)": {}, "film_blocks = 1": {"film_blocks": 1}, "projection": {"condition_head": "projection"}}


def network(attribute: str, overrides: dict) -> ResNetEnergy:
    recipe = load_recipe(f"recipes/shapes-{attribute}.toml")
    config = build_model(recipe, build_dataset(recipe.data)).config
    return ResNetEnergy(dataclasses.replace(config, **overrides)).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    color = load("shapes-color")
    x = torch.rand(args.n, 3, 16, 16)
    for name, overrides in VARIANTS.items():
        shape, size = network("shape", overrides), network("size", overrides)
        plain = color.condition(color="red") + shape.condition(shape="circle") + size.condition(size="large")
        seconds = {form: step_seconds(e, x, args.repeats) for form, e in (("plain", plain), ("guided", guided(plain)))}
        print(json.dumps({"variant": name, "ms": {k: round(1000 * v, 1) for k, v in seconds.items()},
                          "ratio": round(seconds["guided"] / seconds["plain"], 2)}), flush=True)


if __name__ == "__main__":
    main()
