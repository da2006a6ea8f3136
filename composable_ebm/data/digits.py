"""scikit-learn's bundled 8x8 handwritten digits (no download), upsampled: the ``digits`` dataset."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from composable_ebm.configs import MAX_IMAGE_SIZE, check_size
from composable_ebm.data.base import DataConfig, ImageDataset, dataset
from composable_ebm.errors import InvalidInputError


def digits(size: int = 16, channels: int = 1) -> ImageDataset:
    """scikit-learn's bundled 8x8 digits (1797 images, no download), upsampled to ``size``, label ``digit``."""
    try:
        from sklearn.datasets import load_digits
    except ModuleNotFoundError as err:  # an optional extra: say how to get it
        raise ModuleNotFoundError("the digits dataset needs scikit-learn: pip install 'composable_ebm[digits]'") from err
    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)
    if channels == 3:
        x = x.expand(-1, 3, -1, -1).contiguous()
    elif channels != 1:
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    labels = {"digit": torch.tensor(bunch.target, dtype=torch.long)}
    return ImageDataset(x, labels, {"digit": tuple(str(d) for d in range(10))}, "digits")


@dataset("digits")
@dataclass(frozen=True)
class DigitsData(DataConfig):
    """Recipe settings of the digits dataset (``[data] dataset = "digits"``): one attribute, ``digit``."""

    size: int = 16
    """image side (upsampled from 8)"""
    channels: int = 1
    """1 (grey) or 3 (the grey copied into RGB)"""

    def __post_init__(self) -> None:
        check_size("DigitsData", "size", self.size, low=4, high=MAX_IMAGE_SIZE)
        if self.channels not in (1, 3) or isinstance(self.channels, bool):
            raise InvalidInputError(f"DigitsData.channels must be 1 or 3, got {self.channels!r}")

    def build(self, base: Path | None = None) -> ImageDataset:
        return digits(self.size, self.channels)
