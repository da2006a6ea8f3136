"""Noise-conditioned energies (energy-parameterised diffusion): the algebra passes the level, the annealed samplers
reproduce closed forms at every level, denoising score matching trains, and the family goes through the same
commands as contrastive-divergence models."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import composable_ebm as cebm
from composable_ebm.analytic import GaussianEnergy, NoisedGaussianEnergy
from composable_ebm.cli import app
from composable_ebm.configs import config_from_dict, config_to_dict
from composable_ebm.data import ImageDataset
from composable_ebm.errors import InvalidInputError
from composable_ebm.nets.unet import DenoisingUNetConfig, DenoisingUNetEnergy
from composable_ebm.pipeline import plan
from composable_ebm.pipeline import sample as pipeline_sample
from composable_ebm.sampling import LadderConfig, SamplerConfig, SamplingDefaults, sample
from composable_ebm.training import DenoisingConfig, Trainer, TrainerConfig
from composable_ebm.training.denoising import DenoisingObjective, LevelDistribution, edm_weights
from tests.test_energy import randomize

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

A = NoisedGaussianEnergy(torch.tensor([1.0, 0.0]), torch.tensor([[1.0, 0.3], [0.3, 0.5]]), name="a")
B = NoisedGaussianEnergy(torch.tensor([-1.0, 1.0]), torch.tensor([[0.5, 0.0], [0.0, 1.0]]), name="b")


def product(sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance of ``N(mu_a, C_a + sigma^2 I) N(mu_b, C_b + sigma^2 I)``, normalised."""
    pa, pb = torch.linalg.inv(A.covariance(sigma)), torch.linalg.inv(B.covariance(sigma))
    cov = torch.linalg.inv(pa + pb)
    return cov @ (pa @ A.mean + pb @ B.mean), cov


def tiny_unet(**overrides) -> DenoisingUNetEnergy:
    base = dict(name="tiny-unet", image_size=8, channels=(8, 16), embedding=16, groups=4,
                attributes={"color": ("red", "green")}, null_condition=True)
    base.update(overrides)
    return DenoisingUNetEnergy(DenoisingUNetConfig(**base))


@pytest.mark.learning
@pytest.mark.parametrize("method", ["langevin", "mala", "hmc"])
@pytest.mark.parametrize("sigma", [1.0, 0.3, 0.05])
def test_a_sum_of_two_noised_gaussians_samples_their_closed_form_product_at_every_level(method, sigma):
    """One level of the ladder run long: the samples' moments are the product's at that level (4,000 chains)."""
    mean, cov = product(sigma)
    step = (0.01 if method == "langevin" else 0.05) / sigma**2  # the ladder multiplies the step size by sigma^2
    ladder = LadderConfig(levels=1, sigma_min=sigma, sigma_max=sigma, denoise=False, method=method, steps=300,
                          step_size=step)
    result = sample(A + B, 4000, ladder, seed=0)
    x = result.samples
    tol = 0.05 + 0.05 * float(cov.diagonal().max())
    assert (x.mean(0) - mean).abs().max() < tol
    assert (torch.cov(x.T) - cov).abs().max() < tol
    if method != "langevin":
        assert 0.5 < result.acceptance_rate < 1.0  # per-chain accept/reject, in the diagnostics


@pytest.mark.parametrize("method", ["mala", "hmc"])
def test_the_whole_ladder_ends_at_the_product_at_its_last_level(method):
    mean, cov = product(0.05)
    ladder = LadderConfig(levels=12, sigma_min=0.05, sigma_max=3.0, denoise=False, method=method, steps=25, step_size=1.0)
    result = sample(A + B, 4000, ladder, seed=1)
    assert (result.samples.mean(0) - mean).abs().max() < 0.08
    assert (torch.cov(result.samples.T) - cov).abs().max() < 0.08
    assert result.diagnostics.acceptance.shape == (12 * 25,)


@pytest.mark.parametrize(("expression", "moments"), [
    ("2 * a + b", lambda: weighted_product(2.0, 1.0, 0.05)),
    ("a + b", lambda: weighted_product(1.0, 1.0, 0.05)),
    ("a / 2", lambda: (A.mean, 2 * A.covariance(0.05))),
    ("a / 0.5", lambda: (A.mean, 0.5 * A.covariance(0.05))),
])
def test_a_weight_and_a_temperature_end_the_ladder_at_their_closed_form(expression, moments):
    """Down the whole ladder with MALA transitions, ``w_a E_a + w_b E_b`` ends at the precision-weighted product of
    the two Gaussians at the last level, so ``2 * a + b`` lies nearer ``a`` than ``a + b`` does, and ``a / T`` at
    ``a``'s distribution with its covariance times ``T``: wider for ``T > 1``, narrower for ``T < 1``."""
    energy = {"2 * a + b": 2 * A + B, "a + b": A + B, "a / 2": A / 2, "a / 0.5": A / 0.5}[expression]
    mean, cov = moments()
    ladder = LadderConfig(levels=12, sigma_min=0.05, sigma_max=3.0, denoise=False, method="mala", steps=25,
                          step_size=1.0)
    x = sample(energy, 4000, ladder, seed=5).samples
    tol = 0.05 + 0.05 * float(cov.diagonal().max())
    assert (x.mean(0) - mean).abs().max() < tol
    assert (torch.cov(x.T) - cov).abs().max() < tol


