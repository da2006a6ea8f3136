"""Atomic training checkpoints and RNG state capture.

A checkpoint is a ``torch.save`` of tensors, numbers, strings and containers only, so it
loads with ``weights_only=True``. It is written to a temporary file in the same folder,
flushed to disk, then renamed over the old one: a crash mid-write leaves the previous
checkpoint intact.
"""

from __future__ import annotations

import hashlib
import pickle
import random
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from composable_ebm.atomic import write_atomic
from composable_ebm.errors import ModelFileError, RunFailure


class CheckpointWriteError(RunFailure, OSError):
    """A checkpoint could not be written (full or read-only disk); the previous one is kept."""

CORRUPT_FILE_ERRORS = (RuntimeError, EOFError, OSError, ValueError, TypeError, KeyError, IndexError, OverflowError,
                       AttributeError, AssertionError, pickle.UnpicklingError)
"""What ``torch.load`` raises on a damaged file (found by fuzzing): the zip reader, the restricted
unpickler and tensor rebuilding each fail in their own way. Caught around ``torch.load`` only."""

STATE_MISMATCH_ERRORS = (RuntimeError, KeyError, ValueError, TypeError, IndexError)
"""What restoring a well-formed checkpoint of another model raises (``load_state_dict``: missing or
mis-shaped tensors); `check_state` has checked its structure first, so nothing else is the file's fault."""

_STATE_TYPES = {"step": int, "rollbacks": int, "model": dict, "ema": dict, "optimizer": dict, "rng": dict}
_RNG_TYPES = {"generator": torch.Tensor, "torch": torch.Tensor, "numpy": dict, "python": dict}
_NUMPY_TYPES = {"key": torch.Tensor, "pos": int, "has_gauss": int, "cached_gaussian": float}
_PYTHON_TYPES = {"version": int, "internal": list, "gauss": (float, type(None))}


def check_state(state: dict[str, Any], path: Path) -> None:
    """The structure of a training state (`composable_ebm.training.Trainer.state_dict`): every part present and
    of its type, so that restoring it fails only where the model does not fit. One line naming the part."""
    for where, part, types in (("", state, _STATE_TYPES), ("rng.", state.get("rng"), _RNG_TYPES),
                               ("rng.numpy.", (state.get("rng") or {}).get("numpy"), _NUMPY_TYPES),
                               ("rng.python.", (state.get("rng") or {}).get("python"), _PYTHON_TYPES)):
        for key, kind in types.items():
            value = part.get(key, KeyError) if isinstance(part, dict) else KeyError
            if value is KeyError or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                found = "missing" if value is KeyError else f"a {type(value).__name__}"
                raise ModelFileError(f"{path}: {where}{key} is {found}, not a training-state part; the file is damaged"
                                     " or not a checkpoint of cebm train; start fresh with --no-resume")
    own = "objective" if "objective" in state else "buffer"  # the buffer alone: written before the objectives were separate
    if not isinstance(state.get(own), dict):
        found = "missing" if own not in state else f"a {type(state[own]).__name__}"
        raise ModelFileError(f"{path}: objective is {found}, not a training-state part; the file is damaged or not a"
                             " checkpoint of cebm train; start fresh with --no-resume")
    if state["step"] < 0 or state["rollbacks"] < 0:
        raise ModelFileError(f"{path}: step {state['step']} and rollbacks {state['rollbacks']} must be >= 0; the file is"
                             " damaged; start fresh with --no-resume")
    py = state["rng"]["python"]
    words = py["internal"]  # Mersenne Twister: 624 32-bit words and a position in 0..624
    if py["version"] != 3 or len(words) != 625 or not all(
            isinstance(w, int) and not isinstance(w, bool) and 0 <= w < 2**32 for w in words) or words[-1] > 624:
        raise ModelFileError(f"{path}: rng.python is not a state of Python's random generator (version 3, 624 32-bit"
                             " words and a position); the file is damaged; start fresh with --no-resume")


