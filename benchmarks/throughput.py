"""Throughput of the shipped recipes' networks: a training iteration and one sampling step, against the machine.

For each recipe's network, each batch size and each device setting (the CPU with 1 and 2 threads; CUDA when
present) it measures:

- the time of one training iteration (`Trainer.train_step`: the recipe's chain, losses, optimiser and EMA) and of
  one sampling step (the energy and its input gradient at a batch, as a Langevin step runs them);
- the arithmetic rate of the sampling step (FLOPs counted by torch's ``FlopCounterMode``) against a dense float32
  matrix product measured in the same run (the machine's limit for this work);
- the share of a sampling step's wall time spent outside kernels: wall time minus the time the profiler attributes
  to the operators' own work (CPU: the self time of every ``aten::`` operator; CUDA: the kernels' device time).

    python -m benchmarks.throughput [--recipes shapes-shape ...] [--batches 24 64 128] [--threads 1 2] [--iters 3]
                                    [--paper]

``--paper`` adds the sampling step of the paper's 32-px CIFAR-10 network (``recipes/cifar10.toml``) on random input;
its training iteration needs CIFAR-10, so it is not timed.

The table goes into docs/benchmarks.md (section ``throughput``; with ``--cuda-only``, the CUDA rows alone go into
``throughput-cuda``). With ``--precision`` it instead times a training
iteration of each recipe at its own batch in float32 and in bfloat16 (`TrainerConfig.precision`), alternating the
two in one run on one thread (CUDA too when present), into the section ``throughput-precision``:

    python -m benchmarks.throughput --precision [--recipes ...] [--iters 5]

With ``--cuda-graphs`` (a CUDA device needed) it times a training iteration and a whole sampling chain of each recipe
on the GPU with the chain's transitions replayed from CUDA graphs (`composable_ebm.accel.graphs`) against
without, alternating the two in one run, into the section ``throughput-cuda-graphs``:

    python -m benchmarks.throughput --cuda-graphs [--recipes ...] [--batches 24 128] [--iters 5] [--paper]

(``--paper`` there adds a step of the paper's 32-px network's training chain, eager and replayed, against the limit.)

With ``--compile`` it times each recipe's network eagerly against through ``torch.compile`` (the energy compiled
for the batch's fixed shape, its input gradient by the compiled backward), alternating the two in one run on one
CPU thread (and on CUDA when present), into the section ``throughput-compile``:

    python -m benchmarks.throughput --compile [--recipes ...] [--batches 24 64 128] [--iters 3]

For each it gives a sampling step both ways, the first compiled call's seconds (the compilation), the largest
relative difference of the input gradient from the eager one, and a training iteration both ways. In the compiled
iteration the chain's evaluations use the compiled energy with the parameters held (as a chain uses them); the
last, differentiable step and the losses stay eager. A denoising recipe's loss differentiates the input gradient
again, which a compiled energy's backward cannot do, so its compiled iteration compiles the whole loss instead
(`CompiledDenoising`: the input gradient by ``torch.func.grad`` inside the graph). Where a compiled iteration fails
on the platform, its row says why in one line instead of a time.

With ``--derivatives`` it times a training iteration of each denoising recipe (by default; the
contrastive-divergence recipes' KL loss does not use the layers' own derivatives) at its own batch on one CPU thread
(CUDA too when present) with the second derivatives of the convolutions, group normalisations and SiLUs by autograd's
formulas against by `composable_ebm.accel.derivatives`' own (`CEBM_OWN_DERIVATIVES`), in float32 and in bfloat16,
alternating the four in one run, into the section ``throughput-derivatives``. Its first column is the eager float32
path the issue on throughput started from; its last compares the recipe's default now (its own precision, own
derivatives) with it:

    python -m benchmarks.throughput --derivatives [--recipes ...] [--iters 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks._report import write_section
from benchmarks.sampling import _sync, matmul_gflops, step_flops, step_seconds
from composable_ebm.recipes import build_dataset, build_model, load_recipe
from composable_ebm.accel.settings import Speed
from composable_ebm.accel.precision import native_bfloat16
from composable_ebm.training import Trainer
from composable_ebm.training.denoising import DenoisingObjective, noise_prediction_loss

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = {"shapes-shape": "shapes-shape.toml", "shapes-color": "shapes-color-palette.toml",
           "shapes-size": "shapes-size.toml", "shapes-position": "shapes-position.toml",
           "diffusion/shapes-shape": "diffusion/shapes-shape.toml", "faces-smiling": "faces-smiling.toml"}
CD_RECIPES = [name for name in SHIPPED if name.startswith("shapes-")]
PAPER = "paper-32"  # the paper's 32-px CIFAR-10 network (recipes/cifar10.toml): its sampling step alone, no data


def _labels(model, batch: int, device: torch.device) -> dict[str, torch.Tensor]:
    return {a: torch.zeros(batch, dtype=torch.long, device=device) for a in model.attributes}


def sampling_step(model, batch: int, device: torch.device, reps: int) -> tuple[float, float]:
    """Seconds of one energy-and-gradient evaluation at ``batch``, and the share of it outside kernels."""
    x = torch.rand(batch, *model.input_shape, device=device)
    labels = _labels(model, batch, device) or None
    seconds = step_seconds(model, x, labels, reps)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        model.energy_and_grad(x, labels)
        _sync(device)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    if device.type == "cuda":
        busy = sum(e.self_device_time_total for e in events) / 1e6
    else:
        busy = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::")) / 1e6
    return seconds, max(0.0, 1.0 - busy / wall)


def training_iteration(recipe, data, batch: int, device: torch.device, iters: int, precision: str | None = None,
                       compiled: bool = False) -> float:
    """Seconds of one `Trainer.train_step` of the recipe at ``batch`` (after one warm-up iteration), at the recipe's
    precision or ``precision`` (of the denoising loss, or of a contrastive-divergence recipe's chain); with
    ``compiled``, the chain's energy compiled (`compiled_chain`), or a denoising recipe's whole loss
    (`CompiledDenoising`)."""
    model = build_model(recipe, data)
    if compiled:
        torch._dynamo.reset()
        if not model.noise_conditioned:
            compiled_chain(model)
    config = dataclasses.replace(recipe.trainer, batch_size=batch)
    if precision is not None and model.noise_conditioned:
        config = config.with_objective(precision=precision)
    elif precision is not None:
        config = config.with_objective(sampler=dataclasses.replace(config.objective.sampler, precision=precision))
    trainer = Trainer(model, data, config, device=device)
    if compiled and model.noise_conditioned:
        trainer.objective = CompiledDenoising(trainer.energy)
    trainer.train_step()
    _sync(device)
    t = time.perf_counter()
    for _ in range(iters):
        trainer.train_step()
    _sync(device)
    return (time.perf_counter() - t) / iters


def device_label(device: torch.device, bfloat16: bool = False) -> str:
    """A one-thread table's device column: ``cpu, 1 thread`` or the GPU's name; with ``bfloat16``, saying where
    bfloat16 fell back to float32 (with a warning) for want of the device's own bfloat16 arithmetic."""
    where = "cpu, 1 thread" if device.type == "cpu" else torch.cuda.get_device_name()
    if bfloat16 and not native_bfloat16(device.type):
        where += ", no bfloat16 arithmetic (runs float32)"
    return where


def precision_table(names: list[str], iters: int) -> None:
    """A training iteration of each recipe at its own batch, float32 against bfloat16, alternated in one run."""
    torch.set_num_threads(1)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    rows = []
    for name in names:
        recipe = load_recipe(ROOT / "recipes" / SHIPPED[name])
        data = build_dataset(recipe.data, recipe.folder)  # the recipe's own data: what training reads (cached)
        batch = recipe.trainer.batch_size
        for device in devices:
            times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
            for _ in range(2):  # alternate, so a drift in the machine's speed reaches both alike
                for precision in times:
                    times[precision].append(training_iteration(recipe, data, batch, device, iters, precision))
            where = device_label(device, bfloat16=True)
            full, half = min(times["float32"]), min(times["bfloat16"])
            rows.append((name, where, batch, full, half))
            print(rows[-1], flush=True)
    lines = [
        "## Training in bfloat16",
        "",
        f"`python -m benchmarks.throughput --precision --recipes {' '.join(names)} --iters {iters}` on torch"
        f" {torch.__version__}: seconds of one training iteration (`Trainer.train_step`) at the recipe's own batch,"
        " float32 against bfloat16 (`[trainer] precision` for a denoising recipe, `[trainer.sampler] precision` for"
        f" a contrastive-divergence recipe's chain), the faster of two alternating measurements of {iters} iterations"
        " each.",
        "",
        "| recipe | device | batch | float32 s / iteration | bfloat16 s / iteration | speed-up |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {n} | {w} | {b} | {f:.3f} | {h:.3f} | {f / h:.2f}x |" for n, w, b, f, h in rows),
    ]
    write_section("throughput-precision", "\n".join(lines))
    print("\n".join(lines))


