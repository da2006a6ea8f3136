"""Downloads from a Hub on 127.0.0.1: paths come only from checked strings, every wait is bounded,
the server's answer is what the user is told, and a failed download leaves nothing in the cache."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from huggingface_hub import constants
from huggingface_hub.utils import _http, set_client_factory
from typer.testing import CliRunner

from composable_ebm import MLPConfig, MLPEnergy
from composable_ebm.cli import app
from composable_ebm.errors import HubUnavailableError, InvalidInputError, ModelNotFoundError
from composable_ebm.persistence import CONFIG_NAME, WEIGHTS_NAME
from composable_ebm.models import load_model, push_folder, save_model
from tests.hub_server import HubServer, Repo
from tests.test_reliability import _one_line_error, _SilentServer

runner = CliRunner()


def _files(tmp: Path, name: str) -> dict[str, bytes]:
    folder = save_model(MLPEnergy(MLPConfig(name=name, hidden=8, depth=1)), tmp / f"model-{name}")
    return {n: (folder / n).read_bytes() for n in (CONFIG_NAME, WEIGHTS_NAME)}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A Hub holding someorg/toy (a model named v1) and an empty cache, both offline-safe."""
    with HubServer() as server:
        repo = Repo(private=False)
        repo._commit(_files(tmp_path, "v1"), "main")
        server.repos["someorg/toy"] = repo
        server.cache = tmp_path / "cache"
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(server.cache))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("CEBM_HUB_TIMEOUT", "1")
        yield server
    set_client_factory(_http.default_client_factory)  # a push bounds the shared client; give back the default


def _cache_files(hub) -> list[str]:
    return sorted(str(p.relative_to(hub.cache)) for p in hub.cache.rglob("*") if p.is_file() or p.is_symlink())


