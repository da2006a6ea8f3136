"""Bounds and refusals: what the library refuses in one line instead of overwriting, recursing, allocating or drawing
noise (docs/safety.md lists them)."""

from __future__ import annotations

import importlib
import json
import os
import socket
import sys

import pytest
import torch
from typer.testing import CliRunner

import composable_ebm as cebm
from composable_ebm import MLPConfig, MLPEnergy
from composable_ebm.cli import app
from composable_ebm.errors import FolderLockedError, InvalidInputError, ModelFileError, NotSavableError
from composable_ebm.models import load_model, save_model

runner = CliRunner()


def _tiny(seed: int = 0) -> MLPEnergy:
    torch.manual_seed(seed)
    return MLPEnergy(MLPConfig(hidden=8, depth=1))


# ------------------------------------------------------------------------------------------------- saving
def test_save_links_the_folders_other_files_instead_of_copying_them(tmp_path):
    """A save into a folder with other files swaps the folder whole, and the other files arrive as the same inodes
    (hard links), so the save needs no second copy of them; the model files are new."""
    folder = save_model(_tiny(), tmp_path / "m")
    big = folder / "data.bin"
    big.write_bytes(os.urandom(1 << 16))
    (folder / "notes").mkdir()
    (folder / "notes" / "a.txt").write_text("kept")
    before = (big.stat().st_ino, (folder / "notes" / "a.txt").stat().st_ino)
    old_weights = (folder / "model.safetensors").stat().st_ino
    save_model(_tiny(1), folder)
    assert (big.stat().st_ino, (folder / "notes" / "a.txt").stat().st_ino) == before
    assert (folder / "notes" / "a.txt").read_text() == "kept"
    assert (folder / "model.safetensors").stat().st_ino != old_weights
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".m.")]  # no staging left behind


def _run_with_checkpoint(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["--threads", "1", "train", "recipes/toy-8gaussians.toml", "--out", str(out),
                                 "--steps", "2", "--device", "cpu", "--no-progress"])
    assert result.exit_code == 0, result.output
    return out


