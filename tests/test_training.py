"""Trainer: buffer, losses (with an independent check of the L_opt gradient), resume, faults, DDP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from composable_ebm.errors import InvalidInputError
from composable_ebm.images import as_float_images
from composable_ebm import MLPConfig, MLPEnergy, ResNetEnergy
from composable_ebm.sampling import SamplerConfig
from composable_ebm.training import (
    ContrastiveConfig,
    ImprovedCDObjective,
    ReplayBuffer,
    Trainer,
    TrainerConfig,
    TrainingDiverged,
    cd_loss,
    entropy_loss,
    load_checkpoint,
    nearest_neighbour_distance,
    save_atomic,
)
from tests.conftest import FlakyEnergy, contrastive_trainer, tiny_config

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "train_worker.py"


# ----------------------------------------------------------------------------- buffer
def test_buffer_round_trip_is_exact_and_keeps_labels_with_samples():
    buf = ReplayBuffer(50, (3, 4, 4), attributes=["color"], policy="fifo")
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(20, 3, 4, 4)
    labels = {"color": torch.arange(20) % 3}
    buf.add(x, labels, gen)
    got, got_labels = buf.sample(200, gen)
    # every sample read back is bit-identical to a stored one, with the label stored with it
    match = (got.flatten(1)[:, None] == x.flatten(1)[None]).all(-1)  # (200, 20)
    assert match.any(1).all()
    idx = match.float().argmax(1)
    assert torch.equal(got_labels["color"], labels["color"][idx])
    # many round trips through the buffer change nothing (no quantisation drift)
    y = x.clone()
    for _ in range(10):
        b = ReplayBuffer(20, (3, 4, 4), policy="fifo")
        b.add(y, None, gen)
        y = b.samples[: b.size].clone()
    assert torch.equal(y, x)


def test_buffer_respects_capacity_and_fifo_keeps_the_newest():
    buf = ReplayBuffer(10, (2,), policy="fifo")
    gen = torch.Generator().manual_seed(0)
    for i in range(5):
        buf.add(torch.full((4, 2), float(i)), None, gen)
    assert len(buf) == 10
    assert sorted(buf.samples[:, 0].tolist()) == [2.0, 2.0, 3.0, 3.0, 3.0, 3.0, 4.0, 4.0, 4.0, 4.0]


def test_buffer_add_keeps_the_last_item_of_a_slot_and_reads_nothing_back(monkeypatch):
    """A batch longer than the buffer: the later item of each slot wins, as if added one by one; items that are not
    kept never show (the buffer's spare row is past its end), and `add` asks the device for nothing (on a GPU a
    `nonzero` or a read waits for its queue)."""
    def refuse(*args, **kwargs):
        raise AssertionError("ReplayBuffer.add read a value back")

    fifo = ReplayBuffer(4, (1,), attributes=["a"], policy="fifo")
    reservoir = ReplayBuffer(4, (1,), attributes=["a"], policy="reservoir")
    gen = torch.Generator().manual_seed(0)
    with monkeypatch.context() as patch:
        for name in ("nonzero", "tolist", "item", "__bool__", "__int__"):
            patch.setattr(torch.Tensor, name, refuse)
        patch.setattr(torch, "nonzero", refuse)
        for _ in range(3):
            for buf in (fifo, reservoir):
                buf.add(torch.arange(10.0)[:, None], {"a": torch.arange(10)}, gen)
    assert fifo.samples[:, 0].tolist() == [8.0, 9.0, 6.0, 7.0] and fifo.labels["a"].tolist() == [8, 9, 6, 7]
    assert fifo.samples.shape[0] == 4 and fifo.state_dict()["samples"].shape[0] == 4
    assert torch.equal(reservoir.samples[:, 0].long(), reservoir.labels["a"])  # labels stay with their samples
    assert len(reservoir) == 4 and reservoir.seen == 30


def test_reservoir_buffer_holds_a_uniform_sample_of_everything_seen():
    buf = ReplayBuffer(1000, (1,), policy="reservoir")
    gen = torch.Generator().manual_seed(0)
    for i in range(20):  # 20 batches of 500 items, tagged by batch
        buf.add(torch.full((500, 1), float(i)), None, gen)
    counts = torch.bincount(buf.samples[:, 0].long(), minlength=20).float()
    assert len(buf) == 1000
    # each batch should hold ~50 of the 1000 slots; early batches are not crowded out
    assert counts.min() > 25 and counts.max() < 80


def test_buffer_state_dict_round_trip():
    gen = torch.Generator().manual_seed(0)
    buf = ReplayBuffer(8, (2,), attributes=["a"])
    buf.add(torch.randn(5, 2), {"a": torch.arange(5)}, gen)
    other = ReplayBuffer(8, (2,), attributes=["a"])
    other.load_state_dict(buf.state_dict())
    assert len(other) == 5 and other.seen == 5
    assert torch.equal(other.samples, buf.samples) and torch.equal(other.labels["a"], buf.labels["a"])
    with pytest.raises(ValueError, match="does not match"):
        ReplayBuffer(9, (2,), attributes=["a"]).load_state_dict(buf.state_dict())



def test_buffer_resized_on_load_keeps_the_newest_fifo_items_and_a_reservoir_subset():
    gen = torch.Generator().manual_seed(0)
    fifo = ReplayBuffer(8, (1,), attributes=["a"], policy="fifo")
    for i in range(11):  # items 0..10: the buffer holds 3..10, item 10 in slot 2
        fifo.add(torch.full((1, 1), float(i)), {"a": torch.tensor([i])}, gen)
    small = ReplayBuffer(4, (1,), attributes=["a"], policy="fifo")
    with pytest.raises(ValueError, match="does not match"):
        small.load_state_dict(fifo.state_dict())
    small.load_state_dict(fifo.state_dict(), resize=True)
    assert small.samples[:, 0].tolist() == [7.0, 8.0, 9.0, 10.0] and small.labels["a"].tolist() == [7, 8, 9, 10]
    small.add(torch.full((1, 1), 11.0), {"a": torch.tensor([11])}, gen)  # overwrites the oldest
    assert sorted(small.samples[:, 0].tolist()) == [8.0, 9.0, 10.0, 11.0]
    large = ReplayBuffer(16, (1,), attributes=["a"], policy="fifo")
    large.load_state_dict(fifo.state_dict(), resize=True)
    assert len(large) == 8 and large.samples[:8, 0].tolist() == [float(i) for i in range(3, 11)]
    large.add(torch.full((2, 1), 11.0), {"a": torch.tensor([11, 11])}, gen)  # appended, nothing lost
    assert len(large) == 10 and large.samples[8:10, 0].tolist() == [11.0, 11.0]
    reservoir = ReplayBuffer(8, (1,), attributes=["a"])
    reservoir.add(torch.arange(100.0)[:, None], {"a": torch.arange(100)}, gen)
    kept = ReplayBuffer(4, (1,), attributes=["a"])
    kept.load_state_dict(reservoir.state_dict(), resize=True)
    assert len(kept) == 4 and kept.seen == 100
    assert kept.samples[:, 0].tolist() == reservoir.samples[:4, 0].tolist()


# ----------------------------------------------------------------------------- losses
def test_cd_loss_formula():
    e_pos, e_neg = torch.tensor([1.0, 2.0]), torch.tensor([0.5, -0.5])
    assert float(cd_loss(e_pos, e_neg, 0.0)) == pytest.approx(1.5)
    assert float(cd_loss(e_pos, e_neg, 2.0)) == pytest.approx(1.5 + 2.0 * (2.5 + 0.25))


def test_nearest_neighbour_distance_matches_brute_force():
    x, bank = torch.randn(7, 3, 4, 4), torch.randn(11, 3, 4, 4)
    brute = (x.flatten(1)[:, None] - bank.flatten(1)[None]).norm(dim=-1).min(1).values
    torch.testing.assert_close(nearest_neighbour_distance(x, bank), brute, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(entropy_loss(x, bank), -torch.log(brute).mean(), rtol=1e-4, atol=1e-4)


def _tiny_mlp() -> MLPEnergy:
    torch.manual_seed(0)
    return MLPEnergy(MLPConfig(hidden=8, depth=2)).double()


def test_opt_loss_gradient_matches_finite_differences_through_the_last_langevin_step():
    """d/dθ E_{θ0}(x - η dE_θ/dx(x) + σω), by central differences in one parameter, equals autograd's L_opt gradient."""
    model = _tiny_mlp()
    eta, sigma = 0.3, 0.05
    cfg = TrainerConfig(objective=ContrastiveConfig(sampler=SamplerConfig(step_size=eta, noise=sigma, steps=1),
                                                    kl_ent=False, cd_l2=0.0, chain_augment=None))
    objective = ImprovedCDObjective(model, cfg.objective)
    x_prev = torch.randn(6, 2, dtype=torch.float64)
    noise = torch.randn(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))  # what the step draws
    out = objective(torch.randn(6, 2, dtype=torch.float64), None, x_prev, None, torch.Generator().manual_seed(5), None)
    param = model.net[2].weight  # a hidden layer's weight
    (grad,) = torch.autograd.grad(out.opt, param)

    frozen = _tiny_mlp()
    frozen.load_state_dict(model.state_dict())

    def l_opt_with(theta_entry: float, i: int, j: int) -> float:
        probe = _tiny_mlp()
        probe.load_state_dict(model.state_dict())
        with torch.no_grad():
            probe.net[2].weight[i, j] = theta_entry
        _, g = probe.energy_and_grad(x_prev)  # dE_θ/dx at x_prev
        x_hat = x_prev - eta * g + sigma * noise
        with torch.no_grad():
            return float(frozen(x_hat).mean())  # energy under the frozen (original) parameters

    eps = 1e-5
    for i, j in [(0, 0), (3, 5), (7, 2)]:
        w = float(param[i, j].detach())
        fd = (l_opt_with(w + eps, i, j) - l_opt_with(w - eps, i, j)) / (2 * eps)
        assert float(grad[i, j]) == pytest.approx(fd, rel=1e-5, abs=1e-8)
    assert grad.abs().sum() > 0


