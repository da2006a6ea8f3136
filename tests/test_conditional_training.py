"""Conditional training: negatives under the data's label mix, one chain driver, attribute-safe
augmentation, a useful EMA, and runs that are what they say."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from composable_ebm import Energy, MLPConfig, MLPEnergy, shapes
from composable_ebm.cli import app
from composable_ebm.evaluation import AttributeClassifier
from composable_ebm.recipes import build_dataset, build_model, load_recipe
from composable_ebm.sampling import AugmentConfig, SamplerConfig, augment
from composable_ebm.training import ContrastiveConfig, Trainer, TrainerConfig, label_loss, other_values
from tests.conftest import FlakyEnergy, contrastive_trainer

ROOT = Path(__file__).resolve().parents[1]


class LabelRecorder(MLPEnergy):
    """Records the label of every chain evaluation (the condition the negatives run under)."""

    seen: list[torch.Tensor] = []

    def energy_and_grad(self, x, labels=None, create_graph=False):
        if not create_graph:
            LabelRecorder.seen.append(labels["side"].detach().clone())
        return super().energy_and_grad(x, labels, create_graph)


def _two_blobs(n: int, seed: int, p_one: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """2-D points: label 0 around (-1.5, 0), label 1 around (1.5, 0)."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < p_one).long()
    x = torch.randn(n, 2, generator=g) * 0.3 + torch.stack([3.0 * y - 1.5, torch.zeros(n)], dim=1)
    return x, y


class Blobs:
    def __init__(self, n: int, seed: int, p_one: float = 0.5) -> None:
        self.images, side = _two_blobs(n, seed, p_one)
        self.labels = {"side": side}


def _blob_config(**overrides) -> TrainerConfig:
    base = dict(
        steps=200, batch_size=32, lr=2e-3, ema_decay=0.9,
        sampler=SamplerConfig(step_size=0.01, noise="exact", steps=10), chain_augment=None,
        buffer_size=256, reinit_prob=0.01, cd_l2=0.1, ent_min_buffer=64, ent_bank=32, log_every=1000,
        checkpoint_every=10**6,
    )
    base.update(overrides)
    return contrastive_trainer(**base)


