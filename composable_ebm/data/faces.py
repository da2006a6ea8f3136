"""Faces drawn by DiceBear: the ``faces`` dataset, rendered here from a pinned npm package.

DiceBear (``@dicebear/core`` and ``@dicebear/collection`` 9.4.3: code MIT, designs CC0 1.0) draws faces from
options; ``@resvg/resvg-js`` renders them to PNG. `render_faces` runs the renderer in ``faces_renderer/`` (its
``package.json`` and ``package-lock.json`` pin every version; ``npm ci`` installs them into a cache folder once) and
writes a CelebA-format folder: ``000000.png ...`` and ``list_attr_celeba.txt`` with four independent, balanced
attributes. Two styles (`STYLES`):

- ``pixel-art`` (16x16 designs): ``smiling`` (a smiling or a straight or frowning mouth, 4 and 5 of DiceBear's
  designs, those whose 16 pixels tell them apart), ``glasses`` and ``hat`` (present or absent, 14 and 10 designs),
  ``hair`` (``blond``, ``brown``, ``dark``, ``red``); eyes, skin, clothing, accessories, beard, which mouth,
  glasses, hat and hairstyle are DiceBear's own draw from each face's seed.
- ``lorelei`` (line art by Lisa Wischofsky, for 64 px and up): ``smiling`` (5 upturned smiles against an open round
  mouth, a frown and a straight line), ``glasses`` and ``beard`` (present or absent, 5 and 2 designs), ``hair``
  (``blond``, ``brown``, ``grey``, ``red``, the beard's colour too, none as dark as the mouth's lines drawn over
  it); head, eyes, eyebrows, nose, earrings, freckles, which mouth, glasses and beard, and the hairstyle (45 of 48,
  the nearly bald ones left out) are DiceBear's own draw.

Each face is drawn over one flat background colour (``background="fixed"``); ``"random"`` draws each face's colour
from a second stream of the seed, so the faces are those of the fixed background, over other colours (what a judge
that must not read the background trains on). The same ``n``, ``seed``, ``size``, ``style`` and ``background`` give
the same bytes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from composable_ebm.configs import MAX_IMAGE_SIZE, check_size
from composable_ebm.data.base import DataConfig, ImageDataset, dataset
from composable_ebm.data.folder import attribute_folder
from composable_ebm.data.npm import cache_root, installed, package_digest, tool_failure
from composable_ebm.errors import InvalidInputError, RunFailure

RENDERER = Path(__file__).resolve().parent / "faces_renderer"
"""The render script and its pinned npm packages (``package.json``, ``package-lock.json``)."""
RENDERER_FILES = ("package.json", "package-lock.json", "render.mjs")


@dataclass(frozen=True)
class FacesStyle:
    """A DiceBear style the renderer draws: its attributes and what cards and docs say about it."""

    attributes: dict[str, tuple[str, ...]]
    """the attributes of a rendered folder, with their values as the folder reader names them"""
    generator: str
    """where the faces come from: the style, its author, its licence and the renderer"""


STYLES = {
    "pixel-art": FacesStyle(
        {"smiling": ("no", "yes"), "glasses": ("no", "yes"), "hat": ("no", "yes"),
         "hair": ("blond", "brown", "dark", "red")},
        "DiceBear pixel-art faces (@dicebear/core and @dicebear/collection 9.4.3; code MIT, designs CC0 1.0),"
        " rendered with @resvg/resvg-js 2.6.2"),
    "lorelei": FacesStyle(
        {"smiling": ("no", "yes"), "glasses": ("no", "yes"), "beard": ("no", "yes"),
         "hair": ("blond", "brown", "grey", "red")},
        "DiceBear lorelei faces by Lisa Wischofsky (@dicebear/core and @dicebear/collection 9.4.3; code MIT,"
        " designs CC0 1.0), rendered with @resvg/resvg-js 2.6.2"),
}
"""The styles `render_faces` draws, by name."""
FACES_ATTRIBUTES = STYLES["pixel-art"].attributes
"""The attributes of a rendered folder of the default style (pixel-art)."""
GENERATOR = STYLES["pixel-art"].generator
"""What to say in cards and docs about where the default style's faces come from."""


BACKGROUNDS = ("fixed", "random")
"""`render_faces` backgrounds: one flat colour for every face, or a flat colour drawn per face."""


def _check_background(background: str, where: str) -> str:
    if background not in BACKGROUNDS:
        raise InvalidInputError(f"{where}: unknown background {background!r}; valid choices: {', '.join(BACKGROUNDS)}")
    return background


def _check_style(style: str, where: str) -> FacesStyle:
    if style not in STYLES:
        raise InvalidInputError(f"{where}: unknown faces style {style!r}; valid choices: {', '.join(STYLES)}")
    return STYLES[style]
NODE_LINE = ("rendering faces needs Node.js (18 or newer) and npm on the PATH: apt-get install nodejs npm, or see"
             " nodejs.org")


def renderer_digest() -> str:
    """A digest of the render script and its pinned packages: a cached install or folder of another renderer is
    never reused."""
    return package_digest(RENDERER, RENDERER_FILES)


RENDER_SECONDS = (600.0, 0.1)
"""How long one render may take before it is stopped: a fixed start plus this many seconds per face, about eight
times what one face took on a busy 2-core CPU (1,000 faces in 13 s)."""


def _renderer() -> Path:
    """A copy of the renderer with its packages installed, checked before each use (`composable_ebm.data.npm.installed`)."""
    return installed(RENDERER, RENDERER_FILES, "faces-renderer", "the faces renderer", NODE_LINE)