def test_opt_loss_does_not_differentiate_the_outer_energy():
    """With the last step's gradient detached, L_opt has no parameter gradient: E is frozen."""
    model = _tiny_mlp()
    from composable_ebm.training import opt_loss

    x = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    loss = opt_loss(model, x)
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    assert all(g is None for g in grads)
    assert all(p.requires_grad for p in model.parameters())


class CountingEnergy(MLPEnergy):
    """Counts input-gradient evaluations (Langevin steps)."""

    grad_calls = 0

    def energy_and_grad(self, x, labels=None, create_graph=False):
        CountingEnergy.grad_calls += 1
        return super().energy_and_grad(x, labels, create_graph)


@pytest.mark.parametrize("kl", [True, False])
def test_each_langevin_step_is_computed_once(kl):
    CountingEnergy.grad_calls = 0
    model = CountingEnergy(MLPConfig(hidden=8, depth=2))
    cfg = TrainerConfig(steps=1, batch_size=4, log_every=1000,
                        objective=ContrastiveConfig(sampler=SamplerConfig(step_size=0.1, noise=0.01, steps=7),
                                                    chain_augment=None, kl_opt=kl, kl_ent=kl))
    trainer = Trainer(model, torch.randn(32, 2), cfg)
    trainer.train_step()
    assert CountingEnergy.grad_calls == 7


