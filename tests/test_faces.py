"""The faces dataset: DiceBear's pixel-art faces rendered from pinned npm packages into a CelebA-format folder."""

from __future__ import annotations

import shutil

import pytest
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
