"""Training a recipe into a run folder, and reading a model back from one: what ``cebm train`` does, as a library.

A run folder holds ``checkpoint.pt`` (the whole training state, for ``--resume``), ``log.jsonl``, the
trained EMA model in ``model/`` (config, weights, card) and ``health.png``. `train_recipe` writes it;
`load_run` reads the model of a finished run, or of an unfinished one from its checkpoint.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from composable_ebm.errors import InvalidInputError, RunFailure, one_line

if TYPE_CHECKING:  # pragma: no cover
    from composable_ebm.training import StepRecord

RUN_FILES = ("checkpoint.pt", "log.jsonl", "model", "health.png", "tensorboard", "network.json")
"""What a run writes into its folder: a new run there must not mix with these."""
NETWORK_FILE = "network.json"
"""The run's network and sampling defaults (a model folder's ``config.json`` without weights): `export_run` builds
the model from it."""


@dataclass
class TrainedRun:
    """What `train_recipe` did."""

    model: Any  # the EMA energy, as saved to out/model
    steps: int  # the step the run reached
    rollbacks: int
    resumed_from: int | None  # the step a resumed run started from; None: a fresh run
    set_aside: Path | None  # where a previous run's files were moved (``overwrite``)
    seconds: float  # wall time of this call's training
    stopped: str | None = None  # why training stopped before its last step (a signal, --max-minutes); None: finished


def set_aside_previous_run(out: Path, overwrite: bool) -> tuple[Path, list[str]] | None:
    """Before a fresh run in ``out``: refuse a folder holding another run's files, or with ``overwrite``
    move them to ``out/replaced-<time>/``: returns that folder and the names moved. ``None``: nothing was there."""
    present = [name for name in RUN_FILES if (out / name).exists()]
    if not present:
        return None
    if not overwrite:
        raise InvalidInputError(f"{out} holds another run ({', '.join(present)}); --no-resume starts a new run, so pass"
                                " --overwrite to move those files to OUT/replaced-<time>/, or choose another --out")
    aside = out / time.strftime("replaced-%Y%m%d-%H%M%S")
    n = 0
    while aside.exists():
        n += 1
        aside = out / (time.strftime("replaced-%Y%m%d-%H%M%S") + f"-{n}")
    aside.mkdir()
    for name in present:
        os.replace(out / name, aside / name)
    return aside, present


def _start_from(trainer: Any, source: str | Path, allow_config_change: bool = False) -> list[str]:
    """Load the weights of the model at ``source`` into a new run's network and its EMA copy.

    The weights must fit the recipe's network key for key and shape for shape. Its config must be the recipe's
    too (the name aside), unless ``allow_config_change``: then a setting that leaves the weights' shapes as
    they are may differ (a new input transform fine-tuned from trained weights), and the differences are
    returned, ``["field: theirs against ours", ...]``. With it, a model without attributes (an unconditional
    base) may start a conditional network too: the weights that read only the condition
    (`Energy.condition_weights`) start at zero, so the run starts as the base's energy."""
    from composable_ebm.configs import config_to_dict
    from composable_ebm.models import load_model

    model = load_model(source)
    weights, own = model.state_dict(), trainer.energy.state_dict()
    if not getattr(model, "attributes", None):  # an unconditional base: the condition's weights start at zero
        prefixes = tuple(trainer.energy.condition_weights)
        zeros = {k: torch.zeros_like(v) for k, v in own.items() if k not in weights and k.startswith(prefixes)}
        if zeros and not allow_config_change:
            raise InvalidInputError(f"--init {source} has no attributes (an unconditional base) and the recipe's "
                                    "network has: start from it with --allow-config-change (the weights that read "
                                    "the condition start at zero)")
        weights.update(zeros)
    differ = sorted(set(weights) ^ set(own)) or [k for k in own if weights[k].shape != own[k].shape]
    changed: list[str] = []
    if not differ and hasattr(model, "config") and hasattr(trainer.energy, "config"):
        theirs, ours = config_to_dict(model.config), config_to_dict(trainer.energy.config)
        changed = [f"{k}: {theirs.get(k)!r} against {ours.get(k)!r}" for k in sorted(set(theirs) | set(ours))
                   if k != "name" and theirs.get(k) != ours.get(k)]
        if not allow_config_change:
            differ = changed
    if differ:
        raise InvalidInputError(f"--init {source}: its network is not the recipe's (first difference: {differ[0]});"
                                " initialise from a model trained with this recipe's [model] settings, or allow"
                                " settings that keep the weights' shapes to differ (--allow-config-change)")
    trainer.energy.load_state_dict(weights)
    trainer.ema.load_state_dict(weights)
    return changed


