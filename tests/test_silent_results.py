"""Inputs that used to give a silent wrong result, a traceback or an unclear line: each is now one clear line."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

import composable_ebm as cebm
from composable_ebm.cli import app
from composable_ebm.errors import CebmError, InvalidInputError, ModelFileError

runner = CliRunner()


def _one_line(result, *needles: str, code: int = 2) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and result.output.count("\n") <= 2, result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)


def test_a_bundled_model_with_a_revision_is_refused_not_loaded_as_is():
    with pytest.raises(InvalidInputError, match="bundled model, which has one version"):
        cebm.load("shapes-color", revision="v2")
    _one_line(runner.invoke(app, ["info", "shapes-color@v999"]), "shapes-color is a bundled model", "v999")


def test_a_grid_of_four_channels_or_of_nan_is_refused_not_drawn_wrong(tmp_path):
    with pytest.raises(InvalidInputError, match=r"grey or RGB images \(B, 1 or 3, H, W\), got shape \(2, 4, 8, 8\)"):
        cebm.save_image_grid(torch.rand(2, 4, 8, 8), tmp_path / "g.png")
    with pytest.raises(InvalidInputError, match="NaN or infinite"):
        cebm.save_image_grid(torch.full((2, 3, 8, 8), math.nan), tmp_path / "g.png")
    for bad in ({"nrow": 0}, {}):
        with pytest.raises(InvalidInputError):
            cebm.save_image_grid(torch.rand(0, 3, 8, 8) if not bad else torch.rand(2, 3, 8, 8), tmp_path / "g.png", **bad)
    assert not (tmp_path / "g.png").exists()


def test_weights_that_overflow_are_one_line_not_blamed_on_the_model():
    m = cebm.load("shapes-color").condition(color="red")
    with pytest.raises(InvalidInputError, match="a weight of the composite reached"):
        m * 1e4 * 1e4
    with pytest.raises(InvalidInputError, match="a weight of the composite reached"):
        m / 1e-200 / 1e-200


def test_per_call_sampler_settings_are_type_checked_as_a_recipes_are():
    m = cebm.load("shapes-color").condition(color="red")
    with pytest.raises(InvalidInputError, match="SamplerConfig.steps must be an integer, got a string"):
        m.sample(2, steps="3")
    with pytest.raises(InvalidInputError, match="unknown AugmentConfig setting"):
        m.sample(2, augment={"spin": 1})
    assert m.sample(2, steps=1, augment={"flip_prob": 0.5}, seed=0).shape == (2, 3, 16, 16)  # a table is a config


def test_a_checkpoint_at_a_negative_step_is_refused(tmp_path):
    from composable_ebm import MLPConfig, MLPEnergy, SamplerConfig, Trainer, TrainerConfig

    config = TrainerConfig(steps=1, batch_size=4, dequantize=False,
                           objective=cebm.ContrastiveConfig(buffer_size=8, chain_augment=None,
                                                            sampler=SamplerConfig(step_size=0.1, noise=0.01, steps=1)))
    trainer = Trainer(MLPEnergy(MLPConfig(hidden=8, depth=1)), torch.randn(16, 2), config, out_dir=tmp_path)
    trainer.fit()
    trainer.close()
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    state["step"] = -5
    torch.save(state, tmp_path / "bad.pt")
    again = Trainer(MLPEnergy(MLPConfig(hidden=8, depth=1)), torch.randn(16, 2), config)
    with pytest.raises(ModelFileError, match="step -5 and rollbacks 0 must be >= 0"):
        again.resume(tmp_path / "bad.pt")


@pytest.mark.parametrize("record, words", [({"step": 1, "e_diff": "0.5"}, "e_diff is '0.5'"),
                                           ({"event": "x", "e_diff": 0.5, "to_step": 3}, "it has no step")])
def test_a_log_record_that_is_not_numbers_is_named_not_plotted(tmp_path, record, words):
    (tmp_path / "log.jsonl").write_text(json.dumps({"step": 0, "e_diff": 0.1}) + "\n" + json.dumps(record) + "\n")
    _one_line(runner.invoke(app, ["plot", str(tmp_path), "-o", str(tmp_path / "h.png")]), words)
    assert not (tmp_path / "h.png").exists()


@pytest.mark.parametrize("args, words", [
    (["--threads", "100000", "info", "shapes-color"], "--threads must be a whole number from 1 to 1024"),
    (["--threads", str(2**64), "info", "shapes-color"], "--threads must be a whole number from 1 to 1024"),
    (["sample", "shapes-color", "-n", str(2**70), "-o", "x.png"], "-n"),
    (["eval", "ood", "shapes-color", "--in", "shapes", "--out", "noise", "-n", "0"], "-n"),
])
def test_out_of_range_counts_are_one_line(args, words):
    _one_line(runner.invoke(app, args), words)


def test_a_long_expressions_error_keeps_what_was_expected():
    text = " + ".join(["shapes-color[color=red]"] * 60) + " +"
    result = runner.invoke(app, ["compose", text, "-o", "x.png"])
    _one_line(result, "expected name, found the end", "characters)")


def test_a_hub_cache_that_is_a_file_is_named_not_called_unreachable(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    with pytest.raises(InvalidInputError, match="is a file, not a folder; set HF_HUB_CACHE"):
        cebm.load("someorg/model")


def test_a_damaged_cached_download_says_how_to_fetch_it_again(tmp_path, monkeypatch):
    """A model in the Hub cache whose weights were damaged after the download: the error names --refresh."""
    import shutil

    from huggingface_hub import constants

    from composable_ebm.models import BUNDLED_DIR

    cache = tmp_path / "cache"
    snap = cache / "models--someorg--toy" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    for name in ("config.json", "README.md"):
        shutil.copy(BUNDLED_DIR / "shapes-color" / name, snap / name)
    (snap / "model.safetensors").write_bytes(b"\x00" * 64)
    (cache / "models--someorg--toy" / "refs").mkdir()
    (cache / "models--someorg--toy" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CebmError, match=r"a cached download: --refresh"):
        cebm.load("someorg/toy")


def test_a_model_folder_whose_name_is_not_utf8_loads_samples_and_saves(tmp_path):
    import shutil

    from composable_ebm.models import BUNDLED_DIR

    name = tmp_path / b"m\xff".decode("utf-8", "surrogateescape")
    shutil.copytree(BUNDLED_DIR / "shapes-shape", name)
    model = cebm.load(name)
    assert model.condition(shape="circle").sample(1, steps=1, seed=0).shape == (1, 3, 16, 16)
    model.save_pretrained(tmp_path / b"n\xfe".decode("utf-8", "surrogateescape"))


def test_a_composite_says_why_it_has_no_save_pretrained():
    a = cebm.load("shapes-shape").condition(shape="circle")
    with pytest.raises(AttributeError, match="only a trained model .* is saved or pushed"):
        (a + a).save_pretrained("x")
