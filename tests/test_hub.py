"""Loading from the Hugging Face Hub through huggingface_hub, offline, from a pre-filled cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from composable_ebm import MLPConfig, MLPEnergy
from composable_ebm.errors import ModelNotFoundError
from composable_ebm.models import load_model, save_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.subprocess
def test_hub_id_resolves_through_snapshot_download_from_a_prefilled_cache(tmp_path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--someorg--toy"
    save_model(MLPEnergy(MLPConfig(name="toy", hidden=8, depth=1)), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path))
    code = "import composable_ebm as c; m = c.load('someorg/toy'); print(type(m).__name__, m.name, m.config.hidden)"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["MLPEnergy", "toy", "8"]
    # a repository that is not in the cache fails loudly in offline mode
    code = "import composable_ebm as c; c.load('someorg/missing')"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "someorg/missing" in out.stderr


def test_a_source_that_is_neither_folder_nor_repo_id_is_rejected(tmp_path):
    with pytest.raises(FileNotFoundError, match="is neither a model folder, a bundled model .* nor a Hub repository id") as err:
        load_model("not a name")
    assert str(err.value).startswith("'not a name'")
    # a path that looks local is never sent to the Hub: a missing folder says so
    for path in (tmp_path / "nowhere" / "deep", "./nowhere/deep", "~/nowhere-cebm/deep"):
        with pytest.raises(ModelNotFoundError, match="no model folder at "):
            load_model(path)


def test_failed_save_keeps_the_previous_model_files(tmp_path, monkeypatch):
    save_model(MLPEnergy(MLPConfig(name="v1", hidden=8, depth=1)), tmp_path / "m")
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()}

    def crash_midway(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr("composable_ebm.persistence.write_weights", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        save_model(MLPEnergy(MLPConfig(name="v2", hidden=8, depth=1)), tmp_path / "m")
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()} == before  # no temp files, nothing replaced
    assert load_model(tmp_path / "m").name == "v1"


_PUSH_AND_LOAD = r"""
import os, sys, json, subprocess, tempfile, torch
import composable_ebm as c
from composable_ebm import MLPConfig, MLPEnergy
from composable_ebm.sampling import SamplerConfig
from composable_ebm.training import ContrastiveConfig, Trainer, TrainerConfig
first, second = (MLPEnergy(MLPConfig(name=n, hidden=8, depth=1)) for n in ("first", "second"))
config = TrainerConfig(steps=3, batch_size=8,
                       objective=ContrastiveConfig(sampler=SamplerConfig(step_size=0.05, noise=0.01, steps=2),
                                                   chain_augment=None, buffer_size=32, ent_bank=4, ent_min_buffer=4))
trainer = Trainer(first, torch.randn(64, 2), config)
trainer.fit(3)
first = trainer.ema  # a trained model
first.save_pretrained(sys.argv[1])
cli = [sys.executable, "-m", "composable_ebm.cli"]
push = subprocess.run([*cli, "push", sys.argv[1], "someorg/toy"], capture_output=True, text=True)
assert push.returncode == 0, push.stderr
print(push.stdout.strip().split(":")[0])
second.push_to_hub("someorg/toy", revision="v2")  # a branch of its own
os.environ["HF_HUB_CACHE"] = tempfile.mkdtemp()  # a fresh cache: everything below is downloaded
x = torch.randn(16, 2)
main, pinned = c.load("someorg/toy"), MLPEnergy.from_pretrained("someorg/toy@v2")
print(main.name, torch.equal(main(x), first(x)), pinned.name, torch.equal(pinned(x), second(x)))
info = subprocess.run([*cli, "info", "someorg/toy@v2", "--json"], capture_output=True, text=True)
print(json.loads(info.stdout)["config"]["name"])
from huggingface_hub import hf_hub_download
for revision in ("main", "v2"):  # each card's usage block runs as written and loads its own model
    card = open(hf_hub_download("someorg/toy", "README.md", revision=revision)).read()
    assert card.startswith("---\nlibrary_name: composable_ebm\n"), card[:80]
    block = card.split("```python\n", 1)[1].split("```", 1)[0]
    scope = {}
    exec(block, scope)
    print(revision, scope["model"].name, tuple(scope["images"].shape))
"""


@pytest.mark.subprocess
def test_push_then_load_round_trips_bit_for_bit_through_a_local_hub(tmp_path):
    from tests.hub_server import HubServer

    with HubServer() as hub:
        env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cache"), HF_TOKEN="hf_test",
                   HF_HUB_DISABLE_TELEMETRY="1")
        env.pop("HF_HUB_OFFLINE", None)
        out = subprocess.run([sys.executable, "-c", _PUSH_AND_LOAD, str(tmp_path / "model")], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.strip().splitlines()
        assert lines[0] == f"pushed {tmp_path / 'model'} to someorg/toy"
        assert lines[1].split() == ["first", "True", "second", "True"]
        assert lines[2] == "second"
        assert lines[3:] == ["main first (16, 2)", "v2 second (16, 2)"]
        assert sorted(hub.repos["someorg/toy"].branches) == ["main", "v2"]
        main_files = hub.repos["someorg/toy"].commits[hub.repos["someorg/toy"].branches["main"]]
        assert sorted(main_files) == ["README.md", "config.json", "model.safetensors"]
        assert "POST /api/repos/create" in hub.requests


def test_a_missing_folder_under_a_local_folder_is_not_sent_to_the_hub(tmp_path, monkeypatch):
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError, match="no model folder at runs/classifier"):
        load_model("runs/classifier")  # looks like org/name, but runs/ is a folder here
