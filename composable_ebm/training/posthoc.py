"""Post-hoc EMA: a run's EMA length chosen after training (Karras et al. 2024, "Analyzing and Improving the Training
Dynamics of Diffusion Models", section 3).

A run with ``[trainer] posthoc_ema = [0.05, 0.10]`` keeps, beside its EMA, one power-function average of its weights
per relative std. At step ``t`` (counted from 1) such an average moves towards the weights by
``1 - (1 - 1/t) ** (gamma + 1)``, so it weighs the weights of step ``tau`` in proportion to ``tau ** gamma`` over
``(0, t]``. The profile's std over ``t`` is its relative std,
``sigma_rel = sqrt((gamma + 1) / ((gamma + 2) ** 2 * (gamma + 3)))``: 0.289 for ``gamma = 0`` (the plain mean of the
run) and smaller as ``gamma`` grows.

Every ``posthoc_every`` steps (and at a run's last step) each average is written to ``RUN/ema/``. The average of any
other relative std, at any step that was written, is then a least-squares combination of the written ones: their
profiles are known in closed form, so the combination whose profile is nearest the wanted one (in L2 over steps) is
found from their inner products alone (`reconstruction_weights`). ``cebm export RUN --ema-std S`` writes it as a model
folder."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from composable_ebm.atomic import write_atomic
from composable_ebm.errors import InvalidInputError, ModelFileError

FOLDER = "ema"
MAX_STD = 0.28
"""The largest relative std an average may have here: ``gamma`` above 0.1 (at 0, the mean of the whole run, 0.289)."""
_NAME = re.compile(r"posthoc-(\d{8})-std(\d\.\d{4})\.safetensors")


def gamma_of(std: float) -> float:
    """The exponent ``gamma`` of the power-function profile whose relative std is ``std``: the largest real root of
    ``gamma^3 + 7 gamma^2 + (16 - 1/std^2) gamma + (12 - 1/std^2) = 0`` (the std's definition, squared and
    multiplied out)."""
    if not (isinstance(std, (int, float)) and 0.0 < std <= MAX_STD):
        raise InvalidInputError(f"an EMA's relative std must be a number in (0, {MAX_STD}], got {std!r} (0.05-0.15 are"
                                " usual; 0.289 would be the mean of the whole run)")
    k = 1.0 / std ** 2
    roots = np.roots([1.0, 7.0, 16.0 - k, 12.0 - k])
    return float(max(r.real for r in roots if abs(r.imag) < 1e-9))


def std_of(gamma: float) -> float:
    """The relative std of the power-function profile of exponent ``gamma``."""
    return math.sqrt((gamma + 1) / ((gamma + 2) ** 2 * (gamma + 3)))


def _inner(t_a: np.ndarray, g_a: np.ndarray, t_b: np.ndarray, g_b: np.ndarray) -> np.ndarray:
    """Inner products over steps of the profiles ``(g + 1) tau^g / t^(g + 1)`` on ``(0, t]`` (each integrates to 1),
    for every pair of ``a`` and ``b`` (broadcast); computed in logs, so long runs and large ``gamma`` do not
    overflow."""
    t_min = np.minimum(t_a, t_b)
    log = (np.log(g_a + 1) + np.log(g_b + 1) - np.log(g_a + g_b + 1) + (g_a + g_b + 1) * np.log(t_min)
           - (g_a + 1) * np.log(t_a) - (g_b + 1) * np.log(t_b))
    return np.exp(log)


def reconstruction_weights(steps: Sequence[int], gammas: Sequence[float], step: int, gamma: float) -> np.ndarray:
    """The weights, one per written average (``steps[i]``, ``gammas[i]``), whose sum of averages comes nearest the
    average of exponent ``gamma`` at ``step``: the least-squares solution of ``A w = b``, ``A`` the averages'
    profiles' inner products and ``b`` theirs with the wanted profile."""
    t = np.asarray(steps, dtype=np.float64)
    g = np.asarray(gammas, dtype=np.float64)
    gram = _inner(t[:, None], g[:, None], t[None, :], g[None, :])
    target = _inner(t, g, np.float64(step), np.float64(gamma))
    weights, *_ = np.linalg.lstsq(gram, target, rcond=None)
    return weights


