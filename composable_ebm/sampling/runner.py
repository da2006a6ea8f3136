"""The runner: ``n`` chains of any `composable_ebm.sampling.chain.Chain` on the energy it is handed, with the
generator, the kept states, the progress bar and the per-step diagnostics every chain shares.

It runs what it is given: the chain's settings come decided (`composable_ebm.pipeline` decides them once), and it
asks the chain to start and to run, never which kind it is. It takes the energy per call and holds no model.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from composable_ebm.accel.settings import Speed
from composable_ebm.errors import InvalidInputError, NonFiniteError
from composable_ebm.sampling.chain import Chain
from composable_ebm.sampling.transitions import ChainState, StepInfo

if TYPE_CHECKING:  # pragma: no cover; the sampler runs any energy it is handed and imports none
    from composable_ebm.energy import Energy, Labels

MAX_SAMPLES = 1 << 20
"""Most chains one call runs (``n``); the command line's ``-n`` has the same bound."""
MAX_SAMPLE_ELEMENTS = 1 << 30
"""Most elements of one call's batch of chains (``n`` times the input's size): 4 GiB in float32, before any
network activation."""


@dataclass
class SamplerDiagnostics:
    """Per-step records, each of shape ``(total_steps,)``."""

    energy: Tensor  # mean energy after each step
    grad_norm: Tensor  # mean L2 norm of dE/dx at each step's start
    acceptance: Tensor | None  # MALA (any sampler with an accept step): fraction accepted at each step; else None


@dataclass
class SampleResult:
    """What a sampler call returns; the fields do not depend on which options were set."""

    samples: Tensor  # (n, *sample_shape), final states (a latent energy's decoded: `composable_ebm.latent`)
    chain: Tensor | None  # (T, n, *sample_shape): every keep_every-th state (first and last included), if asked
    diagnostics: SamplerDiagnostics
    config: Chain  # the settings actually used
    latents: Tensor | None = None  # (n, *input_shape): a latent energy's final states before decoding; else None

    @property
    def acceptance_rate(self) -> float | None:
        """Mean MALA acceptance over all steps (``None`` for Langevin)."""
        acc = self.diagnostics.acceptance
        return None if acc is None or acc.numel() == 0 else float(acc.mean())


StepCallback = Callable[[dict[str, Any]], None]


def check_count(n: object) -> int:
    """``n``, the number of samples, as an int; one line unless it is a whole number from 1 to `MAX_SAMPLES`."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= MAX_SAMPLES:
        raise InvalidInputError(f"n must be a whole number from 1 to {MAX_SAMPLES:,} (the number of samples), got"
                                f" {n!r}")
    return int(n)


def make_generator(seed: int | None, generator: torch.Generator | None, device: torch.device) -> torch.Generator:
    """An explicit generator on ``device``: the given one, or one seeded with ``seed``; without either, one seeded
    from torch's global generator, so ``torch.manual_seed`` makes a call repeat (and advances as any draw does)."""
    if generator is not None and seed is not None:
        raise ValueError("pass either seed= or generator=, not both")
    if generator is not None:
        if torch.device(generator.device).type != torch.device(device).type:
            raise ValueError(f"generator is on {generator.device} but the chains are on {device}")
        return generator
    gen = torch.Generator(device=device)
    if seed is None:
        gen.manual_seed(int(torch.randint(0, 2**62, (1,))))
    else:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**63:
            raise InvalidInputError(f"seed must be an integer in [0, 2^63 - 1], got {seed!r}")
        gen.manual_seed(int(seed))
    return gen


def sample(
    energy: Energy,
    n: int | None,
    chain: Chain,
    *,
    x0: Tensor | None = None,
    labels: Labels | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    keep_every: int = 0,
    progress: bool = False,
    callback: StepCallback | None = None,
    speed: Speed | None = None,
) -> SampleResult:
    """Run ``chain`` on ``energy`` as both are given and return a `SampleResult`.

    This is the sampler itself: how an expression is sampled by default (its guided form, a model's own settings,
    overrides) is the pipeline's business: `composable_ebm.pipeline.sample`, which ``Energy.sample`` and the CLI call.

    Args:
        energy: any ``Energy``, composite or not (it is not modified, nor its modes or flags).
        n: number of chains (with ``x0`` omitted: started where ``chain`` starts them).
        chain: the settings, which are the chain: a `SamplerConfig` (Algorithm 2) or a `LadderConfig`.
        x0: starting batch ``(n, *input_shape)`` instead.
        labels: per-item attribute indices for a conditional energy.
        seed, generator: explicit randomness (one of them); the same seed gives the same samples.
        device: where the chains run (default: the energy's).
        keep_every: keep every k-th state of the chain in ``result.chain`` (0: keep none; the last is kept too).
        progress: show a progress bar.
        callback: called after every step with ``{"step", "x", "energy", "grad_norm", "accepted"}``.
        speed: what the run may do to go faster (default: `Speed.from_environment`, read now).
    """
    chain.check(energy)
    speed = speed if speed is not None else Speed.from_environment()
    x, gen = _starts(energy, n, chain, x0, seed, generator, device)
    record = _Record(chain.total_steps, keep_every, callback, progress, x)
    end = chain.run(energy, x, gen, labels, on_step=record.on_step, cuda_graphs=speed.cuda_graphs)
    final = end.x.detach()
    record.close(final)
    _check_finite(energy, chain, final, record.energies)
    return SampleResult(final, record.chain(), record.diagnostics(), end.settings or chain)


