"""Energy networks: the paper's ResNets (single and multiscale), a small MLP and the noise-conditioned U-Net energy,
each registered by name (`composable_ebm.model_types.register`), and the named input transforms their configs may
list (`TRANSFORMS`)."""

from composable_ebm.nets.mlp import MLPConfig, MLPEnergy
from composable_ebm.nets.resnet import (
    PAPER_32_BLOCKS,
    PAPER_128_BLOCKS,
    BlockSpec,
    ResNetConfig,
    ResNetEnergy,
)
from composable_ebm.nets.transforms import TRANSFORMS
from composable_ebm.nets.unet import DenoisingUNetConfig, DenoisingUNetEnergy

__all__ = [
    "TRANSFORMS",
    "BlockSpec",
    "DenoisingUNetConfig",
    "DenoisingUNetEnergy",
    "MLPConfig",
    "MLPEnergy",
    "PAPER_128_BLOCKS",
    "PAPER_32_BLOCKS",
    "ResNetConfig",
    "ResNetEnergy",
]
