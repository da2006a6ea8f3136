"""Sampling: registered transitions (Langevin, MALA, HMC), augmentation transitions, the chain protocol and its two
chains (Algorithm 2's Langevin chain, the noise ladder of noise-conditioned energies), the runner, and a trained
model's sampling defaults."""

from composable_ebm.sampling.augment import AugmentConfig, augment
from composable_ebm.sampling.chain import Chain, ChainEnd, run_transitions, with_overrides
from composable_ebm.sampling.langevin import SamplerConfig, algorithm2, initial_noise
from composable_ebm.sampling.annealed import AtLevel, LadderConfig, run_ladder
from composable_ebm.sampling.runner import SampleResult, SamplerDiagnostics, make_generator, sample
from composable_ebm.sampling.defaults import SamplingDefaults
from composable_ebm.sampling.transitions import (
    SAMPLERS,
    ChainState,
    StepInfo,
    chain_grad_norm,
    clamp_bounds,
    differentiable_last_step,
    evaluate,
    hmc_step,
    langevin_move,
    langevin_step,
    langevin_update,
    mala_step,
)

__all__ = [
    "SAMPLERS",
    "AtLevel",
    "AugmentConfig",
    "Chain",
    "ChainEnd",
    "ChainState",
    "LadderConfig",
    "SampleResult",
    "SamplerConfig",
    "SamplerDiagnostics",
    "SamplingDefaults",
    "StepInfo",
    "algorithm2",
    "augment",
    "chain_grad_norm",
    "clamp_bounds",
    "differentiable_last_step",
    "evaluate",
    "hmc_step",
    "initial_noise",
    "langevin_move",
    "langevin_step",
    "langevin_update",
    "make_generator",
    "mala_step",
    "run_ladder",
    "run_transitions",
    "sample",
    "with_overrides",
]
