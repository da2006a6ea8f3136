"""Image datasets with attributes, all in memory: the trainer's ``TrainingData``.

- `shapes`: procedural single objects on a plain background (any size, seeded), with
  attribute combinations that can be held out of the training split;
- `digits`: scikit-learn's bundled 8x8 handwritten digits, upsampled;
- `attribute_folder`: a folder of images with a CelebA-format attribute table;
- `cifar10`: CIFAR-10 from a local copy of its binary version.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from composable_ebm.energy import value_index
from composable_ebm.errors import InvalidInputError
from composable_ebm.images import as_float_images, bomb_message


@dataclass
class ImageDataset:
    """Images ``(N, C, H, W)`` (float in ``[0, 1]`` or uint8) with attribute labels.

    ``attributes`` maps each attribute to its value names; ``labels[attr]`` holds value
    indices ``(N,)``. Indexing returns ``(image, {attr: index})`` for torch data loaders.
    """

    images: Tensor
    labels: dict[str, Tensor]
    attributes: dict[str, tuple[str, ...]]
    name: str = "dataset"
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.images.shape[0]
        for attr, idx in self.labels.items():
            if attr not in self.attributes:
                raise ValueError(f"labels for unknown attribute {attr!r}; attributes: {sorted(self.attributes)}")
            if idx.shape != (n,):
                raise ValueError(f"labels[{attr!r}] must have shape ({n},), got {tuple(idx.shape)}")

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, dict[str, Tensor]]:
        return as_float_images(self.images[i]), {a: v[i] for a, v in self.labels.items()}

    def select_attributes(self, names: Sequence[str]) -> ImageDataset:
        """The same images with only the named attributes (e.g. one attribute per model)."""
        unknown = sorted(set(names) - set(self.attributes))
        if unknown:
            raise ValueError(f"unknown attribute(s) {unknown}; valid attributes: {sorted(self.attributes)}")
        return ImageDataset(
            self.images, {a: self.labels[a] for a in names}, {a: self.attributes[a] for a in names}, self.name,
            dict(self.info),
        )


# --------------------------------------------------------------------------- shapes
SHAPES_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "shape": ("circle", "square", "triangle"),
    "color": ("red", "green", "blue"),
    "size": ("small", "large"),
    "position": ("left", "right"),
}
_RGB = torch.tensor([[0.90, 0.12, 0.12], [0.12, 0.80, 0.15], [0.15, 0.25, 0.95]])
_BACKGROUND = 0.08
_HALF_EXTENT = (0.17, 0.27)  # object half-size as a fraction of the image, small / large
_CENTRE_X = (0.30, 0.70)  # left / right


def _combination_mask(labels: Mapping[str, Tensor], combos: Sequence[Mapping[str, str]]) -> Tensor:
    n = next(iter(labels.values())).shape[0]
    held = torch.zeros(n, dtype=torch.bool)
    for combo in combos:
        match = torch.ones(n, dtype=torch.bool)
        for attr, value in combo.items():
            index = value_index(SHAPES_ATTRIBUTES, attr, value)
            match &= labels[attr] == index
        held |= match
    return held


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
    combos = [dict(zip(SHAPES_ATTRIBUTES, c)) for c in itertools.product(*SHAPES_ATTRIBUTES.values())]
    table = {a: torch.tensor([SHAPES_ATTRIBUTES[a].index(c[a]) for c in combos]) for a in SHAPES_ATTRIBUTES}
    held = _combination_mask(table, holdout)
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


# --------------------------------------------------------------------------- digits
def digits(size: int = 16, channels: int = 1) -> ImageDataset:
    """scikit-learn's bundled 8x8 digits (1797 images, no download), upsampled to ``size``, label ``digit``."""
    try:
        from sklearn.datasets import load_digits
    except ModuleNotFoundError as err:  # an optional extra: say how to get it
        raise ModuleNotFoundError("the digits dataset needs scikit-learn: pip install 'composable_ebm[digits]'") from err
    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
    if size != 8:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)
    if channels == 3:
        x = x.expand(-1, 3, -1, -1).contiguous()
    elif channels != 1:
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    labels = {"digit": torch.tensor(bunch.target, dtype=torch.long)}
    return ImageDataset(x, labels, {"digit": tuple(str(d) for d in range(10))}, "digits")


