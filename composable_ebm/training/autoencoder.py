"""Training an `composable_ebm.nets.autoencoder.Autoencoder` on images: ``cebm train-autoencoder`` (which reads an
image folder, without the combinations it is told to leave out, and hands the images here).

The loss is the L1 and squared errors of the reconstruction plus, weighted by ``edge_weight``, the L1 error of its
horizontal and vertical differences (thin dark lines, such as line-art glasses or a smile, are where the plain
errors are small and the differences large), and, weighted by ``worst_weight``, the mean error of each image's worst
reconstructed pixels. Adam at ``lr`` with a cosine decay over ``steps``. ``held_out`` of the
images are kept aside to measure the reconstruction's PSNR.

Two levers for what a trained autoencoder erases (``python -m benchmarks.autoencoder`` finds it: the worst cell of
one attribute's value within another's): ``focus`` (a mask over the images, such as every bearded face, ``cebm
train-autoencoder --focus beard=yes``) draws ``focus_share`` of each batch from those images, and ``init`` starts
from a trained autoencoder's weights (``--init``), to fine-tune it on them. Fine-tuning changes the encoder too, so
latent models trained over the old latents are trained again over the new ones.

The run folder holds ``checkpoint.pt`` (weights, Adam, the generator, the step and the seconds spent, written every
``checkpoint_every`` steps and when stopped) and, once trained, ``model/`` with its standardised latents
(`composable_ebm.nets.autoencoder.with_latent_statistics`) and a card. The same command resumes a stopped run; other
settings than the checkpoint's are one line.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from composable_ebm.configs import check_range, check_size, config_to_dict
from composable_ebm.errors import InvalidInputError
from composable_ebm.nets.autoencoder import Autoencoder, AutoencoderConfig, with_latent_statistics


@dataclass(frozen=True)
class AutoencoderTraining:
    """How an autoencoder is trained (the module's docstring)."""

    steps: int = 6000
    batch_size: int = 32
    lr: float = 1e-3
    edge_weight: float = 1.0
    """weight of the L1 error of the reconstruction's horizontal and vertical differences"""
    worst_weight: float = 0.0
    """weight of the mean L1 error over the ``worst_share`` of each image's pixels that it reconstructs worst: a thin
    line a blur erases (a smile drawn over a beard) is a few dozen pixels, too few for the means to notice"""
    worst_share: float = 0.02
    """the share of each image's pixels ``worst_weight`` averages over"""
    held_out: int = 500
    """rows kept aside to measure the reconstruction's PSNR"""
    focus_share: float = 0.0
    """the share of each batch drawn from the ``focus`` images `fit_autoencoder` is given (the rest from all)"""
    checkpoint_every: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        owner = "AutoencoderTraining"
        check_size(owner, "steps", self.steps, low=1, high=1 << 24)
        check_size(owner, "batch_size", self.batch_size, high=1 << 16)
        check_size(owner, "held_out", self.held_out, low=0, high=1 << 24)
        check_size(owner, "checkpoint_every", self.checkpoint_every, high=1 << 24)
        check_size(owner, "seed", self.seed, low=0, high=2**31 - 1)
        check_range(owner, "lr", self.lr, 0.0, 1.0, low_open=True)
        check_range(owner, "edge_weight", self.edge_weight, 0.0, 1e3)
        check_range(owner, "worst_weight", self.worst_weight, 0.0, 1e3)
        check_range(owner, "worst_share", self.worst_share, 0.0, 1.0, low_open=True)
        check_range(owner, "focus_share", self.focus_share, 0.0, 1.0)


@dataclass
class TrainedAutoencoder:
    """What `fit_autoencoder` did."""

    model: Autoencoder
    steps: int  # the step the run reached
    seconds: float  # training time of the run so far, every sitting
    psnr: float | None  # of the held-out rows' reconstructions; None while unfinished or without held-out rows
    stopped: bool  # stopped by the time limit before its last step (the same command resumes)


def reconstruction_loss(x_hat: Tensor, x: Tensor, edge_weight: float, worst_weight: float = 0.0,
                        worst_share: float = 0.02) -> Tensor:
    """L1 + squared error + ``edge_weight`` x the L1 error of the horizontal and vertical differences +
    ``worst_weight`` x the mean L1 error (over channels) of the ``worst_share`` worst pixels of each image."""
    loss = F.l1_loss(x_hat, x) + F.mse_loss(x_hat, x)
    if edge_weight:
        for dim in (-1, -2):
            loss = loss + edge_weight * F.l1_loss(x_hat.diff(dim=dim), x.diff(dim=dim))
    if worst_weight:
        error = (x_hat - x).abs().mean(dim=1).flatten(1)
        k = max(1, math.ceil(worst_share * error.shape[1]))
        loss = loss + worst_weight * error.topk(k, dim=1).values.mean()
    return loss


def psnr(x_hat: Tensor, x: Tensor) -> float:
    """Peak signal-to-noise ratio in dB of images in ``[0, 1]``, over the whole batch."""
    return float(10 * torch.log10(1 / F.mse_loss(x_hat.clamp(0, 1), x).clamp_min(1e-12)))


def fit_autoencoder(images: Tensor, out: str | Path, config: AutoencoderConfig,
                    training: AutoencoderTraining = AutoencoderTraining(), source: str = "images",
                    max_minutes: float | None = None, device: torch.device | str = "cpu",
                    echo: Callable[[str], None] | None = None, focus: Tensor | None = None,
                    init: tuple[Autoencoder, str] | None = None) -> TrainedAutoencoder:
    """Train (or resume) an autoencoder on ``images`` (uint8 ``(N, C, H, W)``; ``source`` says what they are, for the
    card and the resume check) into the run folder ``out``; ``max_minutes`` stops it after the step in progress,
    checkpointed. ``focus``: which images (bool ``(N,)``) ``training.focus_share`` of each batch is drawn from;
    ``init``: an autoencoder of ``config``'s network and its name, whose weights the run starts from."""
    say = echo or (lambda line: None)
    out = Path(out)
    if (focus is None) != (training.focus_share == 0):
        raise InvalidInputError("a focus needs a share of each batch to draw from it, and a share needs a focus:"
                                " give both (--focus and --focus-share) or neither")
    train, held, chosen = _split(images, training, focus)
    with torch.random.fork_rng(devices=[]):  # the initial weights from the seed, the caller's generator untouched
        torch.manual_seed(training.seed)
        model = Autoencoder(config).to(device)
    if init is not None:
        _start_from(model, *init)
    optimizer = torch.optim.Adam(model.parameters(), lr=training.lr)
    generator = torch.Generator().manual_seed(training.seed)
    setup = {"config": config_to_dict(config), "training": config_to_dict(training), "source": source,
             "images": int(images.shape[0])}
    if init is not None:
        setup["init"] = init[1]
    if chosen is not None:
        setup["focus"] = int(chosen.numel())  # the training images in the focus
    step, spent = _resume(out, model, optimizer, generator, setup, say)
    deadline = time.monotonic() + 60 * max_minutes if max_minutes is not None else math.inf
    start = time.perf_counter()
    while step < training.steps and time.monotonic() < deadline:
        for group in optimizer.param_groups:  # cosine decay, a function of the step: a resumed run goes on as one
            group["lr"] = training.lr * 0.5 * (1 + math.cos(math.pi * step / training.steps))
        x = train[_batch(train.shape[0], chosen, training, generator)].to(device).float() / 255
        loss = reconstruction_loss(model(x), x, training.edge_weight, training.worst_weight, training.worst_share)
        if not torch.isfinite(loss):
            raise InvalidInputError(f"the autoencoder's loss is {float(loss)} at step {step + 1}; lower --lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        if step % training.checkpoint_every == 0 or step == training.steps:
            spent = _checkpoint(out, model, optimizer, generator, setup, step, spent, start)
            start = time.perf_counter()
            say(f"step {step} of {training.steps}: loss {float(loss.detach()):.4f}, {spent / 60:.1f} min so far")
    spent = _checkpoint(out, model, optimizer, generator, setup, step, spent, start)
    if step < training.steps:
        say(f"stopped at step {step} of {training.steps} (--max-minutes); run the same command to resume")
        return TrainedAutoencoder(model, step, spent, None, True)
    return _finish(model.eval(), train, held, out, step, spent, training, source, say, setup)


def _start_from(model: Autoencoder, source: Autoencoder, name: str) -> None:
    """``source``'s weights in ``model``: the same network (its latent constants are measured again at the end)."""
    mine, theirs = config_to_dict(model.config), config_to_dict(source.config)
    differ = [k for k in mine if k not in ("name", "latent_shift", "latent_scale") and mine[k] != theirs.get(k)]
    if differ:
        raise InvalidInputError(f"--init {name}: its network is not the one asked for ({differ[0]}"
                                f" {theirs.get(differ[0])!r} against {mine[differ[0]]!r}); leave out the network"
                                " options to take its own")
    model.load_state_dict(source.state_dict())


def _split(images: Tensor, training: AutoencoderTraining,
           focus: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """The training images, the ``held_out`` ones (at most a tenth), drawn with the seed, and the indices of the
    training images in ``focus`` (None without one)."""
    order = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(training.seed))
    aside = min(training.held_out, images.shape[0] // 10)
    if images.shape[0] - aside < training.batch_size:
        raise InvalidInputError(f"{images.shape[0]} images to train on, fewer than a batch of {training.batch_size}")
    chosen = None
    if focus is not None:
        chosen = focus[order[aside:]].nonzero().flatten()
        if chosen.numel() == 0:
            raise InvalidInputError("no training image is in the focus (--focus): name a combination the images have")
    return images[order[aside:]], images[order[:aside]], chosen


def _batch(n: int, chosen: Tensor | None, training: AutoencoderTraining, generator: torch.Generator) -> Tensor:
    """One batch's indices into the training images: ``focus_share`` of them from ``chosen``, the rest from all."""
    k = 0 if chosen is None else round(training.focus_share * training.batch_size)
    rest = torch.randint(n, (training.batch_size - k,), generator=generator)
    if not k:
        return rest
    return torch.cat([chosen[torch.randint(chosen.numel(), (k,), generator=generator)], rest])


def _resume(out: Path, model: Autoencoder, optimizer: torch.optim.Optimizer, generator: torch.Generator,
            setup: dict[str, Any], say: Callable[[str], None]) -> tuple[int, float]:
    """The step and seconds of ``out``'s checkpoint, loaded into the model, Adam and the generator; ``(0, 0.0)``
    without one. A checkpoint of other settings is one line."""
    from composable_ebm.training.checkpoint import load_checkpoint

    path = out / "checkpoint.pt"
    if not path.is_file():
        return 0, 0.0
    state = load_checkpoint(path)
    if _comparable(state.get("setup")) != _comparable(setup):
        raise InvalidInputError(f"{path} was trained with other settings ({state.get('setup')}); resume with the same"
                                " command (--steps may differ), or choose another --out")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    say(f"resumed from step {state['step']}")
    return int(state["step"]), float(state["seconds"])


def _comparable(setup: Any) -> Any:
    """A run's settings as a resume compares them: the training settings with the defaults of any a checkpoint
    predates, and without ``steps``, which a resumed run may change (the cosine decay follows the new count; a
    count the checkpoint has reached finishes the run at once)."""
    if not isinstance(setup, dict) or not isinstance(setup.get("training"), dict):
        return setup
    from composable_ebm.configs import config_from_dict

    try:
        training = config_from_dict(AutoencoderTraining, setup["training"])
    except (InvalidInputError, TypeError, ValueError):
        return setup
    return {**setup, "training": {**config_to_dict(training), "steps": None}}


def _checkpoint(out: Path, model: Autoencoder, optimizer: torch.optim.Optimizer, generator: torch.Generator,
                setup: dict[str, Any], step: int, spent: float, start: float) -> float:
    """Write ``out/checkpoint.pt`` atomically; returns the seconds spent in every sitting so far."""
    from composable_ebm.training.checkpoint import save_atomic

    spent += time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
                     "step": step, "seconds": spent, "setup": setup}, out / "checkpoint.pt")
    return spent


def _finish(model: Autoencoder, train: Tensor, held: Tensor, out: Path, step: int, spent: float,
            training: AutoencoderTraining, source: str, say: Callable[[str], None],
            setup: dict[str, Any]) -> TrainedAutoencoder:
    """Standardise the latents on (up to 2,000) training rows, measure the held-out PSNR, save ``out/model``."""
    from composable_ebm.model_cards import model_card
    from composable_ebm.models import save_model

    device = next(model.parameters()).device
    with_latent_statistics(model, train[:2000].to(device).float() / 255)
    quality = None
    if held.shape[0]:
        with torch.no_grad():
            x = held.to(device).float() / 255
            quality = psnr(torch.cat([model.reconstruct(x[i:i + 256]) for i in range(0, x.shape[0], 256)]), x)
    started = f", from the weights of `{setup['init']}`" if "init" in setup else ""
    focused = (f", {training.focus_share:.0%} of each batch drawn from the {setup['focus']:,} of them in its focus"
               if "focus" in setup else "")
    notes = (f"Trained for {step} steps of batch {training.batch_size} on {train.shape[0]:,} images ({source}){started}"
             f"{focused} in {spent / 60:.1f} minutes"
             + (f"; reconstructs {held.shape[0]} held-out images at {quality:.1f} dB PSNR" if quality is not None
                else "") + ".")
    save_model(model.cpu(), out / "model", card=model_card(model, location=str(out / "model"), notes=notes))
    say(f"trained {step} steps in {spent / 60:.1f} min" + (f"; held-out PSNR {quality:.1f} dB" if quality else "")
        + f"; model in {out / 'model'}")
    return TrainedAutoencoder(model, step, spent, quality, False)


def checkpoint_autoencoder(run: str | Path) -> tuple[Autoencoder, int]:
    """The autoencoder of a run's latest checkpoint (its latents not yet standardised: those constants are measured
    when training finishes), and its step: a run in progress, measured without stopping it."""
    from composable_ebm.configs import config_from_dict
    from composable_ebm.training.checkpoint import load_checkpoint

    path = Path(run) / "checkpoint.pt"
    if not path.is_file():
        raise InvalidInputError(f"{run} holds no checkpoint.pt: not a cebm train-autoencoder run, or one that never"
                                " saved")
    state = load_checkpoint(path)
    try:
        model = Autoencoder(config_from_dict(AutoencoderConfig, state["setup"]["config"]))
        model.load_state_dict(state["model"])
    except (KeyError, TypeError, RuntimeError) as err:
        raise InvalidInputError(f"{path} is not a checkpoint of cebm train-autoencoder ({err})") from err
    return model.eval(), int(state["step"])
