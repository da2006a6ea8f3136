"""The arithmetic network passes run in: float32, or bfloat16 under autocast where the device has bfloat16 arithmetic
of its own (the sampler's energy evaluations, `SamplerConfig.precision`; the denoising loss,
`DenoisingConfig.precision`)."""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Literal, get_args

import torch

Precision = Literal["float32", "bfloat16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


def native_bfloat16(device_type: str) -> bool:
    """Whether ``device_type`` has bfloat16 arithmetic of its own: a GPU from Ampere on; a CPU for which oneDNN has
    bfloat16 kernels (AVX-512 BF16 or AMX on x86, BF16 on Arm). Elsewhere bfloat16 is emulated, many times slower
    than float32 (docs/training.md)."""
    if device_type == "cuda":  # without emulation: an older GPU "supports" bfloat16 by emulating it
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device_type == "cpu":
        return _cpu_bfloat16()
    return True  # other backends: as asked


@functools.cache
def _cpu_bfloat16() -> bool:
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _device_words(device_type: str) -> str:
    if device_type == "cuda":
        return torch.cuda.get_device_name()
    return "this CPU" if device_type == "cpu" else device_type


def autocast(device_type: str, precision: str, doing: str = "sampling") -> contextlib.AbstractContextManager:
    """The context network passes run in at ``precision``: nothing for float32, bfloat16 autocast on ``device_type``
    (the sampler's energy evaluations; the trainer's denoising loss, ``doing="training"``).

    Where the device has no bfloat16 arithmetic (`native_bfloat16`) it warns in one line and runs float32: emulated,
    bfloat16 would be many times slower, where it was asked for to be faster."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid choices: {list(PRECISIONS)}")
    if precision == "float32":
        return contextlib.nullcontext()
    if not native_bfloat16(device_type):
        warnings.warn(f"{_device_words(device_type)} has no bfloat16 arithmetic; {doing} in float32",
                      RuntimeWarning, stacklevel=3)
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
