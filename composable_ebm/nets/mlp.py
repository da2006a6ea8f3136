"""A small MLP energy for low-dimensional data (the 2-D toy densities)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from composable_ebm.configs import JSONConfig, check_attributes, check_size
from composable_ebm.energy import Energy, Labels
from composable_ebm.model_types import register
from composable_ebm.pretrained import Pretrained


@dataclass(frozen=True)
class MLPConfig(JSONConfig):
    """Configuration of an `MLPEnergy`."""

    name: str = "mlp"
    """The model's name."""
    dim: int = 2
    """Input dimension."""
    hidden: int = 128
    """Hidden width."""
    depth: int = 3
    """number of hidden layers"""
    spectral_norm: bool = False
    """Spectral normalisation of every linear layer."""
    value_range: tuple[float, float] | None = None
    """None: unbounded (no clamping when sampling)"""
    attributes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Attributes it is conditioned on: name -> value names."""

    def __post_init__(self) -> None:
        check_size("MLPConfig", "dim", self.dim, high=1_000_000)
        check_size("MLPConfig", "hidden", self.hidden)
        check_size("MLPConfig", "depth", self.depth, low=0, high=256)
        check_attributes("MLPConfig", self.attributes)


@register("mlp")
class MLPEnergy(Pretrained, Energy):
    """``x -> Linear -> Swish -> ... -> Linear -> 1``, conditioned by concatenating one-hot attributes."""

    config_class = MLPConfig

    def __init__(self, config: MLPConfig) -> None:
        super().__init__((config.dim,), config.value_range, config.attributes)
        self.config = config
        cond_dim = sum(len(v) for v in config.attributes.values())
        layers: list[nn.Module] = []
        width = config.dim + cond_dim
        for _ in range(config.depth):
            layers += [self._linear(width, config.hidden), nn.SiLU()]
            width = config.hidden
        layers.append(self._linear(width, 1))
        self.net = nn.Sequential(*layers)

    def _linear(self, cin: int, cout: int) -> nn.Module:
        layer = nn.Linear(cin, cout)
        return nn.utils.parametrizations.spectral_norm(layer) if self.config.spectral_norm else layer

    @property
    def name(self) -> str:
        return self.config.name

    def energy(self, x: Tensor, labels: Labels | None) -> Tensor:
        """The network's scalar output on ``x`` concatenated with one-hot attributes, ``(B,)``."""
        if self.attributes:
            parts = [x]
            for attr, values in self.attributes.items():
                if labels is not None and attr in labels:
                    parts.append(F.one_hot(labels[attr], len(values)).to(x.dtype))
                else:
                    parts.append(x.new_zeros(x.shape[0], len(values)))
            x = torch.cat(parts, dim=1)
        return self.net(x).squeeze(-1)