def derivatives_table(names: list[str], iters: int, rounds: int) -> None:
    """A training iteration of each recipe at its own batch: autograd's second derivatives against
    `composable_ebm.accel.derivatives`', in float32 and bfloat16, alternated in one run (the fastest of ``rounds``)."""
    torch.set_num_threads(1)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    variants = [("float32", False), ("float32", True), ("bfloat16", False), ("bfloat16", True)]
    rows = []
    for name in names:
        recipe = load_recipe(ROOT / "recipes" / SHIPPED[name])
        data = build_dataset(recipe.data, recipe.folder)
        batch = recipe.trainer.batch_size
        objective = recipe.trainer.objective
        shipped = objective.precision if build_model(recipe, data).noise_conditioned else objective.sampler.precision
        for device in devices:
            times: dict[tuple[str, bool], list[float]] = {v: [] for v in variants}
            compared = [("float32", False), (shipped, True)]  # the eager float32 path and the default
            for i in range(rounds):  # alternate, so a drift in the machine's speed reaches every variant alike: the
                # two compared back to back, in turns first, then the others
                order = compared[::-1] if i % 2 else compared
                for precision, native in order + [v for v in variants if v not in compared]:
                    os.environ["CEBM_OWN_DERIVATIVES"] = "1" if native else "0"  # read as each run starts
                    times[precision, native].append(training_iteration(recipe, data, batch, device, iters, precision))
            os.environ["CEBM_OWN_DERIVATIVES"] = "cpu"
            best = {v: min(t) for v, t in times.items()}
            # the default against the float32 path within each round (back to back), the median over rounds
            ratios = sorted(a / b for a, b in zip(times["float32", False], times[shipped, True], strict=True))
            rows.append((name, device_label(device, bfloat16=True), batch, best, ratios, shipped))
            print(rows[-1], flush=True)
    lines = [
        "## The layers' own second derivatives",
        "",
        f"`python -m benchmarks.throughput --derivatives --recipes {' '.join(names)} --iters {iters} --rounds"
        f" {rounds}` on torch {torch.__version__}: seconds of one training iteration (`Trainer.train_step`) at the"
        " recipe's own batch, with the second derivatives of the convolutions, group normalisations and SiLUs by"
        " autograd's formulas (`CEBM_OWN_DERIVATIVES=0`) and by `composable_ebm.accel.derivatives`' own, in float32"
        " and in bfloat16 (`[trainer] precision` for a denoising recipe, `[trainer.sampler] precision` for a"
        f" contrastive-divergence recipe's chain), the fastest of {rounds} alternating measurements of {iters}"
        " iterations each. Default: the recipe's own precision with the layers' own derivatives, against the eager"
        " float32 path with autograd's: the median, lowest and highest of"
        " the rounds' ratios (each round measures those two back to back, in turns first, so a drift in the machine's"
        " speed reaches both alike).",
        "",
        "| recipe | device | batch | float32, autograd's | float32, own | bfloat16, autograd's | bfloat16, own |"
        " default | default's speed-up (median; lowest-highest) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, where, batch, best, ratios, shipped in rows:
        cells = " | ".join(f"{best[v]:.3f}" for v in variants)
        lines.append(f"| {name} | {where} | {batch} | {cells} | {shipped}, own | {ratios[len(ratios) // 2]:.2f}x;"
                     f" {ratios[0]:.2f}-{ratios[-1]:.2f}x |")
    write_section("throughput-derivatives", "\n".join(lines))
    print("\n".join(lines))


def chain_seconds(model, batch: int, chain, device: torch.device) -> float:
    """Seconds of one sampling chain of ``batch`` under ``chain`` (the model's first values), after a warm-up chain
    (which also captures the graphs where they are on)."""
    from composable_ebm.sampling import sample

    labels = _labels(model, batch, device) or None
    sample(model, batch, chain, labels=labels, seed=0)
    _sync(device)
    start = time.perf_counter()
    sample(model, batch, chain, labels=labels, seed=1)
    _sync(device)
    return time.perf_counter() - start


def paper_chain_steps(batches: list[int]) -> tuple[list[tuple[int, float, float, float]], float]:
    """The paper's 32-px network's training chain (recipes/cifar10.toml's ``[trainer.sampler]``, 40 Langevin steps)
    on the GPU, eager against replayed from CUDA graphs, the faster of two alternating runs: per batch, seconds per
    step both ways and the step's arithmetic (`step_flops`); and the dense float32 matrix-product rate (the limit)."""
    device = torch.device("cuda")
    recipe = load_recipe(ROOT / "recipes" / "cifar10.toml")
    model = build_model(recipe, torch.empty(0)).to(device)
    chain = recipe.trainer.objective.sampler
    rows = []
    for batch in batches:
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(2):
            for on in (False, True):
                os.environ["CEBM_CUDA_GRAPHS"] = "1" if on else "0"  # read as each run starts
                times[on].append(chain_seconds(model, batch, chain, device) / chain.total_steps)
        os.environ["CEBM_CUDA_GRAPHS"] = "0"
        rows.append((batch, min(times[False]), min(times[True]), step_flops(model, batch, device)))
        print((PAPER, *rows[-1]), flush=True)
    return rows, matmul_gflops(device)


def graphs_table(names: list[str], batches: list[int], iters: int, paper: bool = False) -> None:
    """A training iteration and a sampling chain on the GPU, eager against replayed from CUDA graphs (and with
    ``paper``, the paper's 32-px network's chain step against the device's limit)."""
    device = torch.device("cuda")
    rows = []
    for name in names:
        recipe = load_recipe(ROOT / "recipes" / SHIPPED[name])
        data = build_dataset(recipe.data, recipe.folder)
        model = build_model(recipe, data).to(device)
        chain = model.sampling_defaults.sampler
        for batch in batches:
            times: dict[bool, list[float]] = {False: [], True: []}
            chains: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(2):  # alternate, so a drift in the machine's speed reaches both alike
                for on in (False, True):
                    os.environ["CEBM_CUDA_GRAPHS"] = "1" if on else "0"  # read as each run starts
                    times[on].append(training_iteration(recipe, data, batch, device, iters))
                    chains[on].append(chain_seconds(model, batch, chain, device))
            os.environ["CEBM_CUDA_GRAPHS"] = "0"
            rows.append((name, batch, min(times[False]), min(times[True]), min(chains[False]), min(chains[True]),
                         chain.total_steps))
            print(rows[-1], flush=True)
    lines = [
        "## CUDA graphs",
        "",
        f"`python -m benchmarks.throughput --cuda-graphs --recipes {' '.join(names)} --batches"
        f" {' '.join(map(str, batches))} --iters {iters}{' --paper' if paper else ''}` on torch {torch.__version__},"
        f" {torch.cuda.get_device_name()}: a training iteration (`Trainer.train_step`: a contrastive-divergence"
        " recipe's chain, losses, Adam and the EMA; a denoising recipe's loss, Adam and the EMA) and a whole sampling"
        " chain (the model's own sampler), run eagerly against replayed from CUDA graphs (`CEBM_CUDA_GRAPHS`: a"
        " chain's transitions, and a denoising iteration's batch, loss and backward pass), the faster of two"
        f" alternating measurements ({iters} iterations each).",
        "",
        "| recipe | batch | s / iteration, eager | with graphs | speed-up | chain steps | s / chain, eager | with graphs"
        " | speed-up |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *(f"| {n} | {b} | {e:.3f} | {g:.3f} | {e / g:.2f}x | {k} | {ce:.3f} | {cg:.3f} | {ce / cg:.2f}x |"
          for n, b, e, g, ce, cg, k in rows),
    ]
    if paper:
        steps, limit = paper_chain_steps(batches)
        lines += [
            "",
            f"{PAPER}, the paper's 32-px network (recipes/cifar10.toml) on random input: a step of its training chain"
            " (`[trainer.sampler]`, 40 Langevin steps), its arithmetic (torch's FlopCounterMode) over its time"
            f" against a dense float32 2048 x 2048 matrix product in the same run ({limit:.0f} GFLOP/s).",
            "",
            "| network | batch | ms / step, eager | with graphs | speed-up | GFLOP/s with graphs | of the limit |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *(f"| {PAPER} | {b} | {e * 1e3:.2f} | {g * 1e3:.2f} | {e / g:.2f}x | {f / g / 1e9:.0f} |"
              f" {f / g / 1e9 / limit:.0%} |" for b, e, g, f in steps),
        ]
    write_section("throughput-cuda-graphs", "\n".join(lines))
    print("\n".join(lines))


