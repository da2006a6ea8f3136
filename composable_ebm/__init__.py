"""composable_ebm: energy-based models that compose.

Implements "Improved Contrastive Divergence Training of Energy-Based Models"
(Du, Li, Tenenbaum, Mordatch, ICML 2021).
"""

__version__ = "0.1.0"

from composable_ebm.analytic import GaussianEnergy
from composable_ebm.energy import NULL, Conditioned, Disjunction, Energy, Guided, Labels, WeightedSum, guided
from composable_ebm.nets import BlockSpec, MLPConfig, MLPEnergy, ResNetConfig, ResNetEnergy
from composable_ebm.sampling import AugmentConfig, SampleResult, SamplerConfig, sample
from composable_ebm.training import ReplayBuffer, Trainer, TrainerConfig, TrainingDiverged
from composable_ebm.data import ImageDataset, attribute_folder, cifar10, digits, shapes
from composable_ebm.evaluation import (
    AttributeClassifier,
    ClassifierConfig,
    InceptionV3Features,
    auroc,
    compositional_accuracy,
    fid,
    inception_score,
    ood_auroc,
    plot_training_health,
    train_classifier,
)
from composable_ebm.images import chain_strip, image_grid, save_chain_strip, save_image_grid
from composable_ebm.hub import load_model as load
from composable_ebm.hub import push_to_hub as push
from composable_ebm.hub import save_model as save

__all__ = [
    "AttributeClassifier",
    "AugmentConfig",
    "BlockSpec",
    "ClassifierConfig",
    "Conditioned",
    "Disjunction",
    "Energy",
    "GaussianEnergy",
    "Guided",
    "ImageDataset",
    "InceptionV3Features",
    "Labels",
    "MLPConfig",
    "NULL",
    "MLPEnergy",
    "ReplayBuffer",
    "ResNetConfig",
    "ResNetEnergy",
    "SampleResult",
    "SamplerConfig",
    "Trainer",
    "TrainerConfig",
    "TrainingDiverged",
    "WeightedSum",
    "__version__",
    "attribute_folder",
    "auroc",
    "chain_strip",
    "cifar10",
    "compositional_accuracy",
    "digits",
    "fid",
    "guided",
    "image_grid",
    "inception_score",
    "load",
    "ood_auroc",
    "plot_training_health",
    "sample",
    "push",
    "save",
    "save_chain_strip",
    "save_image_grid",
    "shapes",
    "train_classifier",
]
