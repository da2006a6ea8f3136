"""Training in bfloat16 (`TrainerConfig.precision` for the denoising loss, ``sampler.precision`` for a
contrastive-divergence chain): the same losses, gradients and chains as float32 within stated tolerances, refused in
one line when misspelt or misplaced, float32 with a warning where a GPU or a CPU has no bfloat16 arithmetic.

The numerics tests use the ``bfloat16_arithmetic`` fixture: bfloat16 as asked, emulated where this CPU has none."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from composable_ebm import DenoisingUNetConfig, DenoisingUNetEnergy, ResNetEnergy
from composable_ebm.errors import InvalidInputError
from composable_ebm.sampling import SamplerConfig, algorithm2
from composable_ebm.training import ContrastiveConfig, DenoisingConfig, Trainer, TrainerConfig
from composable_ebm.training.denoising import DenoisingObjective
from composable_ebm.accel import precision as arithmetic
from tests.conftest import tiny_config

CPU = torch.device("cpu")


def _images(n: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return (0.5 + 0.2 * torch.randn(n, 3, 8, 8, generator=g)).clamp(0, 1)


@pytest.mark.usefixtures("bfloat16_arithmetic")
def test_bfloat16_denoising_loss_and_gradients_match_float32():
    """Loss within 2% and the parameters' gradient within cosine 0.99 of float32, on one batch and one noise draw."""
    model = DenoisingUNetEnergy(DenoisingUNetConfig(name="u", image_size=8, channels=(16, 32), embedding=16, groups=4,
                                                    attributes={"color": ("red", "green")}, null_condition=True))
    objective = DenoisingObjective(model)
    x, labels = _images(), {"color": torch.arange(32) % 2}
    out = {}
    for precision in ("float32", "bfloat16"):
        model.zero_grad(set_to_none=True)
        with arithmetic.autocast("cpu", precision, doing="training"):
            result = objective(x, labels, torch.Generator().manual_seed(0))
        assert result.loss.dtype == torch.float32
        result.loss.backward()
        out[precision] = (float(result.loss.detach()), torch.cat([p.grad.flatten() for p in model.parameters()]))
    (loss32, grad32), (loss16, grad16) = out["float32"], out["bfloat16"]
    assert abs(loss16 - loss32) < 0.02 * loss32, (loss16, loss32)
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0) > 0.99


