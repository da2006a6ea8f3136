"""Image grids and chain strips as image files (torchvision's grid layout, PIL for writing)."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image
from torch import Tensor
from torchvision.utils import make_grid

from composable_ebm.atomic import write_atomic
from composable_ebm.errors import InvalidInputError


def as_float_images(x: Tensor) -> Tensor:
    """Images as float in ``[0, 1]``: uint8 is scaled by 1/255, anything else cast to float."""
    return x.float() / 255.0 if x.dtype == torch.uint8 else x.float()


def to_pil(grid: Tensor) -> Image.Image:
    """A ``(C, H, W)`` float image in ``[0, 1]`` as a PIL image."""
    if grid.ndim != 3 or grid.shape[0] not in (1, 3):
        raise ValueError(f"expected one image (1 or 3, H, W), got shape {tuple(grid.shape)}")
    array = (grid.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    return Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)


MIN_SHOWN_SIDE = 64
"""Grids show every image at least this many pixels wide by default (small images are upscaled)."""


def default_scale(side: int) -> int:
    """The nearest-neighbour upscaling that shows an image of ``side`` pixels at >= ``MIN_SHOWN_SIDE``."""
    return max(1, -(-MIN_SHOWN_SIDE // max(int(side), 1)))


def image_grid(images: Tensor, nrow: int | None = None, padding: int = 2, scale: int | None = None) -> Image.Image:
    """A grid of a batch ``(B, C, H, W)`` in ``[0, 1]``, ``nrow`` images per row (default: square).

    Every image is upscaled ``scale`` times with nearest neighbour, so each pixel stays a crisp block
    (default: `default_scale`, a 16-pixel image shown 64 pixels wide); ``scale=1`` keeps the size.
    """
    if images.ndim != 4 or images.shape[0] == 0 or images.shape[1] not in (1, 3):
        raise InvalidInputError(f"expected a batch of one or more grey or RGB images (B, 1 or 3, H, W), got shape"
                                f" {tuple(images.shape)}")
    if not bool(torch.isfinite(images).all()):
        raise InvalidInputError("the images hold NaN or infinite values; a grid of them would be drawn wrong")
    if nrow is not None and (isinstance(nrow, bool) or not isinstance(nrow, int) or nrow < 1):
        raise InvalidInputError(f"nrow must be a whole number >= 1 (images per row), got {nrow!r}")
    scale = default_scale(images.shape[-1]) if scale is None else scale
    if isinstance(scale, bool) or not isinstance(scale, int) or not 1 <= scale <= 64:
        raise InvalidInputError(f"scale must be a whole number from 1 to 64, got {scale!r}")
    if nrow is None:
        nrow = max(1, int(round(images.shape[0] ** 0.5)))
    x = images.detach().float().cpu().clamp(0, 1)
    if scale > 1:
        x = x.repeat_interleave(scale, dim=-2).repeat_interleave(scale, dim=-1)
    grid = make_grid(x, nrow=nrow, padding=padding, pad_value=1.0)
    return to_pil(grid if images.shape[1] == 3 else grid[:1])


def chain_strip(chain: Tensor, max_chains: int = 8, padding: int = 2) -> Image.Image:
    """Chains as rows, time left to right: ``chain`` is ``(T, n, C, H, W)`` from a sampler result."""
    if chain.ndim != 5:
        raise ValueError(f"expected a chain (T, n, C, H, W), got shape {tuple(chain.shape)}")
    steps, n = chain.shape[:2]
    rows = chain[:, : min(n, max_chains)].transpose(0, 1).reshape(-1, *chain.shape[2:])  # (n*T, C, H, W)
    return image_grid(rows, nrow=steps, padding=padding)


IMAGE_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP"}
"""File suffixes an image may be written under, and the format each one means."""


def image_format(path: str | Path) -> str:
    """The image format ``path``'s suffix names; any other suffix is an error listing the valid ones."""
    suffix = Path(path).suffix.lower()
    if suffix not in IMAGE_FORMATS:
        raise InvalidInputError(f"{path}: cannot tell an image format from the suffix {suffix or '(none)'!r};"
                                f" valid suffixes: {sorted(IMAGE_FORMATS)}")
    return IMAGE_FORMATS[suffix]


