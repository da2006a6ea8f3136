"""The arithmetic of the denoising loss (`TrainerConfig.precision`): float32, or bfloat16 under autocast."""

from __future__ import annotations

import contextlib
import warnings

import torch

from composable_ebm.sampling.transitions import autocast


def network_precision(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """A context in which the network passes of the denoising loss run at ``precision`` on ``device``: the
    sampler's `autocast`, except that where the device has no bfloat16 (a GPU before Ampere) it warns in one line and
    runs in float32.

    ``bfloat16`` is autocast: matrix products and convolutions in bfloat16, the weights, their gradients, the
    optimiser and the inputs' gradients in float32.
    """
    if precision == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        warnings.warn(f"{torch.cuda.get_device_name(device)} has no bfloat16 arithmetic; training in float32",
                      RuntimeWarning, stacklevel=2)
        return contextlib.nullcontext()
    return autocast(device.type, precision)
