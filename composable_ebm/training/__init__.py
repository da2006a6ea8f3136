"""Training: one loop (`Trainer`) around an objective (contrastive divergence with its replay buffer and improved-CD
losses, or denoising score matching), checkpoints, DDP."""

from composable_ebm.training.buffer import ReplayBuffer
from composable_ebm.training.checkpoint import load_checkpoint, save_atomic
from composable_ebm.training.config import ContrastiveConfig, DenoisingConfig, ObjectiveConfig, learning_rate
from composable_ebm.training.contrastive import ContrastiveDivergence
from composable_ebm.training.denoising import DenoisingScoreMatching
from composable_ebm.training.faults import TrainingDiverged
from composable_ebm.training.log import RunLog, read_log
from composable_ebm.training.loop import Loop
from composable_ebm.training.losses import (
    cd_loss,
    entropy_loss,
    frozen_energy,
    nearest_neighbour_distance,
    label_loss,
    opt_loss,
    other_values,
)
from composable_ebm.training.trainer import (
    ImprovedCDObjective,
    Objective,
    ObjectiveOutput,
    StepRecord,
    Trainer,
    TrainerConfig,
    TrainingData,
    TrainingSummary,
    init_distributed,
)

__all__ = [
    "ContrastiveConfig",
    "ContrastiveDivergence",
    "DenoisingConfig",
    "DenoisingScoreMatching",
    "ImprovedCDObjective",
    "Loop",
    "Objective",
    "ObjectiveConfig",
    "ObjectiveOutput",
    "ReplayBuffer",
    "RunLog",
    "StepRecord",
    "Trainer",
    "TrainerConfig",
    "TrainingData",
    "TrainingDiverged",
    "TrainingSummary",
    "cd_loss",
    "entropy_loss",
    "frozen_energy",
    "init_distributed",
    "load_checkpoint",
    "nearest_neighbour_distance",
    "label_loss",
    "learning_rate",
    "opt_loss",
    "other_values",
    "read_log",
    "save_atomic",
]