def save_image(image: Image.Image, path: str | Path) -> Path:
    """Write ``image`` in the format its suffix names, atomically (temp file + rename), so a failed
    write leaves no broken file."""
    fmt = image_format(path)
    return write_atomic(path, lambda tmp: (image.convert("RGB") if fmt == "JPEG" else image).save(tmp, format=fmt))


def save_image_grid(images: Tensor, path: str | Path, nrow: int | None = None, scale: int | None = None) -> Path:
    """Write a batch of images as one grid (PNG, JPEG or WebP, by the suffix), upscaled as `image_grid`."""
    return save_image(image_grid(images, nrow, scale=scale), path)


def save_chain_strip(chain: Tensor, path: str | Path, max_chains: int = 8) -> Path:
    """Write a sampler chain as a PNG strip (the paper's figure of chains travelling between modes)."""
    return save_image(chain_strip(chain, max_chains), path)


def bomb_message(err: Exception) -> str:
    """PIL's decompression-bomb refusal in one line: the image's pixels and the limit."""
    import re

    m = re.search(r"\((\d+) pixels\) exceeds limit of (\d+) pixels", str(err))
    if m is None:
        return f"too large to decode ({' '.join(str(err).split())[:120]})"
    return (f"{int(m.group(1)):,} pixels, more than the {int(m.group(2)):,} an image may have"
            " (PIL's decompression-bomb limit, Image.MAX_IMAGE_PIXELS x 2)")


def load_image_folder(folder: str | Path, size: int | None = None, limit: int | None = None) -> Tensor:
    """The images of a folder (``IMAGE_FORMATS`` suffixes, sorted by name) as RGB floats ``(N, 3, H, W)`` in
    ``[0, 1]``, resized to ``size`` x ``size`` when given (else all must share the first one's size)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InvalidInputError(f"no image folder at {folder}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidInputError(f"limit must be a positive number of images, got {limit!r}")
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_FORMATS)[:limit]
    if not paths:
        raise InvalidInputError(f"{folder} holds no images; valid suffixes: {sorted(IMAGE_FORMATS)}")
    out = []
    for path in paths:
        try:
            with Image.open(path) as image:
                image = image.convert("RGB")
                if size is not None:
                    image = image.resize((size, size), Image.BILINEAR)
                array = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
                out.append(array.view(image.height, image.width, 3).permute(2, 0, 1))
        except Image.DecompressionBombError as err:
            raise InvalidInputError(f"{path}: {bomb_message(err)}") from err
        except OSError as err:
            raise InvalidInputError(f"{path}: not a readable image ({err})") from err
        if out[-1].shape != out[0].shape:
            raise InvalidInputError(f"{path} is {tuple(out[-1].shape[1:])}, {paths[0].name} is {tuple(out[0].shape[1:])};"
                                    " images of one folder share a size (or pass a size to resize them)")
    return torch.stack(out).float() / 255.0


def save_scatter(points: Tensor, path: str | Path, limits: tuple[float, float] | None = None) -> Path:
    """Write 2-D samples ``(N, 2)`` as a scatter plot PNG (for the toy energies)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(f"expected 2-D points (N, 2), got shape {tuple(points.shape)}")
    p = points.detach().float().cpu().numpy()
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.scatter(p[:, 0], p[:, 1], s=2, alpha=0.5)
    if limits is not None:
        ax.set_xlim(*limits)
        ax.set_ylim(*limits)
    ax.set_aspect("equal")
    return save_figure(fig, path)


def save_figure(fig, path: str | Path) -> Path:
    """Render a matplotlib figure, close it, and write it as a PNG (atomically)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.canvas.draw()
    image = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba()).convert("RGB")
    plt.close(fig)
    return save_image(image, path)
