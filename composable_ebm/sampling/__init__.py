"""Sampling: registered transitions (Langevin, MALA), augmentation transitions, Algorithm 2's chain runner, and a
trained model's sampling defaults."""

from composable_ebm.sampling.augment import AugmentConfig, augment
from composable_ebm.sampling.runner import (
    ChainEnd,
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
    langevin_update,
    mala_step,
)

__all__ = [
    "SAMPLERS",
    "AugmentConfig",
    "ChainEnd",
    "ChainState",
    "SampleResult",
    "SamplerConfig",
    "SamplerDiagnostics",
    "SamplingDefaults",
    "StepInfo",
    "augment",
    "chain_grad_norm",
    "clamp_bounds",
    "differentiable_last_step",
    "evaluate",
    "initial_noise",
    "langevin_move",
    "langevin_step",
    "langevin_update",
    "make_generator",
    "mala_step",
    "with_overrides",
    "run_chain",
    "sample",
]
