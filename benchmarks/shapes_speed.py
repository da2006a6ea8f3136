"""Training-iteration time of the Shapes attribute recipes against the network they replaced.

Times ``Trainer.train_step`` (median after warm-up, buffer filled so that L_ent is on) for:
the previous Shapes setup (16x16, three towers with self-attention); the recipe
(``recipes/shapes-shape.toml``: one tower, no attention) in float32; the recipe with bfloat16
sampling; the recipe with channels_last weights.

    python -m benchmarks.shapes_speed [--iters 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from benchmarks._report import machine, write_section
from benchmarks._shapes import recipe_path
from composable_ebm import BlockSpec, ResNetConfig, ResNetEnergy
from composable_ebm.recipes import build_dataset, build_model, load_recipe
from composable_ebm.training import Trainer

PREVIOUS_BLOCKS = (BlockSpec(channels=32), BlockSpec(channels=32, down=True), BlockSpec(kind="attention"),
                   BlockSpec(channels=64, down=True))


def seconds_per_iteration(variant: str, iters: int) -> float:
    recipe = load_recipe(recipe_path("shape"))
    data = build_dataset(dataclasses.replace(recipe.data, n=2000))
    config = dataclasses.replace(recipe.trainer, log_every=10**9, checkpoint_every=10**9)
    if variant == "previous":
        torch.manual_seed(0)
        model = ResNetEnergy(ResNetConfig(image_size=16, stem_channels=32, blocks=PREVIOUS_BLOCKS, groups=8,
                                          attributes=data.attributes))
    else:
        model = build_model(recipe, data)
    if variant == "bfloat16":
        config = config.with_objective(sampler=dataclasses.replace(config.objective.sampler, precision="bfloat16"))
    if variant == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    trainer = Trainer(model, data, config)
    while len(trainer.buffer) < config.objective.ent_min_buffer + config.batch_size:
        trainer.buffer.add(torch.rand(config.batch_size, *model.input_shape), {"shape": torch.zeros(
            config.batch_size, dtype=torch.long)}, trainer.generator)
    trainer.train_step()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=8)
    args = parser.parse_args()
    labels = {
        "previous": "previous Shapes network: 3 towers + self-attention (float32)",
        "recipe": "recipe network: 1 tower, no attention (float32)",
        "bfloat16": "recipe network, bfloat16 sampling",
        "channels_last": "recipe network, channels_last weights (float32)",
    }
    results = {}
    for variant in labels:
        results[variant] = seconds_per_iteration(variant, args.iters)
        print(f"{labels[variant]}: {results[variant]:.3f} s / iteration", flush=True)
    base = results["previous"]
    rows = [f"| {labels[v]} | {s:.3f} | {base / s:.2f}x |" for v, s in results.items()]
    write_section("shapes-speed", "\n".join([
        "## Training iteration, Shapes attribute recipe (16x16, batch 32, 20 Langevin steps, KL loss on)",
        "",
        f"`python -m benchmarks.shapes_speed --iters {args.iters}` on {machine()}; median of {args.iters} iterations.",
        "Every row runs the shape recipe's trainer settings (label term on); only the network or precision differs.",
        "",
        "| network | s / iteration | speed-up over the previous network |",
        "| --- | --- | --- |",
        *rows,
        "",
        "The recipes use the float32 one-tower network. bfloat16 sampling pays off for the paper's 32x32 network",
        "(the sampling table above) but not for this small one on this CPU, nor do channels_last weights;",
        "`torch.compile` is not wired into the trainer.",
    ]))


if __name__ == "__main__":
    main()
