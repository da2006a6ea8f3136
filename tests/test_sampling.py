"""Sampler: moments on analytic energies, MALA acceptance, determinism, augmentation, side effects."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from PIL import Image

from composable_ebm import GaussianEnergy, ResNetEnergy
from composable_ebm.images import save_chain_strip
from composable_ebm.pipeline import composed, default_settings, sample
from composable_ebm.sampling import AugmentConfig, SamplerConfig, augment
from tests.conftest import settings, tiny_config
from tests.test_energy import randomize

MEAN = torch.tensor([1.0, -2.0])
COV = torch.tensor([[1.0, 0.5], [0.5, 2.0]])


def moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.mean(0), torch.cov(x.T)


def test_langevin_with_small_step_reproduces_gaussian_moments():
    energy = GaussianEnergy(MEAN, COV)
    result = sample(energy, 4000, SamplerConfig(step_size=0.02, noise="exact", steps=1500), seed=0)
    mean, cov = moments(result.samples)
    torch.testing.assert_close(mean, MEAN, atol=0.1, rtol=0)
    torch.testing.assert_close(cov, COV, atol=0.12, rtol=0)


def test_mala_reproduces_gaussian_moments_with_a_large_step():
    energy = GaussianEnergy(MEAN, COV)
    result = sample(energy, 4000, SamplerConfig(step_size=0.6, noise="exact", steps=300, method="mala"), seed=1)
    mean, cov = moments(result.samples)
    torch.testing.assert_close(mean, MEAN, atol=0.08, rtol=0)
    torch.testing.assert_close(cov, COV, atol=0.12, rtol=0)
    assert 0.3 < result.acceptance_rate < 1.0


def test_unadjusted_langevin_with_a_large_step_is_biased_but_mala_is_not():
    """The property that makes MALA worth having: at step 0.6 plain Langevin inflates the variance."""
    energy = GaussianEnergy(MEAN, COV)
    ula = sample(energy, 4000, SamplerConfig(step_size=0.6, noise="exact", steps=300), seed=2)
    # ULA on a Gaussian inflates the variance along precision eigenvalue lam by 1 / (1 - step * lam / 2)
    assert torch.linalg.eigvalsh(torch.cov(ula.samples.T))[0] > 1.3 * torch.linalg.eigvalsh(COV)[0]


@pytest.mark.learning
@pytest.mark.parametrize("method", ["langevin", "mala"])
def test_sum_of_two_gaussian_energies_samples_the_product_gaussian(method):
    m1, c1 = torch.tensor([2.0, 0.0]), torch.tensor([[1.0, 0.3], [0.3, 0.5]])
    m2, c2 = torch.tensor([-1.0, 1.0]), torch.tensor([[0.8, -0.2], [-0.2, 1.5]])
    p1, p2 = torch.linalg.inv(c1), torch.linalg.inv(c2)
    cov = torch.linalg.inv(p1 + p2)
    mean = cov @ (p1 @ m1 + p2 @ m2)
    energy = GaussianEnergy(m1, c1) + GaussianEnergy(m2, c2)
    step = 0.02 if method == "langevin" else 0.3
    result = sample(energy, 4000, SamplerConfig(step_size=step, noise="exact", steps=800, method=method), seed=3)
    got_mean, got_cov = moments(result.samples)
    torch.testing.assert_close(got_mean, mean, atol=0.05, rtol=0)
    torch.testing.assert_close(got_cov, cov, atol=0.05, rtol=0)


def test_mala_acceptance_falls_as_the_step_grows():
    energy = GaussianEnergy(MEAN, COV)
    rates = [
        sample(energy, 1000, SamplerConfig(step_size=s, noise="exact", steps=100, method="mala"), seed=0).acceptance_rate
        for s in (0.05, 0.5, 2.0, 5.0)
    ]
    assert all(a > b for a, b in itertools.pairwise(rates)), rates
    assert rates[0] > 0.95 and rates[-1] < 0.3


def test_mala_never_leaves_the_value_range(color_model):
    from composable_ebm.sampling import sample as run_sampler

    cfg = SamplerConfig(step_size=0.01, noise=0.2, steps=5, method="mala")
    result = run_sampler(color_model.condition(color="red"), 6, cfg, seed=0)
    assert result.samples.min() >= 0 and result.samples.max() <= 1


@pytest.fixture
def image_energy():
    torch.manual_seed(0)
    return randomize(ResNetEnergy(tiny_config(name="img")))


def test_same_seed_gives_identical_samples_and_different_seeds_differ(image_energy):
    cfg = SamplerConfig(step_size=1.0, noise=0.01, steps=3, rounds=2, augment=AugmentConfig(blur_prob=0.5))
    a = sample(image_energy, 4, cfg, seed=7).samples
    b = sample(image_energy, 4, cfg, seed=7).samples
    c = sample(image_energy, 4, cfg, seed=8).samples
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    gen = torch.Generator().manual_seed(7)
    assert torch.equal(sample(image_energy, 4, cfg, generator=gen).samples, a)


def test_augmenting_identical_images_gives_all_different_images_in_range():
    torch.manual_seed(0)
    base = torch.rand(1, 3, 16, 16).expand(64, 3, 16, 16).contiguous()
    out = augment(base, AugmentConfig(blur_prob=0.5), torch.Generator().manual_seed(0))
    assert out.shape == base.shape
    assert out.min() >= 0 and out.max() <= 1
    diffs = (out[:, None] - out[None]).flatten(2).abs().amax(-1)  # (64, 64) max-abs difference
    distinct_pairs = (diffs > 1e-3).sum() - 0  # diagonal is zero
    assert distinct_pairs >= 64 * 63 - 2  # (almost) every pair of augmented images differs


def test_augmentation_with_everything_off_except_full_crop_is_identity():
    x = torch.rand(5, 3, 8, 8)
    cfg = AugmentConfig(color_prob=0.0, grayscale_prob=0.0, flip_prob=0.0, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0))
    torch.testing.assert_close(augment(x, cfg, torch.Generator().manual_seed(0)), x, atol=1e-5, rtol=0)


def test_flip_only_mirrors_every_image():
    x = torch.rand(5, 3, 8, 8)
    cfg = AugmentConfig(color_prob=0.0, grayscale_prob=0.0, flip_prob=1.0, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0))
    torch.testing.assert_close(augment(x, cfg, torch.Generator().manual_seed(0)), x.flip(-1), atol=1e-5, rtol=0)


def _square(size: int = 32, half: int = 6) -> torch.Tensor:
    """A flat square on a flat background, centred: ``(1, 3, size, size)``."""
    x = torch.full((1, 3, size, size), 0.1)
    x[..., size // 2 - half:size // 2 + half, size // 2 - half:size // 2 + half] = 0.9
    return x


def _object_area(x: torch.Tensor) -> torch.Tensor:
    return (x.mean(1) > 0.5).float().sum((1, 2))


def test_a_crop_area_above_one_zooms_out_keeping_the_background():
    x = _square()
    cfg = AugmentConfig(color_prob=0.0, grayscale_prob=0.0, flip_prob=0.0, crop_scale=(4.0, 4.0), crop_ratio=(1.0, 1.0))
    out = augment(x.expand(8, 3, 32, 32), cfg, torch.Generator().manual_seed(0))
    # a frame of twice the image's side: the 12-pixel square becomes 6 pixels wide, the rest is the border's grey
    assert torch.allclose(_object_area(out), torch.full((8,), 36.0), atol=8)
    assert torch.allclose(out[..., 0, :], torch.full_like(out[..., 0, :], 0.1))
    with pytest.raises(ValueError, match=r"crop_scale must satisfy 0 < low <= high <= 16, got \(0.5, 20.0\)"):
        AugmentConfig(crop_scale=(0.5, 20.0))


@pytest.mark.parametrize("log_scale, zoomed_out", [(True, 0.5), (False, 0.8)])
def test_crop_log_scale_zooms_in_as_often_as_out(log_scale, zoomed_out):
    """Areas in [1/4, 4]: log-uniform, half the frames are larger than the image; uniform, (4 - 1) / 3.75 = 0.8."""
    x = _square().expand(2000, 3, 32, 32)
    cfg = AugmentConfig(color_prob=0.0, grayscale_prob=0.0, flip_prob=0.0, crop_scale=(0.25, 4.0),
                        crop_ratio=(1.0, 1.0), crop_log_scale=log_scale)
    smaller = (_object_area(augment(x, cfg, torch.Generator().manual_seed(0))) < 144).float().mean().item()
    assert abs(smaller - zoomed_out) < 0.04


def test_grayscale_only_makes_channels_equal():
    x = torch.rand(5, 3, 8, 8)
    cfg = AugmentConfig(color_prob=0.0, grayscale_prob=1.0, flip_prob=0.0, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0))
    out = augment(x, cfg, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out[:, 0], out[:, 1])
    torch.testing.assert_close(out[:, 1], out[:, 2])


def test_sampling_leaves_parameter_grads_flags_and_mode_untouched(image_energy):
    params = list(image_energy.parameters())
    params[0].requires_grad_(False)
    for p in params[1:]:
        p.grad = torch.full_like(p, 0.25)
    image_energy.train()
    flags = [p.requires_grad for p in params]
    cfg = SamplerConfig(step_size=1.0, steps=3, rounds=2, augment=AugmentConfig())
    sample(image_energy, 3, cfg, seed=0)
    assert [p.requires_grad for p in params] == flags
    assert params[0].grad is None
    assert all(torch.equal(p.grad, torch.full_like(p, 0.25)) for p in params[1:])
    assert image_energy.training
    image_energy.eval()
    sample(image_energy, 3, cfg, seed=0)
    assert not image_energy.training


def test_composite_of_conditional_networks_samples_end_to_end(color_model, shape_model):
    red, circle = color_model.condition(color="red"), shape_model.condition(shape="circle")
    color_model.sampling_defaults = settings(step_size=10.0, steps=4, augment=AugmentConfig())
    composite = red + circle - 0.5 * shape_model.condition(shape="square")
    # a sum divides its parts' step size by the number of terms, not by the weights
    assert getattr(composite, "sampling_defaults", None) is None  # a composite has no settings of its own
    assert default_config(composite).step_size == pytest.approx(10.0 / 3)
    assert default_config(2.0 * red + circle).step_size == pytest.approx(10.0 / 2)
    assert default_config(red | circle).step_size == pytest.approx(10.0)
    # the shape model has no augmentation of its own, so the sum runs none (a colour model's flips
    # and crops would move what a position or size model is bound to)
    assert default_config(composite).augment is None
    shape_model.sampling_defaults = settings(step_size=10.0, steps=4, augment=AugmentConfig())
    # both use it, but neither records that it keeps the attribute its term is bound to
    assert default_config(composite).augment is None
    color_model.sampling_defaults = settings(step_size=10.0, steps=4, augment=AugmentConfig(),
                                               augment_preserves=("color",))
    shape_model.sampling_defaults = settings(step_size=10.0, steps=4, augment=AugmentConfig(), augment_preserves=())
    assert default_config(composite).augment is None  # the shape model's keeps no shape
    shape_model.sampling_defaults = settings(step_size=10.0, steps=4, augment=AugmentConfig(),
                                               augment_preserves=("shape",))
    assert default_config(composite).augment == AugmentConfig()
    assert default_config(red | circle).augment == AugmentConfig()
    images = composite.sample(n=4, seed=0)
    assert images.shape == (4, 3, 8, 8)
    assert images.min() >= 0 and images.max() <= 1
    # per-call overrides win over the derived defaults; form="plain" samples the sum as written (a plain sum that
    # negates a model with a null condition is refused: tests/test_guided.py)
    plain = red + circle + 0.5 * shape_model.condition(shape="triangle")
    result = plain.sample_result(n=2, seed=0, steps=2, rounds=3, keep_every=2, form="plain")
    assert result.config.step_size == pytest.approx(10.0 / 3) and result.config.steps == 2
    assert result.diagnostics.energy.shape == (6,)


def test_a_sum_of_models_with_null_conditions_samples_its_guided_form_by_default(color_model, shape_model):
    """form="auto": guided when every term is a conditioned model with a null condition, with the part's
    step size and steps (a plain sum divides the step by its number of terms); anything else as written."""
    from composable_ebm import Guided

    color_model.sampling_defaults = settings(step_size=10.0, steps=4)
    red, circle = color_model.condition(color="red"), shape_model.condition(shape="circle")
    composite = red + 2.0 * circle
    auto = composed(composite)
    assert isinstance(auto, Guided) and auto.weights == (1.0, 2.0)
    assert composed(composite, "plain") is composite
    assert composed(red) is red and composed(red | circle, "auto").expression() == "(color[red] | shape[circle])"
    cfg = composite.sample_result(n=2, seed=0).config
    assert cfg.step_size == pytest.approx(10.0) and cfg.steps == 4
    assert composite.sample_result(n=2, seed=0, form="plain").config.step_size == pytest.approx(5.0)
    torch.testing.assert_close(composite.sample(2, seed=1), composite.sample(2, seed=1, form="guided"))
    assert not torch.equal(composite.sample(2, seed=1), composite.sample(2, seed=1, form="plain"))
    with pytest.raises(ValueError, match=r"unknown composition form 'mixed'.*\['auto', 'plain', 'guided'\]"):
        composite.sample(2, form="mixed")


def test_result_has_chain_and_diagnostics_of_the_documented_shapes(image_energy, tmp_path):
    cfg = SamplerConfig(step_size=1.0, steps=4, rounds=2, final_steps=2)
    result = sample(image_energy, 3, cfg, seed=0, keep_every=5)
    assert result.samples.shape == (3, 3, 8, 8)
    assert result.chain.shape == (1 + 2, 3, 3, 8, 8)  # the start, then steps 5 and 10 (the last)
    assert torch.equal(result.chain[-1], result.samples)
    assert result.diagnostics.energy.shape == (10,) and result.diagnostics.grad_norm.shape == (10,)
    assert result.diagnostics.acceptance is None and result.acceptance_rate is None
    no_chain = sample(image_energy, 3, cfg, seed=0)
    assert no_chain.chain is None and torch.equal(no_chain.samples, result.samples)
    path = save_chain_strip(result.chain, tmp_path / "chain.png")
    with Image.open(path) as im:
        assert im.size == (3 * 64 + 4 * 2, 3 * 64 + 4 * 2)  # 3 states across, 3 chains down, 8 px shown at 64


def test_callback_sees_every_step(image_energy):
    seen = []
    sample(image_energy, 2, SamplerConfig(step_size=1.0, steps=3, rounds=2), seed=0, callback=lambda d: seen.append(d["step"]))
    assert seen == [1, 2, 3, 4, 5, 6]


def test_bf16_sampling_returns_float32_samples_close_to_fp32(image_energy, bfloat16_arithmetic):
    cfg = SamplerConfig(step_size=0.5, noise=0.0, steps=2)
    fp32 = sample(image_energy, 4, cfg, seed=0).samples
    bf16 = sample(image_energy, 4, cfg, seed=0, precision="bfloat16").samples
    assert bf16.dtype == torch.float32
    assert (bf16 - fp32).abs().max() < 0.05


def test_bad_settings_are_rejected_with_the_valid_choices(image_energy):
    with pytest.raises(ValueError, match="valid settings"):
        sample(image_energy, 2, seed=0, stepz=3)
    with pytest.raises(ValueError, match="valid choices"):
        SamplerConfig(method="gibbs")
    with pytest.raises(ValueError, match="image energies"):
        sample(GaussianEnergy(MEAN, COV), 2, SamplerConfig(augment=AugmentConfig()), seed=0)
    with pytest.raises(ValueError, match="crop_scale"):
        AugmentConfig(crop_scale=(0.0, 1.0))


@pytest.mark.learning
@pytest.mark.parametrize("temperature", [2.0, 0.5])
def test_temperature_scales_the_spread_under_the_decoupled_noise_sampler(temperature):
    """``E / T`` under the fixed-noise Langevin sampler the bundled models use (step and noise set apart):
    its stationary variance is T times that of ``E`` (for a Gaussian: noise^2 / (2 step) * T * cov)."""
    energy = GaussianEnergy(torch.zeros(2), torch.eye(2) * 0.5)
    energy.sampling_defaults = settings(step_size=0.02, noise=0.2, steps=600, clamp=False)
    base = sample(energy, 4000, seed=0).samples.var(dim=0).mean()
    tempered = sample(energy / temperature, 4000, seed=0).samples.var(dim=0).mean()
    # decoupled noise: variance = noise^2 / (2 step) * cov = 0.5 for E, T times that for E / T
    assert float(base) == pytest.approx(0.5, rel=0.12)
    assert float(tempered / base) == pytest.approx(temperature, rel=0.15)


def test_smooth_initialisation_starts_from_low_frequency_noise_in_the_value_range(image_energy):
    """init_scale draws the starting noise at a coarser grid: neighbouring pixels nearly agree."""
    from composable_ebm.sampling import initial_noise

    gen = torch.Generator().manual_seed(0)
    plain = initial_noise(image_energy, 64, gen, torch.device("cpu"))
    smooth = initial_noise(image_energy, 64, gen, torch.device("cpu"), init_scale=4)
    assert smooth.shape == plain.shape and smooth.min() >= 0 and smooth.max() <= 1
    jump = lambda x: (x[..., 1:] - x[..., :-1]).abs().mean()  # noqa: E731
    assert jump(smooth) < 0.4 * jump(plain)


def test_a_recipe_records_only_its_own_attributes_as_preserved_by_its_augmentation(tmp_path):
    """[sampling] augment_preserves names attributes of the recipe's model; another is one clear line."""
    from composable_ebm.errors import InvalidInputError
    from composable_ebm.recipes import load_recipe

    recipe = tmp_path / "r.toml"
    base = Path(__file__).resolve().parents[1] / "recipes" / "shapes-shape.toml"
    recipe.write_text(f'base = "{base}"\n[sampling]\naugment_preserves = ["shape"]\n')
    assert load_recipe(recipe).sampling.augment_preserves == ("shape",)
    recipe.write_text(f'base = "{base}"\n[sampling]\naugment_preserves = ["position"]\n')
    with pytest.raises(InvalidInputError, match=r"augment_preserves names \['position'\].*valid choices: \['shape'\]"):
        load_recipe(recipe)