def test_chain_steps_max_draws_each_iterations_chain_length_from_the_range_with_the_runs_generator():
    def lengths(seed: int, iterations: int = 40) -> list[int]:
        model = CountingEnergy(MLPConfig(hidden=8, depth=2))
        cfg = TrainerConfig(steps=iterations, batch_size=4, log_every=1000, seed=seed,
                            objective=ContrastiveConfig(sampler=SamplerConfig(step_size=0.1, noise=0.01, steps=3),
                                                        chain_steps_max=6, chain_augment=None, kl_ent=False))
        trainer = Trainer(model, torch.randn(32, 2), cfg)
        out = []
        for _ in range(iterations):
            CountingEnergy.grad_calls = 0
            trainer.train_step()
            out.append(CountingEnergy.grad_calls)
        return out

    drawn = lengths(0)
    assert set(drawn) == {3, 4, 5, 6}  # every length of the range, and nothing outside it
    assert drawn == lengths(0) and drawn != lengths(1)  # drawn from the run's seeded generator
    for bad in (2, 4.5, True):  # below sampler.steps, not an integer
        with pytest.raises(InvalidInputError, match=rf"chain_steps_max must be an integer in \[3, 16777216\], got {bad!r}"):
            TrainerConfig(objective=ContrastiveConfig(sampler=SamplerConfig(step_size=0.1, steps=3),
                                                      chain_steps_max=bad))


# ----------------------------------------------------------------------------- trainer
def small_config(**overrides) -> TrainerConfig:
    base = dict(
        steps=6, batch_size=8, sampler=SamplerConfig(step_size=10.0, noise=0.005, steps=3), buffer_size=32,
        ent_bank=8, ent_min_buffer=8, log_every=2, checkpoint_every=3, ema_decay=0.5,
    )
    base.update(overrides)
    return contrastive_trainer(**base)


class Data:
    def __init__(self, n: int = 48) -> None:
        g = torch.Generator().manual_seed(1)
        self.images = torch.rand(n, 3, 8, 8, generator=g)
        self.labels = {"color": torch.randint(0, 3, (n,), generator=g)}


def test_training_logs_health_and_both_gradient_norms(tmp_path):
    model = ResNetEnergy(tiny_config(attributes={"color": ("red", "green", "blue")}))
    trainer = Trainer(model, Data(), small_config(), out_dir=tmp_path)
    init = [p.detach().clone() for p in trainer.ema.parameters()]
    summary = trainer.fit()
    assert summary.steps == 6 and summary.rollbacks == 0
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6]
    for r in records:
        for key in ("e_pos", "e_neg", "e_diff", "grad_norm_cd", "grad_norm_kl", "langevin_grad_norm", "images_per_second"):
            assert key in r and r[key] == r[key]  # present and not NaN
        assert r["grad_norm_kl"] > 0 and r["grad_norm_cd"] > 0  # the KL gradient is real on logging steps
    # the EMA moved away from the initial weights, towards the trained ones (decay 0.5: most of the way)
    def dist(a, b):
        return sum(float((x - y).detach().norm()) for x, y in zip(a, b, strict=True))

    trained, ema = list(model.parameters()), list(trainer.ema.parameters())
    assert dist(ema, init) > 0 and dist(ema, trained) < 0.5 * dist(init, trained)


def test_ablation_switches_remove_the_kl_terms(tmp_path):
    model = ResNetEnergy(tiny_config(attributes={"color": ("red", "green", "blue")}))
    cfg = small_config(kl_opt=False, kl_ent=False, chain_augment=None)
    trainer = Trainer(model, Data(), cfg, out_dir=tmp_path)
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert records and all("loss_cd" in r and "grad_norm_cd" in r for r in records)
    assert not any({"loss_opt", "loss_ent", "grad_norm_kl"} & set(r) for r in records)  # off: absent, never a 0


