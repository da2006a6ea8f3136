"""The Shapes dataset: procedural single objects on a plain background, with what only it needs.

Besides the data (`shapes`, `render_shapes`) and its recipe settings (`ShapesData`), this file registers the input
transforms the bundled Shapes models were trained with (`composable_ebm.nets.transforms`): ``channel-sort`` and
``shapes-palette-order``, which make a network's towers blind to which colour channel, or which of this palette's
colours, an object has.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from composable_ebm.configs import MAX_IMAGE_SIZE, check_size
from composable_ebm.data.base import DataConfig, ImageDataset, check_holdout, combination_mask, dataset
from composable_ebm.nets.transforms import TRANSFORMS

SHAPES_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "shape": ("circle", "square", "triangle"),
    "color": ("red", "green", "blue"),
    "size": ("small", "large"),
    "position": ("left", "right"),
}
COLOURS = {"red": (0.90, 0.12, 0.12), "green": (0.12, 0.80, 0.15), "blue": (0.15, 0.25, 0.95)}
"""The palette's RGB values, by colour name."""
_RGB = torch.tensor([COLOURS[c] for c in SHAPES_ATTRIBUTES["color"]])
_BACKGROUND = 0.08
_HALF_EXTENT = (0.17, 0.27)  # object half-size as a fraction of the image, small / large
_CENTRE_X = (0.30, 0.70)  # left / right


def _shape_sdf(kind: Tensor, px: Tensor, py: Tensor, cx: Tensor, cy: Tensor, r: Tensor) -> Tensor:
    """Signed distance ``(N, H, W)`` to a circle (0), square (1) or upward triangle (2) of half-size ``r``."""
    dx, dy = px - cx, py - cy
    circle = torch.sqrt(dx * dx + dy * dy) - r
    square = torch.maximum(dx.abs(), dy.abs()) - 0.85 * r  # same visual area as the circle, roughly
    # equilateral triangle with circumradius 1.25 r, pointing up (y grows downwards in images)
    k = math.sqrt(3.0)
    s = 1.25 * r * k / 2  # half side length
    qx, qy = dx.abs(), -dy + 0.25 * 1.25 * r  # centre the triangle's area
    tri = torch.maximum(qx * k / 2 + qy / 2 - s / k, -qy - s / k)
    return torch.where(kind == 0, circle, torch.where(kind == 1, square, tri))


def render_shapes(labels: Mapping[str, Tensor], size: int, generator: torch.Generator) -> Tensor:
    """Draw one anti-aliased object per image ``(N, 3, size, size)`` from attribute indices, with jitter."""
    n = labels["shape"].shape[0]
    jitter = lambda scale: scale * (2 * torch.rand(n, 1, 1, generator=generator) - 1)  # noqa: E731
    half = torch.tensor(_HALF_EXTENT)[labels["size"]].view(n, 1, 1) * (1 + jitter(0.08))
    cx = torch.tensor(_CENTRE_X)[labels["position"]].view(n, 1, 1) + jitter(0.05)
    cy = 0.5 + jitter(0.08)
    ticks = (torch.arange(size) + 0.5) / size
    py, px = ticks.view(1, size, 1), ticks.view(1, 1, size)
    sdf = _shape_sdf(labels["shape"].view(n, 1, 1), px, py, cx, cy, half)  # (N, H, W), in image units
    coverage = (0.5 - sdf * size).clamp(0, 1).unsqueeze(1)  # one-pixel anti-aliasing ramp
    color = _RGB[labels["color"]].view(n, 3, 1, 1)
    return _BACKGROUND * (1 - coverage) + color * coverage


def balanced_weights(table: Mapping[str, Tensor], allowed: Tensor, iterations: int = 500) -> Tensor:
    """Weights over the combinations ``table`` lists (each attribute's value index per combination), zero where
    ``allowed`` is False, under which every attribute's values are equally frequent: iterative proportional
    fitting from uniform weights on the allowed combinations (of such weights, the closest to uniform in KL
    divergence). Raises ``ValueError`` when the allowed combinations cannot be balanced (a value with no allowed
    combination)."""
    w = allowed.double()
    for attribute, index in table.items():
        counts = torch.bincount(index[allowed], minlength=int(index.max()) + 1)
        if (counts == 0).any():
            raise ValueError(f"no allowed combination has {attribute} value {int(torch.nonzero(counts == 0)[0])}:"
                             " the split cannot be balanced")
    for _ in range(iterations):
        for index in table.values():
            k = int(index.max()) + 1
            marginal = torch.zeros(k, dtype=w.dtype).index_add_(0, index, w) / w.sum()
            w = w / (k * marginal[index])
    return (w / w.sum()).float()


