"""Shared fixtures: tiny networks that keep the suite fast on a 2-core CPU."""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import sys
import tempfile

# The caller's Hub settings never reach a test: an offline user's HF_HUB_OFFLINE, their token, endpoint or cache
# would make the tests that serve a Hub on 127.0.0.1 (push, download) fail or touch their files. huggingface_hub reads
# these when it is imported, so they go before anything imports it; each test process gets an empty Hub home.
HUB_VARIABLES = ("HF_", "HUGGINGFACE_", "HUGGING_FACE_", "TRANSFORMERS_OFFLINE")
for _name in [n for n in os.environ if n.startswith(HUB_VARIABLES)]:
    del os.environ[_name]
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="cebm-tests-hf-home-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
if "huggingface_hub.constants" in sys.modules:  # imported before this file (a plugin): read the cleared settings
    import importlib

    importlib.reload(sys.modules["huggingface_hub.constants"])

import pytest
import torch

from composable_ebm import BlockSpec, MLPConfig, MLPEnergy, ResNetConfig, ResNetEnergy
from composable_ebm.sampling import SamplerConfig, SamplingDefaults
from composable_ebm.training import ContrastiveConfig, TrainerConfig

TINY_BLOCKS = (
    BlockSpec(channels=8),
    BlockSpec(channels=8, down=True),
    BlockSpec(kind="attention"),
    BlockSpec(channels=16, down=True),
)


def settings(**fields) -> SamplingDefaults:
    """A model's sampling defaults from flat fields: `SamplerConfig`'s, with guidance_scale / augment_preserves."""
    own = {k: fields.pop(k) for k in ("guidance_scale", "augment_preserves") if k in fields}
    return SamplingDefaults(SamplerConfig(**fields), **own)


def contrastive_trainer(**settings) -> TrainerConfig:
    """A contrastive-divergence `TrainerConfig` from flat settings, as a recipe's ``[trainer]`` names them: the
    loop's fields and `ContrastiveConfig`'s side by side."""
    own = {f.name for f in dataclasses.fields(ContrastiveConfig)}
    return TrainerConfig(**{k: v for k, v in settings.items() if k not in own},
                         objective=ContrastiveConfig(**{k: v for k, v in settings.items() if k in own}))


def tiny_config(**overrides) -> ResNetConfig:
    """A 3-tower ResNet on 8x8 images with 8-16 channels: the paper's layout, shrunk."""
    base = dict(name="tiny", image_size=8, stem_channels=8, blocks=TINY_BLOCKS, groups=4, multiscale=True)
    base.update(overrides)
    return ResNetConfig(**base)


if os.environ.get("PYTEST_XDIST_WORKER"):  # one torch thread per worker (the CLI's default too): workers share the cores
    os.environ["CEBM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def bfloat16_arithmetic(monkeypatch):
    """bfloat16 runs as asked on every CPU (emulated where the CPU has none of its own), so a test of its numerics
    tests bfloat16 and not the float32 fallback (`composable_ebm.accel.precision.native_bfloat16`)."""
    from composable_ebm.accel import precision

    monkeypatch.setattr(precision, "native_bfloat16", lambda device_type: True)


@pytest.fixture
def color_model() -> ResNetEnergy:
    return ResNetEnergy(tiny_config(name="color", attributes={"color": ("red", "green", "blue")}, null_condition=True))


@pytest.fixture
def shape_model() -> ResNetEnergy:
    return ResNetEnergy(tiny_config(name="shape", attributes={"shape": ("circle", "square", "triangle")},
                                    null_condition=True))


class FlakyEnergy(MLPEnergy):
    """Returns NaN energies on one chosen call (``poison_call``, counting from 1): a fault injected mid-training."""

    calls = 0
    poison_call = -1

    def energy(self, x, labels):
        FlakyEnergy.calls += 1
        e = super().energy(x, labels)
        return e * float("nan") if FlakyEnergy.calls == FlakyEnergy.poison_call else e

    @classmethod
    def poisoned_at(cls, call: int, config: MLPConfig) -> FlakyEnergy:
        """A new model whose ``call``-th energy evaluation (from now) is NaN."""
        cls.calls, cls.poison_call = 0, call
        return cls(config)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache folder of the module's own (``CEBM_CACHE``): npm installs and rendered folders start empty there."""
    import os

    path = tmp_path_factory.mktemp("cebm-cache")
    old = os.environ.get("CEBM_CACHE")
    os.environ["CEBM_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("CEBM_CACHE")
    else:
        os.environ["CEBM_CACHE"] = old
