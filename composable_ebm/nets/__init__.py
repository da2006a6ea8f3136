"""Energy networks: the paper's ResNets (single and multiscale) and a small MLP, registered by name (`NETWORKS`),
and the named input transforms their configs may list (`TRANSFORMS`)."""

from composable_ebm.nets.mlp import MLPConfig, MLPEnergy
from composable_ebm.nets.registry import NETWORKS
from composable_ebm.nets.resnet import (
    PAPER_32_BLOCKS,
    PAPER_128_BLOCKS,
    BlockSpec,
    ResNetConfig,
    ResNetEnergy,
)
from composable_ebm.nets.transforms import TRANSFORMS

__all__ = [
    "NETWORKS",
    "TRANSFORMS",
    "BlockSpec",
    "MLPConfig",
    "MLPEnergy",
    "PAPER_128_BLOCKS",
    "PAPER_32_BLOCKS",
    "ResNetConfig",
    "ResNetEnergy",
]
