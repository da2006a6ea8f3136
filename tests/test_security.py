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
from composable_ebm.models import push_folder, save_model

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


def _request(url: str, method: str, path: str, headers: dict[str, str], body: bytes | None = None,
             typed: bool = True) -> tuple[int, str]:
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.putrequest(method, path, skip_host=True)
    for key, value in headers.items():
        conn.putheader(key, value)
    if body is not None and typed:
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


def test_the_studio_answers_only_its_own_origin(studio_url):
    """A page of another origin cannot drive the studio: ``Origin: null`` (a sandboxed frame, a data: or file: page),
    a page on another port of localhost, and a request without Origin that the browser marks cross-site or same-site
    are refused (403) before Gradio sees them; the studio's own page is served."""
    from urllib.parse import urlsplit

    port = urlsplit(studio_url).port
    host = f"127.0.0.1:{port}"
    body = b'{"data": ["shapes-color[color=red]", "auto", 0, 1, "1", ""]}'
    for origin in ("null", f"http://127.0.0.1:{port + 1}", f"http://localhost:{port}", f"https://127.0.0.1:{port}"):
        status, text = _request(studio_url, "POST", "/gradio_api/call/on_generate", {"Host": host, "Origin": origin},
                                body)
        assert status == 403 and "another origin" in text and "--allowed-origin" in text, origin
    for site in ("cross-site", "same-site"):
        status, text = _request(studio_url, "GET", "/gradio_api/info", {"Host": host, "Sec-Fetch-Site": site})
        assert status == 403 and site in text
    status, _ = _request(studio_url, "GET", "/", {"Host": host, "Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"})
    assert status == 200


def test_the_studio_takes_no_uploads(studio_url):
    """Gradio's upload route, and any multipart body, are refused: nothing is written to the studio's disk."""
    import tempfile
    from pathlib import Path
    from urllib.parse import urlsplit

    host = f"127.0.0.1:{urlsplit(studio_url).port}"
    temp = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")
    before = sum(1 for p in temp.rglob("*")) if temp.is_dir() else 0
    form = (b"--b\r\nContent-Disposition: form-data; name=\"files\"; filename=\"x.bin\"\r\n\r\n" + b"0" * 65536 +
            b"\r\n--b--\r\n")
    for path in ("/gradio_api/upload", "/upload", "/gradio_api/queue/join"):
        status, text = _request(studio_url, "POST", path, {"Host": host, "Origin": f"http://{host}",
                                                           "Content-Type": "multipart/form-data; boundary=b",
                                                           "Content-Length": str(len(form))}, form, typed=False)
        assert status == 403 and "upload" in text, path
    after = sum(1 for p in temp.rglob("*")) if temp.is_dir() else 0
    assert after == before


def test_the_studio_loads_only_bundled_cached_and_rooted_models(tmp_path, monkeypatch):
    """No path outside --models-root is looked at, and no Hub model is downloaded: the same line for a folder that
    exists and one that does not, so a page learns nothing of the disk."""
    from huggingface_hub import constants

    from composable_ebm import studio
    from tests.hub_server import HubServer

    root = tmp_path / "models"
    inside = _model_folder(root)
    outside = _model_folder(tmp_path / "elsewhere")
    lines = set()
    for name in (str(outside), str(tmp_path / "missing"), "../elsewhere/m", str(inside) + "/../../elsewhere/m"):
        with pytest.raises(InvalidInputError) as info:
            studio.studio_loader(name, "cpu", root)
        lines.add(str(info.value).replace(repr(name), "NAME"))
    assert len(lines) == 1 and "bundled models" in lines.pop()
    assert studio.studio_loader("m", "cpu", root).__class__.__name__ == "MLPEnergy"
    assert studio.studio_loader(str(inside), "cpu", root).__class__.__name__ == "MLPEnergy"
    with pytest.raises(InvalidInputError, match="none was given"):
        studio.studio_loader(str(inside), "cpu", None)
    with HubServer() as hub:  # a Hub model that is not cached is not fetched
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
        with pytest.raises(Exception, match="not in the local Hub cache"):
            studio.studio_loader("org/anything", "cpu", root)
        assert not hub.requests


def test_the_studio_keeps_a_bounded_number_of_models_least_recently_used_first_out():
    from composable_ebm import studio

    loads = []
    cache = studio.ModelCache("cpu", loader=lambda name, device: loads.append(name) or object(), size=2)
    for name in ("a", "b", "a", "c", "a", "b"):
        cache(name)
    assert list(cache.models) == ["a", "b"] and loads == ["a", "b", "c", "b"]
    assert studio.ModelCache("cpu").size == studio.MAX_MODELS


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
    from composable_ebm.models import BUNDLED_DIR, load_model

    folder = tmp_path / "color"
    shutil.copytree(BUNDLED_DIR / "shapes-color", folder)
    payload = json.loads((folder / "config.json").read_text())
    edit(payload["config"])
    (folder / "config.json").write_text(json.dumps(payload))
    with pytest.raises(ModelFileError, match=re.escape(words)):
        load_model(folder)
