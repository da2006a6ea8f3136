"""Training: replay buffer, improved-CD losses, Algorithm 1's trainer, checkpoints, DDP."""

from composable_ebm.training.buffer import ReplayBuffer
from composable_ebm.training.checkpoint import load_checkpoint, save_atomic
from composable_ebm.training.losses import (
    cd_loss,
    entropy_loss,
    frozen_energy,
    nearest_neighbour_distance,
    opt_loss,
)
from composable_ebm.training.trainer import (
    ImprovedCDObjective,
    Trainer,
    TrainerConfig,
    TrainingData,
    TrainingDiverged,
    TrainingSummary,
    init_distributed,
)

__all__ = [
    "ImprovedCDObjective",
    "ReplayBuffer",
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
    "opt_loss",
    "save_atomic",
]