def test_a_revision_that_would_leave_the_cache_is_refused_before_any_request(hub, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    for revision in ("../../../../victim.txt", "/etc/passwd", "main/../../x", ".hidden", "a\nb", "a b", "x.lock"):
        with pytest.raises(InvalidInputError, match="revision .* a revision is a branch, tag or commit id"):
            load_model(f"someorg/toy@{revision}")
        with pytest.raises(InvalidInputError, match="revision"):
            load_model("someorg/toy", revision=revision)
    assert hub.requests == [] and victim.read_text() == "the user's file"
    assert not hub.cache.exists()
    _one_line_error(runner.invoke(app, ["info", "someorg/toy@../../victim.txt"]), "contains '..'")
    _one_line_error(runner.invoke(app, ["push", str(tmp_path / "model-v1"), "someorg/toy", "--revision", "../x"]),
                    "revision '../x'")
    # branch names with slashes stay valid (the Hub's refs/pr/1, a user's release/v1)
    with pytest.raises(ModelNotFoundError, match="HTTP 404"):
        load_model("someorg/toy@release/v1")


def test_a_commit_id_from_the_hub_that_is_not_hex_is_refused(hub, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    hub.script = lambda method, path: ((200, {"Content-Type": "application/json"},
                                        [b'{"sha": "../../../../victim.txt", "siblings": []}'])
                                       if path.startswith("/api/models/") else None)
    with pytest.raises(HubUnavailableError, match="commit id '../../../../victim.txt', not 40 hex digits"):
        load_model("someorg/toy")
    assert victim.read_text() == "the user's file" and _cache_files(hub) == []


def test_a_hub_answer_of_deeply_nested_json_is_one_line(hub):
    """The Hub's JSON is parsed with a depth bound: 100,000 nested arrays are one line naming the answer, not a
    RecursionError."""
    deep = b"[" * 100_000 + b"]" * 100_000
    hub.script = lambda method, path: ((200, {"Content-Type": "application/json"}, [deep])
                                       if path.startswith("/api/models/") else None)
    with pytest.raises(HubUnavailableError, match="the Hub's answer for someorg/toy: JSON nested 100000 levels deep"):
        load_model("someorg/toy")
    assert _cache_files(hub) == []


def test_a_download_lands_in_the_hub_cache_layout_and_loads_offline_after(hub, monkeypatch):
    assert load_model("someorg/toy").name == "v1"
    sha = hub.repos["someorg/toy"].branches["main"]
    files = _cache_files(hub)
    assert "models--someorg--toy/refs/main" in files
    assert {f"models--someorg--toy/snapshots/{sha}/{n}" for n in (CONFIG_NAME, WEIGHTS_NAME)} <= set(files)
    assert not [f for f in files if "incomplete" in f or f.endswith(".tmp")]
    weights = hub.cache / f"models--someorg--toy/snapshots/{sha}/{WEIGHTS_NAME}"
    assert weights.resolve().parent.name == "blobs"  # a link into blobs/, as huggingface_hub lays it out
    assert weights.resolve().name == hashlib.sha256(weights.read_bytes()).hexdigest()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    asked = len(hub.requests)
    assert load_model("someorg/toy").name == "v1" and load_model(f"someorg/toy@{sha}").name == "v1"
    assert len(hub.requests) == asked  # the cache answered


def test_refresh_downloads_a_newer_revision_and_a_cached_model_never_asks(hub, tmp_path):
    assert load_model("someorg/toy").name == "v1"
    hub.repos["someorg/toy"]._commit(_files(tmp_path, "v2"), "main")
    asked = len(hub.requests)
    assert load_model("someorg/toy").name == "v1" and len(hub.requests) == asked
    assert load_model("someorg/toy", refresh=True).name == "v2"
    assert load_model("someorg/toy").name == "v2"  # refs/main now names the new commit
    result = runner.invoke(app, ["info", "someorg/toy", "--refresh"])
    assert result.exit_code == 0 and result.output.startswith("name        v2\n")


def _weights_script(hub, status: int, headers: dict, chunks: list):
    def script(method, path):
        return (status, headers, chunks) if path.endswith(f"/{WEIGHTS_NAME}") else None
    hub.script = script


@pytest.mark.subprocess
def test_a_trickling_download_ends_at_the_file_bound_and_leaves_nothing(hub, monkeypatch):
    monkeypatch.setenv("CEBM_HUB_FILE_TIMEOUT", "1.5")
    _weights_script(hub, 200, {"Content-Length": "100000"}, [b"x" * 10, 0.3] * 40)  # 33 bytes a second
    t0 = time.perf_counter()
    with pytest.raises(HubUnavailableError, match=r"took more than 1.5 s \(\d+ bytes received\); CEBM_HUB_FILE_TIMEOUT"):
        load_model("someorg/toy")
    assert time.perf_counter() - t0 < 10
    assert not [f for f in _cache_files(hub) if "blobs" in f and "config" not in f and WEIGHTS_NAME in f]
    assert not [f for f in _cache_files(hub) if "incomplete" in f or WEIGHTS_NAME in f]


@pytest.mark.subprocess
def test_a_download_that_stalls_midway_ends_at_the_read_bound(hub):
    _weights_script(hub, 200, {"Content-Length": "100000"}, [b"x" * 100, 5])
    t0 = time.perf_counter()
    with pytest.raises(HubUnavailableError, match="stopped sending for 1 s after 100 bytes"):
        load_model("someorg/toy")
    assert time.perf_counter() - t0 < 4
    assert not [f for f in _cache_files(hub) if "incomplete" in f or WEIGHTS_NAME in f]


def test_a_short_or_corrupted_file_is_not_kept(hub):
    _weights_script(hub, 200, {"Content-Length": "100000"}, [b"x" * 100])  # the connection closes early
    with pytest.raises(HubUnavailableError, match="after 100 bytes|received 100 of 100000 bytes"):
        load_model("someorg/toy")
    body = b"not the weights"
    _weights_script(hub, 200, {"Content-Length": str(len(body)), "X-Linked-Etag": '"' + "0" * 64 + '"'}, [body])
    with pytest.raises(HubUnavailableError, match="SHA-256 does not match"):
        load_model("someorg/toy")
    assert not [f for f in _cache_files(hub) if "incomplete" in f or WEIGHTS_NAME in f]
    hub.script = None  # the Hub is fixed: the next load downloads and works
    assert load_model("someorg/toy").name == "v1"


@pytest.mark.parametrize("status, headers, body, error, needles", [
    (401, {"X-Error-Message": "Invalid credentials in Authorization header"}, b"{}", ModelNotFoundError,
     ["HTTP 401", "Invalid credentials", "HF_TOKEN"]),
    (403, {}, b"gated repository", ModelNotFoundError, ["HTTP 403", "gated repository"]),
    (500, {}, b"upstream exploded", HubUnavailableError, ["HTTP 500", "upstream exploded"]),
    (200, {"Content-Type": "text/html"}, b"<html><body>Sign in</body></html>", HubUnavailableError,
     ["text/html, not JSON", "Sign in", "HF_ENDPOINT"]),
])
def test_what_the_hub_said_is_what_the_user_reads(hub, status, headers, body, error, needles):
    hub.script = lambda method, path: (status, {"Content-Length": str(len(body)), **headers}, [body])
    with pytest.raises(error) as err:
        load_model("someorg/toy")
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))
    assert "did not answer" not in str(err.value)


