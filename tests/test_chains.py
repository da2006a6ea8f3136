"""The sampling wing: one chain protocol for both families, decided once by the pipeline, and a sampler that is right
by default for an energy that declares nothing."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

from composable_ebm.energy import Energy
from composable_ebm.errors import NonFiniteError
from composable_ebm.pipeline import UNDECLARED, plan
from composable_ebm.sampling import Chain, LadderConfig, SamplerConfig, sample

PACKAGE = Path(__file__).resolve().parents[1] / "composable_ebm"


class Bowl(Energy):
    """``E(x) = |x|^2 / 2`` in 2-D, unbounded: exp(-E) is the standard normal. It declares no sampling settings."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__((2,), value_range=None)
        self.scale = scale

    def energy(self, x, labels=None):
        return 0.5 * (x * x).sum(1) / self.scale**2


class TwoBumps(Energy):
    """A mixture of two Gaussians of std 0.6 at -1.5 and +1.5 along the first axis, with weights 0.3 and 0.7."""

    def __init__(self) -> None:
        super().__init__((2,), value_range=None)

    def energy(self, x, labels=None):
        left = math.log(0.3) - 0.5 * (((x - torch.tensor([-1.5, 0.0])) / 0.6) ** 2).sum(1)
        right = math.log(0.7) - 0.5 * (((x - torch.tensor([1.5, 0.0])) / 0.6) ** 2).sum(1)
        return -torch.logaddexp(left, right)


def test_an_energy_that_declares_nothing_is_sampled_from_exp_minus_e_and_the_adaptation_is_reported():
    """The 2-D bowl with no settings: variance 1 +- 0.1 per axis, mean 0; the chain is `UNDECLARED` (MALA, exact
    noise) with its step size adapted towards the target acceptance, and the result's config says the size it used.
    A wider bowl adapts to a larger step and still gives its own variance."""
    for scale in (1.0, 3.0):
        result = Bowl(scale).sample_result(4000, seed=0)
        variance = result.samples.var(0) / scale**2
        assert ((variance - 1).abs() < 0.1).all(), (scale, variance)
        assert (result.samples.mean(0).abs() < 0.1 * scale).all()
        assert result.config.method == "mala" and result.config.noise == "exact"
        assert result.config.step_size != UNDECLARED.step_size and result.config.adapt == UNDECLARED.adapt
        late = result.diagnostics.acceptance[UNDECLARED.adapt:].mean()
        assert abs(float(late) - UNDECLARED.target_acceptance) < 0.15
    assert Bowl(3.0).sample_result(500, seed=0).config.step_size > Bowl(1.0).sample_result(500, seed=0).config.step_size


def test_a_mixture_of_two_gaussians_puts_each_mode_near_its_weight():
    samples = TwoBumps().sample(4000, seed=1)
    right = float((samples[:, 0] > 0).float().mean())
    assert abs(right - 0.7) < 0.05, right


def test_a_step_size_that_diverges_names_the_step_size_not_the_weights():
    with pytest.raises(NonFiniteError) as info:
        Bowl().sample(16, seed=0, method="langevin", noise=0.01, adapt=0, step_size=5.0, steps=200)
    message = str(info.value)
    assert "step size 5" in message and "lower the step size" in message and "weights" not in message
    broken = Bowl()
    broken.register_parameter("w", torch.nn.Parameter(torch.tensor(float("nan"))))
    broken.energy = lambda x, labels=None: 0.5 * (x * x).sum(1) * broken.w
    with pytest.raises(NonFiniteError, match="its weights hold NaN"):
        broken.sample(4, seed=0, steps=2, adapt=1)


def test_both_chains_are_the_same_protocol_and_the_runner_asks_neither_which_it_is(color_model):
    """`SamplerConfig` and `LadderConfig` each start, run and check a chain; `sample` runs either one as it is
    given: the samples of a given chain come out the same whether the runner or the chain itself is called."""
    from composable_ebm.analytic import NoisedGaussianEnergy

    ladder = LadderConfig(levels=3, sigma_max=2.0, steps=2)
    for chain, energy in ((SamplerConfig(steps=3, step_size=1.0), color_model),
                          (ladder, NoisedGaussianEnergy(torch.zeros(2), torch.eye(2)))):
        protocol = {n for n in vars(Chain) if not n.startswith("_")} | set(Chain.__annotations__)
        assert protocol <= set(dir(chain)), protocol - set(dir(chain))
        result = sample(energy, 5, chain, seed=3)
        gen = torch.Generator().manual_seed(3)
        x = chain.start(energy, 5, gen, torch.device("cpu"))
        assert torch.equal(chain.run(energy, x, gen).x.detach(), result.samples)
        assert result.diagnostics.energy.shape == (chain.total_steps,)
    with pytest.raises(ValueError, match="does not depend on a noise level"):
        sample(color_model, 2, ladder, seed=0)


