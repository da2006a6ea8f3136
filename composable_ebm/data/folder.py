"""A folder of images with a CelebA-format attribute table: the ``folder`` dataset, for your own images.

The table (``list_attr_celeba.txt``) has the number of images on line 1, the column names on line 2, then one row a
file: ``name v1 v2 ...``. A column of ``1`` / ``-1`` is a binary attribute (values ``no``, ``yes``); any other
column is a multi-valued attribute whose values are the distinct words in it (``hair`` with ``black``, ``blond``,
``red``; ``digit`` with ``0`` to ``9``). Images are centre-cropped to a square and resized; grey images stay grey.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from composable_ebm.configs import MAX_IMAGE_SIZE, check_size
from composable_ebm.data.base import DataConfig, ImageDataset, combination_mask, dataset, resolve_root
from composable_ebm.errors import DataNotFoundError, InvalidInputError
from composable_ebm.images import bomb_message

BINARY = ("no", "yes")
"""The values of a ``1`` / ``-1`` column."""
GREY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
"""PIL modes of grey images: a folder of only these is read as one channel."""
MAX_UPSCALE = 4
"""An image whose shorter side is smaller than ``size / MAX_UPSCALE`` is refused, not blown up."""


def read_attribute_table(path: str | Path) -> tuple[list[str], dict[str, list[str]]]:
    """Parse a CelebA-format table: the file names and each column's values as written.

    Raises `InvalidInputError` naming the file and line for a bad count, a row of the wrong length, a column named
    twice or a file listed twice.
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
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidInputError(f"{path}:2: column {twice[0]!r} is named twice; each column needs its own name")
    rows = lines[2:]
    if len(rows) != count:
        raise InvalidInputError(f"{path}: header says {count} images, found {len(rows)} rows")
    files: list[str] = []
    seen: dict[str, int] = {}
    columns: dict[str, list[str]] = {name: [] for name in names}
    for i, row in enumerate(rows, start=3):
        if len(row) != len(names) + 1:
            raise InvalidInputError(f"{path}:{i}: expected a file name and {len(names)} values, got {len(row)} fields")
        if row[0] in seen:
            raise InvalidInputError(f"{path}:{i}: {row[0]!r} is listed again (first on line {seen[row[0]]});"
                                    " each image needs one row")
        seen[row[0]] = i
        files.append(row[0])
        for name, value in zip(names, row[1:], strict=True):
            columns[name].append(value)
    return files, columns


def column_values(values: Sequence[str]) -> tuple[str, ...]:
    """The value names of a column: `BINARY` for ``1`` / ``-1``, else its distinct words (numbers in numeric order)."""
    distinct = set(values)
    if distinct <= {"1", "-1"}:
        return BINARY
    try:
        return tuple(sorted(distinct, key=float))
    except ValueError:
        return tuple(sorted(distinct))


def table_labels(files_columns: Mapping[str, Sequence[str]], columns: Mapping[str, str] | None,
                 where: str, declared: Mapping[str, Sequence[str]] | None = None
                 ) -> tuple[dict[str, Tensor], dict[str, tuple[str, ...]]]:
    """Labels and value names of every column under its own name, and of ``columns`` (ours -> column, ``-Column``
    for a binary column negated) under ours."""
    chosen = {name: name for name in files_columns}
    chosen.update(columns or {})
    labels, attributes = {}, {}
    for ours, column in chosen.items():
        negate = column.startswith("-")
        name = column[1:] if negate else column
        if name not in files_columns:
            raise InvalidInputError(f"{where}: no column {name!r}; columns: {sorted(files_columns)}")
        raw = files_columns[name]
        values = column_values(raw)
        if declared is not None and ours in declared:  # the dataset names every value, seen here or not
            values = tuple(declared[ours])
            unknown = sorted(set(raw) - set(values) - ({"1", "-1"} if values == BINARY else set()))
            if unknown:
                raise InvalidInputError(f"{where}: column {name!r} holds {unknown[:3]}, not among {list(values)}")
        if negate and values != BINARY:
            raise InvalidInputError(f"{where}: {column!r} negates column {name!r}, which is not a 1/-1 column"
                                    f" (its values: {list(values)[:8]})")
        if values == BINARY:
            index = torch.tensor([(v == "1") != negate for v in raw], dtype=torch.long)
        else:
            lookup = {v: i for i, v in enumerate(values)}
            index = torch.tensor([lookup[v] for v in raw], dtype=torch.long)
        labels[ours], attributes[ours] = index, values
    return labels, attributes


