"""Sampling: registered transitions (Langevin, MALA, HMC), augmentation transitions, Algorithm 2's chain runner, the
annealed runner of noise-conditioned energies (a noise ladder), and a trained model's sampling defaults."""

from composable_ebm.sampling.augment import AugmentConfig, augment
from composable_ebm.sampling.runner import (
    ChainEnd,
    ChainSettings,
    SampleResult,
    SamplerDiagnostics,
    initial_noise,
    make_generator,
    with_overrides,
    run_chain,
    sample,
)
from composable_ebm.sampling.defaults import SamplingDefaults
from composable_ebm.sampling.transitions import (
    SAMPLERS,
    ChainState,
    SamplerConfig,
    StepInfo,
    chain_grad_norm,
    clamp_bounds,
    differentiable_last_step,
    evaluate,
    langevin_move,
    langevin_step,
    hmc_step,
    langevin_update,
    mala_step,
)
from composable_ebm.sampling.annealed import AtLevel, LadderConfig, run_ladder

__all__ = [
    "SAMPLERS",
    "AtLevel",
    "AugmentConfig",
    "ChainEnd",
    "ChainSettings",
    "ChainState",
    "SampleResult",
    "LadderConfig",
    "SamplerConfig",
    "SamplerDiagnostics",
    "SamplingDefaults",
    "StepInfo",
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
    "with_overrides",
    "run_chain",
    "run_ladder",
    "sample",
]