def test_the_pipeline_decides_the_chain_once_and_the_runner_holds_no_decision():
    """The runner module has no isinstance check on a config type, picks no default and applies no override; the
    pipeline's plan is where defaults, levels and overrides are decided."""
    tree = ast.parse((PACKAGE / "sampling" / "runner.py").read_text())
    checks = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "isinstance"
              and any(k in ast.unparse(n) for k in ("SamplerConfig", "LadderConfig", "Chain"))]
    assert checks == []
    text = (PACKAGE / "sampling" / "runner.py").read_text()
    assert "with_overrides" not in text and "SamplerConfig()" not in text
    chosen = plan(Bowl(), steps=7)
    assert chosen.config == UNDECLARED.__class__(**{**UNDECLARED.__dict__, "steps": 7})


def test_no_function_in_the_package_is_longer_than_a_screen():
    """Every function of the package fits on one screen: 60 lines at most (Algorithm 2 and the ladder among them)."""
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


def test_no_module_reads_the_environment_or_installs_a_switch_at_import():
    """No ``os.environ`` / ``os.getenv`` at a module's top level and no ``global`` statement: settings are read when a
    run starts (`composable_ebm.accel.settings.Speed`)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if any(isinstance(n, ast.Attribute) and ast.unparse(n) in ("os.environ", "os.getenv") for n in ast.walk(node)):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
        found += [f"{path.relative_to(PACKAGE)}:{n.lineno} global" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    assert not found, found


def test_what_a_family_or_an_energy_declares_is_never_probed_by_name():
    """No ``getattr(..., "sampling_defaults" | "augment" | "buffer", ...)``: `Energy.sampling_defaults`, each chain's
    ``augment`` and the contrastive objective's ``buffer`` are declared."""
    probes = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "hasattr") and len(node.args) > 1 \
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in ("sampling_defaults",
                                                                                          "augment", "buffer"):
                probes.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not probes, probes


def test_the_command_line_sets_every_setting_of_the_models_family_and_names_the_other_family(tmp_path):
    """``--set KEY=VALUE`` reaches any field of the model's chain (a ladder's ``levels`` for the faces, a Langevin
    chain's ``rounds`` and a table for ``augment`` for Shapes); the other family's is one line naming both families;
    ``--help`` says which option belongs to which."""
    from typer.testing import CliRunner

    from composable_ebm.cli import app

    runner = CliRunner()
    out = tmp_path / "grid.png"
    ok = [["sample", "faces-hat", "-c", "hat=yes", "--set", "levels=3", "--set", "predictor=ancestral"],
          ["compose", "shapes-color[color=red]", "--set", "rounds=2", "--steps", "2",
           "--set", "augment={crop_scale = [0.5, 1.0]}"]]
    for args in ok:
        result = runner.invoke(app, ["--threads", "1", *args, "-n", "2", "-o", str(out), "--no-progress"])
        assert result.exit_code == 0, result.output
    for args, needle in ((["sample", "faces-hat", "--rounds", "2"], "['rounds'] is a setting of a Langevin chain"),
                         (["compose", "shapes-color[color=red]", "--set", "levels=4"],
                          "['levels'] is a setting of a noise ladder (LadderConfig), which noise-conditioned models"),
                         (["compose", "shapes-color", "--set", "steps"], "--set takes KEY=VALUE")):
        result = runner.invoke(app, [*args, "-n", "2", "-o", str(out)])
        assert result.exit_code == 2 and needle in result.output, result.output
    text = runner.invoke(app, ["sample", "--help"]).output
    assert "A Langevin chain's: augmentation rounds" in text and "A noise ladder (LadderConfig" in " ".join(text.split())