def save_atomic(payload: dict[str, Any], path: str | Path) -> Path:
    """``torch.save`` to a temp file beside ``path``, fsync, then rename over ``path``.

    A failed write (a full disk: torch's zip writer says "[enforce fail at inline_container.cc] ...
    file write failed") is one line naming the file; the previous checkpoint is left as it was."""
    try:
        return write_atomic(path, lambda tmp: torch.save(payload, tmp))
    except (RuntimeError, OSError) as err:
        text = " ".join(str(err).split())
        reason = text.split("] ", 1)[-1] if text.startswith("[enforce fail") else text
        raise CheckpointWriteError(f"could not write {path} ({reason[:160] or type(err).__name__}): is the disk full"
                                   " or read-only? The previous checkpoint is kept") from err


def load_failure_reason(err: BaseException) -> str:
    """Why ``torch.load(..., weights_only=True)`` refused a file, in a few words and without torch's
    advice to load it with ``weights_only=False`` (which would run code from the file)."""
    if isinstance(err, pickle.UnpicklingError):
        return "it holds pickled Python objects other than tensors, and nothing else is unpickled here"
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text[:160]


def torch_file(path: Path, map_location: torch.device | str = "cpu", what: str = "checkpoint",
               advice: str = "") -> Any:
    """``torch.load(path, weights_only=True)`` of a file from outside, or one line (`ModelFileError`) saying why it is
    not a readable ``what``, followed by ``advice``: a file that is not torch's zip archive (a bare pickle, torch's
    legacy format) is never handed to an unpickler, and torch's warnings about the pickle inside are shown only for a
    file that loads."""
    if not zipfile.is_zipfile(path):
        raise ModelFileError(f"{path} is not a readable {what} (not the torch zip archive torch.save writes: a bare"
                             f" pickle, torch's legacy format or a damaged file, and nothing else is unpickled here){advice}")
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            state = torch.load(path, map_location=map_location, weights_only=True)
    except CORRUPT_FILE_ERRORS as err:
        raise ModelFileError(f"{path} is not a readable {what} ({load_failure_reason(err)}){advice}") from err
    for warning in said:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return state


def load_checkpoint(path: str | Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (no arbitrary unpickling; `torch_file`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    if path.stat().st_size == 0:
        raise ModelFileError(f"{path} is empty (0 bytes); start fresh with --no-resume")
    state = torch_file(path, map_location, "checkpoint", "; start fresh with --no-resume --overwrite")
    if not isinstance(state, dict):
        raise ModelFileError(f"{path} holds a {type(state).__name__}, not a checkpoint; start fresh with --no-resume")
    return state


def capture_rng_state(generator: torch.Generator) -> dict[str, Any]:
    """The trainer's generator and the global torch, CUDA, numpy and Python RNG states."""
    np_state = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "generator": generator.get_state(),
        "generator_device": str(generator.device),
        "torch": torch.get_rng_state(),
        "numpy": {
            "key": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": {"version": py_version, "internal": list(py_internal), "gauss": py_gauss},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any], generator: torch.Generator) -> bool:
    """Inverse of `capture_rng_state`; returns whether the trainer's generator continues its saved stream.

    RNG states are CPU byte tensors whatever the device: a checkpoint read with ``map_location="cuda"``
    holds them on the GPU, so each is moved back before it is set. A generator saved on another kind of
    device (a run started on a GPU, resumed on a CPU) has a state of another form: the generator is then
    seeded from the saved state instead, so the run goes on reproducibly but not bit for bit.
    """
    saved = state["generator"].cpu()
    exact = torch.device(state.get("generator_device", str(generator.device))).type == generator.device.type
    if exact:
        generator.set_state(saved)
    else:
        generator.manual_seed(int.from_bytes(hashlib.sha256(saved.numpy().tobytes()).digest()[:8], "little"))
    torch.set_rng_state(state["torch"].cpu())
    np_state = state["numpy"]
    np.random.set_state(
        ("MT19937", np_state["key"].cpu().numpy().astype(np.uint32), np_state["pos"], np_state["has_gauss"],
         np_state["cached_gaussian"])
    )
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state.cpu(), index)
    return exact