def render_faces(out: str | Path, n: int, seed: int = 0, size: int = 16, *, style: str = "pixel-art",
                 background: str = "fixed", shared: bool = False) -> Path:
    """Render ``n`` faces of ``style`` (`STYLES`) over ``background`` (`BACKGROUNDS`) into the folder ``out``
    (written beside it and moved into place whole); returns it.

    ``shared``: ``out`` is a cache folder other processes may render at the same time; where one of them moves its
    folder into place first, that one is kept (the same arguments render the same bytes)."""
    for name, value, low, high in (("n", n, 1, 1 << 24), ("seed", seed, 0, 2**31 - 1), ("size", size, 8, 512)):
        check_size("render_faces", name, value, low=low, high=high)
    _check_style(style, "render_faces")
    _check_background(background, "render_faces")
    out = Path(out)
    if out.exists():
        raise InvalidInputError(f"{out} exists; render faces into a new folder (or remove it)")
    home = _renderer()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    except OSError as err:
        raise InvalidInputError(f"cannot write the faces folder {out}: {out.parent} does not take new folders"
                                f" ({err.strerror}); choose a folder you can write to") from err
    try:
        limit = RENDER_SECONDS[0] + RENDER_SECONDS[1] * n
        try:
            done = subprocess.run([shutil.which("node") or "node", str(home / "render.mjs"), "--out", str(staging),
                                   "--n", str(n), "--seed", str(seed), "--size", str(size), "--style", style,
                                   "--background", background],
                                  capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise RunFailure(f"rendering {n:,} faces did not finish in {limit:,.0f} s (the bound for that many);"
                             f" nothing was written to {out}: render fewer faces, or check that node runs") from None
        if done.returncode != 0:
            raise RunFailure(f"rendering faces failed: {tool_failure(done.stderr or done.stdout, out.parent)};"
                             f" nothing was written to {out}")
        try:
            os.replace(staging, out)
        except OSError as err:
            if not out.exists():
                raise
            if not shared:
                raise InvalidInputError(f"{out} appeared while the faces were rendering (another process wrote it);"
                                        " render faces into a new folder (or remove it)") from err
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out


def faces_folder(n: int, seed: int = 0, size: int = 16, style: str = "pixel-art", background: str = "fixed") -> Path:
    """The rendered folder of ``n`` faces of ``style`` from ``seed`` at ``size`` over ``background``, rendered into
    the cache the first time."""
    _check_style(style, "faces_folder")
    _check_background(background, "faces_folder")
    tag = ("" if style == "pixel-art" else f"-{style}") + ("" if background == "fixed" else f"-{background}")
    folder = cache_root() / f"faces-{renderer_digest()}{tag}-n{n}-seed{seed}-size{size}"  # the defaults add no tag
    if not (folder / "list_attr_celeba.txt").is_file():
        render_faces(folder, n, seed, size, style=style, background=background, shared=True)
    return folder


def faces(n: int, seed: int = 0, size: int = 16, holdout: Sequence[Mapping[str, str]] = (),
          style: str = "pixel-art", background: str = "fixed") -> ImageDataset:
    """``n`` rendered faces of ``style`` over ``background`` with their four attributes, the ``holdout``
    combinations left out."""
    data = attribute_folder(faces_folder(n, seed, size, style, background), image_size=size, channels=3,
                            holdout=holdout,
                            values=_check_style(style, "faces").attributes)
    data.name = "faces"
    return data


@dataset("faces")
@dataclass(frozen=True)
class FacesData(DataConfig):
    """Recipe settings of the faces dataset (``[data] dataset = "faces"``)."""

    n: int = 20000
    """number of faces rendered"""
    seed: int = 0
    """seed of the renders (attributes and every other option)"""
    size: int = 16
    """image side (pixel-art's designs are 16x16; lorelei's line art wants 64 or more)"""
    holdout: tuple[dict[str, str], ...] = ()
    """attribute combinations kept out of training, e.g. ``[{smiling = "yes", glasses = "yes", hat = "yes"}]``"""
    style: str = "pixel-art"
    """DiceBear style (`STYLES`): ``pixel-art`` (smiling, glasses, hat, hair) or ``lorelei`` (smiling, glasses,
    beard, hair)"""
    background: str = "fixed"
    """``fixed`` (one flat colour behind every face) or ``random`` (a flat colour drawn per face)"""

    def __post_init__(self) -> None:
        check_size("FacesData", "n", self.n, high=1 << 24)
        check_size("FacesData", "seed", self.seed, low=0, high=2**31 - 1)
        check_size("FacesData", "size", self.size, low=8, high=min(512, MAX_IMAGE_SIZE))
        from composable_ebm.data.base import check_holdout

        check_holdout(self.holdout, _check_style(self.style, "FacesData.style").attributes, "FacesData")
        _check_background(self.background, "FacesData.background")

    def build(self, base: Path | None = None) -> ImageDataset:
        return faces(self.n, self.seed, self.size, self.holdout, self.style, self.background)

    def render(self, out: Path) -> Path:
        """Render the faces into ``out`` (every face: a held-out combination is a training choice, not the data's)."""
        return render_faces(out, self.n, self.seed, self.size, style=self.style, background=self.background)

    def describe(self, base: Path | None = None) -> tuple[dict[str, tuple[str, ...]], tuple[int, ...]]:
        return dict(STYLES[self.style].attributes), (3, self.size, self.size)
