"""Evaluation: compositional accuracy, OOD AUROC, FID / Inception score, training-health plots."""

from composable_ebm.evaluation.classifier import (
    AttributeClassifier,
    ClassifierConfig,
    CompositionScore,
    attribute_accuracy,
    compositional_accuracy,
    fit_classifier,
    train_classifier,
)
from composable_ebm.evaluation.conditional import (
    EnergyGap,
    ValueReport,
    conditional_report,
    heldout_energy_gap,
    value_distribution,
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
    "EnergyGap",
    "InceptionV3Features",
    "ValueReport",
    "attribute_accuracy",
    "auroc",
    "compositional_accuracy",
    "conditional_report",
    "extract_features",
    "fid",
    "find_inception_weights",
    "fit_classifier",
    "frechet_distance",
    "gaussian_stats",
    "heldout_energy_gap",
    "inception_score",
    "inception_score_from_probs",
    "ood_auroc",
    "plot_training_health",
    "read_log",
    "train_classifier",
    "value_distribution",
]