@pytest.mark.learning
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_label_mix_of_negatives_is_the_datas(seed):
    """Every chain runs under its positive's label, so the negatives' mix tracks the data's (0.7 here)."""
    LabelRecorder.seen = []
    torch.manual_seed(seed)
    model = LabelRecorder(MLPConfig(hidden=16, depth=2, value_range=(-4.0, 4.0), attributes={"side": ("l", "r")}))
    trainer = Trainer(model, Blobs(2000, seed, p_one=0.7), _blob_config(steps=120, seed=seed))
    trainer.fit()
    second_half = torch.cat(LabelRecorder.seen[len(LabelRecorder.seen) // 2:])
    assert abs(float(second_half.float().mean()) - 0.7) < 0.04


@pytest.mark.learning
def test_conditional_energy_classifies_fresh_data_without_label_offsets():
    """argmin_y E(x | y) recovers the label of fresh points: no per-label energy offset dominates."""
    torch.manual_seed(0)
    model = MLPEnergy(MLPConfig(hidden=32, depth=2, value_range=(-4.0, 4.0), attributes={"side": ("l", "r")}))
    trainer = Trainer(model, Blobs(2000, 0), _blob_config(steps=300))
    trainer.fit()
    x, y = _two_blobs(1000, seed=9)
    with torch.no_grad():
        energies = torch.stack([trainer.ema(x, {"side": torch.full_like(y, v)}) for v in (0, 1)], dim=1)
    accuracy = float((energies.argmin(dim=1) == y).float().mean())
    assert accuracy > 0.95


def test_label_loss_contrasts_each_positive_with_itself_under_another_value():
    torch.manual_seed(0)
    attrs = {"side": ("l", "r"), "tone": ("a", "b", "c")}
    model = MLPEnergy(MLPConfig(hidden=16, depth=2, value_range=(-4.0, 4.0), attributes=attrs))
    x = torch.randn(500, 2)
    labels = {"side": torch.randint(2, (500,)), "tone": torch.randint(3, (500,))}
    others = other_values(labels, attrs, torch.Generator().manual_seed(1))
    for attr in attrs:  # always another value, each of them about equally often
        assert bool((others[attr] != labels[attr]).all())
        counts = torch.bincount((others[attr] - labels[attr]) % len(attrs[attr]), minlength=len(attrs[attr]))
        assert counts[0] == 0 and counts[1:].min() > 0.4 * len(x) / (len(attrs[attr]) - 1)
    e_pos = model(x, labels)
    expected = torch.stack([
        e_pos.mean() - e.mean() + 0.5 * (e_pos.pow(2).mean() + e.pow(2).mean())
        for e in (model(x, {**labels, a: others[a]}) for a in attrs)
    ]).mean()
    assert torch.allclose(label_loss(model, x, e_pos, labels, others, l2_weight=0.5), expected, atol=1e-6)


def test_label_weight_adds_the_label_term_to_the_loss_only_when_asked():
    torch.manual_seed(0)
    model = MLPEnergy(MLPConfig(hidden=16, depth=2, value_range=(-4.0, 4.0), attributes={"side": ("l", "r")}))
    record = Trainer(model, Blobs(200, 0), _blob_config(label_weight=2.0)).train_step()
    assert record.loss_label is not None and record.loss_label != 0.0
    terms = [t for t in (record.loss_cd, record.loss_opt, record.loss_ent, record.loss_label) if t is not None]
    assert record.loss == pytest.approx(sum(terms), rel=1e-5)
    assert Trainer(model, Blobs(200, 0), _blob_config()).train_step().loss_label is None
    with pytest.raises(ValueError, match=r"label_weight must be a finite number in \[0, inf\)"):
        TrainerConfig(objective=ContrastiveConfig(label_weight=-1.0))


class CountingEnergy(MLPEnergy):
    calls = 0

    def energy_and_grad(self, x, labels=None, create_graph=False):
        CountingEnergy.calls += 1
        return super().energy_and_grad(x, labels, create_graph)


def test_trainer_chains_honour_rounds_and_final_steps_and_compute_each_step_once():
    CountingEnergy.calls = 0
    model = CountingEnergy(MLPConfig(hidden=8, depth=2))
    cfg = TrainerConfig(steps=1, batch_size=4, log_every=1000,
                        objective=ContrastiveConfig(chain_augment=None,
                                                    sampler=SamplerConfig(step_size=0.1, noise=0.01, steps=3, rounds=2, final_steps=2)))
    Trainer(model, torch.randn(32, 2), cfg).train_step()
    assert CountingEnergy.calls == 3 * 2 + 2


def test_trainer_refuses_settings_it_cannot_honour():
    with pytest.raises(ValueError, match="training chains use method 'langevin'"):
        TrainerConfig(objective=ContrastiveConfig(sampler=SamplerConfig(method="mala")))
    with pytest.raises(ValueError, match=r"unknown TrainerConfig setting\(s\) \['negative_labels'\]"):
        TrainerConfig.from_dict({"negative_labels": "buffer"})
    with pytest.raises(ValueError, match=r"ema_decay must be a finite number in \[0, 1\)"):
        TrainerConfig(ema_decay=1.5)


def test_ema_tracks_the_model_from_the_first_steps():
    """With the paper's 0.9999 and warm-up, after 20 steps the EMA sits near the trained weights, not the initial ones."""
    torch.manual_seed(0)
    model = MLPEnergy(MLPConfig(hidden=16, depth=2, value_range=(-4.0, 4.0), attributes={"side": ("l", "r")}))
    init = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model, Blobs(500, 0), _blob_config(steps=20, ema_decay=0.9999))
    trainer.fit()
    dist = lambda a, b: sum(float((x - y).detach().norm() ** 2) for x, y in zip(a, b, strict=True)) ** 0.5  # noqa: E731
    ema, trained = list(trainer.ema.parameters()), list(model.parameters())
    assert dist(ema, trained) < 0.3 * dist(init, trained)
    no_warmup = Trainer(MLPEnergy(model.config), Blobs(500, 0), _blob_config(steps=20, ema_decay=0.9999, ema_warmup=False))
    start = [p.detach().clone() for p in no_warmup.ema.parameters()]
    no_warmup.fit()
    assert dist(list(no_warmup.ema.parameters()), start) < 0.01 * dist(list(no_warmup.energy.parameters()), start)


def test_an_energy_that_overrides_forward_is_refused():
    with pytest.raises(TypeError, match="implement energy"):

        class Bypass(Energy):  # noqa: F841
            def forward(self, x, labels=None):
                return x.sum()


# ----------------------------------------------------------------------- attribute-safe augmentation
@pytest.fixture(scope="module")
def shapes_classifier() -> AttributeClassifier:
    """The bundled Shapes classifier (every attribute of 16-px Shapes read right >= 0.99)."""
    from composable_ebm.models import load_model

    return load_model("shapes-classifier")


ATTRIBUTES = ("shape", "color", "size", "position")
ATTRIBUTE_RECIPES = {a: ROOT / "recipes" / ("shapes-color-palette.toml" if a == "color" else f"shapes-{a}.toml")
                     for a in ATTRIBUTES}
"""The recipes of the bundled models: every chain from noise, flips at most, channel-blind networks (the colour
model's last stage: towers blind to the palette, on the balanced split)."""
OTHER_RECIPES = [ROOT / "recipes" / "shapes-color.toml"]
"""The colour model's first stage."""


@pytest.mark.learning
@pytest.mark.parametrize("path", sorted([*ATTRIBUTE_RECIPES.values(), *OTHER_RECIPES]),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_augmentations_leave_the_models_attribute_unchanged(path, shapes_classifier):
    """Chain-start, positive and sampling augmentations of each recipe keep what the classifier reads for
    that recipe's attribute, on real Shapes images."""
    recipe = load_recipe(path)
    attribute = recipe.data.attributes[0]
    images = shapes(600, 16, seed=3, split="all")
    truth = images.labels[attribute]
    clean = shapes_classifier.predict(images.images)[attribute]
    assert float((clean == truth).float().mean()) > 0.98
    configs = {"chain": recipe.trainer.objective.chain_augment, "positives": recipe.trainer.data_augment,
               "sampling": recipe.sampling.sampler.augment}
    for where, cfg in configs.items():
        if cfg is None:
            continue
        out = augment(images.images, cfg, torch.Generator().manual_seed(0))
        read = shapes_classifier.predict(out)[attribute]
        agree = float((read == truth).float().mean())
        assert agree > 0.97, f"{where} augmentation of shapes-{attribute} changes {attribute}: {agree:.3f} kept"


@pytest.mark.learning
@pytest.mark.parametrize("attribute", sorted(ATTRIBUTE_RECIPES))
def test_no_training_positive_or_chain_start_is_a_held_out_combination(attribute, shapes_classifier):
    """Clean zero-shot: 40 batches of 256 positives drawn by the recipe's own trainer (augmented as in
    training) hold no red circle as the classifier reads them, and every chain starts from noise
    (so no augmentation of a buffer sample can draw one either)."""
    recipe = load_recipe(ATTRIBUTE_RECIPES[attribute])
    assert recipe.data.holdout == ({"color": "red", "shape": "circle"},)
    assert recipe.trainer.objective.reinit_prob == 1.0 and recipe.trainer.objective.chain_augment is None
    data = build_dataset(recipe.data)
    trainer = Trainer(build_model(recipe, data), data, recipe.trainer)
    red, circle = 0, 0
    for _ in range(40):
        x, _ = trainer.positives(256)
        read = shapes_classifier.predict(x)
        red_circles = (read["color"] == red) & (read["shape"] == circle)
        assert not bool(red_circles.any()), f"shapes-{attribute}'s positives draw {int(red_circles.sum())} red circles"
    # the check can fail: the same positives under an RGB channel permutation do draw red circles
    permuted = augment(x, AugmentConfig(color_prob=0.0, grayscale_prob=0.0, channel_permute_prob=1.0, flip_prob=0.0,
                                        crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0)), torch.Generator().manual_seed(0))
    read = shapes_classifier.predict(permuted)
    assert bool(((read["color"] == red) & (read["shape"] == circle)).any())


def test_a_colour_jitter_would_be_caught(shapes_classifier):
    """The check above can fail: SimCLR colour jitter changes what the classifier reads as colour."""
    images = shapes(600, 16, seed=3, split="all")
    out = augment(images.images, AugmentConfig(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0)),
                  torch.Generator().manual_seed(0))
    read = shapes_classifier.predict(out)["color"]
    assert float((read == images.labels["color"]).float().mean()) < 0.9


