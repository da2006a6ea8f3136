"""``cebm eval compose``, ``fid`` and ``ood``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from composable_ebm.cli.common import (
    MAX_SAMPLES, CountOpt, DeviceOpt, ExpressionCommand, FormOpt, RefreshOpt, RoundsOpt, StepSizeOpt, StepsOpt, _device,
    _load_classifier, _load_energy, _load_expression, _overrides, _parse_bindings, eval_app,
)
from composable_ebm.errors import InvalidInputError

if TYPE_CHECKING:
    import torch


@eval_app.command("compose", cls=ExpressionCommand)
def eval_compose(
    expression: Annotated[str, typer.Argument(help="Composition expression, as for `cebm compose`.")],
    classifier: Annotated[str, typer.Option(help="Attribute classifier (folder or name).")],
    target: Annotated[list[str], typer.Option("--target", "-t", help="attr=value the samples should show.")],
    n: CountOpt = 64,
    seed: Annotated[int, typer.Option(min=0, max=2**63 - 1, help="Random seed.")] = 0,
    steps: StepsOpt = None,
    rounds: RoundsOpt = None,
    step_size: StepSizeOpt = None,
    device: DeviceOpt = None,
    refresh: RefreshOpt = False,
    form: FormOpt = "auto",
) -> None:
    """Compositional accuracy: how often the classifier finds every target attribute in composed samples.

    \b
    Example: cebm eval compose "shapes-color[color=red] + shapes-shape[shape=circle]" --classifier shapes-classifier -t color=red -t shape=circle
    """
    from composable_ebm.evaluation import compositional_accuracy
    from composable_ebm.pipeline import plan, run

    dev = _device(device)
    energy = _load_expression(expression, dev, refresh)
    clf = _load_classifier(classifier, dev, refresh)
    chosen = plan(energy, form, **_overrides(steps=steps, rounds=rounds, step_size=step_size))
    samples = run(chosen, n, seed=seed, progress=True).samples
    score = compositional_accuracy(samples, clf, _parse_bindings(target))
    typer.echo(json.dumps({"expression": chosen.energy.expression(), "n": score.n, "per_attribute": score.per_attribute,
                           "joint": score.joint}, indent=2))


@eval_app.command("fid")
def eval_fid(
    real: Annotated[Path, typer.Argument(help="Folder of real images (.png, .jpg, .jpeg, .webp).")],
    fake: Annotated[Path, typer.Argument(help="Folder of generated images.")],
    features: Annotated[str, typer.Option(help="Inception v3 weights file (.pth or .safetensors), or an attribute "
                                                "classifier (folder or name) whose penultimate features are used.")],
    limit: Annotated[Optional[int], typer.Option(help="Use at most this many images of each folder.")] = None,
    batch_size: Annotated[int, typer.Option(help="Images per feature batch.")] = 100,
    device: DeviceOpt = None,
) -> None:
    """FID between two image folders under a feature network you supply.

    \b
    Example: cebm eval fid data/real samples/ --features shapes-classifier
    """
    from composable_ebm.evaluation import (
        AttributeClassifier,
        InceptionV3Features,
        extract_features,
        frechet_distance,
        gaussian_stats,
    )
    import torch

    from composable_ebm.models import load_model
    from composable_ebm.images import load_image_folder

    dev = _device(device)
    if batch_size < 1:
        raise InvalidInputError(f"--batch-size must be >= 1, got {batch_size}")
    if Path(features).is_file():
        size, feature_fn = None, InceptionV3Features(features).to(dev)
    else:
        network = load_model(features, dev)
        if not isinstance(network, AttributeClassifier):
            raise InvalidInputError(f"--features {features}: a {type(network).__name__}; valid choices: an Inception v3"
                                    " weights file or an attribute classifier")
        size, feature_fn = network.config.image_size, network.features
    stats, counts = [], []
    for folder in (real, fake):
        images = load_image_folder(folder, size=size, limit=limit)
        with torch.no_grad():
            stats.append(gaussian_stats(extract_features(images, feature_fn, batch_size, device=dev, progress=True)))
        counts.append(images.shape[0])
    value = frechet_distance(*stats[0], *stats[1])
    typer.echo(json.dumps({"fid": value, "real": counts[0], "fake": counts[1], "features": features}))


@eval_app.command("ood")
def eval_ood(
    model: Annotated[str, typer.Argument(help="Model folder, bundled name or org/name.")],
    in_data: Annotated[str, typer.Option(
        "--in", help="In-distribution data: a registered dataset (shapes, digits, faces ...) or a folder of images.")],
    out_data: Annotated[str, typer.Option(
        "--out", help="Out-of-distribution data: a registered dataset, noise, or a folder of images.")],
    condition: Annotated[list[str], typer.Option("--condition", "-c", help="attr=value (repeatable).")] = [],  # noqa: B006
    n: Annotated[int, typer.Option("-n", min=1, max=MAX_SAMPLES,
                                   help="Images of each side (a folder: at most this many).")] = 500,
    seed: int = 0,
    device: DeviceOpt = None,
) -> None:
    """OOD AUROC of -E(x) between two datasets or image folders (resized to the model's input shape).

    A registered dataset is drawn with its own defaults and, where its settings have them, n images at the model's
    size from the seed (the out side from seed + 1). A conditional model trained without label dropout needs its
    attributes bound (-c).

    \b
    Example: cebm eval ood shapes-color -c color=red --in shapes --out noise
    """
    from composable_ebm.evaluation import ood_auroc

    energy = _load_energy(model, _device(device))
    bindings = _parse_bindings(condition)
    if bindings:
        energy = energy.condition(**bindings)
    shape, space = tuple(energy.sample_shape), energy.latent_space
    inside, outside = _ood_images(in_data, shape, n, seed), _ood_images(out_data, shape, n, seed + 1)
    if space is not None:  # a latent energy scores the images' latents
        inside, outside = space.encode(inside), space.encode(outside)
    typer.echo(json.dumps({"auroc": ood_auroc(energy, inside, outside), "n": n}))


def _ood_images(name: str, shape: tuple[int, int, int], n: int, seed: int) -> torch.Tensor:
    """``n`` images of ``name`` (noise, a folder, or a registered dataset drawn at ``seed``) in ``shape``: resized,
    grey read as its luminance where the model takes one channel."""
    import torch
    import torch.nn.functional as F

    from composable_ebm.images import load_image_folder

    c, h, w = shape
    if name == "noise":
        x = torch.rand(n, c, h, w, generator=torch.Generator().manual_seed(seed))
    elif Path(name).is_dir():
        x = load_image_folder(name, size=h, limit=n)
    else:
        x = _registered_images(name, n, h, seed)
    if c == 1 and x.shape[1] == 3:  # a grey model reads the images' luminance
        x = (0.299 * x[:, :1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:]).clamp(0, 1)
    x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False) if x.shape[-1] != w else x
    return x.expand(-1, c, -1, -1) if x.shape[1] == 1 and c == 3 else x[:, :c]


def _registered_images(name: str, n: int, size: int, seed: int) -> torch.Tensor:
    """``n`` images of a registered dataset drawn with its own defaults and, where its settings have them, ``n``,
    ``size`` and ``seed``; one line for a name that is none, or a dataset of no images."""
    import dataclasses

    import torch

    from composable_ebm.configs import config_from_dict
    from composable_ebm.data import DATASETS

    names = DATASETS.names()
    if name not in names:
        raise InvalidInputError(f"unknown data {name!r}; valid choices: a registered dataset ({', '.join(names)}),"
                                " noise, or a folder of images")
    cls = DATASETS.get(name)
    fields = {f.name for f in dataclasses.fields(cls)}
    data = config_from_dict(cls, {k: v for k, v in {"n": n, "size": size, "seed": seed}.items() if k in fields}).build()
    x = getattr(data, "images", None)
    if x is None or x.ndim != 4:
        raise InvalidInputError(f"{name} is not a dataset of images; valid choices: an image dataset"
                                f" ({', '.join(names)}), noise, or a folder of images")
    x = x[:n]
    return x.float() / 255 if x.dtype == torch.uint8 else x.float()