def test_the_differentiable_last_step_ends_a_chain_where_the_whole_chain_ends():
    """A chain of T steps, and T - 1 steps then `differentiable_last_step` (the trainer's way), reach the
    same positions from the same generator; without an observer the last position is left unevaluated."""
    from composable_ebm.sampling import algorithm2, differentiable_last_step

    energy = GaussianEnergy(MEAN, COV)
    config = SamplerConfig(step_size=0.1, noise=0.2, steps=5)
    x0 = torch.zeros(8, 2)
    seen = []
    whole = algorithm2(energy, x0, config, torch.Generator().manual_seed(3), on_step=lambda *a: seen.append(a[0]))
    assert seen == [1, 2, 3, 4, 5] and whole.state is not None
    unobserved = algorithm2(energy, x0, config, torch.Generator().manual_seed(3))
    assert unobserved.state is None and torch.equal(unobserved.x, whole.x)
    gen = torch.Generator().manual_seed(3)
    head = algorithm2(energy, x0, config, gen, num_steps=4)
    x_hat, start = differentiable_last_step(energy, head.x, config, gen, create_graph=False)
    assert torch.equal(x_hat, whole.x) and torch.equal(start.x, head.x)
    assert not torch.equal(x_hat, head.x)  # it moved


def default_config(energy):
    """The chain settings the pipeline derives for ``energy`` (its own or its parts')."""
    return default_settings(energy).sampler


