"""Sampling: Langevin and MALA transitions, augmentation transitions, Algorithm 2's chain runner."""

from composable_ebm.sampling.augment import AugmentConfig, augment
from composable_ebm.sampling.runner import (
    SampleResult,
    SamplerDiagnostics,
    initial_noise,
    make_generator,
    resolve_config,
    sample,
)
from composable_ebm.sampling.transitions import (
    ChainState,
    SamplerConfig,
    StepInfo,
    chain_grad_norm,
    clamp_bounds,
    combine_sampler_configs,
    evaluate,
    langevin_step,
    langevin_update,
    mala_step,
)

__all__ = [
    "AugmentConfig",
    "ChainState",
    "SampleResult",
    "SamplerConfig",
    "SamplerDiagnostics",
    "StepInfo",
    "augment",
    "chain_grad_norm",
    "clamp_bounds",
    "combine_sampler_configs",
    "evaluate",
    "initial_noise",
    "langevin_step",
    "langevin_update",
    "make_generator",
    "mala_step",
    "resolve_config",
    "sample",
]