def test_checkpoints_load_with_weights_only_and_hold_the_full_state(tmp_path):
    model = ResNetEnergy(tiny_config(attributes={"color": ("red", "green", "blue")}))
    Trainer(model, Data(), small_config(), out_dir=tmp_path).fit()
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["step"] == 6
    assert {"model", "ema", "optimizer", "objective", "rng"} <= set(state)
    assert state["objective"]["buffer"]["samples"].shape == (32, 3, 8, 8)
    assert {"generator", "torch", "numpy", "python"} <= set(state["rng"])


def test_failed_save_leaves_the_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_atomic({"step": 1, "w": torch.ones(3)}, path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        save_atomic({"step": 2, "bad": Unpicklable()}, path)
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temp file left behind


@pytest.mark.subprocess
def test_sigkilled_run_resumes_to_bit_identical_weights(tmp_path):
    """Kill -9 at step 10 (last checkpoint: step 8), resume, and end where an uninterrupted run ends."""
    run = [sys.executable, str(WORKER)]
    subprocess.run([*run, str(tmp_path / "straight"), "12"], check=True, cwd=ROOT)
    killed = subprocess.run([*run, str(tmp_path / "killed"), "12", "--kill-at", "10"], cwd=ROOT)
    assert killed.returncode == -9
    assert load_checkpoint(tmp_path / "killed" / "checkpoint.pt")["step"] == 8
    subprocess.run([*run, str(tmp_path / "killed"), "12", "--resume"], check=True, cwd=ROOT)
    a = load_file(tmp_path / "straight" / "final-rank0.safetensors")
    b = load_file(tmp_path / "killed" / "final-rank0.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    log = [json.loads(line) for line in (tmp_path / "killed" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [3, 6, 9, 12]  # records after the checkpoint were redone once


def _flaky_trainer(tmp_path, on_fault: str) -> Trainer:
    # each iteration evaluates the energy 6 times (2 chain steps, the last step, E(x+), E(x-), frozen E(x^)),
    # so call 40 falls in iteration 7
    torch.manual_seed(0)
    model = FlakyEnergy.poisoned_at(40, MLPConfig(hidden=16, depth=2))
    cfg = TrainerConfig(steps=12, batch_size=8, log_every=1, checkpoint_every=4, on_fault=on_fault,
                        objective=ContrastiveConfig(sampler=SamplerConfig(step_size=0.05, noise=0.01, steps=3),
                                                    chain_augment=None, buffer_size=64, ent_bank=8, ent_min_buffer=8))
    return Trainer(model, torch.randn(64, 2), cfg, out_dir=tmp_path)


def test_injected_nan_is_reported_and_rolled_back(tmp_path):
    trainer = _flaky_trainer(tmp_path, "rollback")
    summary = trainer.fit()
    assert summary.steps == 12 and summary.rollbacks == 1
    fault = summary.faults[0]
    assert fault["action"] == "rollback" and "non-finite" in fault["reason"] and fault["step"] == 7
    events = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    rolled = next(e for e in events if e.get("event") == "rolled_back")
    assert rolled["to_step"] == 4
    assert [e.get("event") for e in events].count("fault") == 1  # logged once, after the cut back to step 4
    steps = [e["step"] for e in events if "e_diff" in e]
    assert steps == sorted(set(steps)), f"the rollback left logged steps that were redone: {steps}"
    assert all(torch.isfinite(p).all() for p in trainer.energy.parameters())


def test_injected_nan_stops_training_when_asked(tmp_path):
    trainer = _flaky_trainer(tmp_path, "stop")
    with pytest.raises(TrainingDiverged, match="step 7: non-finite"):
        trainer.fit()
    events = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [e for e in events if "event" in e] == [{"event": "fault", "step": 7, "reason": trainer.faults[0]["reason"],
                                                    "action": "stop"}]


def test_data_without_the_conditioned_labels_is_rejected():
    model = ResNetEnergy(tiny_config(attributes={"color": ("red", "green")}))
    with pytest.raises(ValueError, match=r"no labels for \['color'\]"):
        Trainer(model, torch.rand(8, 3, 8, 8), small_config())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.subprocess
def test_ddp_two_gloo_processes_keep_identical_weights(tmp_path):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
        "--master_addr=127.0.0.1", str(WORKER), str(tmp_path), "6",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=300)
    r0 = load_file(tmp_path / "final-rank0.safetensors")
    r1 = load_file(tmp_path / "final-rank1.safetensors")
    model_keys = [k for k in r0 if k.startswith("model.")]
    assert all(torch.equal(r0[k], r1[k]) for k in model_keys)
    # the ranks trained on different samples, so agreement comes from gradient averaging, not luck
    init = ResNetEnergy(tiny_config(attributes={"color": ("red", "green", "blue")})).state_dict()
    assert any(not torch.equal(r0[f"model.{k}"], v) for k, v in init.items() if v.is_floating_point())
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 6


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_data_start_prob_starts_that_share_of_chains_from_training_images(p):
    model = ResNetEnergy(tiny_config(attributes={"color": ("red", "green", "blue")}))
    data = Data()
    trainer = Trainer(model, data, small_config(data_start_prob=p, reinit_prob=1.0, batch_size=400, chain_augment=None))
    _, labels = trainer.positives(400)
    starts, run_under = trainer.objective._chain_starts(400, labels)
    flat = as_float_images(trainer.images).flatten(1)  # the images as the trainer keeps them
    from_data = (torch.cdist(starts.flatten(1), flat, compute_mode="donot_use_mm_for_euclid_dist").min(dim=1).values < 1e-5).float().mean().item()
    assert abs(from_data - p) < 0.08
    assert torch.equal(run_under["color"], labels["color"])  # they run under the positives' condition


def test_chain_augmentation_moves_the_starts_from_the_buffer_and_leaves_fresh_noise_alone():
    from composable_ebm.sampling import AugmentConfig

    model = ResNetEnergy(tiny_config(attributes={"color": ("red", "green", "blue")}))
    zoom = AugmentConfig(color_prob=0.0, grayscale_prob=0.0, flip_prob=0.0, crop_scale=(0.02, 0.02), crop_ratio=(1.0, 1.0))
    trainer = Trainer(model, Data(), small_config(reinit_prob=0.5, batch_size=400, buffer_size=400, chain_augment=zoom))
    stripes = torch.zeros(400, 3, 8, 8)
    stripes[..., ::2] = 1.0  # one-pixel stripes: a crop of 1.1 pixels square zooms them into a smooth ramp
    trainer.buffer.add(stripes, {"color": torch.zeros(400, dtype=torch.long)}, trainer.generator)
    _, labels = trainer.positives(400)
    starts, _ = trainer.objective._chain_starts(400, labels)
    step = (starts[..., 1:] - starts[..., :-1]).abs().flatten(1).mean(1)  # per start: mean horizontal difference
    fresh = step > 0.2  # uniform noise: 1/3; a zoomed stripe changes far less per pixel
    assert abs(fresh.float().mean().item() - 0.5) < 0.08
    assert (step[fresh] - 1 / 3).abs().max() < 0.08  # noise as drawn (zoomed as far: under 0.1)
    assert (step[~fresh] < 0.15).all()  # every buffer start took the zoom (unzoomed stripes: 1.0)


def test_a_training_chain_takes_one_augmentation_setting():
    from composable_ebm.errors import InvalidInputError
    from composable_ebm.sampling import AugmentConfig

    with pytest.raises(InvalidInputError, match="one augmentation: chain_augment"):
        TrainerConfig(objective=ContrastiveConfig(sampler=SamplerConfig(step_size=1.0, steps=2, augment=AugmentConfig())))
    assert TrainerConfig(objective=ContrastiveConfig(sampler=SamplerConfig(step_size=1.0, steps=2),
                                                     chain_augment=AugmentConfig())).objective.chain_augment


def test_train_recipe_is_cebm_train_as_a_library_call(tmp_path):
    from composable_ebm import load_run, train_recipe

    recipe = tmp_path / "toy.toml"
    recipe.write_text('[model]\ntype = "mlp"\nhidden = 8\ndepth = 2\nvalue_range = [-4.0, 4.0]\n[data]\ndataset = "toy2d"\ndensity = "8gaussians"\n'
                      'n = 64\n[trainer]\nsteps = 4\nbatch_size = 8\nlog_every = 2\ncheckpoint_every = 2\n'
                      'chain_augment = false\n[trainer.sampler]\nstep_size = 0.01\nsteps = 3\n')
    lines = []
    first = train_recipe(recipe, tmp_path / "run", steps=2, echo=lines.append)
    assert first.steps == 2 and first.resumed_from is None and (tmp_path / "run" / "model" / "config.json").is_file()
    again = train_recipe(recipe, tmp_path / "run", echo=lines.append)  # resumes to the recipe's 4 steps
    assert again.resumed_from == 2 and again.steps == 4 and "resumed from step 2" in lines
    loaded = load_run(tmp_path / "run")
    x = torch.randn(5, 2)
    torch.testing.assert_close(loaded(x), again.model.to("cpu")(x))
    from composable_ebm.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="holds another run"):
        train_recipe(recipe, tmp_path / "run", resume=False)


