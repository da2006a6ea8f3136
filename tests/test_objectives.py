"""Each training objective's first iterations against its loss written out by hand from the same random draws.

The energies are Gaussians with learnable parameters, ``E(x) = a |x - m|^2 / 2`` and, noise-conditioned,
``E(x, sigma) = |x - m|^2 / (2 (s^2 + sigma^2))``, so every term of a loss is a formula here. The draws are replayed
from a copy of the trainer's generator in the order the loop makes them (positives, chain starts, the last step's
noise; or positives, levels, noise).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from composable_ebm.energy import Energy, NoiseConditioned
from composable_ebm.sampling import SamplerConfig
from composable_ebm.training import ContrastiveConfig, DenoisingConfig, Trainer, TrainerConfig

DIM, N, BATCH = 3, 64, 8
TOL = 1e-5
"""float32 throughout (the trainer's data are float32): the formulas here sum in another order than the network's
reductions, which moves the result by a few float32 ulps, far below what another draw or a wrong term would."""


class Bowl(Energy):
    """``a |x - m|^2 / 2``."""

    def __init__(self) -> None:
        super().__init__((DIM,), None)
        self.a = nn.Parameter(torch.tensor(1.5))
        self.m = nn.Parameter(torch.tensor([0.2, -0.1, 0.3]))

    def energy(self, x, labels):
        return 0.5 * self.a * (x - self.m).pow(2).sum(dim=1)


class NoisedBowl(NoiseConditioned):
    """The energy of ``N(m, s^2 I)`` data noised to level ``sigma``: ``|x - m|^2 / (2 (s^2 + sigma^2))``."""

    def __init__(self) -> None:
        super().__init__((DIM,), None)
        self.s = nn.Parameter(torch.tensor(0.7))
        self.m = nn.Parameter(torch.tensor([0.2, -0.1, 0.3]))

    @property
    def noise_range(self):
        return 0.1, 2.0

    def energy(self, x, labels, sigma=None):
        sigma = torch.full((x.shape[0],), 0.1, dtype=x.dtype) if sigma is None else sigma
        return 0.5 * (x - self.m).pow(2).sum(dim=1) / (self.s**2 + sigma**2)


def _data() -> torch.Tensor:
    return torch.randn(N, DIM, generator=torch.Generator().manual_seed(3))


def _replay(trainer: Trainer) -> torch.Generator:
    copy = torch.Generator()
    copy.set_state(trainer.generator.get_state())
    return copy


@pytest.mark.parametrize("cd_l2", [0.0, 0.5])
def test_contrastive_divergence_steps_compute_the_loss_written_out(cd_l2):
    """One Langevin step from noise (K = 1, no KL term): ``L = mean E(x+) - mean E(x-) + alpha mean(E+^2 + E-^2)``
    with ``x- = x0 - eta dE/dx(x0) + sigma z``, for three iterations; the gradient norm the record holds is that
    loss's, and Adam moved the parameters."""
    model = Bowl()
    eta, noise = 0.1, 0.05
    config = TrainerConfig(steps=3, batch_size=BATCH, grad_clip=None, dequantize=False, ema_decay=0.5,
                           objective=ContrastiveConfig(sampler=SamplerConfig(step_size=eta, noise=noise, steps=1),
                                                       kl_opt=False, kl_ent=False, chain_augment=None, cd_l2=cd_l2,
                                                       reinit_prob=1.0, buffer_policy="fifo", buffer_size=64))
    images = _data()
    trainer = Trainer(model, images, config)
    for step in range(3):
        gen = _replay(trainer)
        idx = torch.randint(N, (BATCH,), generator=gen)
        x0 = torch.randn(BATCH, DIM, generator=gen)  # the chains' start: fresh noise (every start, reinit_prob 1)
        if step:  # the buffer's draws: which samples, and which starts are fresh (all of them)
            torch.randint(step * BATCH, (BATCH,), generator=gen)
            torch.rand(BATCH, generator=gen)
        z = torch.randn(BATCH, DIM, generator=gen)
        a, m = model.a.detach().clone().requires_grad_(), model.m.detach().clone().requires_grad_()
        x_neg = (x0 - eta * a.detach() * (x0 - m.detach()) + noise * z).detach()
        e_pos = 0.5 * a * (images[idx] - m).pow(2).sum(dim=1)
        e_neg = 0.5 * a * (x_neg - m).pow(2).sum(dim=1)
        loss = e_pos.mean() - e_neg.mean() + cd_l2 * (e_pos.pow(2).mean() + e_neg.pow(2).mean())
        grad_norm = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, (a, m))]))
        before = (model.a.detach().clone(), model.m.detach().clone())
        record = trainer.train_step()
        assert record.loss_cd == pytest.approx(float(loss.detach()), rel=TOL, abs=TOL)
        assert record.loss == record.loss_cd and record.loss_opt is None and record.loss_ent is None
        assert record.grad_norm == pytest.approx(float(grad_norm), rel=TOL)
        assert not torch.equal(model.a.detach(), before[0]) and not torch.equal(model.m.detach(), before[1])
    assert len(trainer.buffer) == 3 * BATCH  # the negatives kept (fifo: without a draw)


def test_denoising_score_matching_steps_compute_the_loss_written_out():
    """``L = mean ((sigma dE/dx(x + sigma z, sigma) - z)^2)`` with ``sigma`` log-uniform on the trained levels and
    ``dE/dx = (x - m) / (s^2 + sigma^2)``, for three iterations; the objective keeps nothing between them."""
    model = NoisedBowl()
    config = TrainerConfig(steps=3, batch_size=BATCH, grad_clip=None, dequantize=False, ema_decay=0.5,
                           objective=DenoisingConfig())
    images = _data()
    trainer = Trainer(model, images, config)
    low, high = model.noise_range
    for _ in range(3):
        gen = _replay(trainer)
        idx = torch.randint(N, (BATCH,), generator=gen)
        x = images[idx]
        u = torch.rand(BATCH, generator=gen)
        sigma = torch.exp(math.log(low) + u * (math.log(high) - math.log(low)))
        z = torch.randn(BATCH, DIM, generator=gen)
        s, m = model.s.detach().clone().requires_grad_(), model.m.detach().clone().requires_grad_()
        noised = x + sigma.view(-1, 1) * z
        grad_x = (noised - m) / (s**2 + sigma.view(-1, 1) ** 2)
        loss = (sigma.view(-1, 1) * grad_x - z).pow(2).mean()
        grad_norm = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, (s, m))]))
        record = trainer.train_step()
        assert record.loss_dsm == pytest.approx(float(loss.detach()), rel=TOL) and record.loss == record.loss_dsm
        assert record.grad_norm == pytest.approx(float(grad_norm), rel=TOL)
        assert record.e_pos is None and record.e_diff is None
    assert trainer.objective.state_dict() == {}
    with pytest.raises(AttributeError, match="a denoising run keeps no replay buffer"):
        trainer.buffer  # noqa: B018 - the property refuses
