"""``cebm train``, ``export``, ``data`` and ``train-classifier``: runs, model folders and the data they read."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from composable_ebm.cli.common import DeviceOpt, OverwriteOpt, _device, _parse_bindings, app
from composable_ebm.errors import InvalidInputError



@app.command()
def train(
    recipe: Annotated[Path, typer.Argument(help="A TOML recipe (see recipes/).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder: checkpoint, log, model.")],
    steps: Annotated[Optional[int], typer.Option(help="Override the recipe's number of steps.")] = None,
    resume: Annotated[bool, typer.Option(help="Resume from OUT/checkpoint.pt if it exists.")] = True,
    overwrite: Annotated[bool, typer.Option(
        help="With --no-resume: start a new run in an OUT that holds another run's files (they are moved to "
             "OUT/replaced-<time>/, never mixed with the new run's).")] = False,
    allow_config_change: Annotated[
        bool, typer.Option(help="Resume even if the recipe's training settings differ from the checkpoint's; with --init, start "
                              "from a model whose [model] settings differ where its weights' shapes do not, or from "
                              "one without attributes (an unconditional base: the condition's weights start at "
                              "zero).")
    ] = False,
    device: DeviceOpt = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    license: Annotated[Optional[str], typer.Option(
        help="License of the trained model, written into its card (e.g. mit, apache-2.0; default: none).")] = None,
    init: Annotated[Optional[str], typer.Option(
        help="Start a new run from this model's weights (a folder, bundled name or org/name; a fresh optimiser): "
             "fine-tuning. A run resumed from its checkpoint ignores it.")] = None,
    max_minutes: Annotated[Optional[float], typer.Option(
        "--max-minutes", min=0.0, help="Stop after this many minutes of training, saving the checkpoint and the model "
                                       "(the same command resumes).")] = None,
    precision: Annotated[Optional[str], typer.Option(
        help="float32 or bfloat16: the arithmetic of a noise-conditioned model's denoising loss ([trainer] "
             "precision; default: the recipe's). A resumed run may change it.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", metavar="TABLE.KEY=VALUE",
        help="Change one recipe setting over the file's (repeatable; VALUE in TOML, or a bare word), e.g. --set "
             "trainer.batch_size=512 --set trainer.lr=3e-4. The card lists them; resume with the same ones.")] = None,
) -> None:
    """Train an energy with Algorithm 1 and save its EMA weights to OUT/model.

    Ctrl-C (SIGINT), SIGTERM and --max-minutes stop after the step in progress and save the checkpoint and the model;
    the same command resumes. `cebm export OUT` makes a model folder from the checkpoint of any run.

    \b
    Example: cebm train recipes/shapes-color.toml --out runs/color
    """
    import signal

    from composable_ebm.runs import train_recipe

    run = train_recipe(recipe, out, steps=steps, resume=resume, overwrite=overwrite,
                       allow_config_change=allow_config_change, device=_device(device), progress=progress,
                       license=license, init=init, echo=typer.echo, max_minutes=max_minutes, precision=precision,
                       settings=set_ or ())
    if run.stopped is not None and run.stopped.startswith("SIG"):
        raise typer.Exit(128 + int(getattr(signal, run.stopped)))  # the shell's status for a signalled command


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="A run folder (cebm train --out), finished or not.")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Model folder to write (default: RUN/model).")] = None,
    recipe: Annotated[Optional[Path], typer.Option(
        help="The run's recipe, for a run written before runs kept their network.json.")] = None,
    license: Annotated[Optional[str], typer.Option(help="License written into the model's card.")] = None,
    overwrite: OverwriteOpt = False,
    ema_std: Annotated[Optional[float], typer.Option(
        "--ema-std", help="Instead of the run's EMA, the average of this relative std (0-0.28] made after training "
                          "from the run's post-hoc averages ([trainer] posthoc_ema).")] = None,
    ema_step: Annotated[Optional[int], typer.Option(
        "--ema-step", help="With --ema-std: the step it is made at, one the averages were written at (default: the "
                           "last).")] = None,
) -> None:
    """Write a model folder from the EMA weights of a run's latest checkpoint, without resuming it.

    \b
    Example: cebm export runs/color --out models/color
             cebm export runs/color --ema-std 0.07 --out models/color-ema007
    """
    from composable_ebm.runs import export_run

    written = export_run(run, out, recipe=recipe, license=license, overwrite=overwrite, ema_std=ema_std,
                         ema_step=ema_step)
    typer.echo(f"wrote {written}")


@app.command("data")
def data_command(
    name: Annotated[str, typer.Argument(help="A dataset that is drawn, not read (faces, shapes ...).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write (a new one).")],
    n: Annotated[Optional[int], typer.Option("-n", "--n", min=1, max=1 << 24, help="Number of images.")] = None,
    seed: Annotated[Optional[int], typer.Option(min=0, help="Seed of the draw.")] = None,
    size: Annotated[Optional[int], typer.Option(min=4, help="Image side.")] = None,
    style: Annotated[Optional[str], typer.Option(
        help="How the faces are drawn: pixel-art (16 px designs; smiling, glasses, hat, hair) or lorelei (line art"
             " for 64 px; smiling, glasses, beard, hair). Faces only.")] = None,
    background: Annotated[Optional[str], typer.Option(
        help="What is behind each face: fixed (one flat colour) or random (a flat colour drawn per face; the same"
             " faces). Faces only.")] = None,
) -> None:
    """Write a drawn dataset as an image folder with a CelebA-format attribute table (the folder dataset reads it).

    \b
    Example: cebm data faces --out data/rendered-faces --n 64 --seed 0
             cebm data faces --style lorelei --size 64 --out data/faces-64 --n 64
    """
    from composable_ebm.configs import config_from_dict
    from composable_ebm.data import DATASETS

    cls = DATASETS.get(name, "cebm data: ")
    given = {k: v for k, v in {"n": n, "seed": seed, "size": size, "style": style, "background": background}.items()
             if v is not None}
    config = config_from_dict(cls, given)
    typer.echo(f"wrote {config.render(out)}")


@app.command("train-classifier")
def train_classifier_command(
    folder: Annotated[Path, typer.Argument(help="An image folder with a CelebA-format attribute table.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Classifier folder to write.")],
    attributes: Annotated[list[str], typer.Option(
        "--attribute", "-a", help="A column to read (repeatable; default: every column).")] = [],  # noqa: B006
    attribute_file: Annotated[str, typer.Option(help="The table, relative to FOLDER.")] = "list_attr_celeba.txt",
    size: Annotated[int, typer.Option(min=8, help="Image side the classifier reads (your models' size).")] = 32,
    steps: Annotated[int, typer.Option(min=1, help="Training steps (Adam, batch 64).")] = 1500,
    held_out: Annotated[float, typer.Option(
        min=0.0, max=0.5, help="Share of the rows kept aside to measure accuracy.")] = 0.1,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the split and the training.")] = 0,
    pooling: Annotated[str, typer.Option(
        help="What the heads read of the last feature map: mean (over positions) or flatten (the whole map: for"
             " aligned images whose attributes are small and in one place, such as faces at 64 px).")] = "mean",
    architecture: Annotated[str, typer.Option(
        help="The network: plain (conv, group norm, SiLU, average pool) or residual (residual blocks, ReLU,"
             " stride-2 convs): a second judge of another network misses other samples.")] = "plain",
    width: Annotated[int, typer.Option(min=8, help="Channels of the first stage (a multiple of 8), doubled at each"
                                       " further one.")] = 32,
    name: Annotated[Optional[str], typer.Option(help="The classifier's name (default: FOLDER's name + -classifier).")]
        = None,
    device: DeviceOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Train an attribute classifier on a folder's attributes, so `cebm eval compose` can score your compositions.

    \b
    Example: cebm train-classifier data/faces --out runs/faces-classifier -a Smiling -a Hat --size 16
    """
    from composable_ebm.evaluation.classifier import fit_folder_classifier

    result = fit_folder_classifier(folder, out, attributes or None, attribute_file, size, steps, held_out, seed,
                                   _device(device), overwrite=overwrite, pooling=pooling,
                                   architecture=architecture, width=width, name=name)
    for attr, acc in result.accuracy.items():
        typer.echo(f"{attr}: {acc:.3f} read right on {result.held_out} held-out images")
    typer.echo(f"wrote {result.folder}")