def test_export_refuses_a_folder_that_is_not_empty_without_overwrite(tmp_path):
    """`cebm export RUN --out DIR` where DIR holds another model or a user's files: one line naming --overwrite,
    exit 2, every file as it was; with --overwrite the model files are replaced and the user's other file stays."""
    run = _run_with_checkpoint(tmp_path)
    other = save_model(_tiny(3), tmp_path / "other", card="# another model\n")
    (other / "mine.txt").write_text("my notes")
    before = {p.name: p.read_bytes() for p in other.iterdir()}
    result = runner.invoke(app, ["export", str(run), "--out", str(other)])
    assert result.exit_code == 2 and "is not empty" in result.output and "--overwrite" in result.output
    assert {p.name: p.read_bytes() for p in other.iterdir()} == before
    result = runner.invoke(app, ["export", str(run), "--out", str(other), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert (other / "mine.txt").read_text() == "my notes"
    assert (other / "config.json").read_bytes() != before["config.json"]
    result = runner.invoke(app, ["export", str(run), "--out", str(tmp_path / "new")])  # a new folder needs nothing
    assert result.exit_code == 0, result.output


def test_train_classifier_refuses_a_folder_that_is_not_empty_before_training(tmp_path):
    from PIL import Image

    data = tmp_path / "data"
    data.mkdir()
    rows = []
    for i in range(8):
        Image.new("RGB", (8, 8), (255 * (i % 2), 0, 0)).save(data / f"{i:06d}.png")
        rows.append(f"{i:06d}.png {1 if i % 2 else -1}")
    (data / "list_attr_celeba.txt").write_text("8\nRed\n" + "\n".join(rows) + "\n")
    out = save_model(_tiny(), tmp_path / "clf")
    before = (out / "model.safetensors").read_bytes()
    args = ["train-classifier", str(data), "--out", str(out), "--size", "8", "--steps", "1", "--device", "cpu"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "is not empty" in result.output and "--overwrite" in result.output
    assert "read right" not in result.output  # refused before training
    assert (out / "model.safetensors").read_bytes() == before
    result = runner.invoke(app, [*args, "--overwrite"])
    assert result.exit_code == 0, result.output
    assert load_model(out).__class__.__name__ == "AttributeClassifier"


def test_a_composite_has_no_save_and_says_so_in_the_librarys_own_error():
    a, b = _tiny(), _tiny(1)
    with pytest.raises(NotSavableError, match="only a trained model"):
        (a + b).save_pretrained("anywhere")
    assert not hasattr(a + b, "push_to_hub")  # still an AttributeError to hasattr


# ------------------------------------------------------------------------------------------------- locks
@pytest.mark.parametrize("pid", [-1, 0, 2**40, "12", None])
def test_a_lock_naming_a_pid_no_process_can_have_is_refused_as_damaged(tmp_path, pid):
    from composable_ebm.training.lock import RunLock

    (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": pid}))
    with pytest.raises(FolderLockedError, match="is damaged.*delete it if no run uses"):
        RunLock(tmp_path)
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == pid  # left for the user to judge


def test_a_lock_of_a_finished_process_is_still_taken_over(tmp_path):
    from composable_ebm.training.lock import RunLock

    import subprocess

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": int(gone.stdout)}))
    lock = RunLock(tmp_path)
    assert lock.held and lock.took_over == {"host": socket.gethostname(), "pid": int(gone.stdout)}
    lock.release()


# ------------------------------------------------------------------------------------------------- depth
def test_a_composite_nested_past_the_bound_is_one_line():
    from composable_ebm.energy import MAX_NESTING

    a, b = _tiny(), _tiny(1)
    energy = a
    with pytest.raises(InvalidInputError, match=f"at most {MAX_NESTING}"):
        for _ in range(10_000):
            energy = (energy | b) + a
    ok = a
    for _ in range((MAX_NESTING - 1) // 2):
        ok = (ok | b) + a
    assert ok(torch.zeros(2, 2)).shape == (2,)


def test_an_expression_of_many_weight_factors_is_one_line(tmp_path):
    text = "shapes-color[color=red]" + " * 1" * 1100
    result = runner.invoke(app, ["compose", text, "-n", "1", "-o", str(tmp_path / "g.png")])
    assert result.exit_code == 2 and "nests deeper than" in result.output and "recursion" not in result.output


def test_a_config_of_deeply_nested_json_names_its_file(tmp_path):
    folder = save_model(_tiny(), tmp_path / "m")
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelFileError, match=r"config.json: JSON nested 100000 levels deep; at most 64"):
        load_model(folder)


def test_json_depth_ignores_brackets_inside_strings():
    from composable_ebm.configs import json_depth

    assert json_depth('{"a": [1, {"b": "[[[\\"]]]"}]}') == 3
    assert json_depth("[]") == 1 and json_depth('"[["') == 0


# ------------------------------------------------------------------------------------------------- sampling
def test_the_api_bounds_the_number_of_samples_in_one_line():
    from composable_ebm.sampling.runner import MAX_SAMPLES

    energy = cebm.load("shapes-color").condition(color="red")
    with pytest.raises(InvalidInputError, match=f"n must be a whole number from 1 to {MAX_SAMPLES:,}"):
        energy.sample(n=10**9)
    with pytest.raises(InvalidInputError, match="elements; one call draws at most"):
        cebm.GaussianEnergy(torch.zeros(2048), torch.eye(2048)).sample(n=MAX_SAMPLES)


@pytest.mark.parametrize("expression", [
    "faces-glasses[glasses=yes] - faces-hat[hat=yes]",
    "-faces-hat[hat=yes]",
    "faces-glasses[glasses=yes] - 0.5*faces-hat[hat=yes]",
    "faces-glasses[glasses=yes] - 2*faces-hat[hat=yes] + faces-smiling[smiling=yes]",
    "(faces-glasses[glasses=yes] - faces-hat[hat=yes]) | faces-smiling[smiling=yes]",
])
def test_a_plain_difference_of_models_with_a_null_condition_is_refused_naming_the_guided_form(tmp_path, expression):
    """A plain negation of such a model also rewards what the model finds unlikely in general (with no floor, its
    chains fall away and end as noise): one line naming the guided form, exit 2, no file written."""
    out = tmp_path / "g.png"
    result = runner.invoke(app, ["--threads", "1", "compose", "--form", "plain", "-n", "1", "-o", str(out), "--",
                                 expression])
    assert result.exit_code == 2 and "in the plain form" in result.output and "'guided'" in result.output, result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1
    assert not out.exists()


def test_a_noise_conditioned_difference_without_a_floor_is_refused_and_the_guided_difference_samples():
    from composable_ebm.analytic import NoisedGaussianEnergy
    from composable_ebm.energy import Guided
    from composable_ebm.pipeline import plan

    a = NoisedGaussianEnergy(torch.tensor([1.0, 0.0]), torch.eye(2), name="a")
    b = NoisedGaussianEnergy(torch.tensor([-1.0, 0.0]), torch.eye(2), name="b")
    plan(a - 0.5 * b, "plain")  # weights total 0.5: it has a floor
    with pytest.raises(InvalidInputError, match="has no floor: its weights total 0"):
        (a - b).sample(n=1, form="plain")
    glasses = cebm.load("faces-glasses").condition(glasses="yes")
    hat = cebm.load("faces-hat").condition(hat="yes")
    assert isinstance(plan(glasses - hat).energy, Guided)  # auto: the guided form, which has one
    assert (glasses - hat).sample(n=1, seed=0, steps=1, levels=2, first_steps=1).shape == (1, 3, 16, 16)


# ------------------------------------------------------------------------------------------------- faces renderer
def test_the_faces_renderer_cache_is_checked_before_it_runs(tmp_path, monkeypatch):
    """An edited render.mjs (or an installed package changed) in the cache folder is never run: the check against
    what the package ships (`composable_ebm.data.npm.verified`) fails, and the folder is set aside and installed
    again."""
    faces = importlib.import_module("composable_ebm.data.faces")  # the module; the package exports a function by that name
    npm = importlib.import_module("composable_ebm.data.npm")

    def verified(home):
        return npm.verified(home, faces.RENDERER, faces.RENDERER_FILES)

    monkeypatch.setenv("CEBM_CACHE", str(tmp_path))
    home = tmp_path / f"faces-renderer-{faces.renderer_digest()}"
    (home / "node_modules" / "pkg").mkdir(parents=True)
    for name in faces.RENDERER_FILES:
        (home / name).write_bytes((faces.RENDERER / name).read_bytes())
    (home / "node_modules" / "pkg" / "index.js").write_text("export default 1;\n")
    (home / npm.TREE_RECORD).write_text(npm.tree_digest(home / "node_modules") + "\n")
    assert verified(home)
    (home / "render.mjs").write_text("console.log('not ours');\n")
    assert not verified(home)
    (home / "render.mjs").write_bytes((faces.RENDERER / "render.mjs").read_bytes())
    (home / "node_modules" / "pkg" / "index.js").write_text("process.exit(3);\n")
    assert not verified(home)
    installs = []

    def fake_npm(args, cwd, **kwargs):  # stands in for `npm ci`: records the call and installs a package
        installs.append(cwd)
        (cwd / "node_modules").mkdir()
        (cwd / "node_modules" / "fresh.js").write_text("ok\n")
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(npm.subprocess, "run", fake_npm)
    monkeypatch.setattr(npm.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert faces._renderer() == home and len(installs) == 1
    assert (home / "node_modules" / "fresh.js").is_file() and not (home / "node_modules" / "pkg").exists()
    assert verified(home)
    assert faces._renderer() == home and len(installs) == 1  # verified: not installed again


def test_a_render_that_runs_past_its_bound_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    import subprocess

    faces = importlib.import_module("composable_ebm.data.faces")  # the module; the package exports a function by that name
    from composable_ebm.errors import RunFailure

    monkeypatch.setattr(faces, "_renderer", lambda: tmp_path)

    def slow(args, **kwargs):
        raise subprocess.TimeoutExpired(args, kwargs["timeout"])

    monkeypatch.setattr(faces.subprocess, "run", slow)
    out = tmp_path / "faces"
    with pytest.raises(RunFailure, match=r"rendering 100,000 faces did not finish in 10,600 s"):
        faces.render_faces(out, 100_000)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".faces-")]


# ------------------------------------------------------------------------------------------------- eval ood
def test_eval_ood_takes_any_registered_image_dataset_and_names_the_choices():
    """`eval ood` reads the dataset registry, not a list of two names: digits (grey, expanded to the model's three
    channels) against shapes gives an AUROC; a name that is no dataset, or a dataset of points, is one line."""
    result = runner.invoke(app, ["eval", "ood", "shapes-color", "-c", "color=red", "--in", "shapes", "--out", "digits",
                                 "-n", "16"])
    assert result.exit_code == 0, result.output
    assert 0.0 <= json.loads(result.output)["auroc"] <= 1.0
    result = runner.invoke(app, ["eval", "ood", "shapes-color", "--in", "shapes", "--out", "nothing", "-n", "4"])
    assert result.exit_code == 2 and "valid choices: a registered dataset" in result.output and "faces" in result.output
    result = runner.invoke(app, ["eval", "ood", "shapes-color", "--in", "shapes", "--out", "toy2d", "-n", "4"])
    assert result.exit_code == 2 and "toy2d is not a dataset of images" in result.output


def test_rendering_faces_where_no_folder_can_be_made_is_one_line_naming_the_folder(tmp_path, monkeypatch):
    faces = importlib.import_module("composable_ebm.data.faces")
    monkeypatch.setattr(faces, "_renderer", lambda: tmp_path)
    locked = tmp_path / "locked"
    locked.write_text("a file, not a folder")
    with pytest.raises(InvalidInputError, match=r"cannot write the faces folder .*locked/faces: .*locked does not take"):
        faces.render_faces(locked / "faces", 2)


def test_a_weights_header_of_deeply_nested_json_is_one_line_naming_the_file(tmp_path):
    folder = save_model(_tiny(), tmp_path / "m")
    header = b"[" * 100_000 + b"]" * 100_000
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ModelFileError, match=r"model.safetensors: not a readable safetensors file \(its header\): JSON"
                                             r" nested 100000 levels deep"):
        load_model(folder)