@dataclass(frozen=True)
class Estimate:
    """What `estimate` measured before a run: seconds per iteration, the peak memory, a checkpoint's bytes."""

    seconds_per_step: float
    """the mean of the timed iterations (after one untimed iteration: warm-up, and a CUDA graph's capture)"""
    peak_bytes: int | None
    """on a GPU the device memory allocated at the peak (`torch.cuda.max_memory_allocated`); on a CPU the process's
    resident memory at its peak (``ru_maxrss``); ``None`` where the platform does not say"""
    checkpoint_bytes: int
    """model, EMA, Adam's two moments, the objective's state"""


ESTIMATE_STEPS = 3
"""Training iterations `estimate` runs (and undoes) before a run: one to warm up, two timed."""


def peak_memory(device: torch.device) -> int | None:
    """The peak memory so far: device memory allocated on a GPU (since the last reset of its peak), resident memory
    of the process on a CPU (Linux and macOS; ``None`` elsewhere)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        import resource
    except ImportError:  # Windows: no getrusage
        return None
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, kilobytes on Linux


def estimate(trainer: Any, repeats: int = ESTIMATE_STEPS - 1) -> Estimate | str:
    """Time ``1 + repeats`` real training iterations (the objective, its backward pass, Adam and the EMA, at the
    recipe's batch size and precision, from a CUDA graph where training uses one) and read the peak memory they
    reach, then put the whole training state back (weights, EMA, Adam, the objective's state, the RNGs, the step),
    so the run that follows is the one it would have been. A distributed run's ranks all take part. Where one of
    the iterations faults (a non-finite loss or gradient), the state is put back all the same and the fault's
    reason is returned instead: the run's own fault handling (rollback) meets it again."""
    import time as clock

    from composable_ebm.training.faults import Fault

    device = trainer.device
    saved = copy.deepcopy(trainer.state_dict())
    generator = trainer.generator.get_state()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        trainer.train_step()  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = clock.perf_counter()
        for _ in range(repeats):
            trainer.train_step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = (clock.perf_counter() - start) / repeats
        peak = peak_memory(device)
    except Fault as fault:
        return fault.reason
    finally:
        trainer._restore(saved)
        trainer.generator.set_state(generator)
        trainer.optimizer.zero_grad(set_to_none=True)
    params = sum(p.numel() * p.element_size() for p in trainer.energy.parameters())
    return Estimate(seconds, peak, 4 * params + trainer.objective.state_bytes())


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _memory_words(device: torch.device, peak: int | None) -> str:
    """How `estimate`'s peak reads in a sentence."""
    if peak is None:
        return "memory not measured on this platform"
    what = "GPU memory allocated" if device.type == "cuda" else "process memory"
    return f"peak {what} {_human_bytes(peak)}"


class StopRequests:
    """Turns SIGINT / SIGTERM and a time limit into a request the training loop reads after each step."""

    def __init__(self, max_minutes: float | None = None) -> None:
        self.deadline = time.monotonic() + 60 * max_minutes if max_minutes is not None else None
        self.reason: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequests:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        import signal

        if self.reason is not None and self.reason.startswith("SIG"):  # a second signal: stop at once
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
        self.reason = signal.Signals(signum).name

    def __call__(self) -> bool:
        if self.reason is None and self.deadline is not None and time.monotonic() >= self.deadline:
            self.reason = "--max-minutes"
        return self.reason is not None


def train_recipe(recipe: str | Path, out: str | Path, *, steps: int | None = None, resume: bool = True,
                 overwrite: bool = False, allow_config_change: bool = False, device: torch.device | str | None = None,
                 progress: bool = False, license: str | None = None, init: str | Path | None = None,
                 echo: Callable[[str], None] | None = None, max_minutes: float | None = None,
                 precision: str | None = None, settings: Sequence[str] = ()) -> TrainedRun:
    """Train ``recipe`` (a TOML file) into the run folder ``out``, as ``cebm train`` does.

    Resumes from ``out/checkpoint.pt`` when ``resume`` and it exists; ``resume=False`` starts a new run,
    refused in a folder holding another run unless ``overwrite`` (its files are moved aside). Trains to
    ``steps`` (default: the recipe's), then saves the EMA model with its card to ``out/model`` and the
    health plot to ``out/health.png``. Under ``torchrun`` every rank trains and rank 0 writes. ``echo``
    receives the progress lines (default: none).

    ``init`` (a model folder, bundled name or Hub id, as `composable_ebm.load` takes) starts a new run from that
    model's weights instead of the recipe's initialisation, with a fresh optimiser: fine-tuning. Its network must
    be the recipe's. A step-0 checkpoint is written at once, so the run resumes as a fine-tune without ``init``;
    a run that resumes from a checkpoint ignores it.

    ``precision`` (``float32`` or ``bfloat16``) overrides the recipe's ``[trainer] precision``; the card says so.
    ``settings`` (``TABLE.KEY=VALUE`` each, as `composable_ebm.recipes.parse_setting` reads them) change single
    settings over the recipe's; the card lists them. A resumed run compares the checkpoint with the recipe and
    these settings together, so resume with the same ones.

    Before training it says the estimated time per iteration and the checkpoint's size. SIGINT, SIGTERM or
    ``max_minutes`` stop it after the step in progress: the checkpoint and the model folder are written as at the
    end (`TrainedRun.stopped` says why), and ``cebm train`` resumes from there. `export_run` makes a model folder
    from any run's checkpoint.
    """
    from composable_ebm.training import Trainer, init_distributed

    say = echo or (lambda line: None)
    recipe, out = Path(recipe), Path(out)
    spec, precision = _checked_recipe(recipe, out, settings, precision, steps, max_minutes)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    init_distributed(device)
    data, model = _data_and_model(spec, say)
    trainer = Trainer(model, data, spec.trainer, out_dir=out, device=torch.device(device))
    try:
        aside, resumed_from, init_changes = _start(trainer, model, spec, out, resume=resume, overwrite=overwrite,
                                                   allow_config_change=allow_config_change, init=init, say=say)
        total = steps if steps is not None else spec.trainer.steps
        if trainer.rank == 0:
            _write_network(model, out / NETWORK_FILE, spec)
        _say_estimate(trainer, total, say)
        summary, stopped, seconds, peak = _fit(trainer, total, progress, max_minutes, resumed_from or 0)
        ema = trainer.ema
        ema.sampling_defaults, ema.latent_space = model.sampling_defaults, model.latent_space
        if trainer.rank == 0:
            _save_run(trainer, recipe, out, summary, license, _card_notes(init, init_changes, precision, settings))
            say(f"stopped at step {summary.steps} of {total} ({stopped}); checkpoint and model saved; run the same"
                " command to resume" if summary.stopped else
                f"trained {summary.steps} steps ({summary.rollbacks} rollbacks) at {summary.seconds_per_step:.2f} s"
                f" per step, {_memory_words(trainer.device, peak)}; model in {out / 'model'}")
        return TrainedRun(ema, summary.steps, summary.rollbacks, resumed_from, aside, seconds,
                          stopped if summary.stopped else None)
    finally:
        trainer.close()


def _data_and_model(spec: Any, say: Callable[[str], None]) -> tuple[Any, Any]:
    """The recipe's data and its network; a latent model's data encoded by its autoencoder, whose latent space the
    network is given (`composable_ebm.latent`)."""
    from composable_ebm.data.npm import cache_root
    from composable_ebm.recipes import build_dataset, build_model, encode_dataset, recipe_latent_space

    data = build_dataset(spec.data, spec.folder)
    space = recipe_latent_space(spec)
    if space is not None:
        say(f"the latents of {len(data):,} images by {space}: a latent model trains on them (encoded once, kept in"
            f" {cache_root()})")
        data = encode_dataset(data, space, cache=cache_root())
    model = build_model(spec, data)
    model.latent_space = space
    return data, model


def _checked_recipe(recipe: Path, out: Path, settings: Sequence[str], precision: str | None, steps: int | None,
                    max_minutes: float | None) -> tuple[Any, str | None]:
    """The recipe with ``settings`` and ``precision`` over its own, and everything `train_recipe` can check before
    the first step; the precision the card names (None: the recipe's own)."""
    from composable_ebm.recipes import load_recipe
    from composable_ebm.training import DenoisingConfig

    spec = load_recipe(recipe, settings)
    objective = spec.trainer.objective
    if precision is not None and not isinstance(objective, DenoisingConfig):
        raise InvalidInputError("--precision sets the denoising loss of a noise-conditioned model; a"
                                " contrastive-divergence chain's arithmetic is [trainer.sampler] precision (valid:"
                                " float32, bfloat16)")
    if precision is not None and precision != objective.precision:
        spec = dataclasses.replace(spec, trainer=spec.trainer.with_objective(precision=precision))
    else:
        precision = None  # the recipe's own: nothing for the card to say
    if steps is not None and steps < 0:
        raise InvalidInputError(f"--steps must be >= 0, got {steps}")
    if max_minutes is not None and not max_minutes > 0:
        raise InvalidInputError(f"--max-minutes must be a positive number of minutes, got {max_minutes}")
    if (out / "model").exists() and not (out / "model").is_dir():  # found now, not after the last step
        raise InvalidInputError(f"{out / 'model'} is a file; a run saves its model as a folder there: move the file"
                                " or choose another --out")
    return spec, precision


def _say_estimate(trainer: Any, total: int, say: Callable[[str], None]) -> None:
    """`estimate` the steps to go (every rank takes part), said and logged by rank 0."""
    guess = estimate(trainer) if trainer.step < total else None
    if trainer.rank != 0:
        return
    if isinstance(guess, str):
        say(f"no estimate of the time per step: one of the {ESTIMATE_STEPS} steps it measures faulted ({guess});"
            " training starts, and rolls back where the fault comes again")
    elif guess is not None:
        left = (total - trainer.step) * guess.seconds_per_step
        say(f"about {guess.seconds_per_step:.2f} s per step on {trainer.device} and"
            f" {_memory_words(trainer.device, guess.peak_bytes)} (measured on {ESTIMATE_STEPS} steps, then"
            f" undone), {total - trainer.step} steps to go: about {left / 60:.0f} min; each checkpoint is about"
            f" {_human_bytes(guess.checkpoint_bytes)}")
        if trainer.log is not None:
            trainer.log.append({"event": "estimate", "step": trainer.step,
                                "seconds_per_step": guess.seconds_per_step, "peak_bytes": guess.peak_bytes})


def _fit(trainer: Any, total: int, progress: bool, max_minutes: float | None,
         started: int) -> tuple[Any, str | None, float, int | None]:
    """Train from step ``started`` to ``total`` with a progress bar, stopped by a signal or ``max_minutes``; the time
    per step and peak memory measured are logged. Returns the summary, why it stopped (None: it did not), the seconds
    it took and the peak memory."""
    from tqdm.auto import tqdm

    # disable=None: the bar draws on a terminal only, so a log file gets no carriage returns
    bar = tqdm(total=total, initial=trainer.step, disable=True if not progress or trainer.rank != 0 else None,
               desc="training")
    start = time.perf_counter()
    with StopRequests(max_minutes) as stop:
        try:
            summary = trainer.fit(total, callback=_progress(bar), should_stop=stop)
        finally:
            bar.close()
    seconds, peak = time.perf_counter() - start, peak_memory(trainer.device)
    if trainer.rank == 0 and trainer.log is not None and summary.steps > started:
        trainer.log.append({"event": "measured", "step": summary.steps, "seconds_per_step": summary.seconds_per_step,
                            "peak_bytes": peak})
    return summary, stop.reason, seconds, peak


def _save_run(trainer: Any, recipe: Path, out: Path, summary: Any, license: str | None, notes: str | None) -> None:
    """The EMA model with its card into ``out/model`` (or one line naming `cebm export`, which writes it from the
    checkpoint), and the health plot."""
    from composable_ebm.evaluation import plot_training_health
    from composable_ebm.model_cards import model_card, recipe_text
    from composable_ebm.models import save_model
    from composable_ebm.training import read_log

    try:
        card = model_card(trainer.ema, recipe=recipe_text(recipe), recipe_name=recipe.name, steps=summary.steps,
                          location=str(out / "model"), license=license, notes=notes)
        save_model(trainer.ema, out / "model", card=card)
    except (OSError, ValueError) as err:  # the trained weights are in the checkpoint: say how to get them
        raise RunFailure(f"trained {summary.steps} steps, but the model folder {out / 'model'} could not be written"
                         f" ({one_line(err)}); the trained weights are in {out / trainer.CHECKPOINT}: mend the cause,"
                         f" then `cebm export {out}` writes the model from it") from err
    log = out / trainer.LOG
    if log.is_file() and any("e_diff" in r or "loss_dsm" in r for r in read_log(log)):  # none before log_every
        plot_training_health(out, out / "health.png", title=recipe.stem)


def _start(trainer: Any, model: Any, spec: Any, out: Path, *, resume: bool, overwrite: bool,
           allow_config_change: bool, init: str | Path | None, say: Callable[[str], None]
           ) -> tuple[Path | None, int | None, list[str]]:
    """Start a run: a new one (the previous run's files moved aside when ``overwrite``), a resumed one (its recipe and
    network checked against the checkpoint's), or a fine-tune from ``init``. Returns the folder the previous run was
    moved to, the step resumed from and the settings ``init``'s model differs in."""
    aside, resumed_from, init_changes = None, None, []
    if not resume:
        moved = set_aside_previous_run(out, overwrite)
        if moved is not None:
            aside = moved[0]
            say(f"moved the previous run's {', '.join(moved[1])} to {aside}")
            if trainer.log is not None:
                trainer.log = type(trainer.log)(out)  # a fresh log (and TensorBoard writer) in the emptied folder
    if resume and trainer.checkpoint_path is not None and trainer.checkpoint_path.is_file():
        _check_recipe_unchanged(out / NETWORK_FILE, model, spec, allow_config_change, say)
    if resume and trainer.resume(allow_config_change=allow_config_change):
        _check_network_recorded(out / NETWORK_FILE, allow_config_change, say)
        resumed_from = trainer.step
        say(f"resumed from step {trainer.step}" + ("" if trainer.resumed_exactly else
            " on another kind of device than the checkpoint's: the run goes on, but not bit for bit")
            + (f" (--init {init} ignored: the checkpoint holds the run's weights)" if init is not None else ""))
    elif init is not None:
        init_changes = _start_from(trainer, init, allow_config_change)
        trainer.save_checkpoint()
        say(f"started from the weights of {init}" + (f"; settings changed: {'; '.join(init_changes)}"
                                                      if init_changes else ""))
    return aside, resumed_from, init_changes


def _progress(bar: Any) -> Callable[[int, StepRecord], None]:
    """The trainer's callback that moves the progress bar and shows the energy difference (or the loss)."""
    def tick(step: int, record: StepRecord) -> None:
        bar.update(step - bar.n)
        if record.e_diff is not None:
            bar.set_postfix(e_diff=f"{record.e_diff:+.3f}", refresh=False)
        else:
            bar.set_postfix(loss=f"{record.loss:.4f}", refresh=False)
    return tick


def _card_notes(init: str | Path | None, init_changes: Sequence[str], precision: str | None,
                settings: Sequence[str]) -> str | None:
    """What the card says of how the run was started and changed over its recipe: ``--init``, ``--precision``,
    ``--set``."""
    notes = []
    if init:
        notes.append(f"The run was started from the weights of `{init}` (`--init`), with a fresh optimiser.")
        if init_changes:
            notes.append("Its settings differ from that model's in: " + "; ".join(f"`{c}`" for c in init_changes) + ".")
    if precision is not None:
        notes.append(f"Trained with `--precision {precision}` over the recipe's setting.")
    if settings:
        notes.append("Trained with " + " ".join(f"`--set {s}`" for s in settings) + " over the recipe's settings.")
    return " ".join(notes) or None


def _write_network(model: Any, path: Path, spec: Any) -> None:
    """The run's network and sampling defaults, as a model folder's ``config.json`` holds them, with the recipe's
    data settings under ``extra`` (a resume compares both with the recipe's)."""
    import json

    from composable_ebm.atomic import write_atomic
    from composable_ebm.models import model_payload

    text = json.dumps({**model_payload(model), "extra": {"data": _data_settings(spec)}}, indent=2)
    write_atomic(path, lambda tmp: Path(tmp).write_text(text))


def _data_settings(spec: Any) -> dict[str, Any]:
    from composable_ebm.configs import config_to_dict

    return {"dataset": spec.data.name, **config_to_dict(spec.data)}


def _check_network_recorded(path: Path, allow: bool, say: Callable[[str], None]) -> None:
    """A checkpoint without the record of its network (a run of an older version, or files moved by hand) cannot be
    checked against the recipe: refused unless ``allow``."""
    if path.is_file():
        return
    if allow:
        say(f"resuming without {path.name} (--allow-config-change): the run's [model] and [data] settings are not"
            " checked")
        return
    raise InvalidInputError(f"{path.parent} holds a checkpoint but no {path.name}, so its [model] and [data] settings"
                            " cannot be checked against the recipe; resume with --allow-config-change if it is this"
                            " recipe's run, or start fresh (--no-resume --overwrite keeps the old files aside)")


def _check_recipe_unchanged(path: Path, model: Any, spec: Any, allow: bool, say: Callable[[str], None]) -> None:
    """Refuse to resume a run whose recipe's ``[model]`` or ``[data]`` settings changed since it started (the
    checkpoint compares ``[trainer]`` itself), unless ``allow``: then the changes are said."""
    import json

    from composable_ebm.configs import config_defaults, config_to_dict
    from composable_ebm.training.config import config_differences, with_defaults

    if not path.is_file():  # `_check_network_recorded` speaks of it once the checkpoint has loaded
        return
    try:
        saved = json.loads(path.read_text())
        # a [model] setting added since the run started had its default then
        before = {"model": with_defaults(saved["config"], config_defaults(type(model.config))),
                  "data": saved.get("extra", {}).get("data")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise InvalidInputError(f"{path}: unreadable ({err}); it records the run's network and data") from err
    now = {"model": config_to_dict(model.config), "data": _data_settings(spec)}
    if before["data"] is None:
        now.pop("data"), before.pop("data")
    changed = config_differences(before, now)
    if not changed:
        return
    keys = ", ".join(f"{k} ({old!r} -> {new!r})" for k, (old, new) in sorted(changed.items()))
    if not allow:
        raise InvalidInputError(f"the run in {path.parent} was started with other [model] or [data] settings: {keys};"
                                " resume with the same recipe, start fresh (--no-resume --overwrite keeps the old files"
                                " aside), or allow the change explicitly (--allow-config-change)")
    say(f"resuming with changed settings (--allow-config-change): {keys}")


def _run_network(run: Path, recipe: str | Path | None) -> Any:
    """A run's network, untrained: from its ``network.json``, or (a run without one) from ``recipe``'s network,
    whose shapes the config decides without building the data."""
    from composable_ebm.models import model_from_payload
    from composable_ebm.recipes import build_model_from_shapes, load_recipe

    if recipe is not None:
        return build_model_from_shapes(load_recipe(recipe))
    if (run / NETWORK_FILE).is_file():
        return model_from_payload(run / NETWORK_FILE)
    raise InvalidInputError(f"{run} has no {NETWORK_FILE} (a run of an older version): give the run's recipe")


def checkpoint_model(run: str | Path, recipe: str | Path | None = None, device: torch.device | str = "cpu") -> Any:
    """The EMA model of a run's latest checkpoint, built from the run's ``network.json`` (or, for a run without
    one, from ``recipe``'s network)."""
    from composable_ebm.training import Trainer, load_checkpoint

    run = Path(run)
    checkpoint = run / Trainer.CHECKPOINT
    if not checkpoint.is_file():
        raise InvalidInputError(f"{run} holds no checkpoint.pt: not a run folder, or a run that never saved")
    model = _run_network(run, recipe)
    state = load_checkpoint(checkpoint)
    try:
        model.load_state_dict(state["ema"], strict=True)
    except (KeyError, RuntimeError) as err:
        raise InvalidInputError(f"{checkpoint}: its weights do not fit the network described (give the run's own"
                                " recipe)") from err
    model.checkpoint_step = int(state["step"])
    return model.to(device).eval()


def posthoc_model(run: str | Path, std: float, step: int | None = None, recipe: str | Path | None = None,
                  device: torch.device | str = "cpu") -> Any:
    """The average of relative std ``std`` of a run's weights at ``step`` (default: the last written), reconstructed
    from the post-hoc averages it kept (``[trainer] posthoc_ema``; `composable_ebm.training.posthoc`)."""
    from composable_ebm.training.posthoc import reconstruct

    run = Path(run)
    state, step = reconstruct(run, std, step)
    model = _run_network(run, recipe)
    try:
        model.load_state_dict(state, strict=True)
    except (KeyError, RuntimeError) as err:
        raise InvalidInputError(f"{run}/ema: its weights do not fit the network described (give the run's own"
                                " recipe)") from err
    model.checkpoint_step = step
    return model.to(device).eval()


def export_run(run: str | Path, out: str | Path | None = None, recipe: str | Path | None = None,
               license: str | None = None, overwrite: bool = False, ema_std: float | None = None,
               ema_step: int | None = None) -> Path:
    """Write a model folder (default ``run/model``) from the EMA weights of a run's latest checkpoint: a stopped
    or killed run's model, without resuming it. With ``ema_std``, the weights are instead the average of that
    relative std at ``ema_step`` (default: the last written), made from the run's post-hoc averages
    (`posthoc_model`). A folder that exists and is not empty is refused unless ``overwrite`` (then its model files
    are replaced and the rest stays)."""
    from composable_ebm.model_cards import model_card
    from composable_ebm.persistence import check_new_folder
    from composable_ebm.models import save_model

    if ema_std is None and ema_step is not None:
        raise InvalidInputError("--ema-step picks the step of a post-hoc average: give --ema-std too")
    run = Path(run)
    target = Path(out) if out is not None else run / "model"
    if not overwrite:
        check_new_folder(target)
    if ema_std is None:
        model = checkpoint_model(run, recipe)
        notes = f"Exported from the checkpoint of `{run.name}` at step {model.checkpoint_step}."
    else:
        model = posthoc_model(run, ema_std, ema_step, recipe)
        notes = (f"The average of relative std {ema_std:g} of `{run.name}`'s weights at step {model.checkpoint_step},"
                 " reconstructed from its post-hoc averages (Karras et al. 2024).")
    card = model_card(model, steps=model.checkpoint_step, location=str(target), license=license, notes=notes)
    return save_model(model, target, card=card)


def load_run(run: str | Path, recipe: str | Path | None = None, device: torch.device | str = "cpu") -> Any:
    """The EMA model of a run folder: ``run/model`` when training finished; else the EMA weights of its latest
    checkpoint (`checkpoint_model`; ``recipe`` for a run without ``network.json``)."""
    from composable_ebm.models import load_model

    run = Path(run)
    if (run / "model" / "config.json").is_file():
        return load_model(run / "model", device)
    return checkpoint_model(run, recipe, device)