def test_init_starts_a_run_from_a_trained_models_weights(tmp_path):
    from composable_ebm import train_recipe
    from composable_ebm.errors import InvalidInputError
    from composable_ebm.models import load_model

    text = ('[model]\ntype = "mlp"\nhidden = 8\ndepth = 2\nvalue_range = [-4.0, 4.0]\n[data]\ndataset = "toy2d"\n'
            'density = "8gaussians"\nn = 64\n[trainer]\nsteps = 2\nbatch_size = 8\nlog_every = 1\n'
            'checkpoint_every = 1\nchain_augment = false\nlr = 1e-12\n[trainer.sampler]\nstep_size = 0.01\nsteps = 3\n')
    recipe = tmp_path / "toy.toml"
    recipe.write_text(text.replace("lr = 1e-12", "lr = 0.05").replace("[trainer]\n", "[trainer]\nseed = 3\n"))
    source = train_recipe(recipe, tmp_path / "source").model.to("cpu")
    frozen = tmp_path / "frozen.toml"
    frozen.write_text(text)  # lr 1e-12: the weights stay where they start
    x = torch.randn(5, 2)
    fresh = train_recipe(frozen, tmp_path / "fresh").model.to("cpu")
    assert not torch.allclose(fresh(x), source(x))  # the recipe's own initialisation is another network
    lines = []
    tuned = train_recipe(frozen, tmp_path / "tuned", init=tmp_path / "source" / "model", echo=lines.append)
    torch.testing.assert_close(tuned.model.to("cpu")(x), source(x))
    assert any("started from the weights of" in line for line in lines)
    assert "started from the weights of" in (tmp_path / "tuned" / "model" / "README.md").read_text()
    again = train_recipe(frozen, tmp_path / "tuned", steps=3)  # resumes the fine-tune without init
    assert again.resumed_from == 2
    torch.testing.assert_close(load_model(tmp_path / "tuned" / "model")(x), source(x))
    wide = tmp_path / "wide.toml"
    wide.write_text(text.replace("hidden = 8", "hidden = 16"))
    with pytest.raises(InvalidInputError, match="its network is not the recipe's"):
        train_recipe(wide, tmp_path / "wide", init=tmp_path / "source" / "model")
    ranged = tmp_path / "ranged.toml"  # the same weights' shapes, another network
    ranged.write_text(text.replace("value_range = [-4.0, 4.0]", "value_range = [-5.0, 5.0]"))
    with pytest.raises(InvalidInputError, match="value_range"):
        train_recipe(ranged, tmp_path / "ranged", init=tmp_path / "source" / "model")
    lines = []  # allowed, a setting that keeps the weights' shapes may differ; the log line and the card say which
    allowed = train_recipe(ranged, tmp_path / "ranged", init=tmp_path / "source" / "model", allow_config_change=True,
                           echo=lines.append)
    assert allowed.model.config.value_range == (-5.0, 5.0)
    pairs = list(zip(allowed.model.parameters(), source.parameters(), strict=True))
    assert pairs and all(torch.equal(a.detach().cpu(), b.detach()) for a, b in pairs)  # the source's weights
    assert any("settings changed: value_range" in line for line in lines)
    assert "value_range" in (tmp_path / "ranged" / "model" / "README.md").read_text()
    with pytest.raises(InvalidInputError, match="its network is not the recipe's"):  # never other weights' shapes
        train_recipe(wide, tmp_path / "wide", init=tmp_path / "source" / "model", allow_config_change=True)