# ----------------------------------------------------------------------------- runs are what they say
TOY = """
[model]
type = "mlp"
name = "toy"
hidden = 16
depth = 2
value_range = [-4.0, 4.0]

[data]
dataset = "toy2d"
n = 256

[trainer]
steps = 4
batch_size = 16
chain_augment = false
buffer_size = 64
ent_bank = 8
ent_min_buffer = 8
log_every = 2
checkpoint_every = 2
seed = {seed}

[trainer.sampler]
step_size = 0.01
noise = "exact"
steps = 3

[sampling]
step_size = 0.01
noise = "exact"
steps = 5
"""

runner = CliRunner()


def _train(recipe: Path, out: Path, *extra: str):
    return runner.invoke(app, ["train", str(recipe), "--out", str(out), "--no-progress", *extra])


def test_one_recipe_trains_to_bit_identical_weights(tmp_path):
    recipe = tmp_path / "toy.toml"
    recipe.write_text(TOY.format(seed=3))
    for run in ("a", "b"):
        assert _train(recipe, tmp_path / run).exit_code == 0
    a = (tmp_path / "a" / "model" / "model.safetensors").read_bytes()
    assert a == (tmp_path / "b" / "model" / "model.safetensors").read_bytes()
    other = tmp_path / "other.toml"
    other.write_text(TOY.format(seed=4))
    assert _train(other, tmp_path / "c").exit_code == 0
    assert a != (tmp_path / "c" / "model" / "model.safetensors").read_bytes()


