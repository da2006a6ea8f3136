"""Evaluation: compositional accuracy, OOD AUROC, FID / Inception score, training-health plots."""

from composable_ebm.evaluation.classifier import (
    AttributeClassifier,
    ClassifierConfig,
    CompositionScore,
    attribute_accuracy,
    compositional_accuracy,
    train_classifier,
)
from composable_ebm.evaluation.metrics import (
    InceptionV3Features,
    auroc,
    extract_features,
    fid,
    find_inception_weights,
    frechet_distance,
    gaussian_stats,
    inception_score,
    inception_score_from_probs,
    ood_auroc,
)
from composable_ebm.evaluation.plots import plot_training_health, read_log

__all__ = [
    "AttributeClassifier",
    "ClassifierConfig",
    "CompositionScore",
    "InceptionV3Features",
    "attribute_accuracy",
    "auroc",
    "compositional_accuracy",
    "extract_features",
    "fid",
    "find_inception_weights",
    "frechet_distance",
    "gaussian_stats",
    "inception_score",
    "inception_score_from_probs",
    "ood_auroc",
    "plot_training_health",
    "read_log",
    "train_classifier",
]
