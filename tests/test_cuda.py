"""The CUDA paths: bundled models, the guided sampler in float32 and bfloat16, the CLI and training on a GPU.

Skipped where no CUDA device exists (CI has none); run them on a machine with one.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import composable_ebm as cebm
from composable_ebm.cli import app
from composable_ebm.evaluation import compositional_accuracy
from composable_ebm.models import load_model
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
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert p.device.type == "cpu"
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), name
    assert a.energy(torch.rand(2, 3, 8, 8), {"color": torch.tensor([0, 1])}).isfinite().all()


@pytest.fixture
def cuda_graphs(monkeypatch):
    """CUDA graphs on (``CEBM_CUDA_GRAPHS``, read when each run starts), whatever the caller's environment says."""
    monkeypatch.setenv("CEBM_CUDA_GRAPHS", "1")
    return monkeypatch


def _with_and_without_graphs(run):
    """``run()`` with CUDA graphs off, then on (the variable is read when each run starts)."""
    results = []
    for on in ("0", "1"):
        os.environ["CEBM_CUDA_GRAPHS"] = on
        results.append(run())
    return tuple(results)


def test_a_chain_replayed_from_cuda_graphs_draws_the_eager_chains_noise(cuda_graphs):
    """Analytic energies (no cuDNN, so the same kernels eagerly and in the graph): a Langevin chain, and MALA down a
    noise ladder (either predictor between levels) whose every level is captured with eager steps between levels,
    give the eager samples from the same seed. A graph that drew other noise, or left the generator behind, would move them by the noise's size."""
    from composable_ebm.analytic import GaussianEnergy, NoisedGaussianEnergy
    from composable_ebm.sampling import LadderConfig, SamplerConfig, sample
    from composable_ebm.accel.graphs import MIN_STEPS, _cache

    gaussian = GaussianEnergy(torch.tensor([1.0, 0.0]), torch.tensor([[1.0, 0.3], [0.3, 0.5]])).to("cuda")
    a = NoisedGaussianEnergy(torch.tensor([1.0, 0.0]), torch.tensor([[1.0, 0.3], [0.3, 0.5]]), name="a")
    b = NoisedGaussianEnergy(torch.tensor([-1.0, 1.0]), torch.tensor([[0.5, 0.0], [0.0, 1.0]]), name="b")
    product = (a + b).to("cuda")
    ladder = LadderConfig(method="mala", steps=MIN_STEPS, step_size=0.5, levels=3, sigma_min=0.1, sigma_max=1.0,
                          first_steps=MIN_STEPS)
    cases = ((gaussian, SamplerConfig(method="langevin", steps=2 * MIN_STEPS, step_size=0.01, noise=0.1)),
             (product, ladder), (product, dataclasses.replace(ladder, predictor="heun")),
             (product, dataclasses.replace(ladder, predictor="heun", churn=0.3)))
    for energy, config in cases:
        eager, graphed = _with_and_without_graphs(lambda: sample(energy, 256, config, seed=3))
        assert energy in _cache  # the graphs were made (and are kept for the next call)
        assert torch.allclose(eager.samples, graphed.samples, atol=1e-5), (eager.samples - graphed.samples).abs().max()
        if eager.diagnostics.acceptance is not None:
            assert torch.equal(eager.diagnostics.acceptance, graphed.diagnostics.acceptance)


def test_a_network_chain_replayed_from_a_cuda_graph_matches_the_eager_chain(cuda_graphs):
    """A bundled network's Langevin chain with a bound label and with per-item labels: the same samples to cuDNN's
    rounding (0.0013 at most per pixel after 20 steps on an H200)."""
    from composable_ebm.sampling import sample

    model = cebm.load("shapes-color").to("cuda")
    config = model.sampling_defaults.sampler
    for energy, labels in ((model.condition(color="red"), None),
                           (model, {"color": torch.arange(32, device="cuda") % 3})):
        eager, graphed = _with_and_without_graphs(
            lambda: sample(energy, 32, dataclasses.replace(config, steps=20), seed=3, labels=labels))
        assert torch.allclose(eager.samples, graphed.samples, atol=5e-3), (eager.samples - graphed.samples).abs().max()


def test_the_faces_composition_replayed_from_cuda_graphs_draws_the_eager_faces(cuda_graphs):
    """The README's composition (guided, down the models' noise ladder) with two MALA transitions at each level,
    which are replayed from a graph, from one seed: the same acceptance, faces that carry the three attributes, and
    the same faces. Not to the pixel: cuDNN's rounding moves the energies, a few accept decisions go the other way,
    and those chains end a little elsewhere (with 60 transitions at the first level, the README's grid drawn both ways
    on an H200 differed by 0.005 to 0.11 per face, mean absolute difference, median 0.05, while two different faces of
    the composition differ by 0.13 to 0.31, median 0.23). The models' own settings run no transition: drawn with them,
    the faces carry the attributes too."""
    from composable_ebm.pipeline import plan
    from composable_ebm.sampling import sample
    from composable_ebm.accel.graphs import _cache

    energy = (cebm.load("faces-smiling").condition(smiling="yes") + cebm.load("faces-glasses").condition(glasses="yes")
              + cebm.load("faces-hat").condition(hat="yes")).to("cuda")
    own = plan(energy)  # what `energy.sample` runs: the guided form and the models' sampler
    assert own.config.total_steps == 0  # no transition to replay
    chosen = plan(energy, steps=2)
    eager, graphed = _with_and_without_graphs(lambda: sample(chosen.energy, 64, chosen.config, seed=3))
    assert chosen.energy in _cache  # a graph was made
    rates = eager.acceptance_rate, graphed.acceptance_rate
    assert abs(rates[0] - rates[1]) < 0.02, rates
    classifier = load_model("faces-classifier", "cuda")
    for result in (eager, graphed, sample(own.energy, 64, own.config, seed=3)):
        score = compositional_accuracy(result.samples, classifier, {"smiling": "yes", "glasses": "yes", "hat": "yes"})
        assert score.joint >= 0.9, score.per_attribute
    apart = (eager.samples - graphed.samples).flatten(1).abs().mean(dim=1)
    assert apart.median() < 0.1, apart.sort().values.tolist()


