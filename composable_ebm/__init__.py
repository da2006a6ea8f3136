"""composable_ebm: energy-based models that compose.

Implements "Improved Contrastive Divergence Training of Energy-Based Models"
(Du, Li, Tenenbaum, Mordatch, ICML 2021).
"""

from composable_ebm.analytic import GaussianEnergy
from composable_ebm.energy import Conditioned, Disjunction, Energy, Labels, WeightedSum
from composable_ebm.nets import BlockSpec, MLPConfig, MLPEnergy, ResNetConfig, ResNetEnergy

__version__ = "0.1.0"

__all__ = [
    "BlockSpec",
    "Conditioned",
    "Disjunction",
    "Energy",
    "GaussianEnergy",
    "Labels",
    "MLPConfig",
    "MLPEnergy",
    "ResNetConfig",
    "ResNetEnergy",
    "WeightedSum",
    "__version__",
]
