"""composable_ebm: energy-based models that compose.

Implements "Improved Contrastive Divergence Training of Energy-Based Models"
(Du, Li, Tenenbaum, Mordatch, ICML 2021).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from composable_ebm._version import __version__

# Names are imported on first use (PEP 562), so `import composable_ebm.errors` or `cebm --help`
# does not pay for torch; `from composable_ebm import X` and `composable_ebm.X` work as usual.
_EXPORTS = {
    "GaussianEnergy": "composable_ebm.analytic",
    **dict.fromkeys(["NULL", "Conditioned", "Disjunction", "Energy", "Guided", "Labels", "NoiseConditioned",
                     "WeightedSum", "either", "guided"], "composable_ebm.energy"),
    **dict.fromkeys(["BlockSpec", "DenoisingUNetConfig", "DenoisingUNetEnergy", "MLPConfig", "MLPEnergy",
                     "ResNetConfig", "ResNetEnergy"], "composable_ebm.nets"),
    **dict.fromkeys(["AugmentConfig", "LadderConfig", "SampleResult", "SamplerConfig", "SamplingDefaults"],
                    "composable_ebm.sampling"),
    "sample": "composable_ebm.pipeline",
    **dict.fromkeys(["ContrastiveConfig", "DenoisingConfig", "ReplayBuffer", "Trainer", "TrainerConfig",
                     "TrainingDiverged"], "composable_ebm.training"),
    **dict.fromkeys(["ImageDataset", "attribute_folder", "cifar10", "digits", "shapes"], "composable_ebm.data"),
    **dict.fromkeys(["AttributeClassifier", "ClassifierConfig", "InceptionV3Features", "auroc", "compositional_accuracy",
                     "fid", "inception_score", "ood_auroc", "plot_training_health", "train_classifier"],
                    "composable_ebm.evaluation"),
    **dict.fromkeys(["chain_strip", "image_grid", "save_chain_strip", "save_image_grid"], "composable_ebm.images"),
    "Pretrained": "composable_ebm.pretrained",
    "list_models": "composable_ebm.models",
    "register": "composable_ebm.model_types",
    **dict.fromkeys(["TrainedRun", "load_run", "train_recipe"], "composable_ebm.runs"),
}
_RENAMED = {"load": ("composable_ebm.models", "load_model"), "push": ("composable_ebm.models", "push_to_hub"),
            "save": ("composable_ebm.models", "save_model")}
_SUBMODULES = {"analytic", "atomic", "cli", "configs", "data", "energy", "errors", "evaluation", "expression", "hub",
               "folders", "images", "model_cards", "model_types", "models", "nets", "persistence", "pipeline", "pretrained", "recipes", "registry", "runs", "sampling", "studio",
               "training"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _RENAMED:
        module, attr = _RENAMED[name]
        value = getattr(importlib.import_module(module), attr)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"composable_ebm.{name}")
    else:
        raise AttributeError(f"module 'composable_ebm' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_RENAMED) | _SUBMODULES)


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from composable_ebm.analytic import GaussianEnergy
    from composable_ebm.data import ImageDataset, attribute_folder, cifar10, digits, shapes
    from composable_ebm.energy import (NULL, Conditioned, Disjunction, Energy, Guided, Labels, NoiseConditioned,
                                       WeightedSum, either, guided)
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
    from composable_ebm.model_types import register
    from composable_ebm.models import list_models
    from composable_ebm.models import load_model as load
    from composable_ebm.models import push_to_hub as push
    from composable_ebm.models import save_model as save
    from composable_ebm.pretrained import Pretrained
    from composable_ebm.images import chain_strip, image_grid, save_chain_strip, save_image_grid
    from composable_ebm.runs import TrainedRun, load_run, train_recipe
    from composable_ebm.nets import (BlockSpec, DenoisingUNetConfig, DenoisingUNetEnergy, MLPConfig, MLPEnergy,
                                     ResNetConfig, ResNetEnergy)
    from composable_ebm.pipeline import sample
    from composable_ebm.sampling import AugmentConfig, LadderConfig, SampleResult, SamplerConfig, SamplingDefaults
    from composable_ebm.training import (
        ContrastiveConfig,
        DenoisingConfig,
        ReplayBuffer,
        Trainer,
        TrainerConfig,
        TrainingDiverged,
    )

__all__ = [
    "AttributeClassifier",
    "AugmentConfig",
    "BlockSpec",
    "ClassifierConfig",
    "Conditioned",
    "ContrastiveConfig",
    "DenoisingConfig",
    "DenoisingUNetConfig",
    "DenoisingUNetEnergy",
    "Disjunction",
    "Energy",
    "either",
    "NoiseConditioned",
    "GaussianEnergy",
    "Guided",
    "ImageDataset",
    "InceptionV3Features",
    "Labels",
    "MLPConfig",
    "NULL",
    "MLPEnergy",
    "LadderConfig",
    "Pretrained",
    "ReplayBuffer",
    "ResNetConfig",
    "ResNetEnergy",
    "SampleResult",
    "SamplerConfig",
    "SamplingDefaults",
    "Trainer",
    "TrainedRun",
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
    "list_models",
    "load",
    "load_run",
    "ood_auroc",
    "plot_training_health",
    "sample",
    "push",
    "register",
    "save",
    "save_chain_strip",
    "save_image_grid",
    "shapes",
    "train_classifier",
    "train_recipe",
]
