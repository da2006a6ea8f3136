"""What the training loop and its objective know of each other: an objective (`Objective`: contrastive divergence or
denoising score matching) runs an iteration up to its backward pass and keeps its own state; the loop (`Loop`,
`composable_ebm.training.Trainer`) offers it the data, the backward pass and the run's randomness."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover; annotations only
    import torch
    from torch import Tensor, nn

    from composable_ebm.accel.settings import Speed
    from composable_ebm.energy import Energy
    from composable_ebm.training.config import TrainerConfig
    from composable_ebm.training.record import StepRecord


class Loop(Protocol):
    """What an objective may ask of the loop that runs it."""

    energy: Energy
    config: TrainerConfig
    device: torch.device
    generator: torch.Generator
    images: Tensor
    labels: dict[str, Tensor]
    optimizer: torch.optim.Optimizer
    distributed: bool
    speed: Speed  # what the run may do to go faster (CUDA graphs, the layers' own derivatives), read at its start

    def positives(self, n: int) -> tuple[Tensor, dict[str, Tensor]]:
        """``n`` positives (augmented, dequantized) and their labels, some under the null condition."""

    def draw_images(self, n: int) -> tuple[Tensor, Tensor]:
        """``n`` training images as they are, and their indices."""

    def backward(self, loss: Tensor) -> Tensor:
        """Backward and clip; the gradient norm before clipping."""

    def logs_this_step(self) -> bool:
        """Whether the iteration in progress is logged."""

    def parallel(self, loss: nn.Module) -> nn.Module:
        """``loss`` as the run computes it (wrapped for DDP in a distributed run)."""


class Objective(Protocol):
    """What the loop asks of a training objective (`ContrastiveDivergence`, `DenoisingScoreMatching`)."""

    def step(self) -> StepRecord:
        """One iteration up to its backward pass (gradients on the parameters); its statistics."""

    def applied(self) -> None:
        """The loop applied the iteration (no fault): keep what it made (the negatives)."""

    def fault(self, record: StepRecord) -> str | None:
        """Why ``record``'s statistics are a fault, or None."""

    def state_dict(self) -> dict[str, Any]:
        """The objective's own state in a checkpoint."""

    def load_state_dict(self, state: dict[str, Any], resize: bool = False) -> None:
        """Restore `state_dict`'s (``resize``: a buffer of another capacity fits)."""

    def restored(self) -> None:
        """The loop restored a checkpoint: drop what was made from the old state."""

    def log_fields(self) -> dict[str, Any]:
        """Fields of its own for a log record."""

    def evaluations_per_step(self) -> int:
        """About how many energy-and-gradient evaluations an iteration costs."""

    def state_bytes(self) -> int:
        """Bytes of its own state in a checkpoint."""