@app.command("train-autoencoder")
def train_autoencoder_command(
    folder: Annotated[Path, typer.Argument(help="An image folder with a CelebA-format attribute table.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder: checkpoint.pt, then model/.")],
    size: Annotated[int, typer.Option(min=8, help="Image side it encodes.")] = 64,
    latent_channels: Annotated[Optional[int], typer.Option(
        min=1, help="Channels of a latent (default 4, or --init's).")] = None,
    widths: Annotated[Optional[str], typer.Option(
        help="Channels at each resolution, full first; each further width halves the side (three widths: f4;"
             " default 32,48,64, or --init's).")] = None,
    blocks: Annotated[Optional[int], typer.Option(
        min=0, help="Residual blocks at each resolution (default 1, or --init's).")] = None,
    steps: Annotated[int, typer.Option(min=1, help="Training steps (Adam, cosine decay); a resumed run may change them"
                                       " (a count it has reached finishes it at once).")] = 6000,
    batch_size: Annotated[int, typer.Option(min=1)] = 32,
    lr: Annotated[float, typer.Option(min=0.0)] = 1e-3,
    edge_weight: Annotated[float, typer.Option(
        min=0.0, help="Weight of the L1 error of the image's horizontal and vertical differences (thin lines).")] = 1.0,
    worst_weight: Annotated[float, typer.Option(
        min=0.0, help="Weight of the mean error of each image's worst reconstructed pixels (--worst-share of them):"
        " thin lines a blur erases.")] = 0.0,
    worst_share: Annotated[float, typer.Option(min=0.001, max=1.0)] = 0.02,
    exclude: Annotated[list[str], typer.Option(
        help="attr=value,attr=value: a combination whose images are left out (repeatable), e.g. the held-out one.")]
        = [],  # noqa: B006
    focus: Annotated[list[str], typer.Option(
        help="attr=value,attr=value: a combination whose images --focus-share of each batch is drawn from"
             " (repeatable: any of them), e.g. where the autoencoder's worst cell is.")] = [],  # noqa: B006
    focus_share: Annotated[float, typer.Option(min=0.0, max=1.0, help="The share of each batch drawn from --focus.")]
        = 0.0,
    init: Annotated[Optional[str], typer.Option(
        help="An autoencoder (bundled name or folder) whose weights the run starts from, to fine-tune it; the"
             " network is its own. Latent models of the old latents are trained again over the new ones.")] = None,
    held_out: Annotated[int, typer.Option(min=0, help="Images kept aside to measure the PSNR.")] = 500,
    checkpoint_every: Annotated[int, typer.Option(min=1)] = 100,
    max_minutes: Annotated[Optional[float], typer.Option(
        help="Stop after this many minutes, checkpointed; the same command resumes.")] = None,
    seed: Annotated[int, typer.Option(min=0)] = 0,
    device: DeviceOpt = None,
) -> None:
    """Train a small autoencoder (Conv-ReLU residual blocks, stride-2 stages) whose latents latent energies model.

    \b
    Example: cebm train-autoencoder data/faces --out runs/faces-autoencoder --size 16 --exclude Smiling=yes,Hat=yes
             cebm train-autoencoder data/faces --out runs/ae-tuned --size 16 --init runs/faces-autoencoder/model
             --focus Hat=yes --focus-share 0.5 --steps 500 --lr 3e-4
    """
    from composable_ebm.training.autoencoder import AutoencoderTraining, fit_autoencoder

    config, start = _autoencoder_config(folder, size, init, latent_channels, widths, blocks)
    training = AutoencoderTraining(steps=steps, batch_size=batch_size, lr=lr, edge_weight=edge_weight,
                                   worst_weight=worst_weight, worst_share=worst_share, focus_share=focus_share,
                                   held_out=held_out, checkpoint_every=checkpoint_every, seed=seed)
    images, chosen, source = _autoencoder_images(folder, size, exclude, focus)
    fit_autoencoder(images, out, config, training, source, max_minutes, _device(device), echo=typer.echo,
                    focus=chosen, init=None if start is None else (start, init))


