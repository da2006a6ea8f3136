"""Sampling: Langevin and MALA transitions, augmentation transitions, Algorithm 2's chain runner."""

from composable_ebm.sampling.augment import AugmentConfig, augment
from composable_ebm.sampling.runner import (
    FORMS,
    ChainEnd,
    SampleResult,
    SamplerDiagnostics,
    composition_form,
    default_sampler_config,
    initial_noise,
    make_generator,
    resolve_config,
    run_chain,
    sample,
)
from composable_ebm.sampling.transitions import (
    ChainState,
    SamplerConfig,
    StepInfo,
    chain_grad_norm,
    clamp_bounds,
    evaluate,
    langevin_step,
    langevin_update,
    mala_step,
)

__all__ = [
    "FORMS",
    "AugmentConfig",
    "ChainEnd",
    "ChainState",
    "SampleResult",
    "SamplerConfig",
    "SamplerDiagnostics",
    "StepInfo",
    "augment",
    "chain_grad_norm",
    "clamp_bounds",
    "composition_form",
    "default_sampler_config",
    "evaluate",
    "initial_noise",
    "langevin_step",
    "langevin_update",
    "make_generator",
    "mala_step",
    "resolve_config",
    "run_chain",
    "sample",
]
