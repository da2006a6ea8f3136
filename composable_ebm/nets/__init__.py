"""Energy networks: the paper's ResNets (single and multiscale) and a small MLP."""

from composable_ebm.nets.mlp import MLPConfig, MLPEnergy
from composable_ebm.nets.resnet import (
    PAPER_32_BLOCKS,
    PAPER_128_BLOCKS,
    BlockSpec,
    ResNetConfig,
    ResNetEnergy,
)

__all__ = [
    "BlockSpec",
    "MLPConfig",
    "MLPEnergy",
    "PAPER_128_BLOCKS",
    "PAPER_32_BLOCKS",
    "ResNetConfig",
    "ResNetEnergy",
]