def _autoencoder_config(folder: Path, size: int, init: str | None, latent_channels: int | None, widths: str | None,
                        blocks: int | None) -> tuple[Any, Any]:
    """``cebm train-autoencoder``'s network, and the autoencoder ``--init`` names (None without one): its network
    unless an option says otherwise, or the defaults."""
    import dataclasses

    from composable_ebm.models import load_model
    from composable_ebm.nets.autoencoder import Autoencoder, AutoencoderConfig

    try:
        parsed = None if widths is None else tuple(int(w) for w in widths.split(","))
    except ValueError:
        raise InvalidInputError(f"--widths takes whole numbers separated by commas (e.g. 32,48,64), got {widths!r}")
    start = None if init is None else load_model(init)
    if start is not None and not isinstance(start, Autoencoder):
        raise InvalidInputError(f"--init {init} is a {type(start).__name__}, not an autoencoder; name one"
                                " (cebm train-autoencoder makes them)")
    given = {"latent_channels": latent_channels, "widths": parsed, "blocks": blocks}
    config = dataclasses.replace(AutoencoderConfig() if start is None else start.config,
                                 name=f"{folder.name}-autoencoder", image_size=size,
                                 **{k: v for k, v in given.items() if v is not None})
    return config, start


def _autoencoder_images(folder: Path, size: int, exclude: list[str], focus: list[str]) -> tuple[Any, Any, str]:
    """The folder's images without the ``--exclude`` combinations, which of them are in a ``--focus`` one (None
    without), and what they are, for the card."""
    from composable_ebm.data.base import combination_mask
    from composable_ebm.data.folder import attribute_folder

    left_out = [_parse_bindings([e]) for e in exclude]
    data = attribute_folder(folder, image_size=size)
    try:
        kept = data.without(left_out) if left_out else data
        chosen = (combination_mask(kept.labels, kept.attributes, [_parse_bindings([f]) for f in focus]) if focus
                  else None)
    except ValueError as err:
        raise InvalidInputError(f"--exclude or --focus: {err}") from err
    source = f"`{folder.name}`" + (f" without {'; '.join(', '.join(f'{a}={v}' for a, v in c.items()) for c in left_out)}"
                                   if left_out else "")
    if focus:
        source += f"; focus: {' or '.join(focus)}"
    return kept.images, chosen, source