def compiled_chain(model) -> Callable[[], None]:
    """Give ``model`` (an instance) a compiled energy for its chains' evaluations: `Energy.energy_and_grad` without
    ``create_graph`` runs a ``torch.compile`` of its ``energy`` with the parameters held (``requires_grad`` off for
    the call, so the compiled backward computes the input gradient alone); with ``create_graph`` (the trainer's last,
    differentiable step) it stays eager. Returns the function that restores the eager energy."""
    eager_energy_and_grad, eager_energy = model.energy_and_grad, model.energy
    compiled = torch.compile(eager_energy, dynamic=False)
    params = list(model.parameters())

    def energy_and_grad(x, labels=None, create_graph=False, sigma=None):
        if create_graph:
            return eager_energy_and_grad(x, labels, create_graph=True, sigma=sigma)
        flags = [p.requires_grad for p in params]
        model.requires_grad_(False)
        model.energy = compiled
        try:
            return eager_energy_and_grad(x, labels, sigma=sigma)
        finally:
            del model.energy
            for p, flag in zip(params, flags, strict=True):
                p.requires_grad_(flag)

    model.energy_and_grad = energy_and_grad

    def restore() -> None:
        del model.energy_and_grad

    return restore


class CompiledDenoising(DenoisingObjective):
    """The denoising loss compiled whole by ``torch.compile``: the energy's input gradient is taken by
    ``torch.func.grad`` inside the compiled function, so the parameters' gradient is the first-order backward of one
    graph. (A compiled energy's own backward cannot be differentiated again, which the loss needs.) The batch, the
    levels and the noise are drawn as `DenoisingObjective` draws them. ``backend``: torch.compile's."""

    def __init__(self, energy, backend: str = "inductor") -> None:
        super().__init__(energy)
        self._compiled = torch.compile(self._noise_prediction, dynamic=False, backend=backend)

    def _noise_prediction(self, noised, sigma, z, labels, weight):
        def total(x):
            e = self.energy(x, labels, sigma=sigma)
            return e.sum(), e

        grad, e = torch.func.grad(total, has_aux=True)(noised)
        return noise_prediction_loss(grad, sigma, z, weight), e

    def noise_prediction(self, noised, sigma, z, labels, weight=None):
        return self._compiled(noised.detach(), sigma, z, labels, weight)


