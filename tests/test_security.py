"""Security: what a push may send, what a saved folder keeps, what the studio answers, what a table may read."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from composable_ebm import MLPConfig, MLPEnergy
from composable_ebm.cli import app
from composable_ebm.errors import InvalidInputError
from composable_ebm.persistence import push_folder, save_model

runner = CliRunner()


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_text("-----BEGIN OPENSSH PRIVATE KEY----- not for the Hub\n")
    return path


def _model_folder(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    return save_model(MLPEnergy(MLPConfig(hidden=8, depth=1)), tmp_path / "m", card="# toy\n")


def test_push_refuses_a_model_file_that_is_a_symlink_and_sends_nothing(tmp_path, secret, monkeypatch):
    """`ln -s ~/.ssh/id_ed25519 m/README.md; cebm push m org/x` is one line naming the link; the Hub gets nothing."""
    from huggingface_hub import constants

    from tests.hub_server import HubServer

    folder = _model_folder(tmp_path)
    (folder / "README.md").unlink()
    os.symlink(secret, folder / "README.md")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    with HubServer() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        result = runner.invoke(app, ["push", str(folder), "org/x"])
        assert result.exit_code == 2, result.output
        assert "README.md is a symbolic link" in result.output and "regular files inside the model folder" in result.output
        assert "org/x" not in hub.repos and not hub.requests
        with pytest.raises(InvalidInputError, match="config.json is a symbolic link"):
            (folder / "README.md").unlink()
            (folder / "README.md").write_text("# toy\n")
            real = folder / "config.json"
            real.rename(tmp_path / "config.json")
            os.symlink(tmp_path / "config.json", real)
            push_folder(folder, "org/x")
        assert not hub.requests


def test_save_pretrained_keeps_a_users_symlink_a_link_not_a_copy_of_its_target(tmp_path, secret):
    folder = _model_folder(tmp_path)
    os.symlink(secret, folder / "notes.txt")
    save_model(MLPEnergy(MLPConfig(hidden=8, depth=1)), folder, card="# again\n")
    assert (folder / "notes.txt").is_symlink() and os.readlink(folder / "notes.txt") == str(secret)


@pytest.fixture(scope="module")
def studio_url():
    pytest.importorskip("gradio")
    from composable_ebm import studio

    app = studio.launch("127.0.0.1", device="cpu", prevent_thread_lock=True, quiet=True, allowed_host=("studio.lan",))
    yield app.local_url
    app.close()


def _request(url: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, str]:
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.putrequest(method, path, skip_host=True)
    for key, value in headers.items():
        conn.putheader(key, value)
    if body is not None:
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    response = conn.getresponse()
    text = response.read().decode("utf-8", "replace")
    conn.close()
    return response.status, text


def test_the_studio_refuses_a_forged_host_or_origin(studio_url):
    """DNS rebinding: a page at evil.example:PORT that resolves to 127.0.0.1 sends its own Host and Origin; the
    studio answers 403 to them and serves its own names (and those given with --allowed-host)."""
    from urllib.parse import urlsplit

    port = urlsplit(studio_url).port
    body = b'{"data": ["shapes-color[color=red]", 0, 256, "1048576", ""]}'
    status, text = _request(studio_url, "POST", "/gradio_api/call/on_generate",
                            {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}, body)
    assert status == 403 and "Host 'evil.example:" in text and "--allowed-host" in text
    status, text = _request(studio_url, "GET", "/", {"Host": f"127.0.0.1:{port}", "Origin": f"http://evil.example:{port}"})
    assert status == 403 and "Origin 'http://evil.example:" in text
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"studio.lan:{port}"):
        status, _ = _request(studio_url, "GET", "/", {"Host": host})
        assert status == 200, host


def test_one_studio_request_is_bounded_in_samples_steps_and_work():
    from composable_ebm import studio

    models = studio.ModelCache("cpu")
    with pytest.raises(InvalidInputError, match=f"from 1 to {studio.MAX_SAMPLES}"):
        studio.generate(models, "shapes-color[color=red]", n=studio.MAX_SAMPLES + 1)
    with pytest.raises(InvalidInputError, match=f"at most {studio.MAX_STEPS} a request"):
        studio.generate(models, "shapes-color[color=red]", n=1, steps="1048576")
    with pytest.raises(InvalidInputError, match="sample-steps; the studio runs at most"):
        studio.generate(models, "shapes-color[color=red]", n=64, steps="600")
    for empty in (None, ""):  # a cleared box is one line, not an internal error
        with pytest.raises(InvalidInputError):
            studio.generate(models, "shapes-color[color=red]", n=empty, seed=0)


@pytest.mark.parametrize("edit, words", [
    (lambda c: c.update(image_size=32), "describes input_shape [3, 32, 32], but model.safetensors was saved for [3, 16, 16]"),
    (lambda c: c.update(image_size=4), "describes input_shape [3, 4, 4]"),
    (lambda c: c.update(input_transforms=["channel-sort"]), "describes input_transforms ['channel-sort']"),
])
def test_a_config_edited_away_from_what_the_weights_were_saved_for_is_refused(tmp_path, edit, words):
    """The weights record the input they were trained to see; a config.json that now says another image size, or
    drops an input transform, would load and sample wrong: it is refused in one line."""
    import json
    import shutil

    from composable_ebm.errors import ModelFileError
    from composable_ebm.persistence import BUNDLED_DIR, load_model

    folder = tmp_path / "color"
    shutil.copytree(BUNDLED_DIR / "shapes-color", folder)
    payload = json.loads((folder / "config.json").read_text())
    edit(payload["config"])
    (folder / "config.json").write_text(json.dumps(payload))
    with pytest.raises(ModelFileError, match=re.escape(words)):
        load_model(folder)