def shapes(
    n: int,
    size: int = 32,
    seed: int = 0,
    holdout: Sequence[Mapping[str, str]] = (),
    split: str = "train",
    balance: bool = False,
) -> ImageDataset:
    """The Shapes dataset: ``n`` images of one object each, deterministic in ``seed``.

    Args:
        holdout: attribute combinations (e.g. ``[{"color": "red", "shape": "circle"}]``) that
            the ``train`` split never contains; the ``heldout`` split contains only them.
        split: ``train`` (combinations not held out), ``heldout`` (only held-out ones) or ``all``.
        balance: draw the split's combinations with the weights that make every attribute's values equally
            frequent (`balanced_weights`), as in the whole data, instead of uniformly: with red circles held out,
            a uniform ``train`` split has circles in 0.25 of its images and red in 0.25, not 1 in 3.
    """
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"unknown split {split!r}; valid choices: ['train', 'heldout', 'all']")
    combos = [dict(zip(SHAPES_ATTRIBUTES, c, strict=True)) for c in itertools.product(*SHAPES_ATTRIBUTES.values())]
    table = {a: torch.tensor([SHAPES_ATTRIBUTES[a].index(c[a]) for c in combos]) for a in SHAPES_ATTRIBUTES}
    held = combination_mask(table, SHAPES_ATTRIBUTES, holdout)
    allowed = {"train": ~held, "heldout": held, "all": torch.ones_like(held)}[split]
    if not allowed.any():
        raise ValueError(f"split {split!r} is empty with holdout {list(holdout)}")
    gen = torch.Generator().manual_seed(seed)
    if balance:
        pick = torch.multinomial(balanced_weights(table, allowed), n, replacement=True, generator=gen)
    else:
        pool = torch.nonzero(allowed).squeeze(1)
        pick = pool[torch.randint(pool.numel(), (n,), generator=gen)]
    labels = {a: table[a][pick] for a in SHAPES_ATTRIBUTES}
    images = render_shapes(labels, size, gen)
    return ImageDataset(images, labels, dict(SHAPES_ATTRIBUTES), "shapes", {"seed": seed, "holdout": list(holdout)})


@dataset("shapes")
@dataclass(frozen=True)
class ShapesData(DataConfig):
    """Recipe settings of the Shapes dataset (``[data] dataset = "shapes"``)."""

    n: int = 10000
    """number of images"""
    size: int = 32
    """image side"""
    seed: int = 0
    """seed of the procedural data"""
    holdout: tuple[dict[str, str], ...] = ()
    """attribute combinations kept out of training, e.g. ``[{color = "red", shape = "circle"}]``"""
    balance: bool = False
    """weight the training combinations so every attribute's values are equally frequent despite the held-out ones
    (red circles held out: circles and red 1 in 3 of the images, not 0.25)"""

    def __post_init__(self) -> None:
        check_size("ShapesData", "n", self.n, high=1 << 26)
        check_size("ShapesData", "size", self.size, low=4, high=MAX_IMAGE_SIZE)
        check_size("ShapesData", "seed", self.seed, low=0, high=2**62)
        check_holdout(self.holdout, SHAPES_ATTRIBUTES, "ShapesData")

    def build(self, base: Path | None = None) -> ImageDataset:
        """The training split."""
        return shapes(self.n, self.size, self.seed, holdout=self.holdout, balance=self.balance)

    def describe(self, base: Path | None = None) -> tuple[dict[str, tuple[str, ...]], tuple[int, ...]]:
        return dict(SHAPES_ATTRIBUTES), (3, self.size, self.size)


# ------------------------------------------------------------------------------------- input transforms
@TRANSFORMS.register("channel-sort")
class ChannelSort(nn.Module):
    """Each image's channels sorted by their mean, largest first, ``(B, C, H, W)``: the towers cannot tell which
    channel is which, so a shape model draws a red circle as readily as the green and blue ones it was trained on.

    The order is piecewise constant in ``x``, so gradients flow through the gather to the pixels; any permutation
    of an image's channels gives the same result.
    """

    def forward(self, x: Tensor) -> Tensor:
        order = x.detach().mean(dim=(2, 3)).argsort(dim=1, descending=True)  # (B, C)
        return x.gather(1, order[:, :, None, None].expand_as(x))


SHAPES_PALETTE_ORDER = (COLOURS["green"], COLOURS["red"], COLOURS["blue"])
"""The palette in the order `ShapesPaletteOrder` ranks it (green, red, blue): the first colour is the one every
object becomes, so the order is part of what a trained model saw."""


@TRANSFORMS.register("shapes-palette-order")
class ShapesPaletteOrder(nn.Module):
    """Each image with the Shapes palette's colours in a canonical order, ``(B, 3, H, W)``: what ``channel-sort``
    does to the channels, done to the palette's colours.

    Each pixel is written in palette coordinates, ``x = b + sum_k a_k (c_k - b)`` (``b`` the background, ``c_k``
    the palette's colours, a basis), the coordinates ``a_k`` are ordered by their mean over the image, largest
    first, and the pixel is drawn again from the ordered ones. An object in any palette colour, its anti-aliased
    edges included, becomes the same object in the first colour; the map is invertible, so whatever else an
    image holds (a second colour, noise) stays in it, moved with the colours. The basis and its inverse are
    buffers that follow the module's device and are not saved.
    """

    def __init__(self, palette: Sequence[Sequence[float]] = SHAPES_PALETTE_ORDER,
                 background: Sequence[float] = (_BACKGROUND,) * 3) -> None:
        super().__init__()
        bg = torch.tensor(background, dtype=torch.float64)
        basis = (torch.tensor(palette, dtype=torch.float64) - bg).T  # (C, K): colour k's line from the background
        self.register_buffer("background", bg.float()[None, :, None, None], persistent=False)
        self.register_buffer("basis", basis.float(), persistent=False)
        self.register_buffer("inverse", torch.linalg.inv(basis).float(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[1] != 3:
            raise ValueError(f"shapes-palette-order takes RGB images (B, 3, H, W), got {tuple(x.shape)}")
        bg = self.background.to(x.dtype)
        coords = torch.einsum("kc,bchw->bkhw", self.inverse.to(x.dtype), x - bg)
        order = coords.detach().mean(dim=(2, 3)).argsort(dim=1, descending=True)  # (B, K)
        coords = coords.gather(1, order[:, :, None, None].expand_as(coords))
        return torch.einsum("ck,bkhw->bchw", self.basis.to(x.dtype), coords) + bg