def _step_and_grad(model, x, labels) -> tuple[float, torch.Tensor]:
    """Seconds of one `Energy.energy_and_grad` at ``x`` (synchronised) and its input gradient."""
    _sync(x.device)
    start = time.perf_counter()
    _, grad = model.energy_and_grad(x, labels)
    _sync(x.device)
    return time.perf_counter() - start, grad


def compile_row(recipe, data, batch: int, device: torch.device, iters: int, reps: int) -> tuple:
    """One row of the compile table: sampling step eager / compiled (seconds, the best of two alternating runs of
    ``reps``), the first compiled call's seconds, the input gradient's largest relative difference, and a training
    iteration eager / compiled (``None`` and the reason where the compiled iteration fails)."""
    torch._dynamo.reset()  # each row compiles afresh: no earlier row's graphs count towards dynamo's recompile limit
    model = build_model(recipe, data).to(device)
    x = torch.rand(batch, *model.input_shape, device=device, generator=torch.Generator(device).manual_seed(batch))
    labels = _labels(model, batch, device) or None
    _, reference = _step_and_grad(model, x, labels)
    restore = compiled_chain(model)
    first, compiled_grad = _step_and_grad(model, x, labels)
    restore()
    difference = ((compiled_grad - reference).norm() / reference.norm()).item()
    steps: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(2):  # alternate, so a drift in the machine's speed reaches both alike
        for on in (False, True):
            restore = compiled_chain(model) if on else (lambda: None)
            steps[on].append(step_seconds(model, x, labels, reps))
            restore()
    iterations: dict[bool, list[float]] = {False: [], True: []}
    failed = None
    for _ in range(2):
        iterations[False].append(training_iteration(recipe, data, batch, device, iters))
        if failed is None:
            try:
                iterations[True].append(training_iteration(recipe, data, batch, device, iters, compiled=True))
            except RuntimeError as err:  # a platform where the compiled iteration fails: reported, not hidden
                failed = str(err).splitlines()[0]
    return (min(steps[False]), min(steps[True]), first, difference, min(iterations[False]),
            min(iterations[True]) if not failed else None, failed)


