"""Shared pieces of the Shapes benchmarks: the attribute classifier and trained runs."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from composable_ebm import AttributeClassifier, ClassifierConfig, shapes, train_classifier
from composable_ebm.evaluation import attribute_accuracy
from composable_ebm.models import load_model, save_model
from composable_ebm.runs import load_run as load_run_folder
from composable_ebm.runs import train_recipe

ROOT = Path(__file__).resolve().parents[1]
ATTRIBUTES = ("shape", "color", "size", "position")
HOLDOUT = [{"color": "red", "shape": "circle"}]


def border_colour(x: torch.Tensor) -> torch.Tensor:
    """Each image's mean colour over its border pixels, ``(B, C)`` from ``(B, C, H, W)``."""
    return torch.cat([x[:, :, 0, :], x[:, :, -1, :], x[:, :, :, 0], x[:, :, :, -1]], dim=2).mean(2)


def border_tint(x: torch.Tensor) -> float:
    """The background's tint of a batch ``(B, C, H, W)``: the largest difference between a channel's mean over the
    border pixels and the data's flat dark-grey background (about 0.005 for renders)."""
    from composable_ebm.data.shapes import _BACKGROUND

    return float((border_colour(x).mean(0) - torch.as_tensor(_BACKGROUND, dtype=x.dtype)).abs().max())


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
    """Train a recipe into ``out`` (`composable_ebm.runs.train_recipe`, what ``cebm train`` runs); returns
    the wall time in seconds."""
    t = time.perf_counter()
    train_recipe(recipe or recipe_path(attribute), out, steps=steps, echo=print)
    return time.perf_counter() - t


def snapshot_path(run: Path, step: int) -> Path:
    """Where ``benchmarks.realism_curve --watch`` keeps the EMA weights of ``run``'s checkpoint at ``step``."""
    return Path(run) / "snapshots" / f"ema-{int(step):06d}.safetensors"


def shapes_models(folder: Path | None = None) -> dict:
    """The four Shapes models by attribute: ``folder/shapes-<attribute>`` where that folder exists (each with its own
    settings), the bundled model otherwise."""
    def source(a: str) -> Path | str:
        own = Path(folder) / f"shapes-{a}" if folder is not None else None
        return own if own is not None and own.is_dir() else f"shapes-{a}"

    return {a: load_model(source(a)) for a in ATTRIBUTES}


def load_spec(spec: str):
    """A model from a screen's argument: a model folder, a bundled name, or ``RUN_FOLDER:RECIPE`` (the EMA
    weights of a run, its latest checkpoint while it trains)."""
    return load_run(*(Path(part) for part in spec.split(":", 1))) if ":" in spec else load_model(spec).eval()


def load_run(run: Path, recipe: Path):
    """The EMA model of a run: ``run/model`` when training finished, else the latest checkpoint's EMA."""
    if not (run / "model" / "config.json").is_file():
        print(f"{run}: reading the checkpoint (training not finished)", flush=True)
    return load_run_folder(run, recipe).eval()