class PowerAverages:
    """The power-function averages of a run's weights, one per relative std (`Trainer` keeps one when
    ``posthoc_ema`` is set): updated after every optimiser step, saved in the checkpoint, written to ``RUN/ema/``."""

    def __init__(self, model: nn.Module, stds: Iterable[float]) -> None:
        self.stds = tuple(float(s) for s in stds)
        self.gammas = tuple(gamma_of(s) for s in self.stds)
        self.averages = [[p.detach().float().clone() for p in model.parameters()] for _ in self.stds]

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> None:
        """Move every average towards ``model``'s weights after step ``step`` (counted from 1)."""
        weights = [p.detach().float() for p in model.parameters()]
        for gamma, average in zip(self.gammas, self.averages, strict=True):
            keep = (1.0 - 1.0 / step) ** (gamma + 1.0)
            torch._foreach_lerp_(average, weights, 1.0 - keep)

    def state_dict(self) -> dict:
        return {"stds": list(self.stds), "averages": [list(a) for a in self.averages]}

    def load_state_dict(self, state: dict) -> None:
        if [float(s) for s in state["stds"]] != list(self.stds) or len(state["averages"]) != len(self.averages):
            raise ValueError(f"the checkpoint keeps post-hoc averages of stds {state['stds']}, this run {list(self.stds)}")
        for average, saved in zip(self.averages, state["averages"], strict=True):
            if len(saved) != len(average):
                raise ValueError(f"a post-hoc average holds {len(saved)} tensors, the model {len(average)}")
            for a, s in zip(average, saved, strict=True):
                a.copy_(s)

    def restart(self, model: nn.Module) -> None:
        """Start every average at ``model``'s weights (a run resumed from a checkpoint that kept none)."""
        for average in self.averages:
            for a, p in zip(average, model.parameters(), strict=True):
                a.copy_(p.detach())

    def write(self, model: nn.Module, run: Path, step: int) -> None:
        """``RUN/ema/posthoc-<step>-std<std>.safetensors`` per average: the model's state with the average's
        weights (its buffers as they are), each file written atomically."""
        from safetensors.torch import save_file

        names = [n for n, _ in model.named_parameters()]
        buffers = {n: b.detach().cpu().contiguous() for n, b in model.named_buffers()}
        for std, gamma, average in zip(self.stds, self.gammas, self.averages, strict=True):
            tensors = {n: a.cpu().contiguous() for n, a in zip(names, average, strict=True)} | buffers
            meta = {"step": str(step), "std": repr(std), "gamma": repr(gamma), "buffers": json.dumps(sorted(buffers))}
            write_atomic(snapshot_path(run, step, std), lambda tmp, t=tensors, m=meta: save_file(t, tmp, metadata=m))


def snapshot_path(run: Path, step: int, std: float) -> Path:
    return Path(run) / FOLDER / f"posthoc-{step:08d}-std{std:.4f}.safetensors"


@dataclass(frozen=True)
class Snapshot:
    """One written average: its file, step and exponent, and which of its tensors are buffers (not averaged)."""

    path: Path
    step: int
    gamma: float
    buffers: frozenset[str]


def snapshots(run: str | Path) -> list[Snapshot]:
    """The averages a run has written (`PowerAverages.write`), by step; a file that is not one is an error."""
    from safetensors import SafetensorError, safe_open

    folder = Path(run) / FOLDER
    found = []
    for path in sorted(folder.glob("posthoc-*.safetensors")):
        if not _NAME.fullmatch(path.name):
            continue
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
            found.append(Snapshot(path, int(meta["step"]), float(meta["gamma"]), frozenset(json.loads(meta["buffers"]))))
        except (KeyError, ValueError, TypeError, OSError, SafetensorError) as err:
            raise ModelFileError(f"{path}: not a post-hoc EMA file of cebm train ({err})") from err
    return sorted(found, key=lambda s: (s.step, s.gamma))


def prune(run: Path, after: int) -> None:
    """Remove the averages written after step ``after`` (a run rolled back to it writes them again)."""
    for snap in snapshots(run):
        if snap.step > after:
            snap.path.unlink()


def reconstruct(run: str | Path, std: float, step: int | None = None) -> tuple[dict[str, Tensor], int]:
    """The weights of the EMA of relative std ``std`` at ``step`` (default: the last step written), from the
    averages ``run`` wrote up to that step; returns the state dict and the step."""
    from safetensors.torch import load_file

    gamma = gamma_of(std)
    written = snapshots(run)
    if not written:
        raise InvalidInputError(f"{run} holds no post-hoc averages ({FOLDER}/posthoc-*.safetensors): train with"
                                " [trainer] posthoc_ema = [0.05, 0.10] to keep them")
    steps = sorted({s.step for s in written})
    step = steps[-1] if step is None else step
    if step not in steps:
        raise InvalidInputError(f"{run} wrote its averages at steps {steps}, not at {step}; valid choices: those steps")
    used = [s for s in written if s.step <= step]
    weights = reconstruction_weights([s.step for s in used], [s.gamma for s in used], step, gamma)
    state: dict[str, Tensor] = {}
    accumulated: dict[str, Tensor] = {}
    for snap, w in zip(used, weights, strict=True):
        tensors = load_file(str(snap.path))
        for name, tensor in tensors.items():
            if name not in snap.buffers:
                accumulated[name] = accumulated.get(name, 0) + float(w) * tensor.double()
            if snap.step == step:
                state[name] = tensor  # the buffers (and dtypes) of the step asked for
    for name, total in accumulated.items():
        state[name] = total.to(state[name].dtype)
    return state, step
