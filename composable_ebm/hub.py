"""Save and load models as ``config.json`` + ``model.safetensors`` (strict, nothing pickled).

``config.json`` holds the model type, its typed config and, for energies, the default
sampler settings, so ``load(...).sample(n)`` uses the settings the model was trained for.
A folder is written file by file through temporary names and renames, so a failed save
leaves the previous files in place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from composable_ebm import __version__
from composable_ebm.atomic import write_atomic
from composable_ebm.configs import config_from_dict, config_to_dict
from composable_ebm.energy import Energy
from composable_ebm.evaluation.classifier import AttributeClassifier, ClassifierConfig
from composable_ebm.nets import MLPConfig, MLPEnergy, ResNetConfig, ResNetEnergy
from composable_ebm.sampling import SamplerConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CARD_NAME = "README.md"

MODEL_TYPES: dict[str, tuple[type, type]] = {
    "resnet_energy": (ResNetConfig, ResNetEnergy),
    "mlp_energy": (MLPConfig, MLPEnergy),
    "attribute_classifier": (ClassifierConfig, AttributeClassifier),
}


def _model_type(model: nn.Module) -> str:
    for name, (_, cls) in MODEL_TYPES.items():
        if type(model) is cls:
            return name
    raise TypeError(f"cannot save a {type(model).__name__}; savable types: {sorted(c.__name__ for _, c in MODEL_TYPES.values())}")


def save_model(model: nn.Module, folder: str | Path, card: str | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write ``config.json``, ``model.safetensors`` (and ``README.md`` if a model card is given)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "model_type": _model_type(model),
        "config": config_to_dict(model.config),
        "composable_ebm_version": __version__,
    }
    if isinstance(model, Energy):
        sampler = model.sampler_config
        payload["sampler"] = config_to_dict(sampler) if sampler is not None else None
    if extra:
        payload["extra"] = extra
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    write_atomic(folder / WEIGHTS_NAME, lambda tmp: save_file(state, tmp, metadata={"format": "pt"}))
    write_atomic(folder / CONFIG_NAME, lambda tmp: Path(tmp).write_text(json.dumps(payload, indent=2) + "\n"))
    if card is not None:
        write_atomic(folder / CARD_NAME, lambda tmp: Path(tmp).write_text(card))
    return folder


def read_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {CONFIG_NAME}")
    return json.loads(path.read_text())


def load_model(source: str | Path, device: torch.device | str = "cpu", revision: str | None = None) -> nn.Module:
    """Load a saved model from a folder, or from the Hugging Face Hub as ``"org/name"``.

    Weights are matched strictly: a missing or unexpected tensor is an error.
    """
    folder = resolve_source(source, revision)
    payload = read_config(folder)
    kind = payload.get("model_type")
    if kind not in MODEL_TYPES:
        raise ValueError(f"{folder}: unknown model_type {kind!r}; known types: {sorted(MODEL_TYPES)}")
    config_cls, model_cls = MODEL_TYPES[kind]
    model = model_cls(config_from_dict(config_cls, payload["config"]))
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"{folder} has no {WEIGHTS_NAME}")
    model.load_state_dict(load_file(weights), strict=True)
    if isinstance(model, Energy) and payload.get("sampler") is not None:
        model.sampler_config = config_from_dict(SamplerConfig, payload["sampler"])
    return model.to(device).eval()


BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


def bundled_models() -> list[str]:
    """Short names of the models shipped inside the package (``load("shapes-color")``)."""
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / CONFIG_NAME).is_file())


def resolve_source(source: str | Path, revision: str | None = None) -> Path:
    """A local folder as is; a bundled model's short name; ``"org/name"`` downloaded (or taken from the cache)
    from the Hub."""
    path = Path(source)
    if path.is_dir():
        return path
    text = str(source)
    if text in bundled_models():
        return BUNDLED_DIR / text
    if text.count("/") == 1 and not text.startswith((".", "/")):
        from huggingface_hub import snapshot_download

        local = snapshot_download(repo_id=text, revision=revision, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, CARD_NAME])
        return Path(local)
    raise FileNotFoundError(
        f"'{text}' is neither a model folder, a bundled model ({', '.join(bundled_models()) or 'none installed'})"
        " nor a Hub repository id ('org/name')"
    )
