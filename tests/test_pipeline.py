"""The sampling pipeline: one place decides the form, the settings and the generator, for every caller."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from typer.testing import CliRunner

import composable_ebm as cebm
from composable_ebm import Energy, Guided
from composable_ebm.cli import app
from composable_ebm.errors import InvalidInputError
from composable_ebm.images import image_grid
from composable_ebm.pipeline import composed, default_settings, plan
from composable_ebm.sampling import sample as run_sampler

ROOT = Path(__file__).resolve().parents[1]
EXPRESSION = "shapes-color[color=red] + shapes-shape[shape=circle] + shapes-size[size=large]"
runner = CliRunner()


@pytest.fixture(scope="module")
def bundled():
    return {n: cebm.load(n) for n in ("shapes-color", "shapes-shape", "shapes-size", "shapes-position")}


def test_the_bundled_models_sample_the_same_pixels_as_before_the_core_moved(bundled):
    """Energies and samples (single models, guided, plain, negated and OR energies) equal those the bundled models
    gave before the input transforms and the pipeline moved (tests/data, made by the earlier code on one CPU thread:
    with more, float sums may run in another order). To the bit on the CPU that made them; to 1e-4 per pixel and
    1e-5 per energy anywhere, since another CPU's kernels round differently (an AVX2-only CPU: at most 1.1e-5 per
    pixel apart), where a change to the code moves these chains' pixels by far more."""
    ref = load_file(ROOT / "tests" / "data" / "bundled_reference.safetensors")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        now = _reference_outputs(bundled)
    finally:
        torch.set_num_threads(threads)
    assert set(now) == set(ref)
    for key, value in now.items():
        tolerance = 1e-5 if key.startswith("E_") else 1e-4
        torch.testing.assert_close(value.detach(), ref[key], rtol=0.0, atol=tolerance, msg=key)


def _reference_outputs(bundled) -> dict[str, torch.Tensor]:
    m = bundled
    red, blue = m["shapes-color"].condition(color="red"), m["shapes-color"].condition(color="blue")
    now = {
        "color_red": red.sample(n=4, seed=0),
        "shape_circle": m["shapes-shape"].condition(shape="circle").sample(n=4, seed=1),
        "triple": (red + m["shapes-shape"].condition(shape="circle") + m["shapes-size"].condition(size="large"))
        .sample(n=4, seed=0),
        "plain": (blue + m["shapes-position"].condition(position="left")).sample(n=4, seed=2, form="plain"),
        "neg": (blue - m["shapes-shape"].condition(shape="square")).sample(n=4, seed=3),
        # the disjunction's own energy, chained as the pipeline sampled it before it drew disjunctions as mixtures
        "or": run_sampler(red | blue, 4, default_settings(red | blue).sampler, seed=4).samples,
    }
    x = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    now.update({f"E_{name}": model(x) for name, model in m.items()})
    return now


def test_the_same_expression_and_seed_give_the_same_samples_everywhere(tmp_path, bundled):
    """`.sample()`, `cebm compose` and the studio all go through the pipeline: the same pixels."""
    from composable_ebm import studio
    from composable_ebm.expression import parse_expression

    energy = parse_expression(EXPRESSION, bundled.__getitem__)
    direct = energy.sample(4, seed=3, steps=5)
    out = tmp_path / "grid.png"
    threads = str(torch.get_num_threads())  # the same float sums: the command line's default could be another count
    result = runner.invoke(app, ["--threads", threads, "compose", EXPRESSION, "-n", "4", "--seed", "3", "--steps", "5",
                                 "--scale", "1", "--no-progress", "-o", str(out)])
    assert result.exit_code == 0, result.output
    with Image.open(out) as im:
        assert np.array_equal(np.asarray(im.convert("RGB")), np.asarray(image_grid(direct, scale=1).convert("RGB")))
    made = studio.generate(studio.ModelCache("cpu", loader=lambda name, device: bundled.get(name) or cebm.load(name)),
                           EXPRESSION, n=4,
                           seed=3, steps="5", out_dir=tmp_path)
    assert torch.equal(made.samples, direct)
    assert made.expression.startswith("guided(")


def test_without_a_seed_the_chains_draw_from_torchs_global_generator(bundled):
    red = bundled["shapes-color"].condition(color="red")
    torch.manual_seed(11)
    a = red.sample(2, steps=3)
    torch.manual_seed(11)
    b = red.sample(2, steps=3)
    c = red.sample(2, steps=3)  # the global generator moved on
    assert torch.equal(a, b) and not torch.equal(b, c)


def test_the_energy_layer_carries_no_sampling_policy(bundled):
    """No sampler settings on an energy; a guided node's value depends only on what it was built with."""
    assert not hasattr(Energy, "sampler_config") and not hasattr(Energy, "derived_sampler_config")
    red, circle = bundled["shapes-color"].condition(color="red"), bundled["shapes-shape"].condition(shape="circle")
    node = composed(red + circle)
    assert isinstance(node, Guided) and node.scales == (2.0, 1.0)  # the colour model's own guidance scale
    assert plan(red + circle).config.step_size == 20.0 and plan(red + circle, "plain").config.step_size == 10.0


@pytest.mark.parametrize("make", [lambda m: m - m, lambda m: 0 * m, lambda m: m + m - 2 * m])
def test_a_composite_whose_weights_cancel_is_refused_not_sampled_as_noise(bundled, make):
    red = bundled["shapes-color"].condition(color="red")
    with pytest.raises(InvalidInputError, match="zero total weight on every term"):
        make(red).sample(2, seed=0, steps=1)


def test_compose_of_a_model_minus_itself_is_one_line(tmp_path):
    result = runner.invoke(app, ["compose", "shapes-color[color=red] - shapes-color[color=red]", "-n", "2",
                                 "-o", str(tmp_path / "z.png")])
    assert result.exit_code == 2 and "zero total weight on every term" in result.output
    assert not (tmp_path / "z.png").exists()


@pytest.mark.subprocess
def test_an_energy_samples_in_a_fresh_process_through_any_public_door():
    """`Energy.sample` works whichever public module made the energy (the method imports the pipeline itself)."""
    import subprocess
    import sys

    for code in ("import composable_ebm as c, torch; print(c.GaussianEnergy(torch.zeros(2), torch.eye(2)).sample(3, step_size=0.1).shape)",
                 "from composable_ebm.analytic import GaussianEnergy; import torch;"
                 " print(GaussianEnergy(torch.zeros(2), torch.eye(2)).sample(3, step_size=0.1).shape)",
                 "import composable_ebm as c; print(c.load('shapes-shape').condition(shape='circle').sample(1, steps=1).shape)"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "torch.Size" in out.stdout