@pytest.mark.parametrize("damage, named", [
    (lambda s: s["rng"]["numpy"].update(key=3), "rng.numpy.key is a int"),
    (lambda s: s.update(step="7"), "step is a str"),
    (lambda s: s["rng"].pop("python"), "rng.python is missing"),
])
def test_a_checkpoint_of_the_wrong_structure_is_named_before_anything_is_restored(tmp_path, damage, named):
    from composable_ebm.errors import ModelFileError

    def trainer() -> Trainer:
        config = TrainerConfig(steps=2, batch_size=4,
                               objective=ContrastiveConfig(chain_augment=None, kl_ent=False,
                                                           sampler=SamplerConfig(step_size=0.1, noise=0.01, steps=2)))
        return Trainer(MLPEnergy(MLPConfig(hidden=8, depth=1)), torch.randn(32, 2), config, out_dir=tmp_path)

    trainer().fit()
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    damage(state)
    save_atomic(state, tmp_path / "checkpoint.pt")
    fresh = trainer()
    before = [p.detach().clone() for p in fresh.energy.parameters()]
    with pytest.raises(ModelFileError, match=named):
        fresh.resume()
    # nothing half-restored
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.energy.parameters(), strict=True))


def test_torchrun_with_more_processes_than_gpus_is_one_line_before_any_process_group(monkeypatch):
    import torch.distributed as dist

    from composable_ebm.errors import InvalidInputError
    from composable_ebm.training import init_distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: pytest.fail("a process group was started"))
    with pytest.raises(InvalidInputError, match=r"process 1 of this node has no GPU of its own \(1 CUDA device"):
        init_distributed("cuda")


def test_a_checkpoint_of_a_gpu_run_resumes_on_the_cpu_and_says_it_is_not_bit_for_bit(tmp_path):
    """A CUDA generator's state (16 bytes) cannot drive a CPU generator: the run goes on from a seed drawn from it."""
    from types import SimpleNamespace

    def trainer():
        model = ResNetEnergy(tiny_config(attributes={"color": ("red", "green", "blue")}))
        data = torch.rand(32, 3, 8, 8, generator=torch.Generator().manual_seed(1))
        return Trainer(model, SimpleNamespace(images=data, labels={"color": torch.arange(32) % 3}),
                       TrainerConfig(steps=2, batch_size=4, checkpoint_every=2, log_every=1,
                                     objective=ContrastiveConfig(sampler=SamplerConfig(step_size=10.0, steps=2),
                                                                 buffer_size=16, ent_bank=4, ent_min_buffer=4)),
                       out_dir=tmp_path)

    first = trainer()
    first.fit()
    first.close()
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    state["rng"]["generator"] = torch.arange(16, dtype=torch.uint8)  # as a CUDA generator saves it
    state["rng"]["generator_device"] = "cuda:0"
    save_atomic(state, tmp_path / "checkpoint.pt")
    again = trainer()
    assert again.resume() and again.step == 2 and not again.resumed_exactly
    draws = torch.rand(3, generator=again.generator)
    again.close()
    other = trainer()  # the same saved state seeds the same stream
    other.resume()
    assert torch.equal(torch.rand(3, generator=other.generator), draws)
    other.fit(4)
    other.close()
    events = [r for r in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines()) if r.get("event")]
    assert {"event": "device_changed", "step": 2, "from": "cuda:0", "to": "cpu"} in events


