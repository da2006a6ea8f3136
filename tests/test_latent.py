"""Latent energies: a model over an autoencoder's latents loads its autoencoder, composes in its latent space with
models of the same autoencoder, refuses to mix spaces in one line, and samples decoded images."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import composable_ebm as cebm
from composable_ebm.cli import app
from composable_ebm.errors import CebmError, ModelFileError, NonFiniteError
from composable_ebm.latent import LatentSpace
from composable_ebm.nets.autoencoder import Autoencoder, AutoencoderConfig, with_latent_statistics
from tests.test_own_data import make_faces

runner = CliRunner()

LATENT_RECIPE = """
[model]
type = "denoising-unet"
name = "{name}"
autoencoder = "ae"
channels = [16, 16]
embedding = 16
sigma_min = 0.02
sigma_max = 20.0
sigma_data = 1.0

[data]
dataset = "folder"
root = "faces"
attributes = ["{attribute}"]
size = 16

[trainer]
steps = 2
batch_size = 8
label_dropout = 0.1
data_augment = false
log_every = 1
checkpoint_every = 1

[sampling]
levels = 4
sigma_max = 20.0
sigma_min = 0.02
predictor = "heun"
steps = 0
guidance_scale = 2.0
guided_alone = true
"""


def tiny_autoencoder(folder: Path, images: torch.Tensor, seed: int = 0, channels: int = 4) -> Autoencoder:
    """An untrained f4 autoencoder of 16-px images with measured latent statistics, saved at ``folder``."""
    torch.manual_seed(seed)
    model = with_latent_statistics(Autoencoder(AutoencoderConfig(name="tiny-ae", image_size=16,
                                                                 latent_channels=channels, widths=(8, 8, 8))), images)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def latent_runs(tmp_path_factory, cache):
    """An autoencoder folder and two latent attribute models trained over it for two steps, through ``cebm train``
    (the latents kept in a cache folder of the module's own)."""
    root = tmp_path_factory.mktemp("latent")
    make_faces(root / "faces", n=24)
    from composable_ebm.data.folder import attribute_folder

    images = attribute_folder(root / "faces", image_size=16).images.float() / 255
    tiny_autoencoder(root / "ae", images)
    for name, attribute in (("smiling", "Smiling"), ("hat", "Hat")):
        recipe = root / f"{name}.toml"
        recipe.write_text(LATENT_RECIPE.format(name=name, attribute=attribute))
        result = runner.invoke(app, ["--threads", "1", "train", str(recipe), "--out", str(root / name), "--no-progress"])
        assert result.exit_code == 0, result.output
        assert "the latents of 24 images by ae: a latent model trains on them" in result.output
    assert len(list(cache.glob("latents-*.safetensors"))) == 1  # the two models' images were encoded once
    return root


def test_a_latent_model_loads_its_autoencoder_and_samples_decoded_images(latent_runs):
    smiling = cebm.load(latent_runs / "smiling" / "model")
    assert smiling.input_shape == (4, 4, 4) and smiling.value_range is None
    assert isinstance(smiling.latent_space, LatentSpace) and smiling.sample_shape == (3, 16, 16)
    config = json.loads((latent_runs / "smiling" / "model" / "config.json").read_text())
    assert Path(config["config"]["autoencoder"]) == (latent_runs / "ae").resolve()  # a folder, named from anywhere
    result = smiling.condition(Smiling="yes").sample_result(n=3, seed=0, keep_every=1)
    assert result.samples.shape == (3, 3, 16, 16) and result.latents.shape == (3, 4, 4, 4)
    assert float(result.samples.min()) >= 0 and float(result.samples.max()) <= 1
    assert torch.allclose(result.samples, smiling.latent_space.decode(result.latents))
    assert result.chain.shape[1:] == (3, 3, 16, 16)  # kept states are decoded too
    card = (latent_runs / "smiling" / "model" / "README.md").read_text()
    assert "latents `(4, 4, 4)` of the autoencoder" in card


def test_latent_models_of_one_autoencoder_compose_in_its_space(latent_runs):
    smiling, hat = (cebm.load(latent_runs / n / "model") for n in ("smiling", "hat"))
    assert smiling.latent_space == hat.latent_space and smiling.latent_space is not hat.latent_space
    both = smiling.condition(Smiling="yes") + hat.condition(Hat="yes")
    either = smiling.condition(Smiling="yes") | hat.condition(Hat="no")
    negated = smiling.condition(Smiling="yes") - 0.5 * hat.condition(Hat="yes")
    for energy in (both, either, negated, 2.0 * both / 1.5):
        assert energy.latent_space == smiling.latent_space
        images = energy.sample(n=2, seed=1)
        assert images.shape == (2, 3, 16, 16) and bool(torch.isfinite(images).all())


def test_mixing_autoencoders_or_latents_and_pixels_is_one_line(latent_runs, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(latent_runs / "hat" / "model", other)
    images = torch.rand(8, 3, 16, 16)
    tiny_autoencoder(tmp_path / "ae2", images, seed=5)
    config = json.loads((other / "config.json").read_text())
    config["config"]["autoencoder"] = str(tmp_path / "ae2")
    config["config"]["autoencoder_fingerprint"] = None  # a model that records none is not checked against its own
    (other / "config.json").write_text(json.dumps(config))
    smiling, hat2 = cebm.load(latent_runs / "smiling" / "model"), cebm.load(other)
    with pytest.raises(ValueError, match=r"^cannot compose energies over different autoencoders' latents: smiling\[yes\]"
                                         r" is over the latents of .*, hat\[yes\] over those of .*ae2"):
        smiling.condition(Smiling="yes") + hat2.condition(Hat="yes")
    pixels = cebm.load("faces-smiling")
    with pytest.raises(ValueError, match=r"^cannot compose a latent energy with one over pixels: smiling is over the"
                                         r" latents of .*, faces-smiling over pixels"):
        pixels | smiling
    result = runner.invoke(app, ["compose", f"{latent_runs / 'smiling' / 'model'}[Smiling=yes] + faces-smiling[smiling=yes]",
                                 "-n", "2", "-o", str(tmp_path / "grid.png")])
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1
    assert "cannot compose a latent energy with one over pixels" in result.output and not (tmp_path / "grid.png").exists()


def test_a_missing_corrupt_or_wrong_autoencoder_is_one_line_at_load(latent_runs, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(latent_runs / "smiling" / "model", model)
    config = json.loads((model / "config.json").read_text())

    def names(source: str) -> None:
        config["config"]["autoencoder"], config["config"]["autoencoder_fingerprint"] = source, None
        (model / "config.json").write_text(json.dumps(config))

    names(str(tmp_path / "nowhere"))
    with pytest.raises(CebmError, match=r"^smiling is over the latents of '.*nowhere', which did not load: "):
        cebm.load(model)
    shutil.copytree(latent_runs / "ae", tmp_path / "broken")
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"not a safetensors file")
    names(str(tmp_path / "broken"))
    with pytest.raises(ModelFileError, match=r"^smiling is over the latents of '.*broken', which did not load: "):
        cebm.load(model)
    names("faces-smiling")
    with pytest.raises(ModelFileError, match="names 'faces-smiling' as its autoencoder, but that is a"
                                             " DenoisingUNetEnergy model, not an autoencoder"):
        cebm.load(model)
    tiny_autoencoder(tmp_path / "ae8", torch.rand(8, 3, 16, 16), channels=8)
    names(str(tmp_path / "ae8"))
    with pytest.raises(ModelFileError, match=r"smiling takes inputs of shape \(4, 4, 4\), but its autoencoder .*ae8"
                                             r" makes latents of shape \(8, 4, 4\)"):
        cebm.load(model)
    result = runner.invoke(app, ["compose", f"{model}[Smiling=yes]", "-n", "2", "-o", str(tmp_path / "g.png")])
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1 and "ae8" in result.output


def test_a_decode_to_non_finite_pixels_is_one_line_and_returns_nothing(latent_runs):
    smiling = cebm.load(latent_runs / "smiling" / "model")
    space = smiling.latent_space
    with torch.no_grad():
        space.autoencoder.decoder[0].weight.fill_(1e38)  # any latent now decodes to inf
    with pytest.raises(NonFiniteError, match=r"^decoding 2 of 2 sampled latents with .* gave non-finite pixels"
                                             r" \(latents far outside what it was trained on\)"):
        smiling.condition(Smiling="yes").sample(n=2, seed=0)


def test_a_latent_model_that_names_a_folder_of_this_machine_is_not_pushed(latent_runs, monkeypatch):
    from huggingface_hub import constants

    from tests.hub_server import HubServer

    with HubServer() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_test")
        result = runner.invoke(app, ["push", str(latent_runs / "smiling" / "model"), "my-org/smiling"])
        assert result.exit_code == 2 and "which would not load from the Hub: push the autoencoder first" in result.output
        assert not hub.repos
        pushed = runner.invoke(app, ["push", str(latent_runs / "ae"), "my-org/tiny-ae"])
        assert pushed.exit_code == 0, pushed.output
        model = cebm.load(latent_runs / "smiling" / "model")
        model.config = dataclasses.replace(model.config, autoencoder="my-org/tiny-ae")
        url = model.push_to_hub("my-org/smiling")
        assert "my-org/smiling" in hub.repos and url
        again = cebm.load("my-org/smiling")  # from the Hub: its autoencoder too, by its Hub id
        assert again.latent_space == model.latent_space and again.latent_source == "my-org/tiny-ae"


CD_RECIPE = """
[model]
name = "smiling-cd"
autoencoder = "ae"
stem_channels = 16
groups = 4
multiscale = false
blocks = [{ channels = 16 }, { channels = 16, down = true }]

[data]
dataset = "folder"
root = "faces"
attributes = ["Smiling"]
size = 16

[trainer]
steps = 2
batch_size = 8
reinit_prob = 1.0
chain_augment = false
kl_ent = false
data_augment = false
log_every = 1
checkpoint_every = 1

[trainer.sampler]
step_size = 1.0
noise = 0.01
steps = 3

[sampling]
step_size = 1.0
noise = 0.01
steps = 3
"""


def test_a_contrastive_divergence_model_over_latents_trains_and_samples_decoded_images(latent_runs, tmp_path):
    """The other family composes latents too: a ResNet energy over the same latents, trained by improved contrastive
    divergence through cebm train, unclamped (latents have no value range), sampled into decoded images."""
    recipe = latent_runs / "smiling-cd.toml"
    recipe.write_text(CD_RECIPE)
    result = runner.invoke(app, ["--threads", "1", "train", str(recipe), "--out", str(tmp_path / "cd"), "--no-progress"])
    assert result.exit_code == 0, result.output
    model = cebm.load(tmp_path / "cd" / "model")
    assert model.input_shape == (4, 4, 4) and model.value_range is None and not model.noise_conditioned
    images = model.condition(Smiling="yes").sample(n=2, seed=0)
    assert images.shape == (2, 3, 16, 16) and float(images.min()) >= 0 and float(images.max()) <= 1
    with pytest.raises(ValueError, match="mixes noise-conditioned models"):  # one family per sum, as over pixels
        (model.condition(Smiling="yes") + cebm.load(latent_runs / "hat" / "model").condition(Hat="yes")).sample(n=2)


def test_the_studio_draws_latent_models_and_reads_nothing_outside_its_root(latent_runs, tmp_path):
    from composable_ebm import studio

    root = tmp_path / "root"
    root.mkdir()
    for name in ("smiling", "hat"):
        shutil.copytree(latent_runs / name / "model", root / name)
    models = studio.ModelCache("cpu", models_root=root)
    with pytest.raises(CebmError, match=r"the studio does not load smiling: its autoencoder '.*ae' is a folder outside"):
        studio.generate(models, "smiling[Smiling=yes] + hat[Hat=yes]", n=2, seed=0, out_dir=tmp_path)
    shutil.copytree(latent_runs / "ae", root / "ae")
    for name in ("smiling", "hat"):  # the autoencoder beside them, named relative to each model's folder
        config = json.loads((root / name / "config.json").read_text())
        config["config"]["autoencoder"] = "../ae"
        (root / name / "config.json").write_text(json.dumps(config))
    made = studio.generate(models, "smiling[Smiling=yes] + hat[Hat=yes]", n=2, seed=0, out_dir=tmp_path)
    assert made.samples.shape == (2, 3, 16, 16) and made.png.is_file()


def test_a_latent_model_refuses_an_autoencoder_retrained_under_its_name(latent_runs, tmp_path):
    shutil.copytree(latent_runs / "smiling" / "model", tmp_path / "smiling")
    shutil.copytree(latent_runs / "ae", tmp_path / "ae")
    config = json.loads((tmp_path / "smiling" / "config.json").read_text())
    assert config["config"]["autoencoder_fingerprint"] == cebm.load(latent_runs / "smiling" / "model").latent_space.fingerprint
    config["config"]["autoencoder"] = "../ae"
    (tmp_path / "smiling" / "config.json").write_text(json.dumps(config))
    assert cebm.load(tmp_path / "smiling").latent_space.source == "../ae"  # the same autoencoder, named otherwise
    tiny_autoencoder(tmp_path / "ae", torch.rand(8, 3, 16, 16), seed=9)  # retrained under the same folder
    with pytest.raises(ModelFileError, match=r"smiling was trained over the latents of another autoencoder than the"
                                             r" \.\./ae found now \(fingerprint [0-9a-f]{12}, found [0-9a-f]{12}\)"):
        cebm.load(tmp_path / "smiling")


def test_the_studio_downloads_no_autoencoder(latent_runs, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from composable_ebm import studio
    from tests.hub_server import HubServer

    root = tmp_path / "root"
    shutil.copytree(latent_runs / "smiling" / "model", root / "smiling")
    config = json.loads((root / "smiling" / "config.json").read_text())
    config["config"]["autoencoder"] = "my-org/never-pushed-ae"  # in no cache (another test pushes tiny-ae)
    (root / "smiling" / "config.json").write_text(json.dumps(config))
    with HubServer() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        with pytest.raises(CebmError, match="my-org/never-pushed-ae is not in the local Hub cache, and the studio"):
            studio.generate(studio.ModelCache("cpu", models_root=root), "smiling[Smiling=yes]", n=2, out_dir=tmp_path)
        assert not hub.requests  # nothing was asked of the Hub


def test_an_attribute_model_starts_from_an_unconditional_base(latent_runs, tmp_path):
    """A shared unconditional base: a model without attributes starts an attribute model's run (`--init` with
    `--allow-config-change`); the condition's weights start at zero, so the run starts as the base's energy under
    every condition."""
    base_recipe = latent_runs / "base.toml"
    base_recipe.write_text(LATENT_RECIPE.format(name="base", attribute="Smiling")
                           .replace('attributes = ["Smiling"]', "attributes = []").replace("label_dropout = 0.1", ""))
    result = runner.invoke(app, ["--threads", "1", "train", str(base_recipe), "--out", str(tmp_path / "base"),
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    base = cebm.load(tmp_path / "base" / "model")
    assert base.attributes == {} and base.embed_condition is None
    frozen = latent_runs / "smiling-frozen.toml"  # lr 1e-12: the weights stay where they start
    frozen.write_text(LATENT_RECIPE.format(name="smiling", attribute="Smiling").replace("[trainer]\n",
                                                                                        "[trainer]\nlr = 1e-12\n"))
    args = ["--threads", "1", "train", str(frozen), "--init", str(tmp_path / "base" / "model"), "--no-progress"]
    refused = runner.invoke(app, [*args, "--out", str(tmp_path / "refused")])
    assert refused.exit_code == 2 and "has no attributes (an unconditional base)" in refused.output
    tuned = runner.invoke(app, [*args, "--out", str(tmp_path / "tuned"), "--allow-config-change"])
    assert tuned.exit_code == 0, tuned.output
    model = cebm.load(tmp_path / "tuned" / "model")
    assert model.attributes == {"Smiling": ("no", "yes")}
    torch.manual_seed(0)
    z, sigma = torch.randn(3, *base.input_shape), torch.full((3,), 0.5)
    expected = base.energy(z, None, sigma)
    for value in (0, 1):
        got = model.energy(z, {"Smiling": torch.full((3,), value)}, sigma)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
