"""The training state: checkpoint, resume and rollback of a `Trainer` (its model, EMA, optimiser, its objective's
state (a replay buffer), generator, step and settings), written atomically and read with ``weights_only=True``."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch.distributed as dist

from composable_ebm.errors import InvalidInputError, ModelFileError
from composable_ebm.training.checkpoint import (
    STATE_MISMATCH_ERRORS,
    capture_rng_state,
    check_state,
    load_checkpoint,
    restore_rng_state,
    save_atomic,
)
from composable_ebm.training.config import (REMOVED_SETTINGS, RESUMABLE_CHANGES, TrainerConfig, config_differences,
                                           with_defaults)
from composable_ebm.training.posthoc import prune


class TrainingState:
    """Checkpoint and resume for `composable_ebm.training.Trainer`, which mixes it in: it reads the
    trainer's ``energy``, ``ema``, ``optimizer``, ``objective``, ``generator``, ``step``, ``rollbacks``,
    ``config``, ``out_dir``, ``rank`` and ``log``."""

    CHECKPOINT = "checkpoint.pt"

    @property
    def checkpoint_path(self) -> Path | None:
        """``out_dir/checkpoint.pt``, or ``None`` for a trainer that writes nothing (its checkpoint stays in memory)."""
        return self.out_dir / self.CHECKPOINT if self.out_dir is not None else None

    def state_dict(self) -> dict[str, Any]:
        """The full training state: model, EMA, optimiser, the objective's state, RNG states, step and settings."""
        return {
            "format": 2,
            "step": self.step,
            "rollbacks": self.rollbacks,
            "model": self.energy.state_dict(),  # DDP wraps the objective, never the energy itself
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "objective": self.objective.state_dict(),
            "rng": capture_rng_state(self.generator),
            "trainer_config": json.dumps(self.config.to_dict()),
            **({"posthoc": self.posthoc.state_dict()} if self.posthoc is not None else {}),
        }

    def save_checkpoint(self) -> None:
        """Write the full training state atomically (rank 0); keep it in memory without ``out_dir``."""
        if self.checkpoint_path is None:
            self._memory_checkpoint = copy.deepcopy(self.state_dict())
        elif self.rank == 0:
            save_atomic(self.state_dict(), self.checkpoint_path)
        self._has_own_checkpoint = True
        if self.distributed:
            dist.barrier()

    def _latest_checkpoint(self) -> dict[str, Any] | None:
        if self.checkpoint_path is None:
            return self._memory_checkpoint
        return load_checkpoint(self.checkpoint_path, self.device) if self.checkpoint_path.is_file() else None

    def resume(self, path: str | Path | None = None, allow_config_change: bool = False) -> bool:
        """Load ``path`` (default ``out_dir/checkpoint.pt``) if it exists; returns whether it did.

        The checkpoint's training settings must equal this trainer's, except those in
        `RESUMABLE_CHANGES`; otherwise a ``ValueError`` names the keys that differ.
        ``allow_config_change=True`` resumes anyway and records the change in the log.
        """
        path = Path(path) if path is not None else self.checkpoint_path
        if path is None or not path.is_file():
            return False
        state = load_checkpoint(path, self.device)
        try:
            saved = json.loads(state["trainer_config"])
            if not isinstance(saved, dict):
                raise TypeError(f"trainer_config holds a {type(saved).__name__}")
        except (KeyError, TypeError, ValueError) as err:
            raise ModelFileError(f"{path}: unreadable training settings; start fresh with --no-resume --overwrite (the old files are kept aside) or another --out") from err
        # a setting added to TrainerConfig after the checkpoint was written had its default then; one removed since
        # is dropped where the checkpoint holds the value that behaves as the trainer does now
        saved = {k: v for k, v in saved.items() if REMOVED_SETTINGS.get(k, object()) != v}
        defaults = dataclasses.replace(TrainerConfig(), objective=type(self.config.objective)()).to_dict()
        changed = config_differences(with_defaults(saved, defaults), self.config.to_dict())
        changed = {k: v for k, v in changed.items() if k not in RESUMABLE_CHANGES}
        if changed and not allow_config_change:
            keys = ", ".join(f"{k} ({old!r} -> {new!r})" for k, (old, new) in sorted(changed.items()))
            raise InvalidInputError(
                f"{path} was trained with other settings: {keys}; resume with the same recipe, start fresh"
                " (--no-resume --overwrite keeps the old files aside), or allow the change explicitly (--allow-config-change)"
            )
        check_state(state, path)
        try:
            self._restore(state, resize_buffer=allow_config_change)
        except STATE_MISMATCH_ERRORS as err:  # another model's checkpoint
            reason = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
            raise ModelFileError(f"{path} does not fit this model or is damaged ({reason}); start fresh with"
                                 " --no-resume") from err
        self._has_own_checkpoint = True
        if self.log is not None:
            self.log.truncate(self.step)
            if changed:
                self.log.append({"event": "config_changed", "step": self.step,
                                 "changes": {k: {"old": o, "new": n} for k, (o, n) in changed.items()}})
            if not self.resumed_exactly:
                self.log.append({"event": "device_changed", "step": self.step,
                                 "from": state["rng"].get("generator_device"), "to": str(self.generator.device)})
        return True

    def _restore(self, state: dict[str, Any] | None, resize_buffer: bool = False) -> None:
        if state is None:
            raise RuntimeError("no checkpoint to restore")
        self.objective.restored()
        self.energy.load_state_dict(state["model"], strict=True)
        self.ema.load_state_dict(state["ema"], strict=True)
        self.optimizer.load_state_dict(state["optimizer"])
        # a checkpoint written before the objectives were separate holds its buffer beside the model
        own = state["objective"] if "objective" in state else {"buffer": state["buffer"]}
        self.objective.load_state_dict(own, resize=resize_buffer)
        self.resumed_exactly = restore_rng_state(state["rng"], self.generator)
        self.step = int(state["step"])
        self.rollbacks = int(state["rollbacks"])
        if self.posthoc is not None:
            kept = state.get("posthoc")
            if isinstance(kept, dict) and [float(s) for s in kept.get("stds", ())] == list(self.posthoc.stds):
                self.posthoc.load_state_dict(kept)
            else:  # a run that kept none, or others, until now (--allow-config-change): the averages start here
                self.posthoc.restart(self.energy)
            if self.out_dir is not None and self.rank == 0:
                prune(self.out_dir, after=self.step)  # averages of steps after the checkpoint are written again
        if self.rank != 0:
            # the checkpoint holds rank 0's generator and buffer; other ranks must not replay rank 0's draws
            self.generator.manual_seed(self._seed(self.rollbacks) + 104_729 * self.step)
