"""The path from a folder of your own images to a composed, scored grid (docs/own-data.md), run end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw
from typer.testing import CliRunner

from composable_ebm.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def make_faces(root: Path, n: int = 48) -> None:
    """A tiny folder of 16x16 'faces': a disc, a smile (a bar low down) or not, a hat (a band on top) or not, a hair
    colour of three; held-out combination smiling + hat is still present in the folder (recipes hold it out)."""
    root.mkdir(parents=True, exist_ok=True)
    hair = ["black", "red", "blond"]
    colours = {"black": (20, 20, 20), "red": (200, 40, 30), "blond": (230, 200, 90)}
    lines = [str(n), "Smiling Hat hair"]
    for i in range(n):
        smiling, hat, h = i % 2, (i // 2) % 2, hair[(i // 4) % 3]
        im = Image.new("RGB", (16, 16), (240, 240, 240))
        d = ImageDraw.Draw(im)
        d.ellipse((3, 3, 12, 13), fill=(230, 180, 150))
        d.rectangle((3, 2, 12, 4), fill=colours[h])
        if smiling:
            d.rectangle((5, 10, 10, 11), fill=(120, 20, 20))
        if hat:
            d.rectangle((2, 0, 13, 2), fill=(30, 30, 160))
        im.save(root / f"{i:03d}.png")
        lines.append(f"{i:03d}.png {'1' if smiling else '-1'} {'1' if hat else '-1'} {h}")
    (root / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")


def recipe_for(tmp: Path, name: str, column: str, attribute: str) -> Path:
    text = (ROOT / "recipes" / "folder-template.toml").read_text()
    path = tmp / f"{name}.toml"
    text = (text.replace('name = "my-model"', f'name = "{name}"')
            .replace('root = "data/my-images"', 'root = "faces"')
            .replace('attributes = ["smiling"]', f'attributes = ["{attribute}"]\ncolumns = {{ {attribute} = "{column}" }}'
                                                  '\nholdout = [{ smiling = "yes", Hat = "yes" }]'
                                                  if attribute == "smiling" else f'attributes = ["{attribute}"]')
            .replace("size = 32", "size = 16").replace("batch_size = 24", "batch_size = 4")
            .replace("steps = 60", "steps = 3"))
    path.write_text(text)
    return path


@pytest.mark.learning
def test_a_folder_of_your_own_images_trains_composes_and_is_scored(tmp_path):
    """Folder -> two attribute models (a 1/-1 column and a column of words) -> a classifier of the folder's
    attributes -> a composed grid -> `eval compose`, all through the CLI."""
    make_faces(tmp_path / "faces")
    smiling = recipe_for(tmp_path, "smiling", "Smiling", "smiling")
    hair = recipe_for(tmp_path, "hair", "hair", "hair")
    for recipe, run in ((smiling, "smiling"), (hair, "hair")):
        result = runner.invoke(app, ["train", str(recipe), "--out", str(tmp_path / run), "--steps", "2",
                                     "--no-progress"])
        assert result.exit_code == 0, result.output
        assert "s per step" in result.output and "each checkpoint is about" in result.output
    config = json.loads((tmp_path / "hair" / "model" / "config.json").read_text())["config"]
    assert config["attributes"] == {"hair": ["black", "blond", "red"]} and config["null_condition"]
    result = runner.invoke(app, ["train-classifier", str(tmp_path / "faces"), "--out", str(tmp_path / "clf"),
                                 "--size", "16", "--steps", "150"])
    assert result.exit_code == 0, result.output
    assert "Smiling:" in result.output and "hair:" in result.output
    expression = f"{tmp_path / 'smiling' / 'model'}[smiling=yes] + {tmp_path / 'hair' / 'model'}[hair=red]"
    grid = tmp_path / "grid.png"
    result = runner.invoke(app, ["compose", expression, "-n", "4", "--steps", "3", "-o", str(grid), "--no-progress"])
    assert result.exit_code == 0, result.output
    with Image.open(grid) as im:
        assert im.size[0] >= 2 * 64  # a 2 x 2 grid, each image shown at 64 px or more
    result = runner.invoke(app, ["eval", "compose", expression, "--classifier", str(tmp_path / "clf"),
                                 "-t", "hair=red", "-n", "4", "--steps", "3"])
    assert result.exit_code == 0, result.output
    score = json.loads(result.output[result.output.index("{"):])
    assert set(score["per_attribute"]) == {"hair"} and 0.0 <= score["joint"] <= 1.0
    result = runner.invoke(app, ["eval", "ood", str(tmp_path / "hair" / "model"), "-c", "hair=red", "--in",
                                 str(tmp_path / "faces"), "--out", "noise", "-n", "8"])
    assert result.exit_code == 0, result.output
    assert 0.0 <= json.loads(result.output)["auroc"] <= 1.0


def test_the_held_out_combination_never_reaches_training(tmp_path):
    from composable_ebm.recipes import build_dataset, load_recipe

    make_faces(tmp_path / "faces")
    spec = load_recipe(recipe_for(tmp_path, "smiling", "Smiling", "smiling"))
    data = spec.data.build(spec.folder)
    assert len(data) == 36  # 48 rows, 12 of them smiling with a hat
    assert not ((data.labels["smiling"] == 1) & (data.labels["Hat"] == 1)).any()
    assert build_dataset(spec.data, spec.folder).attributes == {"smiling": ("no", "yes")}


def test_a_stopped_run_keeps_its_checkpoint_and_model_and_export_makes_one_from_any_checkpoint(tmp_path):
    """--max-minutes stops after the step in progress with the checkpoint and the model written; `cebm export`
    writes a model folder from a run's checkpoint, without resuming it."""
    make_faces(tmp_path / "faces")
    recipe = recipe_for(tmp_path, "hair", "hair", "hair")
    result = runner.invoke(app, ["train", str(recipe), "--out", str(tmp_path / "run"), "--steps", "500",
                                 "--max-minutes", "0.001", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "stopped at step" in result.output and "--max-minutes" in result.output
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert 1 <= state["step"] < 500 and (tmp_path / "run" / "model" / "model.safetensors").is_file()
    result = runner.invoke(app, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "exported")])
    assert result.exit_code == 0, result.output
    from composable_ebm import load

    exported, saved = load(tmp_path / "exported"), load(tmp_path / "run" / "model")
    for (k, a), (_, b) in zip(exported.state_dict().items(), saved.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    assert f"at step {state['step']}" in (tmp_path / "exported" / "README.md").read_text()
    result = runner.invoke(app, ["export", str(tmp_path / "faces")])
    assert result.exit_code == 2 and "holds no checkpoint.pt" in result.output


@pytest.mark.subprocess
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_stops_training_with_a_checkpoint_and_a_model(tmp_path):
    make_faces(tmp_path / "faces")
    recipe = recipe_for(tmp_path, "hair", "hair", "hair")
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "composable_ebm.cli", "train", str(recipe), "--out", str(run),
                             "--steps", "100000", "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    deadline = time.monotonic() + 120
    while not (run / "log.jsonl").is_file() or not (run / "log.jsonl").read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() is not None else ""
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "stopped at step" in out and "SIGTERM" in out
    assert (run / "checkpoint.pt").is_file() and (run / "model" / "config.json").is_file()


@pytest.mark.subprocess
def test_training_into_a_log_file_writes_no_carriage_returns(tmp_path):
    """A progress bar draws on a terminal only: `cebm train ... > log` writes plain lines."""
    make_faces(tmp_path / "faces")
    recipe = recipe_for(tmp_path, "hair", "hair", "hair")
    log = tmp_path / "train.log"
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, "-m", "composable_ebm.cli", "train", str(recipe), "--out",
                               str(tmp_path / "run"), "--steps", "2"], stdout=out, stderr=subprocess.STDOUT,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    text = log.read_text()
    assert proc.returncode == 0, text
    assert "\r" not in text and "trained 2 steps" in text