def test_a_checkpoint_that_saved_a_removed_setting_at_its_behaving_value_resumes(tmp_path):
    """negative_labels left TrainerConfig; a checkpoint that saved "positives" (what the trainer does now) resumes,
    one that saved "buffer" is refused as another setting."""
    import json

    from composable_ebm import MLPConfig, MLPEnergy, SamplerConfig, Trainer, TrainerConfig
    from composable_ebm.errors import InvalidInputError

    config = TrainerConfig(steps=2, batch_size=8, log_every=1, checkpoint_every=1, dequantize=False,
                           objective=ContrastiveConfig(buffer_size=16, chain_augment=None,
                                                       sampler=SamplerConfig(step_size=0.1, noise=0.01, steps=2)))
    data = torch.randn(64, 2)
    first = Trainer(MLPEnergy(MLPConfig(hidden=8, depth=1)), data, config, out_dir=tmp_path)
    first.fit()
    first.close()
    path = tmp_path / "checkpoint.pt"
    for value, resumes in (("positives", True), ("buffer", False)):
        state = torch.load(path, weights_only=True)
        state["trainer_config"] = json.dumps({**json.loads(state["trainer_config"]), "negative_labels": value})
        torch.save(state, tmp_path / f"{value}.pt")
        again = Trainer(MLPEnergy(MLPConfig(hidden=8, depth=1)), data, config)
        if resumes:
            assert again.resume(tmp_path / f"{value}.pt") and again.step == 2
        else:
            with pytest.raises(InvalidInputError, match="negative_labels"):
                again.resume(tmp_path / f"{value}.pt")


def test_cebm_train_set_changes_single_settings_lists_them_in_the_card_and_a_resume_needs_the_same(tmp_path):
    from typer.testing import CliRunner

    from composable_ebm.cli import app
    from composable_ebm.recipes import parse_setting
    from composable_ebm.training import load_checkpoint

    from tests.test_diffusion import tiny_diffusion_recipe

    recipe = tiny_diffusion_recipe(tmp_path / "tiny.toml")
    run = tmp_path / "run"
    runner = CliRunner()
    sets = ["--set", "trainer.batch_size=4", "--set", "trainer.lr=2e-3", "--set", "trainer.precision=bfloat16"]
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--steps", "2", "--no-progress", *sets])
    assert result.exit_code == 0, result.output
    saved = json.loads(load_checkpoint(run / "checkpoint.pt")["trainer_config"])
    assert (saved["batch_size"], saved["lr"], saved["precision"]) == (4, 2e-3, "bfloat16")
    card = (run / "model" / "README.md").read_text()
    assert "`--set trainer.batch_size=4` `--set trainer.lr=2e-3`" in card
    # the same settings resume; without them the checkpoint's settings differ from the recipe's: refused
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--steps", "3", "--no-progress", *sets])
    assert result.exit_code == 0 and "resumed from step 2" in result.output, result.output
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--steps", "4", "--no-progress"])
    assert result.exit_code != 0 and "batch_size" in result.output, result.output
    assert load_checkpoint(run / "checkpoint.pt")["step"] == 3  # nothing lost
    # a dotted key reaches a sub-table; a bad setting is one line naming the valid tables or keys
    assert parse_setting("trainer.sampler.steps=40") == {"trainer": {"sampler": {"steps": 40}}}
    assert parse_setting("data.holdout=[]") == {"data": {"holdout": []}}
    for bad, expected in ((["--set", "batch_size=4"], "TABLE one of ['model', 'data', 'trainer', 'sampling']"),
                          (["--set", "trainer.batch_size"], "write TABLE.KEY=VALUE"),
                          (["--set", "trainer.batchsize=4"], "batch_size")):
        result = runner.invoke(app, ["train", str(recipe), "--out", str(tmp_path / "new"), "--no-progress", *bad])
        assert result.exit_code != 0 and expected in result.output, (bad, result.output)
        assert "Traceback" not in result.output



def test_the_cosine_schedule_warms_up_then_falls_from_lr_to_lr_min_by_the_last_step():
    import math

    from composable_ebm.training import learning_rate

    config = TrainerConfig(lr=1e-3, lr_schedule="cosine", lr_min=1e-4, warmup_steps=4)
    rates = [learning_rate(config, step, 101) for step in range(101)]
    cosine = [1e-4 + 0.45e-3 * (1 + math.cos(math.pi * step / 100)) for step in range(101)]
    assert rates[:4] == pytest.approx([c * (s + 1) / 4 for s, c in enumerate(cosine[:4])])  # the linear warm-up
    assert rates[4:] == pytest.approx(cosine[4:])
    assert rates[0] == pytest.approx(2.5e-4) and rates[50] == pytest.approx(5.5e-4) and rates[100] == pytest.approx(1e-4)
    assert learning_rate(config, 500, 101) == pytest.approx(1e-4)  # past the last step it stays at lr_min
    assert learning_rate(TrainerConfig(lr=3e-4), 77, 101) == 3e-4  # constant: lr throughout