def _starts(energy: Energy, n: int | None, chain: Chain, x0: Tensor | None, seed: int | None,
            generator: torch.Generator | None, device: torch.device | str | None) -> tuple[Tensor, torch.Generator]:
    """The chains' starting positions (``x0``, or ``n`` where ``chain`` starts them) and their generator."""
    if x0 is not None:
        if n is not None and n != x0.shape[0]:
            raise ValueError(f"n={n} disagrees with x0's batch of {x0.shape[0]}")
        x = x0.detach().to(torch.float32).clone()
        return x, make_generator(seed, generator, x.device)
    n = check_count(n)
    size = math.prod(energy.input_shape)
    if n * size > MAX_SAMPLE_ELEMENTS:
        raise InvalidInputError(f"n={n:,} samples of shape {tuple(energy.input_shape)} are {n * size:,} elements; one"
                                f" call draws at most {MAX_SAMPLE_ELEMENTS:,}: n <= {MAX_SAMPLE_ELEMENTS // size:,},"
                                " or draw in several calls")
    dev = torch.device(device) if device is not None else energy.device
    gen = make_generator(seed, generator, dev)
    return chain.start(energy, n, gen, dev), gen


class _Record:
    """What a run keeps of its steps: the per-step diagnostics, every ``keep_every``-th state, the progress bar, the
    caller's callback."""

    def __init__(self, total: int, keep_every: int, callback: StepCallback | None, progress: bool, x: Tensor) -> None:
        self.total, self.keep_every, self.callback = total, keep_every, callback
        self.energies: list[Tensor] = []
        self.grad_norms: list[Tensor] = []
        self.accepts: list[Tensor] = []
        self.kept = [x.clone()] if keep_every > 0 else []
        self.last_kept = 0
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="sampling", unit="step", leave=False, disable=None)  # terminals only

    def on_step(self, step: int, state: ChainState, info: StepInfo) -> None:
        self.energies.append(info.energy.detach())
        self.grad_norms.append(info.grad_norm.detach())
        if info.accepted is not None:
            self.accepts.append(info.accepted.float().mean())
        if self.keep_every > 0 and (step % self.keep_every == 0 or step == self.total):
            self.kept.append(state.x.clone())
            self.last_kept = step
        if self.callback is not None:
            self.callback({"step": step, "x": state.x, "energy": info.energy, "grad_norm": info.grad_norm,
                           "accepted": info.accepted})
        if self.bar is not None:
            self.bar.update(1)

    def close(self, final: Tensor) -> None:
        """The run ended at ``final``: kept too where the chain's last step left it elsewhere (a ladder's denoising
        step and clamp come after its last transition)."""
        if self.bar is not None:
            self.bar.close()
        if self.keep_every > 0 and not torch.equal(self.kept[-1], final):
            self.kept.append(final.clone())

    def chain(self) -> Tensor | None:
        return torch.stack(self.kept) if self.kept else None

    def diagnostics(self) -> SamplerDiagnostics:
        return SamplerDiagnostics(
            energy=torch.stack(self.energies).float().cpu() if self.energies else torch.empty(0),
            grad_norm=torch.stack(self.grad_norms).float().cpu() if self.grad_norms else torch.empty(0),
            acceptance=torch.stack(self.accepts).cpu() if self.accepts else None,  # steps with an accept/reject
        )


def _check_finite(energy: Energy, chain: Chain, final: Tensor, energies: list[Tensor]) -> None:
    """One line when the chains end non-finite: naming the weights when the energy's are not finite, else the step
    size, which is what makes chains of a finite energy diverge."""
    if bool(torch.isfinite(final).all()) and not (energies and not bool(torch.isfinite(energies[-1]))):
        return
    if any(not bool(torch.isfinite(p).all()) for p in energy.parameters()):
        raise NonFiniteError(f"sampling {energy.expression()} produced non-finite samples: its weights hold NaN or"
                             " infinite values; reload or retrain the model")
    raise NonFiniteError(f"sampling {energy.expression()} diverged: its chains left the finite numbers with these"
                         f" settings ({chain.summary()}); lower the step size (step_size=, --step-size)")
