"""What a sampler asks of a chain, and the loop of transitions every chain runs.

A chain's settings are its chain: `Chain` is what the runner (`composable_ebm.sampling.runner.sample`) and the
pipeline ask of them, the way `composable_ebm.training.loop` states what the loop asks of an objective. Two
implement it, each in its own file: `composable_ebm.sampling.langevin.SamplerConfig`, the Langevin (MALA, HMC)
chain of Algorithm 2 for an energy without noise levels, and `composable_ebm.sampling.annealed.LadderConfig`, the
walk down a noise ladder of a noise-conditioned energy. The runner never asks which one it holds.

`run_transitions` is the loop both run: ``count`` transitions of a registered step, each reported to ``on_step``,
replayed from a CUDA graph where `composable_ebm.accel.graphs` can (the same draws, fewer kernel launches).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import torch
from torch import Tensor

from composable_ebm.accel import graphs
from composable_ebm.configs import config_from_dict, config_to_dict
from composable_ebm.errors import InvalidInputError
from composable_ebm.sampling.transitions import ChainState, Step, StepInfo, StepSettings

if TYPE_CHECKING:  # pragma: no cover; the chains run any energy they are handed and import none
    from composable_ebm.energy import Energy, Labels

C = TypeVar("C")

OnStep = Callable[[int, ChainState, StepInfo], None]
"""``on_step(step, state, info)`` after every transition, the step counted from 1."""


@dataclass
class ChainEnd:
    """Where a chain stopped: the positions, and their cached energy and gradient when evaluated."""

    x: Tensor
    state: ChainState | None  # None when the last step's position was left unevaluated
    steps: int
    settings: Any = None  # the settings the chain ended with where it changed them (an adapted step size); else None


class Chain(Protocol):
    """A chain's settings, and how it runs them."""

    family: ClassVar[str]
    """the chain's kind in a sentence ("a Langevin chain", "a noise ladder"): messages about its settings name it"""
    noise_levels: ClassVar[bool]
    """whether it walks noise levels: a noise-conditioned energy's chain"""
    method: str
    """the registered transition it runs (`composable_ebm.sampling.transitions.SAMPLERS`)"""
    step_size: float
    augment: Any
    """the augmentation transition at the start of a round (an `AugmentConfig`), None for none"""

    @property
    def total_steps(self) -> int:
        """Transitions per chain (a progress bar's length, the diagnostics' length)."""

    def summary(self) -> str:
        """The settings in one line (``cebm info``, the studio)."""

    def within(self, levels: tuple[float, float] | None) -> Chain:
        """The settings kept to the noise levels ``levels`` (lowest, highest) that a composite's models were trained
        on; unchanged where it walks no levels, or for ``None``."""

    def noise_span(self) -> tuple[float, float] | None:
        """The noise levels it walks (lowest, highest), None for none."""

    def check(self, energy: Energy) -> None:
        """One line unless this chain can run ``energy`` (a ladder needs noise levels, augmentation images)."""

    def start(self, energy: Energy, n: int, generator: torch.Generator, device: torch.device) -> Tensor:
        """``n`` chains' starting positions ``(n, *energy.input_shape)``."""

    def run(self, energy: Energy, x: Tensor, generator: torch.Generator, labels: Labels | None = None, *,
            on_step: OnStep | None = None, cuda_graphs: bool = False) -> ChainEnd:
        """The whole chain from ``x``, reporting every transition to ``on_step``; ``cuda_graphs``: replay runs of
        identical transitions from CUDA graphs where they can be."""


def run_transitions(step: Step, energy: Any, state: ChainState, settings: StepSettings, generator: torch.Generator,
                    labels: Labels | None, count: int, on_step: OnStep | None = None, done: int = 0,
                    cuda_graphs: bool = False) -> tuple[ChainState, int]:
    """``count`` transitions ``step(energy, state, settings, generator, labels)`` from ``state``, each reported to
    ``on_step`` (steps counted on from ``done``), replayed from a CUDA graph where ``cuda_graphs`` and
    `composable_ebm.accel.graphs.replayer` allow. Returns the last state and the step count."""
    graph = graphs.replayer(step, energy, state, settings, generator, labels, count) if cuda_graphs else None
    for _ in range(count):
        if graph is None:
            state, info = step(energy, state, settings, generator, labels)
        else:
            graph.replay()
            state, info = graph.snapshot() if on_step is not None else (None, None)
        done += 1
        if on_step is not None:
            on_step(done, state, info)
    return (graph.snapshot()[0] if graph is not None else state), done


def with_overrides(chain: C, overrides: Mapping[str, Any], where: str = "") -> C:
    """``chain``'s settings with ``overrides`` of its fields (a call's, or a model's own when sampled alone), each
    type- and range-checked as a recipe's would be; a name that is not a field is one line naming the chain's family
    and its valid settings (and ``where`` they were given, e.g. ``" in alone"``)."""
    if not overrides:
        return chain
    kind = type(chain)
    valid = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise InvalidInputError(f"unknown sampler setting(s) {unknown}{where}; valid settings of {kind.family}:"
                                f" {sorted(valid)}")
    plain = {k: (config_to_dict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v)
             for k, v in overrides.items()}
    return config_from_dict(kind, {**config_to_dict(chain), **plain})