@pytest.mark.parametrize("setting, needle", [({"lr_schedule": "linear"}, "valid choices: ['constant', 'cosine']"),
                                             ({"lr": 1e-3, "lr_min": 2e-3}, "lr_min"),
                                             ({"warmup_steps": -1}, "warmup_steps")])
def test_a_bad_learning_rate_schedule_is_refused_in_one_line(setting, needle):
    with pytest.raises(InvalidInputError) as caught:
        TrainerConfig(**setting)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_adam_steps_at_the_scheduled_rate_it_logs_and_a_stopped_run_resumes_on_the_same_curve(tmp_path):
    """Each iteration's Adam step uses `learning_rate` of its step over the run's total and logs it; a run stopped
    after 2 of 5 steps (as --max-minutes stops) and resumed ends at the weights of the run that went straight."""
    from types import SimpleNamespace

    from composable_ebm.training import learning_rate, read_log
    from tests.test_diffusion import tiny_unet

    images = torch.rand(32, 3, 8, 8)
    labels = {"color": torch.randint(0, 2, (32,))}
    config = TrainerConfig(steps=5, batch_size=4, lr=1e-3, lr_schedule="cosine", lr_min=1e-5, warmup_steps=2,
                           betas=(0.9, 0.999), log_every=1, checkpoint_every=1, ema_decay=0.9)

    def trainer(out):
        torch.manual_seed(0)
        return Trainer(tiny_unet(), SimpleNamespace(images=images, labels=labels), config, out_dir=out)

    straight = trainer(tmp_path / "straight")
    seen = []
    straight.fit(callback=lambda step, record: seen.append((record.lr, straight.optimizer.param_groups[0]["lr"])))
    expected = [learning_rate(config, step, 5) for step in range(5)]
    assert [a for a, _ in seen] == pytest.approx(expected) and [b for _, b in seen] == pytest.approx(expected)
    assert len(set(expected)) == 5  # warm-up and cosine: every step at its own rate
    logged = [r["lr"] for r in read_log(tmp_path / "straight" / "log.jsonl") if "lr" in r]
    assert logged == pytest.approx(expected)
    straight.close()

    first = trainer(tmp_path / "resumed")
    assert first.fit(should_stop=lambda: first.step >= 2).stopped
    first.close()
    again = trainer(tmp_path / "resumed")
    assert again.resume(tmp_path / "resumed" / "checkpoint.pt") and again.step == 2
    again.fit()
    for (name, p), q in zip(straight.energy.state_dict().items(), again.energy.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    again.close()


@pytest.mark.parametrize("family", ["contrastive", "denoising"])
def test_the_estimate_before_a_run_times_real_steps_and_leaves_the_run_as_it_would_have_been(family):
    """`cebm train`'s estimate runs training iterations and puts every state back: the run that follows trains to
    the weights it trains to without one (same process, same kernels)."""
    from composable_ebm.runs import ESTIMATE_STEPS, estimate
    from tests.test_diffusion import tiny_unet

    def trainer() -> Trainer:
        if family == "contrastive":
            torch.manual_seed(0)
            return Trainer(ResNetEnergy(tiny_config(attributes={"color": ("red", "green", "blue")})), Data(),
                           small_config())
        data = Data()
        data.labels = {"color": data.labels["color"] % 2}
        torch.manual_seed(0)
        return Trainer(tiny_unet(), data, TrainerConfig(steps=6, batch_size=8))

    plain, probed = trainer(), trainer()
    guess = estimate(probed)
    assert not isinstance(guess, str), guess
    assert probed.step == 0 and guess.seconds_per_step > 0 and guess.checkpoint_bytes > 0
    assert guess.peak_bytes is None or guess.peak_bytes > 10 * 2**20  # a process holding torch: tens of MB at least
    assert ESTIMATE_STEPS == 3
    plain.fit(), probed.fit()
    for a, b in zip(plain.ema.parameters(), probed.ema.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
    for a, b in zip(plain.energy.parameters(), probed.energy.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)


def test_an_estimate_step_that_faults_is_reported_and_the_state_is_put_back(tmp_path):
    """A NaN in one of the estimate's steps (call 8: its second iteration) is its answer, not the run's end: the state
    is as before it, and training then meets its own faults as always."""
    from composable_ebm.runs import estimate

    torch.manual_seed(0)
    model = FlakyEnergy.poisoned_at(8, MLPConfig(hidden=16, depth=2))
    cfg = TrainerConfig(steps=4, batch_size=8, objective=ContrastiveConfig(
        sampler=SamplerConfig(step_size=0.05, noise=0.01, steps=3), chain_augment=None, buffer_size=64, ent_bank=8,
        ent_min_buffer=8))
    trainer = Trainer(model, torch.randn(64, 2), cfg)
    before = [p.detach().clone() for p in trainer.energy.parameters()]
    answer = estimate(trainer)
    assert isinstance(answer, str) and "non-finite" in answer
    assert trainer.step == 0 and all(torch.equal(a, b) for a, b in zip(before, trainer.energy.parameters(), strict=True))
    assert trainer.fit().steps == 4