def compile_table(names: list[str], batches: list[int], iters: int, reps: int) -> None:
    """Each recipe's network eagerly against compiled, at each batch, on one CPU thread (and CUDA when present)."""
    torch.set_num_threads(1)
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # an error, never eager timings in the compiled column
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    rows, peaks = [], {}
    with tempfile.TemporaryDirectory(prefix="cebm-compile-") as cache, \
            mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}):  # cold: no earlier run's compiled kernels
        for name in names:
            recipe = load_recipe(ROOT / "recipes" / SHIPPED[name])
            data = build_dataset(recipe.data, recipe.folder)
            for device in devices:
                where = device_label(device)
                if where not in peaks:  # the machine's speed in this run, so that runs on other days compare
                    peaks[where] = matmul_gflops(device)
                for batch in batches:
                    rows.append((name, where, batch, *compile_row(recipe, data, batch, device, iters, reps)))
                    print(rows[-1], flush=True)

    def iteration_cells(eager: float, compiled: float | None, failed: str | None) -> str:
        if compiled is None:
            return f"{eager:.3f} | — ({failed}) | —"
        return f"{eager:.3f} | {compiled:.3f} | {eager / compiled:.2f}x"

    lines = [
        "## torch.compile",
        "",
        f"`python -m benchmarks.throughput --compile --recipes {' '.join(names)} --batches"
        f" {' '.join(map(str, batches))} --iters {iters} --reps {reps}` on torch {torch.__version__}: one sampling"
        " step (the energy and its input gradient) and one training iteration (`Trainer.train_step`), eager against"
        " with the energy compiled by `torch.compile` for the batch's shape, the faster of two alternating"
        " measurements. Compiling: the first compiled call's seconds, with an empty compile cache. Gradient"
        " difference: the largest relative difference (norm of the difference over the norm) of the compiled input"
        " gradient from the eager one. In the compiled training iteration the chain's evaluations use the compiled"
        " energy with the parameters held; its last, differentiable step and the losses stay eager. A denoising"
        " iteration compiles its whole loss (the input gradient by `torch.func.grad` inside one graph; a compiled"
        " energy's backward cannot be differentiated again), and its batch, levels and noise are drawn eagerly."
        " A dense float32"
        f" 2048 x 2048 matrix product in the same run: {', '.join(f'{k}: {v:.0f} GFLOP/s' for k, v in peaks.items())}.",
        "",
        "| recipe | device | batch | ms / sampling step, eager | compiled | speed-up | compiling, s | gradient"
        " difference | s / training iteration, eager | compiled | speed-up |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *(f"| {n} | {w} | {b} | {se * 1e3:.1f} | {sc * 1e3:.1f} | {se / sc:.2f}x | {first:.0f} | {diff:.0e} |"
          f" {iteration_cells(ie, ic, failed)} |" for n, w, b, se, sc, first, diff, ie, ic, failed in rows),
    ]
    write_section("throughput-compile", "\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=None, choices=list(SHIPPED),
                        help="default: the contrastive-divergence recipes (with --precision: every recipe)")
    parser.add_argument("--precision", action="store_true", help="float32 against bfloat16 training iterations")
    parser.add_argument("--batches", type=int, nargs="+", default=[24, 64, 128])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--iters", type=int, default=2, help="training iterations timed per cell")
    parser.add_argument("--reps", type=int, default=10, help="sampling steps timed per cell")
    parser.add_argument("--no-cuda", action="store_true")
    parser.add_argument("--cuda-only", action="store_true",
                        help="only the CUDA rows, into their own section (throughput-cuda), so a GPU machine's run"
                             " leaves the CPU table alone")
    parser.add_argument("--paper", action="store_true",
                        help=f"also the sampling step of the paper's 32-px network ({PAPER}: recipes/cifar10.toml's"
                             " network on random input; its training iteration needs CIFAR-10, so it is not timed)")
    parser.add_argument("--compile", action="store_true",
                        help="eager against torch.compile, into their own section (throughput-compile)")
    parser.add_argument("--derivatives", action="store_true",
                        help="autograd's second derivatives against composable_ebm.accel.derivatives', float32 and"
                             " bfloat16, into their own section (throughput-derivatives)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurements per cell (--derivatives)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="eager against CUDA-graph chains on the GPU, into their own section"
                             " (throughput-cuda-graphs)")
    args = parser.parse_args()
    if (args.cuda_only or args.cuda_graphs) and not torch.cuda.is_available():
        parser.error(f"{'--cuda-only' if args.cuda_only else '--cuda-graphs'}: no CUDA device is available here")
    if args.cuda_graphs:
        graphs_table(args.recipes or list(SHIPPED), args.batches, args.iters, args.paper)
        return
    if args.compile:
        compile_table(args.recipes or list(SHIPPED), args.batches, args.iters, args.reps)
        return
    if args.precision:
        precision_table(args.recipes or list(SHIPPED), args.iters)
        return
    if args.derivatives:
        derivatives_table(args.recipes or [n for n in SHIPPED if not n.startswith("shapes-")], args.iters, args.rounds)
        return
    args.recipes = args.recipes or CD_RECIPES
    settings = [] if args.cuda_only else [("cpu", t) for t in args.threads]
    if torch.cuda.is_available() and not args.no_cuda:
        settings.append(("cuda", None))
    rows, peaks = [], {}
    for name in args.recipes + ([PAPER] if args.paper else []):
        if name == PAPER:  # the network on its own input shape: the CIFAR-10 files are not needed for a step
            recipe, data = load_recipe(ROOT / "recipes" / "cifar10.toml"), None
        else:
            recipe = load_recipe(ROOT / "recipes" / SHIPPED[name])
            data = build_dataset(recipe.data, recipe.folder)  # the recipe's own data: what training reads (cached)
        for kind, threads in settings:
            if threads is not None:
                torch.set_num_threads(threads)
            device = torch.device(kind)
            where = f"{kind}, {threads} thread{'s' if threads != 1 else ''}" if threads else torch.cuda.get_device_name()
            if where not in peaks:
                peaks[where] = matmul_gflops(device)
            model = build_model(recipe, data if data is not None else torch.empty(0)).to(device)  # paper-32: 3x32x32
            for batch in args.batches:
                flops = step_flops(model, batch, device)
                step, outside = sampling_step(model, batch, device, args.reps)
                iteration = training_iteration(recipe, data, batch, device, args.iters) if data is not None else None
                rate = flops / step / 1e9
                rows.append((name, where, batch, iteration, step * 1e3, rate, rate / peaks[where], outside))
                print(rows[-1], flush=True)
    notes = ""
    if any(kind == "cuda" for kind, _ in settings) and Speed.from_environment().cuda_graphs:
        notes += (" On CUDA the training iteration's chain is replayed from CUDA graphs"
                  " (`composable_ebm.accel.graphs`).")
    if args.paper:
        notes += (f" {PAPER}: the paper's 32-px network (recipes/cifar10.toml, its preset's own input shape) on random"
                  " input; its training iteration needs CIFAR-10, which is not here (—).")
    where_args = ("--cuda-only" if args.cuda_only else f"--threads {' '.join(map(str, args.threads))}") + (
        " --paper" if args.paper else "")
    lines = [
        "## Throughput of the shipped recipes' networks" + (" on CUDA" if args.cuda_only else ""),
        "",
        f"`python -m benchmarks.throughput --recipes {' '.join(args.recipes)} --batches"
        f" {' '.join(map(str, args.batches))} {where_args} --iters {args.iters}`"
        f" on torch {torch.__version__}. A training iteration is `Trainer.train_step` with the recipe's settings at"
        " that batch (its 60-step chain, the losses, Adam and the EMA); a sampling step is one energy-and-input-"
        "gradient evaluation. GFLOP/s is the sampling step's arithmetic (torch's FlopCounterMode) over its time; the"
        " limit is a dense float32 2048 x 2048 matrix product in the same run"
        f" ({', '.join(f'{k}: {v:.0f} GFLOP/s' for k, v in peaks.items())}). Outside kernels: the share of the"
        " step's wall time that the profiler attributes to no operator's own work (Python, dispatch, autograd"
        " bookkeeping, launches)." + notes,
        "",
        "| network | device | batch | s / training iteration | ms / sampling step | GFLOP/s | of the limit |"
        " outside kernels |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *(f"| {n} | {w} | {b} | {'—' if it is None else f'{it:.2f}'} | {ms:.1f} | {r:.1f} | {f:.0%} | {o:.0%} |"
          for n, w, b, it, ms, r, f, o in rows),
    ]
    write_section("throughput-cuda" if args.cuda_only else "throughput", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