def weighted_product(wa: float, wb: float, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance of ``N(mu_a, C_a + sigma^2 I)^wa N(mu_b, C_b + sigma^2 I)^wb``, normalised."""
    pa, pb = wa * torch.linalg.inv(A.covariance(sigma)), wb * torch.linalg.inv(B.covariance(sigma))
    cov = torch.linalg.inv(pa + pb)
    return cov @ (pa @ A.mean + pb @ B.mean), cov


def test_first_steps_take_the_chains_from_the_start_noise_to_the_first_levels_distribution():
    """The chains start from centre-plus-noise, not from the noised product: with no transition at its one level the
    samples are that start; ``first_steps`` transitions there bring them to the product at that level, and they are
    counted, summarised and carried through the config's JSON."""
    mean, cov = product(1.0)
    ladder = LadderConfig(levels=1, sigma_min=1.0, sigma_max=1.0, denoise=False, method="mala", steps=0, step_size=0.5)
    still = sample(A + B, 4000, ladder, seed=3)
    assert (still.samples.mean(0) - mean).abs().max() > 0.3  # the start: mean 0, far from the product's
    cfg = dataclasses.replace(ladder, first_steps=200)
    moved = sample(A + B, 4000, cfg, seed=3)
    assert (moved.samples.mean(0) - mean).abs().max() < 0.08
    assert (torch.cov(moved.samples.T) - cov).abs().max() < 0.08
    assert moved.diagnostics.acceptance.shape == (200,) and cfg.total_steps == 200
    split = LadderConfig(levels=3, steps=2, first_steps=5, final_steps=1)
    assert split.transitions_per_level() == [7, 2, 3] and sum(split.transitions_per_level()) == split.total_steps
    assert "200 steps at the first level" in cfg.summary()
    bare = LadderConfig(levels=20, steps=0, sigma_max=20.0)
    assert bare.total_steps == 0 and bare.transitions_per_level() == [0] * 20
    assert bare.summary() == ("20 noise levels (20 to 0.01, geometric), ancestral steps between them, no transitions"
                              " at a level, denoised")
    assert config_from_dict(LadderConfig, json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    with pytest.raises(InvalidInputError, match="first_steps must be an integer"):
        LadderConfig(first_steps=-1)
    with pytest.raises(InvalidInputError, match=r"first_steps \+ levels x steps \+ final_steps = 2000000 \+ 30 x 2"
                                                r" \+ 0 = 2,000,060 transitions; at most 1,048,576"):
        LadderConfig(steps=2, first_steps=2_000_000)


@pytest.mark.parametrize(("predictor", "steps", "churn", "expected"), [
    ("ancestral", 0, 0.0, 20), ("ancestral", 1, 0.0, 40), ("heun", 0, 0.0, 39), ("heun", 1, 0.0, 59),
    ("heun", 0, 0.4, 39), ("heun", 1, 0.4, 77)])
def test_a_ladder_evaluates_the_energy_once_per_level_and_once_per_transition(predictor, steps, churn, expected,
                                                                             monkeypatch):
    """A draw down L levels costs L evaluations (each level's gradient serves the step to the next level and, at the
    last, the denoising step), plus one per MALA transition and one per Heun correction (L - 1), and with churn the
    gradient where the fresh noise leaves the chains, where a transition's cannot serve (none at sigma_max): what
    benchmarks/faces_speed.py counts for the faces models."""
    single = NoisedGaussianEnergy(torch.tensor([1.0, 0.0]), torch.tensor([[1.0, 0.3], [0.3, 0.5]]), name="single")
    calls = []
    original = single.energy_and_grad
    monkeypatch.setattr(single, "energy_and_grad", lambda *a, **k: calls.append(1) or original(*a, **k))
    sample(single, 4, LadderConfig(levels=20, sigma_max=20.0, predictor=predictor, steps=steps, churn=churn), seed=0)
    assert len(calls) == expected


def test_the_heun_predictor_follows_the_probability_flow_to_the_last_levels_distribution():
    """With no transition at any level, chains started at sigma_max = 50 (nearly the noised data there) and moved by
    the deterministic second-order step reach N(mu, C + sigma_min^2 I) of one noised Gaussian in 20 levels, where the
    first-order ancestral step is still far off in covariance; a bool saved for the predictor reads as today's."""
    single = NoisedGaussianEnergy(torch.tensor([1.0, 0.0]), torch.tensor([[1.0, 0.3], [0.3, 0.5]]), name="single")
    target = single.covariance(0.05)
    errors = {}
    for predictor in ("heun", "ancestral"):
        cfg = LadderConfig(levels=20, sigma_min=0.05, sigma_max=50.0, spacing="karras", steps=0, predictor=predictor,
                           denoise=False)
        x = sample(single, 20000, cfg, seed=0).samples
        errors[predictor] = ((x.mean(0) - single.mean).abs().max(), (torch.cov(x.T) - target).abs().max())
    assert errors["heun"][0] < 0.08 and errors["heun"][1] < 0.1, errors
    assert errors["ancestral"][1] > 2 * errors["heun"][1], errors
    with pytest.raises(InvalidInputError, match=r"predictor 'euler'; valid choices: \['ancestral', 'heun', 'none'\]"):
        LadderConfig(predictor="euler")
    # with churn, fresh noise before each step: still the same distribution, from a stochastic walk
    churned = LadderConfig(levels=20, sigma_min=0.05, sigma_max=50.0, spacing="karras", steps=0, predictor="heun",
                           denoise=False, churn=0.3)
    x = sample(single, 20000, churned, seed=0).samples
    assert (x.mean(0) - single.mean).abs().max() < 0.05 and (torch.cov(x.T) - target).abs().max() < 0.15
    assert "heun steps (churn 0.3) between them" in churned.summary()
    ancestral = dataclasses.replace(churned, predictor="ancestral")  # churn is the Heun step's: ignored here
    assert "churn" not in ancestral.summary()
    torch.testing.assert_close(sample(single, 64, ancestral, seed=1).samples,
                               sample(single, 64, dataclasses.replace(ancestral, churn=0.0), seed=1).samples)
    with pytest.raises(InvalidInputError, match=r"churn must be a finite number in \[0, 1\]"):
        LadderConfig(churn=-0.1)
    for saved, now in ((True, "ancestral"), (False, "none")):
        assert SamplingDefaults.from_flat({"predictor": saved}, ladder=True, saved=True).sampler.predictor == now


def test_metropolis_corrections_remove_the_bias_that_a_large_langevin_step_leaves():
    """At a step where unadjusted Langevin's stationary law is visibly wrong, MALA's and HMC's are right: their
    proposal densities are the proposals' own."""
    target = GaussianEnergy(torch.zeros(2), torch.eye(2))
    wide = {}
    for method in ("langevin", "mala", "hmc"):
        cfg = SamplerConfig(method=method, noise="exact", step_size=0.6, steps=200, clamp=False)
        wide[method] = float(sample(target, 4000, cfg, seed=2).samples.var(0).mean())
    assert abs(wide["langevin"] - 1.0) > 0.3  # 1 / (1 - step / 2) = 1.43 for this Gaussian
    assert abs(wide["mala"] - 1.0) < 0.08 and abs(wide["hmc"] - 1.0) < 0.08


def test_accept_reject_is_per_chain():
    seen = []
    cfg = SamplerConfig(method="mala", noise="exact", step_size=0.8, steps=5, clamp=False)
    sample(GaussianEnergy(torch.zeros(2), torch.eye(2)), 256, cfg, seed=0,
           callback=lambda info: seen.append(info["accepted"]))
    assert all(a.shape == (256,) for a in seen)
    assert any(0 < int(a.sum()) < 256 for a in seen)  # one draw per chain: some accepted, some not, in one step


def test_the_algebra_passes_the_level_to_every_term():
    a, b = tiny_unet(name="a"), tiny_unet(name="b")
    x = torch.rand(5, 3, 8, 8)
    sigma = torch.tensor([0.02, 0.1, 0.3, 0.6, 1.0])
    red, green = a.condition(color="red"), b.condition(color="green")
    ea, eb = red(x, sigma=sigma), green(x, sigma=sigma)
    assert torch.allclose((red + 2 * green)(x, sigma=sigma), ea + 2 * eb, atol=1e-5)
    assert torch.allclose((red / 2)(x, sigma=sigma), ea / 2, atol=1e-5)
    assert torch.allclose((red | green)(x, sigma=sigma), -torch.logaddexp(-ea, -eb), atol=1e-5)
    guided = cebm.guided(red + green)
    null_a, null_b = a(x, sigma=sigma), b(x, sigma=sigma)
    expect = (null_a + null_b) / 2 + (ea - null_a) + (eb - null_b)
    assert torch.allclose(guided(x, sigma=sigma), expect, atol=1e-4)
    assert not torch.allclose(red(x, sigma=0.05), red(x, sigma=0.5))  # the level matters
    assert torch.allclose(red(x), red(x, sigma=a.config.sigma_min))  # no level: the lowest trained
    assert (red(x, sigma=sigma) >= 0).all()  # the squared-norm form is bounded below
    assert (red + green).noise_conditioned and not GaussianEnergy(torch.zeros(2), torch.eye(2)).noise_conditioned
    for bad in (-1.0, 0.0, float("nan"), torch.ones(3)):
        with pytest.raises(ValueError, match="noise level"):
            red(x, sigma=bad)


def test_the_energy_gradient_is_the_unets_noise_prediction_scaled_by_the_level():
    """``sigma dE/dx`` does not shrink or blow up with the level at initialisation: the preconditioning keeps the
    predicted noise of one scale across the ladder."""
    model = tiny_unet()
    x = torch.rand(16, 3, 8, 8)
    scales = []
    for s in (0.01, 0.1, 1.0):
        _, grad = model.energy_and_grad(x, sigma=s)
        scales.append(float((s * grad).flatten(1).norm(dim=1).mean()))
    assert max(scales) / min(scales) < 20


def test_an_input_transform_makes_the_energy_invariant_to_what_it_removes():
    model = tiny_unet(input_transforms=("channel-sort",))
    x = torch.rand(4, 3, 8, 8)
    assert torch.allclose(model(x, sigma=0.2), model(x[:, [2, 0, 1]], sigma=0.2), atol=1e-5)
    plain = tiny_unet()
    assert not torch.allclose(plain(x, sigma=0.2), plain(x[:, [2, 0, 1]], sigma=0.2))


def test_mixing_families_is_one_line():
    model = tiny_unet()
    clean = cebm.ResNetEnergy(cebm.ResNetConfig(name="clean", image_size=8, stem_channels=8, groups=4,
                                                blocks=(cebm.BlockSpec(channels=8, down=True),), multiscale=False))
    with pytest.raises(InvalidInputError, match="mixes noise-conditioned models .* valid choices"):
        plan(model.condition(color="red") + clean)


def test_a_composites_ladder_keeps_to_the_levels_every_model_was_trained_on():
    """Models trained on different noise levels: a composite's ladder starts at the lowest of their highest levels,
    whichever term comes first; a ladder given by hand above a model's levels samples with a warning naming it; levels
    that do not overlap are one line."""
    def with_ladder(model, top):
        model.sampling_defaults = SamplingDefaults(LadderConfig(steps=1, step_size=0.2, levels=4, sigma_max=top))
        return model

    wide = with_ladder(tiny_unet(name="wide", sigma_max=12.0), 12.0)
    narrow = with_ladder(tiny_unet(name="narrow", sigma_max=1.0), 1.0)
    red, green = wide.condition(color="red"), narrow.condition(color="green")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plan(red).config.sigma_max == 12.0  # alone: its own ladder
        for expr in (red + green, green + red, red | green):
            ladder = plan(expr).config
            assert (ladder.sigma_min, ladder.sigma_max) == (0.01, 1.0), expr.expression()
    with pytest.warns(UserWarning, match=r"ladder \[0.01, 12\] reaches levels narrow was not trained on \(\[0.01, 1\]\)"):
        result = cebm.sample(green + red, 2, seed=0, levels=2, sigma_max=12.0)
    assert result.config.sigma_max == 12.0 and torch.isfinite(result.samples).all()
    far = with_ladder(tiny_unet(name="far", sigma_min=2.0, sigma_max=12.0), 12.0)
    with pytest.raises(InvalidInputError, match=r"do not overlap \(narrow \[0.01, 1\], far \[2, 12\]\); valid choices"):
        plan(green + far.condition(color="red"), levels=2, sigma_max=1.0)


def test_a_ladder_and_a_chain_are_two_configs_that_name_none_of_each_others_fields():
    """A noise-conditioned model's table names ladder fields only, another model's chain fields only (one line naming
    the family); a config.json saved with the old nested form reads as today's; a ladder is checked and only
    anneals a noise-conditioned energy."""
    for bad in ({"noise": 0.01}, {"rounds": 2}, {"augment": {"crop_scale": [0.5, 1.0]}}):
        with pytest.raises(InvalidInputError, match=r"belong to the other family: a noise-conditioned model samples down"
                                                    r" a noise ladder \(LadderConfig\); valid settings: .*'levels'"):
            SamplingDefaults.from_flat({"levels": 3, **bad}, ladder=True)
    with pytest.raises(InvalidInputError, match=r"\['levels', 'sigma_max'\] belong to the other family: a model without"):
        SamplingDefaults.from_flat({"steps": 3, "levels": 3, "sigma_max": 2.0}, ladder=False)
    with pytest.raises(InvalidInputError, match=r"\['rounds'\] is a setting of a Langevin chain \(SamplerConfig\), which"
                                                r" models without noise levels sample with; this one samples with a"
                                                r" noise ladder \(LadderConfig\)"):
        pipeline_sample(tiny_unet(), 2, LadderConfig(levels=2), rounds=2)
    with pytest.raises(InvalidInputError, match=r"unknown sampler setting\(s\) \['bogus'\]; valid settings of a noise"
                                                r" ladder \(LadderConfig\)"):
        pipeline_sample(tiny_unet(), 2, LadderConfig(levels=2), bogus=2)
    old = {"step_size": 0.3, "noise": None, "steps": 2, "rounds": 1, "final_steps": 0, "method": "mala",
           "ladder": {"levels": 4, "sigma_max": 2.0, "first_steps": 6}, "augment": None, "clamp": False,
           "init_scale": 1, "guidance_scale": 2.0, "alone": {"steps": 3, "ladder": {"first_steps": 9}}}
    upgraded = SamplingDefaults.from_flat(old, ladder=True, saved=True)
    assert upgraded.sampler == LadderConfig(levels=4, sigma_max=2.0, first_steps=6, step_size=0.3, steps=2)
    assert upgraded.alone == {"steps": 3, "first_steps": 9} and upgraded.guidance_scale == 2.0
    with pytest.raises(InvalidInputError, match="belong to the other family"):
        SamplingDefaults.from_flat({**old, "rounds": 2}, ladder=True, saved=True)  # not a neutral value: not dropped
    assert SamplingDefaults.from_flat({"noise": None}, ladder=False, saved=True).sampler.noise == "exact"
    with pytest.raises(InvalidInputError, match=r"noise must be a number or \"exact\""):
        SamplerConfig(noise=None)
    with pytest.raises(InvalidInputError, match="spacing"):
        LadderConfig(spacing="linear")
    with pytest.raises(InvalidInputError, match="sigma_max"):
        LadderConfig(sigma_min=1.0, sigma_max=0.5)
    assert LadderConfig(levels=5, sigma_min=0.01, sigma_max=1.0, spacing="karras").sigmas()[0] == pytest.approx(1.0)
    with pytest.raises(InvalidInputError, match="nothing to anneal"):
        sample(GaussianEnergy(torch.zeros(2), torch.eye(2)), 4, LadderConfig(levels=3), seed=0)


@pytest.mark.learning
def test_denoising_score_matching_learns_the_score_of_gaussian_data():
    """Trained on images whose pixels are N(0.5, 0.1^2), the model's score at a level points to the data: at sigma the
    noised data is N(0.5, 0.1^2 + sigma^2), whose score at x is -(x - 0.5) / (0.1^2 + sigma^2)."""
    torch.manual_seed(0)
    images = (0.5 + 0.1 * torch.randn(512, 1, 8, 8)).clamp(0, 1)
    model = tiny_unet(in_channels=1, attributes={}, null_condition=False, sigma_min=0.05, sigma_max=1.0,
                      sigma_data=0.1)
    trainer = Trainer(model, images, TrainerConfig(steps=150, batch_size=32, lr=2e-3, betas=(0.9, 0.999),
                                                   ema_decay=0.9, dequantize=False, log_every=150))
    first = trainer.train_step().loss_dsm
    trainer.fit()
    sigma = 0.3
    x = 0.5 + (0.1**2 + sigma**2) ** 0.5 * torch.randn(64, 1, 8, 8)
    score = trainer.ema.score(x, sigma=sigma)
    truth = -(x - 0.5) / (0.1**2 + sigma**2)
    cosine = torch.nn.functional.cosine_similarity(score.flatten(1), truth.flatten(1)).mean()
    assert cosine > 0.8, float(cosine)
    record = trainer.train_step()
    assert record.loss_dsm < first and record.e_diff is None


def tiny_diffusion_recipe(path: Path, *replacements: tuple[str, str]) -> Path:
    """recipes/diffusion/shapes-base.toml shrunk to a few seconds of CPU (a small U-Net, 64 images, batch 8), with
    ``replacements`` (old text, new text) on top, written to ``path``."""
    base = (ROOT / "recipes" / "diffusion" / "shapes-base.toml").read_text()
    for old, new in (("channels = [32, 64, 64]", "channels = [8, 16]"), ("embedding = 64", "embedding = 16"),
                     ("n = 10000", "n = 64"), ("batch_size = 64", "batch_size = 8"), *replacements):
        assert old in base
        base = base.replace(old, new)
    path.write_text(base)
    return path


def test_a_recipe_names_only_its_familys_training_and_sampling_settings(tmp_path):
    """A noise-conditioned recipe that carries contrastive divergence's settings (a buffer, a training chain) or a
    chain's sampler fields, and a contrastive recipe that carries the denoising loss's, are one line each naming
    the family; the recipes as shipped give each family its own objective."""
    from composable_ebm.recipes import load_recipe
    from composable_ebm.training import ContrastiveConfig

    for old, new, needle in (("[trainer]\n", "[trainer]\nreinit_prob = 0.5\n",
                              r"\['reinit_prob'\] are contrastive divergence's: a noise-conditioned model trains by"
                              r" denoising"),
                             ("[sampling]\n", "[trainer.sampler]\nsteps = 3\n\n[sampling]\n",
                              r"\['sampler'\] are contrastive divergence's"),
                             ("[sampling]\n", "[sampling]\nrounds = 2\n", r"\['rounds'\] belong to the other family")):
        recipe = tiny_diffusion_recipe(tmp_path / "bad.toml", (old, new))
        with pytest.raises(InvalidInputError, match=needle):
            load_recipe(recipe)
    ok = load_recipe(tiny_diffusion_recipe(tmp_path / "ok.toml"))
    assert isinstance(ok.trainer.objective, DenoisingConfig) and isinstance(ok.sampling.sampler, LadderConfig)
    shapes = (ROOT / "recipes" / "shapes-base.toml").read_text()
    (tmp_path / "cd.toml").write_text(shapes.replace("[trainer]\n", '[trainer]\nloss_weighting = "edm"\n', 1))
    with pytest.raises(InvalidInputError, match=r"\['loss_weighting'\] are denoising score matching's: a model of"
                                                r" clean data trains by contrastive divergence"):
        load_recipe(tmp_path / "cd.toml")
    assert isinstance(load_recipe(ROOT / "recipes" / "shapes-color.toml").trainer.objective, ContrastiveConfig)


@pytest.mark.learning
def test_the_family_trains_saves_loads_composes_and_samples_through_the_same_commands(tmp_path):
    recipe = tiny_diffusion_recipe(tmp_path / "tiny.toml", ("levels = 15", "levels = 3"),
                                   ('dataset = "shapes"', 'dataset = "shapes"\nattributes = ["color"]'))
    result = runner.invoke(app, ["train", str(recipe), "--out", str(tmp_path / "run"), "--steps", "3", "--no-progress"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "run" / "model"
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "denoising-unet"  # the model config names its family
    assert config["sampler"]["levels"] == 3 and "noise" not in config["sampler"]
    model = cebm.load(str(folder))
    assert model.noise_conditioned and model.sampling_defaults.sampler.levels == 3
    grid = tmp_path / "grid.png"
    result = runner.invoke(app, ["compose", f"{folder}[color=red] + {folder}[color=blue]", "-n", "4", "-o", str(grid),
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    assert grid.is_file()
    result = runner.invoke(app, ["sample", str(folder), "--condition", "color=red", "-n", "2", "-o",
                                 str(tmp_path / "s.png"), "--no-progress"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["info", str(folder)])
    assert result.exit_code == 0 and "denoising" in result.output, result.output
    samples = model.condition(color="red").sample(3, seed=0)
    assert samples.shape == (3, 3, 16, 16) and samples.min() >= 0 and samples.max() <= 1
    assert torch.equal(samples, model.condition(color="red").sample(3, seed=0))
    from composable_ebm import studio

    models = studio.ModelCache("cpu", models_root=tmp_path)  # the studio loads folders under the root it is given
    made = studio.generate(models, f"{folder}[color=red] + {folder}[color=green]", n=2, seed=0, out_dir=tmp_path)
    assert made.samples.shape == (2, 3, 16, 16) and made.png.is_file()
    summary = studio.sampler_summary(models, f"{folder}[color=red]")
    assert "at each of 3 noise levels" in summary and "x sigma^2" in summary, summary


def test_a_guidance_interval_applies_the_scale_only_at_its_noise_levels():
    """Inside ``(lo, hi]`` a term counts at its guidance scale, outside at 1 (its plain conditional), for one level
    per batch and one per item alike; without a level every scale is whole."""
    a, b = randomize(tiny_unet(name="a")), randomize(tiny_unet(name="b"))  # conditions that change the energy
    x = torch.rand(4, 3, 8, 8)
    red, green = a.condition(color="red"), b.condition(color="green")
    node = cebm.Guided([1.0, 1.0], [red, green], scales=[3.0, 2.0], intervals=[(0.0, 0.3), None])

    def expect(sigma, red_scale):
        null_a, null_b = a(x, sigma=sigma), b(x, sigma=sigma)
        return (null_a + null_b) / 2 + red_scale * (red(x, sigma=sigma) - null_a) + 2.0 * (green(x, sigma=sigma) - null_b)

    assert torch.allclose(node(x, sigma=0.3), expect(0.3, 3.0), atol=1e-4)  # hi is inside
    assert torch.allclose(node(x, sigma=0.6), expect(0.6, 1.0), atol=1e-4)
    assert not torch.allclose(expect(0.6, 1.0), expect(0.6, 3.0), atol=1e-3)  # the scale matters at that level
    per_item = torch.tensor([0.05, 0.3, 0.31, 1.0])
    want = torch.where(per_item <= 0.3, expect(per_item, 3.0), expect(per_item, 1.0))
    assert torch.allclose(node(x, sigma=per_item), want, atol=1e-4)
    whole = cebm.Guided([1.0, 1.0], [red, green], scales=[3.0, 2.0])
    assert torch.allclose(node(x), whole(x), atol=1e-5)
    for bad in ((0.3, 0.1), (-0.1, 0.2), (0.0, float("inf")), (0.1,), "0.1,0.3", (True, 0.3)):
        with pytest.raises(InvalidInputError, match="guidance interval must be two noise levels"):
            cebm.Guided([1.0], [red], scales=[3.0], intervals=[bad])


def test_a_models_guidance_interval_is_saved_with_it_and_reaches_its_guided_term(tmp_path):
    """``[sampling] guidance_interval`` goes through config.json, `cebm info` shows it, and the pipeline builds the
    model's guided term with it; a bad one is one line naming what is valid."""
    from composable_ebm.pipeline import composed
    from composable_ebm.sampling import SamplingDefaults

    defaults = SamplingDefaults(LadderConfig(steps=2), guidance_scale=3.0, guidance_interval=[0.0, 0.3],
                                guided_alone=True)
    assert defaults.guidance_interval == (0.0, 0.3)
    flat = json.loads(json.dumps(defaults.to_flat()))
    assert flat["guidance_interval"] == [0.0, 0.3] and SamplingDefaults.from_flat(flat, ladder=True) == defaults
    assert "guidance_interval" not in SamplingDefaults(LadderConfig(steps=2)).to_flat()
    with pytest.raises(InvalidInputError, match=r"guidance interval must be two noise levels \[lo, hi\]"):
        SamplingDefaults.from_flat({**flat, "guidance_interval": [0.5, 0.2]}, ladder=True)
    model = tiny_unet()
    model.sampling_defaults = SamplingDefaults(SamplerConfig(steps=2))
    with pytest.raises(InvalidInputError, match=r"tiny-unet's sampling_defaults hold a SamplerConfig, which its family"
                                                r" does not sample with; valid choices: a LadderConfig"):
        cebm.save(model, tmp_path / "m")
    assert not (tmp_path / "m").exists()
    model.sampling_defaults = defaults
    node = composed(model.condition(color="red"))
    assert isinstance(node, cebm.Guided) and node.scales == (3.0,) and node.intervals == ((0.0, 0.3),)
    cebm.save(model, tmp_path / "m")
    assert cebm.load(str(tmp_path / "m")).sampling_defaults.guidance_interval == (0.0, 0.3)
    shown = runner.invoke(app, ["info", str(tmp_path / "m")])
    assert shown.exit_code == 0 and "3 at noise levels (0, 0.3], 1 elsewhere (alone too)" in shown.output
    assert re.search(r"noise levels trained\s+0.01 to 1\n", shown.output)  # the levels a ladder should keep to


def test_the_edm_weighting_grows_with_the_level_and_averages_one_over_the_levels_trained_on():
    low, high, sigma_data = 0.01, 1.0, 0.3
    u = torch.rand(200_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sigma = torch.exp(math.log(low) + u * (math.log(high) - math.log(low)))  # as DenoisingObjective draws them
    weights = edm_weights(sigma, sigma_data, LevelDistribution(low, high))
    assert abs(float(weights.mean()) - 1) < 0.01
    ends = edm_weights(torch.tensor([low, high]), sigma_data, LevelDistribution(low, high))
    assert float(ends[1] / ends[0]) == pytest.approx((1 + high**2 / sigma_data**2) / (1 + low**2 / sigma_data**2))
    one = LevelDistribution(0.5, 0.5)
    assert float(edm_weights(torch.tensor([0.5]), 0.5, one)) == pytest.approx(1.0)  # one level: weight 1


def test_log_normal_levels_follow_the_truncated_normal_of_ln_sigma_and_the_edm_weights_average_one():
    """Karras et al. 2022's training levels: ln sigma ~ N(mean, std) within the model's range, drawn exactly (the
    truncated normal's mean and spread), with the edm weights' mean still 1 under them."""
    low, high, mean, std = 0.002, 10.0, -1.2, 1.2
    levels = LevelDistribution(low, high, "log-normal", mean, std)
    sigma = levels.draw(200_000, torch.Generator().manual_seed(0), torch.device("cpu"), torch.float32)
    assert float(sigma.min()) >= low * (1 - 1e-6) and float(sigma.max()) <= high * (1 + 1e-6)
    reference = torch.randn(2_000_000, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * std + mean
    reference = reference[(reference >= math.log(low)) & (reference <= math.log(high))]  # rejection: the truth
    assert abs(float(sigma.log().mean()) - float(reference.mean())) < 0.01
    assert abs(float(sigma.log().std()) - float(reference.std())) < 0.01
    uniform = LevelDistribution(low, high).draw(200_000, torch.Generator().manual_seed(0), torch.device("cpu"),
                                                torch.float32)
    assert abs(float(uniform.log().mean()) - (math.log(low) + math.log(high)) / 2) < 0.02
    assert abs(float(edm_weights(sigma.double(), 0.5, levels).mean()) - 1) < 0.02
    with pytest.raises(InvalidInputError, match="put almost no level within the model's noise range"):
        LevelDistribution(0.01, 0.02, "log-normal", 10.0, 0.5)


def test_the_edm_weighted_loss_weighs_each_items_squared_error_by_its_level():
    torch.manual_seed(0)
    model = tiny_unet(attributes={}, null_condition=False, sigma_data=0.25)
    x = torch.rand(6, 3, 8, 8)
    losses = {}
    for weighting in ("noise", "edm"):
        objective = DenoisingObjective(model, weighting)
        losses[weighting] = objective(x, None, torch.Generator().manual_seed(3)).loss.detach()
    g = torch.Generator().manual_seed(3)  # the objective's draws, repeated
    u = torch.rand(6, generator=g)
    sigma = torch.exp(math.log(model.config.sigma_min) + u * (math.log(model.config.sigma_max)
                                                              - math.log(model.config.sigma_min)))
    z = torch.randn(x.shape, generator=g)
    noised = (x + sigma.view(-1, 1, 1, 1) * z).requires_grad_(True)
    (grad,) = torch.autograd.grad(model(noised, sigma=sigma).sum(), noised)
    error = (sigma.view(-1, 1, 1, 1) * grad - z).pow(2).mean(dim=(1, 2, 3))
    weight = edm_weights(sigma, 0.25, LevelDistribution(model.config.sigma_min, model.config.sigma_max))
    assert float(losses["noise"]) == pytest.approx(float(error.mean()), rel=1e-4)
    assert float(losses["edm"]) == pytest.approx(float((weight * error).mean()), rel=1e-4)
    assert abs(float(losses["edm"]) - float(losses["noise"])) > 1e-3 * float(losses["noise"])


def test_the_loss_weighting_is_checked_in_one_line():
    class Levelled(NoisedGaussianEnergy):
        noise_range = (0.01, 1.0)  # a noise-conditioned energy that states no sigma_data

    with pytest.raises(InvalidInputError, match="states no sigma_data; valid choices: 'noise'"):
        DenoisingObjective(Levelled(torch.zeros(2), torch.eye(2)), "edm")
    with pytest.raises(InvalidInputError, match=r"unknown loss weighting 'l1'; valid choices: \['noise', 'edm'\]"):
        DenoisingObjective(tiny_unet(), "l1")
    with pytest.raises(InvalidInputError, match=r"loss_weighting 'snr'; valid choices: \['noise', 'edm'\]"):
        TrainerConfig(objective=DenoisingConfig(loss_weighting="snr"))
    trainer = Trainer(tiny_unet(attributes={}, null_condition=False), torch.rand(16, 3, 8, 8),
                      TrainerConfig(steps=2, batch_size=4, objective=DenoisingConfig(loss_weighting="edm")))
    assert trainer.objective.loss.weighting == "edm" and math.isfinite(trainer.train_step().loss_dsm)
    with pytest.raises(InvalidInputError, match=r"levels must be one of \['log-uniform', 'log-normal'\], got 'cosine'"):
        TrainerConfig.from_flat({"levels": "cosine"})
    with pytest.raises(InvalidInputError, match=r"level_std must be a finite number in \(0, 20\]"):
        TrainerConfig.from_flat({"levels": "log-normal", "level_std": 0})
    flat = TrainerConfig.from_flat({"steps": 2, "batch_size": 4, "levels": "log-normal", "level_mean": -2.0})
    trainer = Trainer(tiny_unet(attributes={}, null_condition=False), torch.rand(16, 3, 8, 8), flat)
    assert trainer.objective.loss.levels.kind == "log-normal" and trainer.objective.loss.levels.mean == -2.0
    assert math.isfinite(trainer.train_step().loss_dsm)


def colour_patches(n: int, seed: int) -> ImageDataset:
    """8x8 images of one flat colour, red for two thirds of them and green for the rest, labelled by colour."""
    g = torch.Generator().manual_seed(seed)
    colour = (torch.rand(n, generator=g) > 2 / 3).long()  # 0: red, 1: green
    images = torch.full((n, 3, 8, 8), 0.1)
    images[:, 0][colour == 0] = 0.9
    images[:, 1][colour == 1] = 0.9
    images = (images + 0.03 * torch.randn(images.shape, generator=g)).clamp(0, 1)
    return ImageDataset(images, {"color": colour}, {"color": ("red", "green")})


def test_the_classifier_term_is_the_implicit_classifiers_cross_entropy_and_only_when_asked():
    """``loss = denoising + w * CE`` with CE over ``-E(x_sigma | c) + log p(c)``, ``p(c)`` the labels' shares; items
    under the null condition take no part; the step records the term, and a weight of 0 computes none."""
    from composable_ebm.training.denoising import implicit_classifier_loss

    model, data = randomize(tiny_unet()), colour_patches(12, 0)
    x, y = data.images, data.labels["color"].clone()
    y[:3] = -1  # dropped to the null condition
    sigma = torch.full((12,), 0.2)
    shares = torch.tensor([0.7, 0.3])
    ce = implicit_classifier_loss(model, x, sigma, {"color": y}, {"color": shares.log()})
    logits = torch.stack([-model(x, {"color": torch.full((12,), c)}, sigma=sigma) for c in (0, 1)], 1) + shares.log()
    expected = torch.nn.functional.cross_entropy(logits[3:], y[3:])
    assert float(ce.detach()) == pytest.approx(float(expected.detach()), rel=1e-5)
    trainer = Trainer(model, data, TrainerConfig(steps=1, batch_size=8, objective=DenoisingConfig(classifier_weight=2.0)))
    assert trainer.objective.loss.log_shares["color"].exp().tolist() == pytest.approx(
        [float((data.labels["color"] == 0).float().mean()), float((data.labels["color"] == 1).float().mean())])
    record = trainer.train_step()
    assert record.loss == pytest.approx(record.loss_dsm + 2.0 * record.loss_classifier, rel=1e-5)
    assert record.loss_classifier > 0 and "loss_classifier" in record.to_log()
    off = Trainer(model, data, TrainerConfig(steps=1, batch_size=8)).train_step()
    assert off.loss_classifier is None and off.loss == off.loss_dsm
    with pytest.raises(InvalidInputError, match=r"classifier_weight must be a finite number in \[0, inf\)"):
        DenoisingConfig(classifier_weight=-1.0)
    with pytest.raises(InvalidInputError, match="trained on no labelled attribute"):
        Trainer(tiny_unet(attributes={}, null_condition=False), torch.rand(8, 3, 8, 8),
                TrainerConfig(steps=1, batch_size=4, objective=DenoisingConfig(classifier_weight=1.0)))


@pytest.mark.learning
def test_the_classifier_term_makes_the_conditions_energies_read_the_condition():
    """Trained on two colours (2 : 1) with the classifier term, ``argmin_c E(x_sigma, sigma | c)`` reads the colour of
    noised images at every level; denoising alone leaves each condition's level free (it read 0.33 here: every
    image taken for the rarer colour)."""
    data, test = colour_patches(600, 1), colour_patches(200, 2)
    torch.manual_seed(0)
    model = tiny_unet(sigma_min=0.02, sigma_max=2.0, sigma_data=0.35)
    trainer = Trainer(model, data, TrainerConfig(steps=300, batch_size=32, lr=2e-3, ema_decay=0.9, dequantize=False,
                                                 label_dropout=0.1, log_every=300,
                                                 objective=DenoisingConfig(classifier_weight=1.0)))
    trainer.fit()
    for level in (0.1, 0.3, 1.0):
        sigma = torch.full((200,), level)
        noised = test.images + level * torch.randn(test.images.shape, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            e = torch.stack([trainer.ema(noised, {"color": torch.full((200,), c)}, sigma=sigma) for c in (0, 1)], 1)
        assert float((e.argmin(1) == test.labels["color"]).float().mean()) > 0.95, level


def test_a_noise_conditioned_energy_is_a_declared_type_the_pipeline_and_objective_ask():
    """The U-Net and the noised Gaussian are `NoiseConditioned`, declaring their levels; the pipeline's trained
    levels and the denoising objective read them from the type, and an energy that only sets a ``noise_range``
    attribute on another class is not taken for one."""
    from composable_ebm import NoiseConditioned
    from composable_ebm.pipeline import trained_levels

    model = DenoisingUNetEnergy(DenoisingUNetConfig(image_size=8, channels=(8, 16), embedding=16, groups=4,
                                                    sigma_min=0.02, sigma_max=3.0, sigma_data=0.4))
    assert isinstance(model, NoiseConditioned) and model.noise_range == (0.02, 3.0) and model.sigma_data == 0.4
    assert trained_levels(model) == (0.02, 3.0)
    assert DenoisingObjective(model, "edm").sigma_data == 0.4
    noised = NoisedGaussianEnergy(torch.zeros(2), torch.eye(2))
    assert isinstance(noised, NoiseConditioned) and noised.noise_range is None and trained_levels(noised) is None
    plain = GaussianEnergy(torch.zeros(2), torch.eye(2))
    plain.noise_range = (0.1, 1.0)  # an attribute by that name does not make an energy noise-conditioned
    assert not isinstance(plain, NoiseConditioned) and not plain.noise_conditioned
    with pytest.raises(InvalidInputError, match="states no noise_range"):
        DenoisingObjective(plain)