@pytest.mark.subprocess
def test_a_push_to_a_hub_that_never_answers_fails_within_the_timeout(tmp_path, monkeypatch):
    folder = save_model(MLPEnergy(MLPConfig(name="toy", hidden=8, depth=1)), tmp_path / "m")
    monkeypatch.setenv("CEBM_HUB_TIMEOUT", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    try:
        with _SilentServer() as endpoint:
            monkeypatch.setattr(constants, "ENDPOINT", endpoint)
            t0 = time.perf_counter()
            with pytest.raises(HubUnavailableError, match="did not answer within 1 s"):
                push_folder(folder, "someorg/toy")
            assert time.perf_counter() - t0 < 15
    finally:
        set_client_factory(_http.default_client_factory)


def test_from_pretrained_takes_huggingface_hubs_arguments(hub, tmp_path):
    other = tmp_path / "other-cache"
    with pytest.raises(ModelNotFoundError, match="not in the local Hub cache and local_files_only is set"):
        MLPEnergy.from_pretrained("someorg/toy", cache_dir=other, local_files_only=True)
    assert hub.requests == []
    model = MLPEnergy.from_pretrained("someorg/toy", cache_dir=other, token="hf_test")
    assert model.name == "v1" and (other / "models--someorg--toy" / "refs" / "main").is_file()
    assert not hub.cache.exists()  # cache_dir replaced the default cache
    asked = len(hub.requests)
    assert MLPEnergy.from_pretrained("someorg/toy", cache_dir=other, local_files_only=True).name == "v1"
    assert len(hub.requests) == asked
    hub.repos["someorg/toy"]._commit(_files(tmp_path, "v2"), "main")
    assert MLPEnergy.from_pretrained("someorg/toy", cache_dir=other, force_download=True).name == "v2"


def test_a_loaded_models_push_keeps_every_field_of_its_card(hub, monkeypatch):
    """`cebm.load("shapes-color").push_to_hub("me/x")` sends the bundled card: its license and model-index too,
    with the usage line loading from the new repository."""
    import composable_ebm as cebm

    monkeypatch.setenv("HF_TOKEN", "hf_test")
    cebm.load("shapes-color").push_to_hub("me/x")
    files = hub.repos["me/x"].commits[hub.repos["me/x"].branches["main"]]
    card = files["README.md"].decode()
    assert "license: mit" in card and "model-index:" in card
    assert 'cebm.load("me/x")' in card


def test_from_pretrained_takes_map_location_and_subfolder_and_names_what_it_does_not_take(hub, tmp_path):
    from composable_ebm import MLPConfig, MLPEnergy
    from composable_ebm.errors import InvalidInputError

    save_model(MLPEnergy(MLPConfig(name="inner", hidden=8, depth=1)), tmp_path / "repo" / "energy")
    assert MLPEnergy.from_pretrained(tmp_path / "repo", subfolder="energy", map_location="cpu").name == "inner"
    with pytest.raises(InvalidInputError, match="takes no proxies .*HTTPS_PROXY"):
        MLPEnergy.from_pretrained("someorg/toy", proxies={"https": "http://proxy:1"})
    with pytest.raises(InvalidInputError, match="disagree"):
        MLPEnergy.from_pretrained("someorg/toy", device="cpu", map_location="meta")
    with pytest.raises(InvalidInputError, match="subfolder='x'"):
        MLPEnergy.from_pretrained("someorg/toy", subfolder="x")
    assert hub.requests == []


def test_a_push_to_a_server_answering_html_is_one_line_naming_the_endpoint(hub, tmp_path, monkeypatch):
    folder = save_model(MLPEnergy(MLPConfig(name="toy", hidden=8, depth=1)), tmp_path / "m")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    body = b"<html><body>Sign in</body></html>"
    hub.script = lambda method, path: (200, {"Content-Type": "text/html", "Content-Length": str(len(body))}, [body])
    with pytest.raises(HubUnavailableError, match="not the Hub's JSON.*HF_ENDPOINT"):
        push_folder(folder, "someorg/new")
