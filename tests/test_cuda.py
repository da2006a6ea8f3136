"""The CUDA paths: bundled models, the guided sampler in float32 and bfloat16, the CLI and training on a GPU.

Skipped where no CUDA device exists (CI has none); run them on a machine with one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import composable_ebm as cebm
from composable_ebm.cli import app
from composable_ebm.evaluation import compositional_accuracy
from composable_ebm.persistence import load_model
from tests.test_cli import TINY_RECIPE

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

EXPRESSION = "shapes-color[color=red] + shapes-shape[shape=circle] + shapes-size[size=large]"
TARGET = {"color": "red", "shape": "circle", "size": "large"}
runner = CliRunner()


def _red_large_circles(device: str):
    color, shape, size = (cebm.load(f"shapes-{a}").to(device) for a in ("color", "shape", "size"))
    return color.condition(color="red") + shape.condition(shape="circle") + size.condition(size="large")


def test_bundled_energies_agree_between_cpu_and_cuda():
    model = cebm.load("shapes-shape")
    x = torch.rand(32, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    labels = {"shape": torch.arange(32) % 3}
    with torch.no_grad():
        on_cpu = model.energy(x, labels)
        on_gpu = model.to("cuda").energy(x.cuda(), {k: v.cuda() for k, v in labels.items()}).cpu()
    # cuDNN may run the convolutions in TF32: agreement to about 1e-3 of the energies' spread
    assert torch.allclose(on_cpu, on_gpu, atol=2e-3 * float(on_cpu.std()) + 1e-6), (on_cpu - on_gpu).abs().max()


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_guided_composition_on_cuda_makes_the_target(precision):
    samples = _red_large_circles("cuda").sample(n=64, seed=0, precision=precision)
    assert samples.device.type == "cuda" and samples.dtype == torch.float32
    assert torch.isfinite(samples).all() and samples.min() >= 0 and samples.max() <= 1
    classifier = load_model("shapes-classifier", "cuda")
    score = compositional_accuracy(samples, classifier, TARGET)
    assert score.joint >= 0.75, score.per_attribute  # on the CPU in float32: 64 of 64 (README)


def test_cli_compose_and_sample_on_cuda_in_bfloat16(tmp_path: Path):
    grid = tmp_path / "grid.png"
    result = runner.invoke(app, ["compose", EXPRESSION, "-n", "4", "--seed", "0", "--device", "cuda",
                                 "--precision", "bfloat16", "-o", str(grid)])
    assert result.exit_code == 0, result.output
    assert Image.open(grid).size[0] >= 2 * 64
    single = tmp_path / "one.png"
    result = runner.invoke(app, ["sample", "shapes-color", "-c", "color=blue", "-n", "4", "--device", "cuda",
                                 "--method", "mala", "--noise", "exact", "--step-size", "0.00001", "-o", str(single)])
    assert result.exit_code == 0, result.output
    assert single.exists()


def test_training_on_cuda_resumes_to_the_same_weights(tmp_path: Path):
    """4 steps straight and 2 + 2 with a resume in between end at the same weights (to cuDNN's rounding)."""
    recipe = tmp_path / "color.toml"
    recipe.write_text(TINY_RECIPE.format(name="color", attribute="color"))
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for out, steps in ((straight, ["--steps", "4"]), (resumed, ["--steps", "2"]), (resumed, ["--steps", "4"])):
        result = runner.invoke(app, ["train", str(recipe), "--out", str(out), "--device", "cuda", "--no-progress",
                                     *steps])
        assert result.exit_code == 0, result.output
    a, b = (load_model(out / "model") for out in (straight, resumed))
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert p.device.type == "cpu"
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), name
    assert a.energy(torch.rand(2, 3, 8, 8), {"color": torch.tensor([0, 1])}).isfinite().all()