def _trained_and_changed(tmp_path, old: str, new: str):
    """The toy recipe trained into ``tmp_path / "run"``, and the same recipe with ``old`` replaced by ``new``."""
    recipe = tmp_path / "toy.toml"
    recipe.write_text(TOY.format(seed=3))
    assert _train(recipe, tmp_path / "run").exit_code == 0
    changed = tmp_path / "changed.toml"
    assert old in TOY
    changed.write_text(TOY.format(seed=3).replace(old, new))
    return recipe, changed


def test_resume_refuses_a_changed_recipe_naming_the_keys(tmp_path):
    recipe, changed = _trained_and_changed(tmp_path, "batch_size = 16", "batch_size = 8")
    result = _train(changed, tmp_path / "run", "--steps", "6")
    assert result.exit_code == 2
    assert "batch_size (16 -> 8)" in result.output and "--allow-config-change" in result.output
    # more steps is no change of recipe
    assert _train(recipe, tmp_path / "run", "--steps", "6").exit_code == 0
    allowed = _train(changed, tmp_path / "run", "--steps", "8", "--allow-config-change")
    assert allowed.exit_code == 0, allowed.output
    events = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    change = next(e for e in events if e.get("event") == "config_changed")
    assert change["changes"] == {"batch_size": {"old": 16, "new": 8}}


def test_an_allowed_resume_takes_a_checkpoint_with_another_buffer_size(tmp_path):
    # e.g. a CPU run resumed on a GPU with more chains and a smaller buffer (chains start from noise)
    _, small = _trained_and_changed(tmp_path, "buffer_size = 64", "buffer_size = 20")
    refused = _train(small, tmp_path / "run", "--steps", "6")
    assert refused.exit_code == 2 and "buffer_size (" in refused.output
    allowed = _train(small, tmp_path / "run", "--steps", "6", "--allow-config-change")
    assert allowed.exit_code == 0, allowed.output
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    buffer = state["objective"]["buffer"]
    assert state["step"] == 6 and buffer["capacity"] == 20 and buffer["samples"].shape[0] == 20