def test_cuda_graphs_setting_leaves_a_cpu_chain_as_it_was_and_is_read_when_a_run_starts(color_model, monkeypatch):
    """The chain's graph replay applies on CUDA devices only (tests/test_cuda.py compares it with the eager chain
    there): on the CPU the setting changes nothing, bit for bit, for a Langevin and a MALA chain with labels. It is
    the run's `Speed`, given or read from ``CEBM_CUDA_GRAPHS`` when the run starts; another value is one line."""
    from composable_ebm.accel.graphs import MIN_STEPS
    from composable_ebm.accel.labels import as_index
    from composable_ebm.accel.settings import Speed
    from composable_ebm.errors import InvalidInputError
    from composable_ebm.sampling import SamplerConfig
    from composable_ebm.sampling import sample as run

    randomize(color_model)
    energy = color_model.condition(color="red")
    for method in ("langevin", "mala"):
        chain = SamplerConfig(steps=MIN_STEPS + 2, step_size=1.0, noise=0.01, method=method)
        results = [run(energy, 6, chain, seed=0, speed=Speed(cuda_graphs=on)) for on in (False, True)]
        assert torch.equal(results[0].samples, results[1].samples)
        assert torch.equal(results[0].diagnostics.energy, results[1].diagnostics.energy)
    monkeypatch.setenv("CEBM_CUDA_GRAPHS", "0")
    assert Speed.from_environment().cuda_graphs is False
    monkeypatch.setenv("CEBM_CUDA_GRAPHS", "yes")
    with pytest.raises(InvalidInputError, match=r"CEBM_CUDA_GRAPHS='yes' is not a valid setting; valid choices"):
        run(energy, 2, SamplerConfig(steps=1), seed=0)
    # label values become long tensors as before: an integer is filled in, a tensor or a list converted
    assert as_index(2, torch.device("cpu")).dtype == torch.long and int(as_index(2, torch.device("cpu"))) == 2
    assert as_index([0, 2], torch.device("cpu")).tolist() == [0, 2]
    assert as_index(torch.tensor([1], dtype=torch.int32), torch.device("cpu")).dtype == torch.long
