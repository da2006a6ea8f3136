"""Shared pieces of the Shapes benchmarks: the attribute classifier and trained runs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import torch

from composable_ebm import AttributeClassifier, ClassifierConfig, shapes, train_classifier
from composable_ebm.evaluation import attribute_accuracy
from composable_ebm.hub import load_model, save_model
from composable_ebm.recipes import build_dataset, build_model, load_recipe
from composable_ebm.training import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
ATTRIBUTES = ("shape", "color", "size", "position")
HOLDOUT = [{"color": "red", "shape": "circle"}]


def recipe_path(attribute: str) -> Path:
    return ROOT / "recipes" / f"shapes-{attribute}.toml"


def shapes_classifier(folder: Path, size: int = 16, steps: int = 600) -> tuple[AttributeClassifier, dict[str, float]]:
    """The Shapes attribute classifier in ``folder`` (trained on every combination, and saved, if absent),
    with its accuracy on 2000 fresh clean renders."""
    if (folder / "config.json").is_file():
        classifier = load_model(folder)
    else:
        data = shapes(8000, size, seed=1, split="all")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            classifier = AttributeClassifier(
                ClassifierConfig(name="shapes-classifier", image_size=size, width=16, attributes=data.attributes)
            )
        train_classifier(classifier, data.images, data.labels, steps=steps)
        save_model(classifier, folder)
    test = shapes(2000, size, seed=2, split="all")
    return classifier.eval(), attribute_accuracy(classifier, test.images, test.labels)


def train_run(attribute: str, out: Path, steps: int | None = None, recipe: Path | None = None) -> float:
    """``cebm train`` a recipe into ``out`` in a subprocess; returns the wall time in seconds."""
    cmd = [sys.executable, "-m", "composable_ebm.cli", "train", str(recipe or recipe_path(attribute)), "--out", str(out),
           "--no-progress"]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return time.perf_counter() - t


def load_run(run: Path, recipe: Path):
    """The EMA model of a run: ``run/model`` when training finished, else the latest checkpoint's EMA."""
    if (run / "model" / "config.json").is_file():
        return load_model(run / "model")
    spec = load_recipe(recipe)
    model = build_model(spec, build_dataset(spec.data))
    state = load_checkpoint(run / "checkpoint.pt")
    model.load_state_dict(state["ema"], strict=True)
    print(f"{run}: checkpoint at step {state['step']} (training not finished)", flush=True)
    return model.eval()