def test_a_fresh_run_never_rolls_back_into_an_older_runs_checkpoint(tmp_path):
    cfg = _blob_config(steps=6, checkpoint_every=3)
    Trainer(MLPEnergy(MLPConfig(hidden=8, depth=2, value_range=(-4.0, 4.0), attributes={"side": ("l", "r")})),
            Blobs(200, 0), cfg, out_dir=tmp_path).fit()
    # a new run in the same folder (no resume) faults in its 2nd iteration, before its first checkpoint
    fresh = Trainer(FlakyEnergy.poisoned_at(15, MLPConfig(hidden=8, depth=2, value_range=(-4.0, 4.0), attributes={"side": ("l", "r")})),
                    Blobs(200, 0), cfg, out_dir=tmp_path)
    summary = fresh.fit()
    assert summary.rollbacks == 1 and summary.faults[0]["step"] == 2
    events = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert next(e for e in events if e.get("event") == "rolled_back")["to_step"] == 0


@pytest.mark.parametrize("path", [ATTRIBUTE_RECIPES["shape"], *(p for p in OTHER_RECIPES if p.name == "shapes-shape.toml")],
                         ids=lambda p: p.parent.name)
def test_the_shape_recipes_network_is_one_tower_and_scores_16x16_shapes(path):
    """The network the shape recipe builds: one full-resolution tower (no multiscale), energies per image."""
    from composable_ebm.recipes import build_dataset, build_model

    recipe = load_recipe(path)
    model = build_model(recipe, build_dataset(recipe.data))
    assert model.config.multiscale is False and model.config.image_size == 16
    assert model(torch.rand(2, 3, 16, 16), {"shape": torch.tensor([0, 2])}).shape == (2,)


def test_a_checkpoint_older_than_a_new_setting_resumes_when_the_recipe_keeps_its_default(tmp_path):
    import torch

    recipe = tmp_path / "toy.toml"
    recipe.write_text(TOY.format(seed=3))
    assert _train(recipe, tmp_path / "run").exit_code == 0
    path = tmp_path / "run" / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    saved = json.loads(state["trainer_config"])
    del saved["data_start_prob"]  # as written before the setting existed
    state["trainer_config"] = json.dumps(saved)
    torch.save(state, path)
    resumed = _train(recipe, tmp_path / "run", "--steps", "6")
    assert resumed.exit_code == 0, resumed.output
    changed = tmp_path / "changed.toml"  # a recipe that sets it to another value is a change, named
    changed.write_text(TOY.format(seed=3).replace("[trainer]", "[trainer]\ndata_start_prob = 0.5"))
    result = _train(changed, tmp_path / "run", "--steps", "8")
    assert result.exit_code == 2 and "data_start_prob (0.0 -> 0.5)" in result.output


def test_the_bundled_recipes_networks_cannot_tell_a_red_circle_from_a_green_one():
    """Every bundled recipe's network is channel-blind, and the colour model's condition enters only through
    its pixel-set head: a red circle and the same circle in green (a channel permutation) get one energy from
    the shape, size and position models, and the colour model's unconditional energy is the same too (its towers
    are blind to the palette: there the red circle is the green one drawn in the data's red, edges included)."""
    circles = shapes(64, 16, seed=5, split="all")
    keep = (circles.labels["shape"] == 0) & (circles.labels["color"] == 1)  # green circles
    green = circles.images[keep][:4]
    for attribute, path in ATTRIBUTE_RECIPES.items():
        recipe = load_recipe(path)
        model = build_model(recipe, build_dataset(replace(recipe.data, n=64))).eval()
        assert "channel-sort" in model.config.input_transforms
        if "shapes-palette-order" in model.config.input_transforms:
            from composable_ebm.data.shapes import _BACKGROUND, COLOURS

            bg = torch.full((1, 3, 1, 1), _BACKGROUND)
            g, r = (torch.tensor(COLOURS[c]).view(1, 3, 1, 1) for c in ("green", "red"))
            assert torch.allclose(green[green.flatten(1).amax(1).argmax()].amax(dim=(1, 2)), g.flatten(), atol=1e-6)
            red = bg + (green - bg) * (r - bg) / (g - bg)  # each pixel's share of the colour, in red
        else:
            red = green[:, [1, 0, 2]]  # the same circles with the red and green channels swapped
        null = {attribute: torch.full((4,), -1)}
        torch.testing.assert_close(model(red, null), model(green, null))
        if attribute != "color":
            labels = {attribute: torch.zeros(4, dtype=torch.long)}
            torch.testing.assert_close(model(red, labels), model(green, labels))
        else:
            assert model.config.condition_head == "pixel_set"
