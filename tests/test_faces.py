"""The faces dataset: DiceBear's pixel-art faces rendered from pinned npm packages into a CelebA-format folder."""

from __future__ import annotations

import shutil

import pytest
import torch
from typer.testing import CliRunner

from composable_ebm.cli import app
from composable_ebm.data import FACES_ATTRIBUTES, FacesData, faces, render_faces
from composable_ebm.errors import InvalidInputError

runner = CliRunner()
needs_node = pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None,
                                reason="rendering faces needs Node.js and npm")


@pytest.mark.subprocess
@needs_node
def test_the_same_seed_renders_the_same_bytes_and_another_seed_other_faces(cache, tmp_path):
    a, b, c = (render_faces(tmp_path / name, 24, seed) for name, seed in (("a", 5), ("b", 5), ("c", 6)))
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir()) and "list_attr_celeba.txt" in files and len(files) == 25
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert (a / "000000.png").read_bytes() != (c / "000000.png").read_bytes()


@needs_node
def test_a_cache_folder_another_process_renders_first_is_kept_and_a_users_folder_is_refused(cache, tmp_path,
                                                                                           monkeypatch):
    import subprocess

    from composable_ebm.data.faces import faces_folder

    folder = faces_folder(6, seed=3)  # the renderer and one rendered folder, as another process leaves them
    rendered = {p.name: p.read_bytes() for p in folder.iterdir()}
    target = {"path": folder}
    real_run = subprocess.run

    def race(args, **kwargs):  # renders into the staging folder, then the other process's folder lands first
        done = real_run(args, **kwargs)
        shutil.copytree(tmp_path / "theirs", target["path"])
        return done

    shutil.copytree(folder, tmp_path / "theirs")
    shutil.rmtree(folder)
    monkeypatch.setattr(subprocess, "run", race)
    assert faces_folder(6, seed=3) == folder  # no error: the folder that landed first is kept
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == rendered
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}-")]  # no staging left
    target["path"] = tmp_path / "mine"
    with pytest.raises(InvalidInputError, match="appeared while the faces were rendering"):
        render_faces(tmp_path / "mine", 6, seed=3)


@pytest.mark.subprocess
@needs_node
def test_faces_carry_four_independent_balanced_attributes_and_the_held_out_triple_is_left_out(cache):
    data = faces(400, seed=0, size=16)
    assert data.images.shape == (400, 3, 16, 16) and data.attributes == FACES_ATTRIBUTES
    for attr, values in FACES_ATTRIBUTES.items():
        share = data.labels[attr].bincount(minlength=len(values)).float() / 400
        assert (share - 1 / len(values)).abs().max() < 0.08, (attr, share)
    both = ((data.labels["smiling"] == 1) & (data.labels["glasses"] == 1)).float().mean()
    assert abs(float(both) - 0.25) < 0.06  # drawn independently
    held = FacesData(n=400, holdout=({"smiling": "yes", "glasses": "yes", "hat": "yes"},)).build()
    triple = (held.labels["smiling"] == 1) & (held.labels["glasses"] == 1) & (held.labels["hat"] == 1)
    assert len(held) < 400 and not triple.any()


@needs_node
def test_cebm_data_faces_writes_a_folder_the_folder_dataset_reads(cache, tmp_path):
    result = runner.invoke(app, ["data", "faces", "--out", str(tmp_path / "f"), "-n", "8", "--seed", "2"])
    assert result.exit_code == 0, result.output
    from composable_ebm.data import attribute_folder

    read = attribute_folder(tmp_path / "f", image_size=16, values=FACES_ATTRIBUTES)
    assert read.attributes == FACES_ATTRIBUTES and len(read) == 8
    again = runner.invoke(app, ["data", "faces", "--out", str(tmp_path / "f"), "-n", "8"])
    assert again.exit_code == 2 and "exists; render faces into a new folder" in again.output


def test_without_node_rendering_is_one_line_saying_what_to_install(monkeypatch, tmp_path):
    import shutil as shell

    monkeypatch.setattr(shell, "which", lambda name: None)
    with pytest.raises(InvalidInputError, match="needs Node.js .* and npm .*apt-get install nodejs npm"):
        render_faces(tmp_path / "f", 4)