def test_resuming_after_the_recipes_data_or_model_changed_is_refused_unless_allowed(tmp_path):
    make_faces(tmp_path / "faces")
    recipe = recipe_for(tmp_path, "hair", "hair", "hair")
    run = tmp_path / "run"

    def train(steps: int, *flags: str):
        return runner.invoke(app, ["train", str(recipe), "--out", str(run), "--steps", str(steps), "--no-progress",
                                   *flags])

    assert train(1).exit_code == 0
    recipe.write_text(recipe.read_text().replace("size = 16", "size = 16\nlimit = 40"))
    result = train(2)
    assert result.exit_code == 2 and "data.limit (0 -> 40)" in result.output and "--allow-config-change" in result.output
    result = train(2, "--allow-config-change")
    assert result.exit_code == 0 and "resuming with changed settings" in result.output
    recipe.write_text(recipe.read_text().replace("stem_channels = 32", "stem_channels = 16"))
    result = train(3)
    assert result.exit_code == 2 and "model.stem_channels (32 -> 16)" in result.output
    # a checkpoint whose network record is gone (files moved by hand) cannot be checked: refused unless allowed
    (run / "network.json").unlink()
    recipe.write_text(recipe.read_text().replace("stem_channels = 16", "stem_channels = 32"))
    result = train(3)
    assert result.exit_code == 2 and "no network.json" in result.output and "--allow-config-change" in result.output
    result = train(3, "--allow-config-change")
    assert result.exit_code == 0 and "not checked" in result.output


def test_a_run_recorded_before_a_model_setting_existed_resumes_with_that_settings_default(tmp_path):
    make_faces(tmp_path / "faces")
    recipe = recipe_for(tmp_path, "hair", "hair", "hair")
    run = tmp_path / "run"
    assert runner.invoke(app, ["train", str(recipe), "--out", str(run), "--steps", "1", "--no-progress"]).exit_code == 0
    record = json.loads((run / "network.json").read_text())
    assert record["config"].pop("film_blocks") == 0  # as a run of a version without the setting wrote it
    (run / "network.json").write_text(json.dumps(record))
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--steps", "2", "--no-progress"])
    assert result.exit_code == 0 and "resumed from step 1" in result.output, result.output