# -------------------------------------------------------------------- attribute folders
def read_attribute_table(path: str | Path) -> tuple[list[str], dict[str, Tensor]]:
    """Parse a CelebA-format table (``list_attr_celeba.txt`` / CelebAMask-HQ annotation).

    Line 1: the number of images; line 2: attribute names; then ``file v1 v2 ...`` with
    values ``1`` / ``-1``. Returns the file names and ``{attribute: bool tensor}``.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InvalidInputError(f"{path}: not UTF-8 text (byte {err.start}); an attribute table is plain text") from err
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        raise InvalidInputError(f"{path}: an attribute table needs a count line and a names line")
    if not lines[0][0].isdigit():
        raise InvalidInputError(f"{path}:1: the first line is the number of images, got {lines[0][0][:40]!r}")
    count, names = int(lines[0][0]), lines[1]
    rows = lines[2:]
    if len(rows) != count:
        raise InvalidInputError(f"{path}: header says {count} images, found {len(rows)} rows")
    files, values = [], []
    for i, row in enumerate(rows, start=3):
        if len(row) != len(names) + 1:
            raise InvalidInputError(f"{path}:{i}: expected a file name and {len(names)} values, got {len(row)} fields")
        bad = [v for v in row[1:] if v not in ("1", "-1")]
        if bad:
            raise InvalidInputError(f"{path}:{i}: attribute values must be 1 or -1, got {bad[0][:40]!r}")
        files.append(row[0])
        values.append([v == "1" for v in row[1:]])
    table = torch.tensor(values, dtype=torch.bool).reshape(len(rows), len(names))
    return files, {name: table[:, j] for j, name in enumerate(names)}


CELEBA_COMPOSITION_ATTRIBUTES = {"young": "Young", "female": "-Male", "smiling": "Smiling", "wavy_hair": "Wavy_Hair"}
"""The paper's composition attributes, in `attribute_folder`'s notation (``-`` negates)."""


def attribute_folder(
    root: str | Path,
    attribute_file: str | Path,
    attributes: Mapping[str, str] = CELEBA_COMPOSITION_ATTRIBUTES,
    image_size: int = 64,
    limit: int | None = None,
) -> ImageDataset:
    """Images of a folder with a CelebA-format attribute table, as binary attributes.

    Args:
        root: folder holding the image files named in the table.
        attribute_file: the table (absolute, or relative to ``root``).
        attributes: our attribute name -> table column, ``-Column`` for its negation
            (``{"female": "-Male"}``). Each becomes a binary attribute with values ``("no", "yes")``.
        image_size: images are centre-cropped to a square and resized to this size.
        limit: read only the first ``limit`` rows.
    """
    from PIL import Image

    root = Path(root)
    table_path = Path(attribute_file)
    if not table_path.is_absolute():
        table_path = root / table_path
    files, table = read_attribute_table(table_path)
    labels = {}
    for ours, column in attributes.items():
        negate = column.startswith("-")
        column = column.lstrip("-")
        if column not in table:
            raise ValueError(f"attribute column {column!r} is not in {table_path}; columns: {sorted(table)}")
        labels[ours] = (table[column] ^ negate).long()
    files = files[:limit] if limit is not None else files
    images = torch.empty(len(files), 3, image_size, image_size, dtype=torch.uint8)
    for i, name in enumerate(files):  # loading happens once, before training
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(f"{table_path} lists {name!r}, but {path} does not exist")
        try:
            im = Image.open(path)
        except Image.DecompressionBombError as err:
            raise InvalidInputError(f"{path}: {bomb_message(err)}") from err
        with im:
            im = im.convert("RGB")
            side = min(im.size)
            left, top = (im.width - side) // 2, (im.height - side) // 2
            im = im.crop((left, top, left + side, top + side)).resize((image_size, image_size), Image.BICUBIC)
            images[i] = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8).view(image_size, image_size, 3).permute(2, 0, 1)
    labels = {a: v[: len(files)] for a, v in labels.items()}
    return ImageDataset(images, labels, {a: ("no", "yes") for a in attributes}, root.name)


# --------------------------------------------------------------------------- CIFAR-10
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def cifar10(root: str | Path, train: bool = True) -> ImageDataset:
    """CIFAR-10 from a local copy of its *binary* version (``cifar-10-batches-bin``).

    The binary version is read directly (1 label byte + 3072 pixel bytes per record), so no
    pickled file from outside is ever loaded. No download happens here.
    """
    root = Path(root)
    folder = root if root.name == "cifar-10-batches-bin" else root / "cifar-10-batches-bin"
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] if train else ["test_batch.bin"]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"CIFAR-10 (binary version) not found: {folder} lacks {missing}. These machines download nothing; "
            "fetch 'cifar-10-binary.tar.gz' from the CIFAR-10 page elsewhere and extract it under the root."
        )
    raw = torch.cat([torch.frombuffer(bytearray((folder / n).read_bytes()), dtype=torch.uint8) for n in names])
    if raw.numel() % 3073:
        raise ValueError(f"{folder}: file sizes are not a multiple of the 3073-byte CIFAR-10 record")
    records = raw.view(-1, 3073)
    images = records[:, 1:].reshape(-1, 3, 32, 32).clone()
    labels = {"label": records[:, 0].long().clone()}
    return ImageDataset(images, labels, {"label": CIFAR10_CLASSES}, "cifar10")