@pytest.mark.subprocess
@needs_node
def test_lorelei_faces_at_64_px_carry_four_balanced_attributes_and_the_same_seed_gives_the_same_bytes(cache, tmp_path):
    from composable_ebm.data.faces import STYLES

    result = runner.invoke(app, ["data", "faces", "--style", "lorelei", "--size", "64", "--out", str(tmp_path / "a"),
                                 "-n", "300", "--seed", "4"])
    assert result.exit_code == 0, result.output
    again = render_faces(tmp_path / "b", 300, 4, 64, style="lorelei")
    pixel = render_faces(tmp_path / "c", 4, 4, 64)
    assert (tmp_path / "a" / "list_attr_celeba.txt").read_text().splitlines()[1] == "smiling glasses beard hair"
    assert all((tmp_path / "a" / f.name).read_bytes() == f.read_bytes() for f in again.iterdir())
    assert (pixel / "000000.png").read_bytes() != (again / "000000.png").read_bytes()  # another style
    lorelei = STYLES["lorelei"].attributes
    data = FacesData(n=300, seed=4, size=64, style="lorelei",
                     holdout=({"smiling": "yes", "glasses": "yes", "beard": "yes"},)).build()
    assert data.images.shape[1:] == (3, 64, 64) and data.attributes == lorelei
    full = faces(300, seed=4, size=64, style="lorelei")
    for attr, values in lorelei.items():
        share = full.labels[attr].bincount(minlength=len(values)).float() / 300
        assert (share - 1 / len(values)).abs().max() < 0.1, (attr, share)
    triple = (data.labels["smiling"] == 1) & (data.labels["glasses"] == 1) & (data.labels["beard"] == 1)
    assert 300 * 0.06 < 300 - len(data) < 300 * 0.2 and not triple.any()
    # beard and hair colour are drawn: the bearded faces' lower half differs from the beardless ones' more than
    # two halves of one group differ
    images = full.images.float()
    beard = full.labels["beard"] == 1
    lower = images[:, :, 40:, 16:48].mean(dim=(1, 2, 3))
    assert lower[beard].mean() < lower[~beard].mean() - 20  # a beard darkens the white chin


@needs_node
def test_random_backgrounds_draw_the_same_faces_over_another_colour_each(cache, tmp_path):
    result = runner.invoke(app, ["data", "faces", "--background", "random", "--out", str(tmp_path / "r"), "-n", "12",
                                 "--seed", "5"])
    assert result.exit_code == 0, result.output
    fixed = faces(12, seed=5, size=16)
    drawn = faces(12, seed=5, size=16, background="random")
    assert all(torch.equal(fixed.labels[a], drawn.labels[a]) for a in fixed.labels)  # the same faces
    corner = lambda data: data.images[:, :, 0, 0]  # noqa: E731  (the background shows at every corner)
    assert (corner(fixed) == corner(fixed)[0]).all()  # one colour behind every fixed face
    assert len({tuple(c.tolist()) for c in corner(drawn)}) >= 10  # a colour per face
    face = fixed.images[:, :, 6:10, 6:10].float()  # the middle of each face is drawn the same over either
    assert (face - drawn.images[:, :, 6:10, 6:10].float()).abs().mean() < 2
    again = faces(12, seed=5, size=16, background="random")
    assert torch.equal(again.images, drawn.images)
    bad = runner.invoke(app, ["data", "faces", "--background", "blue", "--out", str(tmp_path / "b"), "-n", "4"])
    assert bad.exit_code == 2 and "unknown background 'blue'; valid choices: fixed, random" in bad.output
    assert not (tmp_path / "b").exists()


def test_an_unknown_faces_style_is_one_line_naming_the_styles(tmp_path):
    with pytest.raises(InvalidInputError, match="unknown faces style 'cartoon'; valid choices: pixel-art, lorelei"):
        FacesData(style="cartoon")
    result = runner.invoke(app, ["data", "shapes", "--style", "lorelei", "--out", str(tmp_path / "s"), "-n", "4"])
    assert result.exit_code == 2 and "unknown ShapesData setting(s) ['style']" in result.output
    assert not (tmp_path / "s").exists()


@pytest.mark.subprocess
@needs_node
def test_renders_packed_for_a_gpu_unpack_to_the_folder_the_recipe_reads_with_the_same_pixels(cache, tmp_path):
    from benchmarks.faces64 import pack, unpack
    from composable_ebm.data.faces import faces_folder

    data = {"n": 12, "seed": 3, "size": 64, "style": "lorelei"}
    rendered = faces_folder(12, 3, 64, "lorelei")
    carry = pack(tmp_path / "carry", data)
    there = unpack(carry, tmp_path / "gpu-cache")
    assert there.name == rendered.name  # the name faces_folder looks for on the other machine
    from composable_ebm.data import attribute_folder

    a, b = (attribute_folder(f, image_size=64, channels=3) for f in (rendered, there))
    assert torch.equal(a.images, b.images) and all(torch.equal(a.labels[k], b.labels[k]) for k in a.labels)


@pytest.mark.subprocess
@needs_node
def test_the_64_px_recipes_noise_levels_come_from_the_renders_spread(cache):
    """The first level is at least the largest distance between two renders (a chain started there is at the noised
    data), and the preconditioning's sigma_data is the renders' standard deviation per pixel."""
    from pathlib import Path

    from composable_ebm.recipes import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "faces64-smiling.toml")
    data = faces(600, seed=11, size=recipe.data.size, style=recipe.data.style)
    x = data.images.float().flatten(1) / 255
    largest = float(torch.cdist(x, x).max())
    model = recipe.model
    assert largest <= model["sigma_max"] < 2 * largest, (model["sigma_max"], largest)
    assert abs(model["sigma_data"] - float(x.std())) < 0.05
    assert recipe.sampling.sampler.sigma_max == model["sigma_max"]  # the ladder starts there
