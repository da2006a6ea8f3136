"""The autoencoder model type: f4 latents, standardised; saved, loaded and carded like every model; trained by
``cebm train-autoencoder`` from a folder, without the held-out combination, resumable from its checkpoint."""

from __future__ import annotations

import dataclasses

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from composable_ebm.cli import app
from composable_ebm.errors import InvalidInputError
from composable_ebm.models import load_model, save_model
from composable_ebm.nets.autoencoder import Autoencoder, AutoencoderConfig, with_latent_statistics
from composable_ebm.training.autoencoder import AutoencoderTraining, fit_autoencoder, psnr, reconstruction_loss
from tests.test_own_data import make_faces

TINY = AutoencoderConfig(name="tiny-ae", image_size=16, latent_channels=2, widths=(8, 8, 8), blocks=1)


def test_an_f4_autoencoder_maps_images_to_standardised_latents_a_quarter_the_side():
    model = Autoencoder(AutoencoderConfig(image_size=64, latent_channels=4, widths=(16, 16, 16)))
    x = torch.rand(3, 3, 64, 64)
    z = model.encode(x)
    assert z.shape == (3, 4, 16, 16) == (3, *model.config.latent_shape) and model.decode(z).shape == x.shape
    images = torch.rand(64, 3, 64, 64)
    with_latent_statistics(model, images)
    z = model.encode(images).detach()
    assert abs(float(z.mean())) < 1e-3 and abs(float(z.std()) - 1) < 1e-3  # the stored shift and scale standardise
    assert torch.allclose(model.decode(z), model.decoder(model.raw_latents(images)), atol=1e-5)
    with pytest.raises(InvalidInputError, match=r"encodes a batch of shape \(B, 3, 64, 64\), got \(2, 3, 32, 32\)"):
        model.encode(torch.rand(2, 3, 32, 32))
    with pytest.raises(InvalidInputError, match="multiple of the downsampling factor 4"):
        AutoencoderConfig(image_size=66, widths=(8, 8, 8))


def test_an_autoencoder_saves_loads_and_is_carded_like_every_model(tmp_path):
    model = with_latent_statistics(Autoencoder(TINY), torch.rand(8, 3, 16, 16))
    save_model(model, tmp_path / "ae", card=None)
    again = load_model(tmp_path / "ae")
    assert isinstance(again, Autoencoder) and again.config == model.config
    x = torch.rand(2, 3, 16, 16)
    assert torch.equal(again.encode(x), model.encode(x))
    from composable_ebm.model_cards import model_card, pipeline_tag

    card = model_card(again, location="ae")
    assert "autoencoder.encode(images)" in card and pipeline_tag(again) is None


def test_the_loss_sees_a_thin_line_the_plain_errors_barely_see():
    x = torch.zeros(1, 3, 16, 16)
    line = x.clone()
    line[..., 8, :] = 1.0  # one dark line, one pixel thin, in 16 rows
    assert float(reconstruction_loss(x, x, 1.0)) == 0.0
    plain, edged = float(reconstruction_loss(x, line, 0.0)), float(reconstruction_loss(x, line, 1.0))
    assert edged > 2 * plain
    assert psnr(line, line) > 100 and psnr(x, line) == pytest.approx(10 * torch.log10(torch.tensor(16.0)).item(),
                                                                     rel=1e-4)


def test_a_stopped_training_run_resumes_to_the_weights_of_one_that_ran_through(tmp_path):
    from composable_ebm.data.folder import attribute_folder

    make_faces(tmp_path / "faces", n=48)
    images = attribute_folder(tmp_path / "faces", image_size=16).images
    training = AutoencoderTraining(steps=6, batch_size=4, held_out=4, checkpoint_every=2)
    whole = fit_autoencoder(images, tmp_path / "whole", TINY, training)
    assert whole.steps == 6 and not whole.stopped and whole.psnr is not None
    assert (tmp_path / "whole" / "model" / "model.safetensors").is_file()

    class Stop(Exception):
        pass

    def stop_after_step_2(line: str) -> None:
        if line.startswith("step 2 "):
            raise Stop

    with pytest.raises(Stop):
        fit_autoencoder(images, tmp_path / "split", TINY, training, echo=stop_after_step_2)
    from composable_ebm.training.autoencoder import checkpoint_autoencoder

    halfway, step = checkpoint_autoencoder(tmp_path / "split")  # a run in progress, measured from its checkpoint
    assert step == 2 and halfway.config == TINY and halfway.reconstruct(images[:2].float() / 255).shape == (2, 3, 16, 16)
    with pytest.raises(InvalidInputError, match="holds no checkpoint.pt"):
        checkpoint_autoencoder(tmp_path / "faces")
    said: list[str] = []
    resumed = fit_autoencoder(images, tmp_path / "split", TINY, training, echo=said.append)
    assert said[0] == "resumed from step 2" and resumed.steps == 6
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(InvalidInputError, match=r"was trained with other settings .*\(--steps may differ\)"):
        fit_autoencoder(images, tmp_path / "split", TINY, AutoencoderTraining(steps=6, batch_size=8, held_out=4,
                                                                            checkpoint_every=2))
    longer = fit_autoencoder(images, tmp_path / "split", TINY, dataclasses.replace(training, steps=8))
    assert longer.steps == 8 and not torch.equal(longer.model.decoder[-1].weight, whole.model.decoder[-1].weight)
    said.clear()  # a count the run has reached finishes it at once, with the weights it has
    shorter = fit_autoencoder(images, tmp_path / "split", TINY, dataclasses.replace(training, steps=4), echo=said.append)
    assert shorter.steps == 8 and said[0] == "resumed from step 8" and said[-1].startswith("trained 8 steps")
    assert torch.equal(shorter.model.decoder[-1].weight, longer.model.decoder[-1].weight)