def read_image(path: Path, size: int, channels: int) -> Tensor:
    """One image, centre-cropped to a square and resized to ``size``: uint8 ``(channels, size, size)``."""
    from PIL import Image

    try:
        im = Image.open(path)
    except Image.DecompressionBombError as err:
        raise InvalidInputError(f"{path}: {bomb_message(err)}") from err
    except OSError as err:
        raise InvalidInputError(f"{path}: not a readable image ({err})") from err
    with im:
        try:
            im.load()
        except OSError as err:
            raise InvalidInputError(f"{path}: a damaged or truncated image ({err})") from err
        if min(im.size) * MAX_UPSCALE < size:
            raise InvalidInputError(f"{path}: {im.width}x{im.height} pixels, too small for size {size} (at most"
                                    f" {MAX_UPSCALE}x upscaling); lower [data] size or leave the image out")
        if im.mode.startswith("I") or im.mode == "F":  # 16-bit or float grey: scale to 8 bits, not clip
            array = np.asarray(im, dtype=np.float64)
            top = 65535.0 if im.mode.startswith("I") else 1.0
            im = Image.fromarray(np.clip(array / top * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
        im = im.convert("L" if channels == 1 else "RGB")
        side = min(im.size)
        left, top_edge = (im.width - side) // 2, (im.height - side) // 2
        im = im.crop((left, top_edge, left + side, top_edge + side)).resize((size, size), Image.BICUBIC)
        pixels = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8)
        return pixels.view(size, size, channels).permute(2, 0, 1)


def folder_channels(paths: Sequence[Path]) -> int:
    """1 when every image is grey (`GREY_MODES`, read from the headers), else 3."""
    return 1 if all(image_mode(p) in GREY_MODES for p in paths) else 3


def image_mode(path: Path) -> str:
    """The PIL mode of an image file, read from its header."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return im.mode
    except (OSError, Image.DecompressionBombError) as err:
        raise InvalidInputError(f"{path}: not a readable image ({err})") from err


def attribute_folder(
    root: str | Path,
    attribute_file: str | Path = "list_attr_celeba.txt",
    columns: Mapping[str, str] | None = None,
    image_size: int = 64,
    channels: int | None = None,
    holdout: Sequence[Mapping[str, str]] = (),
    limit: int | None = None,
    values: Mapping[str, Sequence[str]] | None = None,
) -> ImageDataset:
    """Images of a folder with a CelebA-format attribute table.

    Args:
        root: folder holding the image files the table names; every row must lie inside it.
        attribute_file: the table (absolute, or relative to ``root``).
        columns: more names: ours -> table column (``-Column`` negates a 1/-1 column); every column is also read
            under its own name.
        image_size: images are centre-cropped to a square and resized to this size.
        channels: 1 or 3; default: 1 when every image is grey, else 3.
        holdout: attribute combinations (ours -> value name) left out of the data.
        limit: read only the first ``limit`` rows.
        values: the value names of some attributes, in order, where a dataset knows them all (a small folder may
            not show every value); by default each column's values are the ones it holds.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataNotFoundError(f"no image folder at {root}")
    table_path = Path(attribute_file)
    if not table_path.is_absolute():
        table_path = root / table_path
    if not table_path.is_file():
        raise DataNotFoundError(f"no attribute table at {table_path}")
    files, raw = read_attribute_table(table_path)
    labels, attributes = table_labels(raw, columns, str(table_path), values)
    keep = ~combination_mask(labels, attributes, holdout) if holdout else torch.ones(len(files), dtype=torch.bool)
    if limit is not None:
        keep &= torch.arange(len(files)) < limit
    index = torch.nonzero(keep).squeeze(1).tolist()
    if not index:
        raise InvalidInputError(f"{table_path}: no row is left to train on (holdout {list(holdout)}, limit {limit})")
    inside = root.resolve()
    paths = []
    for i in index:
        path = (root / files[i]).resolve()
        if not path.is_relative_to(inside):
            raise InvalidInputError(f"{table_path} lists {files[i]!r}, which lies outside {root}; rows name files"
                                    " inside the image folder")
        if not path.is_file():
            raise DataNotFoundError(f"{table_path} lists {files[i]!r}, but {path} is not a regular file")
        paths.append(path)
    if channels is None:
        channels = folder_channels(paths)
    if channels not in (1, 3):
        raise InvalidInputError(f"channels must be 1 or 3, got {channels!r}")
    images = torch.empty(len(paths), channels, image_size, image_size, dtype=torch.uint8)
    for j, path in enumerate(paths):
        images[j] = read_image(path, image_size, channels)
    chosen = torch.tensor(index)
    return ImageDataset(images, {a: v[chosen] for a, v in labels.items()}, attributes, root.name,
                        {"holdout": [dict(c) for c in holdout]})


@dataset("folder")
@dataclass(frozen=True)
class FolderData(DataConfig):
    """Recipe settings of an image folder (``[data] dataset = "folder"``); see `attribute_folder`."""

    root: str = ""
    """the image folder (relative paths start at the recipe's folder)"""
    attribute_file: str = "list_attr_celeba.txt"
    """the CelebA-format table, relative to ``root``"""
    columns: dict[str, str] = field(default_factory=dict)
    """more attribute names: ours -> table column (``-Column`` negates a 1/-1 column); every column is also read under
    its own name"""
    size: int = 64
    """image side"""
    channels: int = 0
    """1 or 3; 0: as the images are (grey stays grey)"""
    holdout: tuple[dict[str, str], ...] = ()
    """attribute combinations left out of training, e.g. ``[{smiling = "yes", glasses = "yes"}]``"""
    limit: int = 0
    """read only the first rows (0: all)"""

    def __post_init__(self) -> None:
        check_size("FolderData", "size", self.size, low=4, high=MAX_IMAGE_SIZE)
        if self.channels not in (0, 1, 3) or isinstance(self.channels, bool):
            raise InvalidInputError(f"FolderData.channels must be 0 (as the images are), 1 or 3, got {self.channels!r}")
        check_size("FolderData", "limit", self.limit, low=0, high=1 << 40)
        for combo in self.holdout:
            if not isinstance(combo, Mapping) or not combo:
                raise InvalidInputError(f"FolderData.holdout must be a list of tables of attribute = value, got {combo!r}")

    def build(self, base: Path | None = None) -> ImageDataset:
        if not self.root:
            raise InvalidInputError("dataset 'folder' needs data.root, the folder of images and their attribute table")
        try:
            return attribute_folder(resolve_root(self.root, base), self.attribute_file, self.columns or None, self.size,
                                    self.channels or None, self.holdout, self.limit or None)
        except InvalidInputError:
            raise
        except ValueError as err:  # value_index: a held-out attribute or value the table does not have
            raise InvalidInputError(f"[data] holdout: {err}") from err

    def describe(self, base: Path | None = None) -> tuple[dict[str, tuple[str, ...]], tuple[int, ...]]:
        """The table's attributes and the image shape, from the table and the images' headers (nothing decoded)."""
        root = resolve_root(self.root, base)
        table = root / self.attribute_file
        files, raw = read_attribute_table(table)
        _, attributes = table_labels(raw, self.columns or None, str(table))
        channels = self.channels or folder_channels([root / f for f in files])
        return attributes, (channels, self.size, self.size)