@pytest.mark.usefixtures("bfloat16_arithmetic")
def test_bfloat16_langevin_chain_ends_where_the_float32_chain_ends():
    """From one start with one noise draw: after one Langevin step every pixel is within 0.02 of the float32 chain's
    (the images span [0, 1]); after ten, where rounding differences have grown through the clamp, the mean pixel is
    within 0.02. The chain's images stay float32."""
    model = ResNetEnergy(tiny_config())
    start = torch.rand(16, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    ends = {}
    for steps in (1, 10):
        for precision in ("float32", "bfloat16"):
            config = SamplerConfig(step_size=10.0, noise=0.005, steps=10, precision=precision)
            ends[precision, steps] = algorithm2(model, start.clone(), config, torch.Generator().manual_seed(2),
                                               num_steps=steps).x
    assert ends["bfloat16", 10].dtype == torch.float32
    assert (ends["float32", 1] - start).abs().max() > 0.2  # the chain moved, so agreeing is not trivial
    assert (ends["bfloat16", 1] - ends["float32", 1]).abs().max() < 0.02
    assert (ends["bfloat16", 10] - ends["float32", 10]).abs().mean() < 0.02


@pytest.mark.parametrize("noise_conditioned", [False, True])
def test_a_bfloat16_run_trains_with_float32_weights_and_records(noise_conditioned, tmp_path, bfloat16_arithmetic):
    if noise_conditioned:
        model = DenoisingUNetEnergy(DenoisingUNetConfig(name="u", image_size=8, channels=(8, 16), embedding=16,
                                                        groups=4))
        config = TrainerConfig(steps=4, batch_size=8, log_every=2, checkpoint_every=2, betas=(0.9, 0.999),
                               objective=DenoisingConfig(precision="bfloat16"))
    else:
        model = ResNetEnergy(tiny_config())
        config = TrainerConfig(steps=4, batch_size=8, log_every=2, checkpoint_every=2,
                               objective=ContrastiveConfig(buffer_size=16, ent_bank=4, ent_min_buffer=4,
                                                           sampler=SamplerConfig(step_size=10.0, noise=0.005, steps=3, precision="bfloat16")))
    trainer = Trainer(model, _images(), config, out_dir=tmp_path)
    before = [p.detach().clone() for p in model.parameters()]
    trainer.fit()
    assert all(p.dtype == torch.float32 for p in [*model.parameters(), *trainer.ema.parameters()])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    record = trainer.train_step()
    assert record.loss == record.loss and abs(record.loss) < 1e3


def test_an_unknown_or_misplaced_precision_is_refused_in_one_line_with_the_choices():
    with pytest.raises(InvalidInputError, match=r"unknown precision 'float16'.*'float32', 'bfloat16'"):
        TrainerConfig(objective=DenoisingConfig(precision="float16"))
    with pytest.raises(InvalidInputError, match=r"a model of clean data trains by contrastive divergence \(ContrastiveConfig\),"
                                                r" not with a DenoisingConfig; valid choices"):
        Trainer(ResNetEnergy(tiny_config()), _images(), TrainerConfig(objective=DenoisingConfig(precision="bfloat16")))


def test_a_gpu_without_bfloat16_trains_in_float32_with_one_warning(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "an old GPU")
    with pytest.warns(RuntimeWarning, match="an old GPU has no bfloat16 arithmetic; training in float32"):
        context = arithmetic.autocast("cuda", "bfloat16", doing="training")
    assert isinstance(context, contextlib.nullcontext)


def test_a_cpu_without_bfloat16_trains_and_samples_in_float32_with_one_warning(monkeypatch):
    """Emulated bfloat16 is many times slower than float32, so where the CPU has none of its own the trainer and the
    sampler run float32 and say so: the same chain, to the bit, as a float32 one."""
    monkeypatch.setattr(arithmetic, "_cpu_bfloat16", lambda: False)
    assert not arithmetic.native_bfloat16("cpu")
    with pytest.warns(RuntimeWarning, match="^this CPU has no bfloat16 arithmetic; training in float32$"):
        context = arithmetic.autocast("cpu", "bfloat16", doing="training")
    assert isinstance(context, contextlib.nullcontext)
    model = ResNetEnergy(tiny_config())
    start = torch.rand(8, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    ends = {}
    for precision in ("float32", "bfloat16"):
        config = SamplerConfig(step_size=10.0, noise=0.005, steps=3, precision=precision)
        with pytest.warns(RuntimeWarning, match="this CPU has no bfloat16 arithmetic; sampling in float32") \
                if precision == "bfloat16" else contextlib.nullcontext():
            ends[precision] = algorithm2(model, start.clone(), config, torch.Generator().manual_seed(2)).x
    assert torch.equal(ends["bfloat16"], ends["float32"])
    assert not torch.equal(ends["float32"], start)


def test_cebm_train_precision_overrides_the_recipe_says_so_in_the_card_and_may_change_on_resume(tmp_path):
    from typer.testing import CliRunner

    from composable_ebm.cli import app
    from composable_ebm.training import load_checkpoint

    from tests.test_diffusion import tiny_diffusion_recipe

    recipe = tiny_diffusion_recipe(tmp_path / "tiny.toml",
                                   ('dataset = "shapes"', 'dataset = "shapes"\nattributes = ["color"]'))
    run = tmp_path / "run"
    runner = CliRunner()
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--steps", "2", "--no-progress",
                                 "--precision", "bfloat16"])
    assert result.exit_code == 0, result.output
    assert "`--precision bfloat16`" in (run / "model" / "README.md").read_text()
    assert json.loads(load_checkpoint(run / "checkpoint.pt")["trainer_config"])["precision"] == "bfloat16"
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--steps", "3", "--no-progress"])
    assert result.exit_code == 0 and "resumed from step 2" in result.output, result.output
    assert json.loads(load_checkpoint(run / "checkpoint.pt")["trainer_config"])["precision"] == "float32"
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--precision", "half", "--no-progress"])
    assert result.exit_code != 0 and "valid choices: ['float32', 'bfloat16']" in result.output