def test_cebm_train_autoencoder_trains_and_refuses_a_bad_exclusion_in_one_line(tmp_path):
    make_faces(tmp_path / "faces", n=48)
    runner = CliRunner()
    args = ["train-autoencoder", str(tmp_path / "faces"), "--out", str(tmp_path / "run"), "--size", "16",
            "--latent-channels", "2", "--widths", "8,8,8", "--steps", "2", "--batch-size", "4", "--held-out", "4"]
    result = runner.invoke(app, [*args, "--exclude", "Smiling=yes,Hat=yes"])
    assert result.exit_code == 0, result.output
    assert load_model(tmp_path / "run" / "model").config.latent_channels == 2
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert "on 33 images (`faces` without Smiling=yes, Hat=yes)" in card  # 12 of 48 smile with a hat, 3 aside
    result = runner.invoke(app, [*args[:3], str(tmp_path / "other"), *args[4:], "--exclude", "Mood=happy"])
    assert result.exit_code == 2 and "Mood" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, [*args[:3], str(tmp_path / "other"), *args[4:], "--widths", "8,x"])
    assert result.exit_code == 2 and "--widths takes whole numbers" in result.output
    assert not Path(tmp_path / "other" / "checkpoint.pt").exists()


def test_a_focus_fills_its_share_of_each_batch_and_init_fine_tunes_a_trained_autoencoder(tmp_path):
    """``--focus`` draws ``--focus-share`` of every batch from the images of a combination; ``--init`` starts from a
    trained autoencoder's weights (its network, whatever the defaults), and says so on the card."""
    from composable_ebm.training.autoencoder import _batch

    chosen = torch.tensor([3, 7])
    training = AutoencoderTraining(batch_size=8, focus_share=0.5)
    drawn = _batch(100, chosen, training, torch.Generator().manual_seed(0))
    assert drawn.shape == (8,) and set(drawn[:4].tolist()) <= {3, 7}
    assert _batch(100, None, AutoencoderTraining(batch_size=8), torch.Generator().manual_seed(0)).shape == (8,)

    make_faces(tmp_path / "faces", n=48)
    runner = CliRunner()
    base = ["train-autoencoder", str(tmp_path / "faces"), "--size", "16", "--steps", "2", "--batch-size", "4",
            "--held-out", "4"]
    first = runner.invoke(app, [*base, "--out", str(tmp_path / "a"), "--latent-channels", "2", "--widths", "8,8,8"])
    assert first.exit_code == 0, first.output
    tuned = runner.invoke(app, [*base, "--out", str(tmp_path / "b"), "--init", str(tmp_path / "a" / "model"),
                                "--focus", "Hat=yes", "--focus-share", "0.5", "--lr", "1e-4"])
    assert tuned.exit_code == 0, tuned.output
    before, after = load_model(tmp_path / "a" / "model"), load_model(tmp_path / "b" / "model")
    assert after.config.widths == (8, 8, 8) and after.config.latent_channels == 2  # the init's network
    moved = (after.decoder[-1].weight - before.decoder[-1].weight).detach().abs().max()
    assert 0 < float(moved) < 0.01  # two small steps from its weights, not a fresh network
    card = (tmp_path / "b" / "model" / "README.md").read_text()
    assert f"from the weights of `{tmp_path / 'a' / 'model'}`, 50% of each batch drawn from the" in card
    assert "focus: Hat=yes" in card
    for extra, line in ((["--init", str(tmp_path / "a" / "model"), "--widths", "8,16,16"], "its network is not"),
                        (["--focus", "Hat=yes"], "give both (--focus and --focus-share) or neither"),
                        (["--focus", "Mood=happy", "--focus-share", "0.5"], "Mood")):
        result = runner.invoke(app, [*base, "--out", str(tmp_path / "c"), *extra])
        assert result.exit_code == 2 and line in result.output and "Traceback" not in result.output, result.output
        assert not (tmp_path / "c" / "checkpoint.pt").exists()
