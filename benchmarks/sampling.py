"""Langevin sampling throughput of the paper's 32x32 network (multiscale, self-attention).

Prints Langevin steps x images per second at batch 16 and 64 in float32 and bfloat16
autocast, the achieved GFLOP/s (FLOPs of one energy-and-input-gradient evaluation, counted
by torch's FlopCounterMode) and, for scale, a dense float32 matmul measured in the same run.
Writes the table to docs/benchmarks.md.

    python benchmarks/sampling.py [--steps 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks._report import machine, write_section
from composable_ebm import ResNetConfig, ResNetEnergy
from composable_ebm.sampling import SamplerConfig, sample


def matmul_gflops(device: torch.device, n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a @ b
    _sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def step_seconds(energy, x: torch.Tensor, labels=None, reps: int = 5, warmup: int = 1) -> float:
    """Seconds of one energy-and-gradient evaluation at ``x``: the mean of ``reps`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        energy.energy_and_grad(x, labels)
    _sync(x.device)
    t = time.perf_counter()
    for _ in range(reps):
        energy.energy_and_grad(x, labels)
    _sync(x.device)
    return (time.perf_counter() - t) / reps


def step_flops(model: ResNetEnergy, batch: int, device: torch.device) -> int:
    """FLOPs of the energy and its input gradient (the counter does not follow autograd.grad,
    so this runs backward() with the parameters frozen, which computes the same kernels); a conditional
    model runs under its first values."""
    x = torch.rand(batch, *model.input_shape, device=device, requires_grad=True)
    labels = {a: torch.zeros(batch, dtype=torch.long, device=device) for a in model.attributes}
    flags = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    try:
        with FlopCounterMode(display=False) as counter:
            model(x, labels or None).sum().backward()
    finally:
        for p, flag in zip(model.parameters(), flags, strict=True):
            p.requires_grad_(flag)
    return counter.get_total_flops()


def measure(model: ResNetEnergy, batch: int, precision: str, steps: int, device: torch.device) -> float:
    cfg = SamplerConfig(step_size=10.0, steps=steps, precision=precision)
    sample(model, batch, dataclasses.replace(cfg, steps=1), seed=0)  # warm-up
    _sync(device)
    t = time.perf_counter()
    sample(model, batch, cfg, seed=0)
    _sync(device)
    return (time.perf_counter() - t) / (steps + 1)  # steps + the initial evaluation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = ResNetEnergy(ResNetConfig.paper_32()).to(device).eval()
    peak = matmul_gflops(device)
    rows = []
    for batch in args.batches:
        flops = step_flops(model, batch, device)
        for precision in ("float32", "bfloat16"):
            sec = measure(model, batch, precision, args.steps, device)
            rows.append((batch, precision, sec, batch / sec, flops / sec / 1e9))
            print(f"batch {batch:3d} {precision:8s} {sec * 1e3:8.1f} ms/step  {batch / sec:8.1f} step*img/s"
                  f"  {flops / sec / 1e9:7.1f} GFLOP/s ({flops / batch / 1e9:.3f} GFLOP per image-step)", flush=True)
    print(f"dense float32 matmul: {peak:.1f} GFLOP/s")
    lines = [
        "## Langevin sampling, paper 32x32 network (multiscale, self-attention)",
        "",
        f"`python benchmarks/sampling.py --steps {args.steps}` on {machine()}.",
        "One step = energy and input gradient at a batch (parameter gradients are not computed).",
        "",
        "| batch | precision | ms / step | steps x images / s | GFLOP/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {b} | {p} | {s * 1e3:.1f} | {r:.1f} | {g:.1f} |" for b, p, s, r, g in rows]
    lines += ["", f"Dense float32 matmul (2048x2048) in the same run: {peak:.1f} GFLOP/s."]
    write_section("sampling", "\n".join(lines))


if __name__ == "__main__":
    main()