def test_a_chain_whose_capture_fails_runs_eagerly_with_the_eager_draws(cuda_graphs):
    """An energy that reads a value back to the host cannot be captured: one warning, then its chains (a Langevin
    chain, and MALA down a noise ladder) draw exactly what they draw eagerly, so the generator they share with the
    failed capture keeps drawing as it did."""
    from composable_ebm.analytic import NoisedGaussianEnergy
    from composable_ebm.sampling import LadderConfig, SamplerConfig, sample
    from composable_ebm.accel.graphs import MIN_STEPS, _cache

    class ReadsBack(NoisedGaussianEnergy):
        def energy(self, x, labels, sigma=None):
            if not bool(x.isfinite().all()):  # a check read back to the host
                raise ValueError("not finite")
            return super().energy(x, labels, sigma)

    energy = ReadsBack(torch.tensor([1.0, 0.0]), torch.tensor([[1.0, 0.3], [0.3, 0.5]])).to("cuda")
    ladder = LadderConfig(method="mala", steps=MIN_STEPS, step_size=0.5, levels=3, sigma_min=0.1, sigma_max=1.0,
                          first_steps=MIN_STEPS)
    langevin = SamplerConfig(method="langevin", steps=2 * MIN_STEPS, step_size=0.01, noise=0.1)
    with pytest.warns(RuntimeWarning, match="CUDA graph capture failed for ReadsBack") as caught:
        for config in (langevin, ladder):
            eager, graphed = _with_and_without_graphs(lambda: sample(energy, 256, config, seed=3))
            assert torch.equal(eager.samples, graphed.samples)
    assert len([w for w in caught if "capture failed" in str(w.message)]) == 1
    assert not _cache.get(energy)  # no graph kept


def test_training_with_cuda_graphs_reaches_the_weights_of_eager_training(tmp_path: Path, cuda_graphs):
    """The trainer's chain replays a graph kept across iterations while the optimiser moves the weights in place."""
    from composable_ebm.accel.graphs import MIN_STEPS

    text = TINY_RECIPE.format(name="color", attribute="color")
    assert "[trainer.sampler]\nstep_size = 10.0\nsteps = 3\n" in text
    recipe = tmp_path / "color.toml"
    recipe.write_text(text.replace("[trainer.sampler]\nstep_size = 10.0\nsteps = 3\n",
                                   f"[trainer.sampler]\nstep_size = 10.0\nsteps = {MIN_STEPS + 2}\n"))
    weights = []
    for on in (False, True):
        cuda_graphs.setenv("CEBM_CUDA_GRAPHS", "1" if on else "0")  # read when the run starts
        out = tmp_path / f"graphs-{on}"
        result = runner.invoke(app, ["train", str(recipe), "--out", str(out), "--device", "cuda", "--no-progress",
                                     "--steps", "4"])
        assert result.exit_code == 0, result.output
        weights.append(load_model(out / "model").state_dict())
    for (name, p), q in zip(weights[0].items(), weights[1].values(), strict=True):
        assert torch.allclose(p, q, rtol=1e-3, atol=1e-5), name


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_denoising_training_replayed_from_a_cuda_graph_reaches_the_eager_weights(tmp_path: Path, cuda_graphs,
                                                                                 precision):
    """A denoising iteration (the batch drawn on the device, the loss, the backward pass and the clip) replays one
    CUDA graph: 6 iterations reach the eager statistics and weights, and after a restore the graph is captured again
    and redraws what the run drew from that state."""
    import dataclasses

    from composable_ebm.accel.settings import Speed
    from composable_ebm.recipes import build_dataset, build_model, load_recipe
    from composable_ebm.training import Trainer
    from tests.test_diffusion import tiny_diffusion_recipe

    recipe = load_recipe(tiny_diffusion_recipe(tmp_path / "tiny.toml",
                                               ('dataset = "shapes"', 'dataset = "shapes"\nattributes = ["color"]')))
    data = build_dataset(recipe.data, recipe.folder)
    config = dataclasses.replace(recipe.trainer, precision=precision)
    runs = {}
    for on in (False, True):
        trainer = Trainer(build_model(recipe, data), data, config, device="cuda", speed=Speed(cuda_graphs=on))
        runs[on] = ([trainer.train_step().loss for _ in range(6)], trainer.ema.state_dict())
        assert (trainer.objective._graph is not None) == on
    (eager_losses, eager_weights), (graph_losses, graph_weights) = runs[False], runs[True]
    assert graph_losses == pytest.approx(eager_losses, rel=1e-3)
    for (name, p), q in zip(eager_weights.items(), graph_weights.values(), strict=True):
        assert torch.allclose(p, q, rtol=1e-3, atol=1e-5), name
    trainer.save_checkpoint()
    before = [trainer.train_step().loss for _ in range(3)]
    trainer._restore(trainer._latest_checkpoint())
    assert trainer.objective._graph is None
    assert [trainer.train_step().loss for _ in range(3)] == pytest.approx(before, rel=1e-5)
    assert trainer.objective._graph is not None
