"""Post-hoc EMA: power-function averages kept while training, any other EMA length made from them afterwards."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from composable_ebm.errors import InvalidInputError
from composable_ebm.training.posthoc import (PowerAverages, gamma_of, reconstruct, reconstruction_weights, snapshots,
                                             std_of)

TOY = ('[model]\ntype = "mlp"\nhidden = 8\ndepth = 2\nvalue_range = [-4.0, 4.0]\n[data]\ndataset = "toy2d"\n'
       'density = "8gaussians"\nn = 64\n[trainer]\nsteps = 6\nbatch_size = 8\nlog_every = 2\ncheckpoint_every = 2\n'
       'chain_augment = false\nposthoc_ema = [0.05, 0.1]\nposthoc_every = 2\n[trainer.sampler]\nstep_size = 0.01\n'
       'steps = 3\n')


def test_gamma_and_relative_std_are_inverse_and_match_the_papers_pairs():
    # Karras et al. 2024 (EDM2), section 3: sigma_rel 0.05 and 0.10 are gamma 16.97 and 6.94
    assert gamma_of(0.05) == pytest.approx(16.97, abs=0.01)
    assert gamma_of(0.10) == pytest.approx(6.94, abs=0.01)
    for std in (0.01, 0.09, 0.2, 0.28):
        assert std_of(gamma_of(std)) == pytest.approx(std, rel=1e-9)
    with pytest.raises(InvalidInputError, match=r"in \(0, 0.28\]"):
        gamma_of(0.3)


def test_a_written_average_is_rebuilt_as_itself():
    steps, gammas = [100, 100, 200, 200], [gamma_of(0.05), gamma_of(0.1)] * 2
    weights = reconstruction_weights(steps, gammas, 200, gamma_of(0.1))
    assert weights == pytest.approx([0, 0, 0, 1], abs=1e-6)


def _trajectory(steps: int) -> list[torch.Tensor]:
    """Weights of a toy run: a drift towards a point plus noise that shrinks, as a trained network's do."""
    g = torch.Generator().manual_seed(0)
    w, out = torch.zeros(64), []
    goal = torch.randn(64, generator=g)
    for t in range(1, steps + 1):
        w = w + 0.01 * (goal - w) + 0.05 * torch.randn(64, generator=g) / t ** 0.25
        out.append(w.clone())
    return out


@pytest.mark.parametrize("std", [0.03, 0.07, 0.15, 0.25])
def test_an_average_of_another_length_is_made_from_the_two_kept(tmp_path, std):
    """30 written averages of each kept length: the one asked for, within 5% of its distance from the weights."""
    model = nn.Linear(8, 8, bias=False)
    kept, direct = PowerAverages(model, (0.05, 0.10)), PowerAverages(model, (std,))
    path, truth = _trajectory(600), {}
    for t, w in enumerate(path, start=1):
        with torch.no_grad():
            model.weight.copy_(w.view(8, 8))
        kept.update(model, t)
        direct.update(model, t)
        if t % 20 == 0:
            kept.write(model, tmp_path, t)
        if t in (400, 600):
            truth[t] = direct.averages[0][0].flatten().clone()
    for t, average in truth.items():
        built, step = reconstruct(tmp_path, std, step=t if t < 600 else None)
        assert step == t
        distance = (average - path[t - 1]).norm()
        assert (built["weight"].flatten() - average).norm() < 0.05 * distance
    with pytest.raises(InvalidInputError, match="valid choices"):
        reconstruct(tmp_path, std, step=401)


def test_a_run_keeps_its_averages_through_a_resume_and_exports_any_length(tmp_path):
    from composable_ebm import load, train_recipe
    from composable_ebm.cli import app
    from composable_ebm.training import load_checkpoint

    recipe = tmp_path / "toy.toml"
    recipe.write_text(TOY)
    train_recipe(recipe, tmp_path / "straight", echo=lambda _: None)
    train_recipe(recipe, tmp_path / "resumed", steps=4, echo=lambda _: None)
    train_recipe(recipe, tmp_path / "resumed", echo=lambda _: None)
    assert [(s.step, round(s.gamma, 2)) for s in snapshots(tmp_path / "resumed")] == [
        (2, 6.94), (2, 16.97), (4, 6.94), (4, 16.97), (6, 6.94), (6, 16.97)]
    a = load_checkpoint(tmp_path / "straight" / "checkpoint.pt")["posthoc"]["averages"]
    b = load_checkpoint(tmp_path / "resumed" / "checkpoint.pt")["posthoc"]["averages"]
    assert all(torch.equal(x, y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True))

    runner = CliRunner()
    out = tmp_path / "ema07"
    done = runner.invoke(app, ["export", str(tmp_path / "resumed"), "--ema-std", "0.07", "--out", str(out)])
    assert done.exit_code == 0, done.output
    model = load(str(out))
    assert "relative std 0.07" in (out / "README.md").read_text()
    ema = load(str(tmp_path / "resumed" / "model"))
    x = torch.randn(16, 2)
    assert model(x).shape == ema(x).shape and not torch.equal(model(x), ema(x))
    refused = runner.invoke(app, ["export", str(tmp_path / "resumed"), "--ema-std", "0.07", "--ema-step", "5",
                                  "--out", str(tmp_path / "other")])
    assert refused.exit_code != 0 and "not at 5; valid choices" in refused.output
    refused = runner.invoke(app, ["export", str(tmp_path / "straight"), "--ema-step", "4"])
    assert refused.exit_code != 0 and "give --ema-std too" in refused.output
