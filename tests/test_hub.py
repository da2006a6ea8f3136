"""Loading from the Hugging Face Hub through huggingface_hub, offline, from a pre-filled cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from composable_ebm import MLPConfig, MLPEnergy
from composable_ebm.errors import ModelNotFoundError
from composable_ebm.hub import load_model, save_model

ROOT = Path(__file__).resolve().parents[1]


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

    monkeypatch.setattr("composable_ebm.hub.save_file", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        save_model(MLPEnergy(MLPConfig(name="v2", hidden=8, depth=1)), tmp_path / "m")
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()} == before  # no temp files, nothing replaced
    assert load_model(tmp_path / "m").name == "v1"
