"""The arithmetic of the denoising loss (`TrainerConfig.precision`): float32, or bfloat16 under autocast."""

from __future__ import annotations

import contextlib

import torch

from composable_ebm.sampling.transitions import autocast


def network_precision(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """A context in which the network passes of the denoising loss run at ``precision`` on ``device``: the
    sampler's `autocast`, so where the device has no bfloat16 arithmetic (a GPU before Ampere, a CPU without
    AVX-512 BF16 or AMX) it warns in one line and trains in float32.

    ``bfloat16`` is autocast: matrix products and convolutions in bfloat16, the weights, their gradients, the
    optimiser and the inputs' gradients in float32.
    """
    return autocast(device.type, precision, doing="training")
