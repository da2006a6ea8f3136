"""Shared fixtures: tiny networks that keep the suite fast on a 2-core CPU."""

from __future__ import annotations

import pytest
import torch

from composable_ebm import BlockSpec, ResNetConfig, ResNetEnergy

TINY_BLOCKS = (
    BlockSpec(channels=8),
    BlockSpec(channels=8, down=True),
    BlockSpec(kind="attention"),
    BlockSpec(channels=16, down=True),
)


def tiny_config(**overrides) -> ResNetConfig:
    """A 3-tower ResNet on 8x8 images with 8-16 channels: the paper's layout, shrunk."""
    base = dict(name="tiny", image_size=8, stem_channels=8, blocks=TINY_BLOCKS, groups=4, multiscale=True)
    base.update(overrides)
    return ResNetConfig(**base)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def color_model() -> ResNetEnergy:
    return ResNetEnergy(tiny_config(name="color", attributes={"color": ("red", "green", "blue")}, null_condition=True))


@pytest.fixture
def shape_model() -> ResNetEnergy:
    return ResNetEnergy(tiny_config(name="shape", attributes={"shape": ("circle", "square", "triangle")},
                                    null_condition=True))
