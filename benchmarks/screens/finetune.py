"""Screen: go on training a shipped model under another recipe (e.g. a balanced training split), from its weights.

Writes a step-0 checkpoint holding the model's weights (as both the trained and the EMA network; a fresh optimiser)
into an empty RUN folder, then trains as ``cebm train RECIPE --out RUN --steps STEPS`` does; run again to resume.
The recipe must build the model's network (a screen recipe whose base is the model's own recipe).

    PYTHONPATH=. python benchmarks/screens/finetune.py RECIPE MODEL RUN STEPS     # MODEL: a bundled name or a folder
"""
import sys
from pathlib import Path

import torch

from composable_ebm.persistence import load_model
from composable_ebm.recipes import build_dataset, build_model, load_recipe
from composable_ebm.runs import train_recipe
from composable_ebm.training import Trainer


def main() -> None:
    recipe, model, run, steps = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    if not (run / Trainer.CHECKPOINT).exists():
        spec = load_recipe(recipe)
        data = build_dataset(spec.data)
        trainer = Trainer(build_model(spec, data), data, spec.trainer, out_dir=run, device="cpu")
        weights = load_model(model).state_dict()
        trainer.energy.load_state_dict(weights)
        trainer.ema.load_state_dict(weights)
        trainer.save_checkpoint()
        trainer.close()
        print(f"{run}: step-0 checkpoint from {model}", flush=True)
    done = train_recipe(recipe, run, steps=steps, device="cpu", echo=lambda line: print(line, flush=True))
    print(f"{run}: {done.steps} steps", flush=True)


if __name__ == "__main__":
    main()
