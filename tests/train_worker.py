"""A tiny training run in its own process, for the SIGKILL-resume and DDP tests.

    python tests/train_worker.py OUT_DIR STEPS [--kill-at N] [--resume]

Writes OUT_DIR/final-rank{R}.safetensors with the trained weights when it finishes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from composable_ebm import ResNetEnergy  # noqa: E402
from composable_ebm.sampling import AugmentConfig, SamplerConfig  # noqa: E402
from composable_ebm.training import ContrastiveConfig, Trainer, TrainerConfig, init_distributed  # noqa: E402
from tests.conftest import tiny_config  # noqa: E402


class Data:
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(123)
        self.images = torch.rand(64, 3, 8, 8, generator=g)
        self.labels = {"color": torch.randint(0, 3, (64,), generator=g)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("steps", type=int)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    init_distributed("cpu")  # gloo: the tiny model trains on the CPU, also where a GPU exists
    torch.manual_seed(0)
    model = ResNetEnergy(tiny_config(attributes={"color": ("red", "green", "blue")}))
    config = TrainerConfig(steps=args.steps, batch_size=8, ema_decay=0.9, log_every=3, checkpoint_every=4,
                           objective=ContrastiveConfig(sampler=SamplerConfig(step_size=10.0, noise=0.005, steps=4),
                                                       chain_augment=AugmentConfig(crop_scale=(0.2, 1.0), blur_prob=0.5),
                                                       buffer_size=32, reinit_prob=0.05, ent_bank=8, ent_min_buffer=8))
    trainer = Trainer(model, Data(), config, out_dir=args.out_dir)
    if args.resume:
        assert trainer.resume(), "nothing to resume from"
    if args.kill_at is not None:
        step = trainer.train_step

        def step_or_die():
            if trainer.step == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return step()

        trainer.train_step = step_or_die
    trainer.fit()
    weights = {f"model.{k}": v.contiguous() for k, v in trainer.energy.state_dict().items()}
    weights.update({f"ema.{k}": v.contiguous() for k, v in trainer.ema.state_dict().items()})
    save_file(weights, os.path.join(args.out_dir, f"final-rank{trainer.rank}.safetensors"))


if __name__ == "__main__":
    main()
