"""Bad input, injected faults and hostile files: no hang, no silent wrong result, no lost model,
one clear line for every bad input. Each test reproduces a failure seen before the fix."""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import composable_ebm as cebm
from composable_ebm import MLPConfig, MLPEnergy
from composable_ebm.cli import app
from composable_ebm.errors import (
    CebmError,
    FolderLockedError,
    InvalidInputError,
    ModelFileError,
    NonFiniteError,
)
from composable_ebm.expression import parse_expression
from composable_ebm.persistence import CONFIG_NAME, WEIGHTS_NAME
from composable_ebm.models import load_model, save_model
from composable_ebm.nets import ResNetConfig, ResNetEnergy
from composable_ebm.recipes import load_recipe
from composable_ebm.sampling import AugmentConfig, SamplerConfig
from composable_ebm.training import ContrastiveConfig, Trainer, TrainerConfig, read_log
from tests.conftest import contrastive_trainer, tiny_config
from tests.test_cli import TINY_RECIPE

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _mlp(name: str = "toy", hidden: int = 8) -> MLPEnergy:
    return MLPEnergy(MLPConfig(name=name, hidden=hidden, depth=1))


def _one_line_error(result, *needles: str | tuple[str, ...], code: int = 2) -> str:
    """The CLI failed with ``code`` and said so in one line starting with 'error:' holding every needle."""
    text = result.stderr if result.stderr else result.output
    lines = [line for line in text.splitlines() if line.strip()]
    assert result.exit_code == code, (result.exit_code, text, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    for needle in needles:  # a tuple: any one of its wordings (click's range messages differ between versions)
        assert any(n in lines[0] for n in ((needle,) if isinstance(needle, str) else needle)), (needle, lines[0])
    return lines[0]


AT_LEAST_1 = ("greater than or equal to 1", "x>=1")  # click 8.3+ / earlier: both name the bound


# --------------------------------------------------------------------------- 1. no hang
class _SilentServer:
    """Accepts connections on 127.0.0.1 and never answers (a Hub that hangs)."""

    def __enter__(self) -> str:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.held: list[socket.socket] = []
        self.stop = False

        def accept() -> None:
            self.sock.settimeout(0.2)
            while not self.stop:
                try:
                    self.held.append(self.sock.accept()[0])
                except OSError:
                    continue

        self.thread = threading.Thread(target=accept, daemon=True)
        self.thread.start()
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        self.stop = True
        self.thread.join()
        for conn in self.held:
            conn.close()
        self.sock.close()


def _prefill_cache(cache: Path, repo: str, model) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = cache / f"models--{repo.replace('/', '--')}"
    save_model(model, folder / "snapshots" / commit)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)


def _load_in_subprocess(env: dict, code: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return out, time.perf_counter() - t0


@pytest.mark.subprocess
def test_a_hub_that_never_answers_fails_within_the_timeout_and_a_cached_model_never_asks(tmp_path):
    _prefill_cache(tmp_path, "someorg/cached", _mlp("cached"))
    with _SilentServer() as endpoint:
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
        env.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(tmp_path), CEBM_HUB_TIMEOUT="1", HF_HUB_DISABLE_TELEMETRY="1")
        out, seconds = _load_in_subprocess(env, "import composable_ebm as c; print(c.load('someorg/cached').name)")
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["cached"]
        assert seconds < 30  # interpreter start and imports; the hanging endpoint is never asked
        code = "import composable_ebm as c; c.load('someorg/uncached')"
        out, seconds = _load_in_subprocess(env, code)
        assert out.returncode != 0
        assert "HubUnavailableError: someorg/uncached is not in the local cache and the Hub" in out.stderr
        assert "did not answer within 1 s" in out.stderr
        assert seconds < 30, seconds  # before: minutes (no timeout at all)
        # the same through the CLI: one line, exit status 1 (a failure at run time, not bad input)
        cli = subprocess.run([sys.executable, "-m", "composable_ebm.cli", "info", "someorg/uncached"], env=env,
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert cli.returncode == 1 and len(cli.stderr.strip().splitlines()) == 1, cli.stderr
        assert cli.stderr.startswith("error: someorg/uncached is not in the local cache")


@pytest.mark.subprocess
def test_offline_with_nothing_cached_is_one_line_within_a_second(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path))
    code = ("import time, composable_ebm as c\nload = c.load  # imports torch (lazily, on first use)\n"
            "t = time.perf_counter()\ntry:\n    load('someorg/missing')\n"
            "except c.errors.ModelNotFoundError as err:\n    print(time.perf_counter() - t)\n    print(err)")
    out, _ = _load_in_subprocess(env, code)
    seconds, message = out.stdout.splitlines()
    assert float(seconds) < 1.0
    assert message.startswith("someorg/missing is not in the local Hub cache and HF_HUB_OFFLINE is set")


# --------------------------------------------------------------------------- 2. no lost model
_KILL_BETWEEN_RENAMES = """
import os, sys
import composable_ebm.persistence as persistence
from composable_ebm import MLPConfig, MLPEnergy
from composable_ebm.models import save_model
real_rename, calls = os.rename, []
def rename(src, dst):
    calls.append(dst)
    if len(calls) == 2:  # the old folder is aside, the new one not yet in place: die here
        os._exit(9)
    real_rename(src, dst)
persistence.os.rename = rename
save_model(MLPEnergy(MLPConfig(name="v2", hidden=8, depth=1)), sys.argv[1])
"""


@pytest.mark.subprocess
def test_a_kill_between_the_renames_of_a_save_loses_no_model(tmp_path):
    folder = tmp_path / "m"
    save_model(_mlp("v1"), folder, card="# v1\n")
    (folder / "notes.txt").write_text("mine")
    out = subprocess.run([sys.executable, "-c", _KILL_BETWEEN_RENAMES, str(folder)], cwd=ROOT, capture_output=True,
                         timeout=120)
    assert out.returncode == 9, out.stderr
    assert not folder.exists()  # the moment of the kill: only the aside copy and the staging folder exist
    assert load_model(folder).name == "v1"  # put back whole, before anything else
    assert (folder / "notes.txt").read_text() == "mine" and (folder / "README.md").read_text() == "# v1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # the dead save's leftovers are gone
    save_model(_mlp("v3"), folder)
    assert load_model(folder).name == "v3" and (folder / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_save_never_mixes_new_weights_with_an_old_config(tmp_path, monkeypatch):
    folder = tmp_path / "m"
    save_model(_mlp("v1", hidden=8), folder)
    real_rename = os.rename

    def fail_second(src, dst, calls=[]):  # noqa: B006 - a counter across calls
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("disk gone")
        real_rename(src, dst)

    monkeypatch.setattr("composable_ebm.persistence.os.rename", fail_second)
    with pytest.raises(OSError, match="disk gone"):
        save_model(_mlp("v2", hidden=16), folder)
    monkeypatch.undo()
    model = load_model(folder)  # the old model, whole (recovered from the aside copy)
    assert model.name == "v1" and model.config.hidden == 8


def test_temporaries_of_an_interrupted_checkpoint_write_are_removed_by_the_next_run(tmp_path):
    (tmp_path / ".checkpoint.pt.abc123.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / "keep.txt").write_text("not ours")
    trainer = Trainer(_mlp(), torch.randn(32, 2), _tiny_trainer_config(), out_dir=tmp_path)
    trainer.close()
    assert not (tmp_path / ".checkpoint.pt.abc123.tmp").exists() and (tmp_path / "keep.txt").exists()


# --------------------------------------------------------------------------- 3. no silent wrong result
def _tiny_trainer_config(**overrides) -> TrainerConfig:
    base = dict(steps=2, batch_size=8, sampler=SamplerConfig(step_size=0.05, noise=0.01, steps=2), chain_augment=None,
                buffer_size=32, ent_bank=4, ent_min_buffer=4, log_every=1, checkpoint_every=1)
    base.update(overrides)
    return contrastive_trainer(**base)


def test_non_finite_weights_are_an_error_naming_the_model_not_a_png_of_nans(tmp_path):
    model = ResNetEnergy(tiny_config(name="broken"))
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(NonFiniteError, match=r"sampling broken produced non-finite"):
        model.sample(2, steps=2)
    save_model(model, tmp_path / "m")
    with pytest.raises(NonFiniteError, match=r"model.safetensors: non-finite weights in "):
        load_model(tmp_path / "m")
    result = runner.invoke(app, ["sample", str(tmp_path / "m"), "-n", "2", "-o", str(tmp_path / "s.png")])
    _one_line_error(result, "non-finite weights")
    assert not (tmp_path / "s.png").exists()


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: TrainerConfig(ema_decay=1.5), r"TrainerConfig.ema_decay must be a finite number in \[0, 1\)"),
        (lambda: TrainerConfig(lr=-1.0), r"TrainerConfig.lr must be a finite number in \(0, inf\)"),
        (lambda: TrainerConfig(betas=(0.0, 1.0)), r"TrainerConfig.betas\[1\] must be"),
        (lambda: TrainerConfig(grad_clip=0.0), r"TrainerConfig.grad_clip must be"),
        (lambda: TrainerConfig(batch_size=0), r"TrainerConfig.batch_size must be an integer in \[1, "),
        (lambda: TrainerConfig(objective=ContrastiveConfig(ent_weight=float("nan"))), r"ContrastiveConfig.ent_weight must be a finite number"),
        (lambda: TrainerConfig(objective=ContrastiveConfig(reinit_prob=2.0)), r"ContrastiveConfig.reinit_prob must be"),
        (lambda: SamplerConfig(step_size=float("inf")), r"SamplerConfig.step_size must be a finite number"),
        (lambda: SamplerConfig(noise=-0.1), r"SamplerConfig.noise must be"),
        (lambda: SamplerConfig(rounds=0), r"SamplerConfig.rounds must be an integer in \[1, "),
        (lambda: AugmentConfig(flip_prob=1.5), r"flip_prob must be a probability in \[0, 1\]"),
        (lambda: ResNetConfig(stem_channels=40000), r"ResNetConfig.stem_channels must be an integer in \[1, 8192\]"),
        (lambda: MLPConfig(hidden=0), r"MLPConfig.hidden must be an integer in \[1, 8192\]"),
    ],
)
def test_every_numeric_setting_is_range_checked_at_construction(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    "line, needle",
    [
        ('lr = "0.001"', "TrainerConfig.lr must be a number, got a string '0.001'"),
        ('steps = "100"', "TrainerConfig.steps must be an integer, got a string '100'"),
        ("batch_size = 1.5", "TrainerConfig.batch_size must be an integer, got a number 1.5"),
        ("kl_ent = 1", "ContrastiveConfig.kl_ent must be true or false, got an integer 1"),
        ("betas = 0.9", "TrainerConfig.betas must be a list, got a number 0.9"),
        ('on_fault = "retry"', "TrainerConfig.on_fault must be one of ['rollback', 'stop'], got 'retry'"),
    ],
)
def test_recipe_values_are_type_checked_before_anything_runs(tmp_path, line, needle):
    recipe = tmp_path / "bad.toml"
    text = TINY_RECIPE.format(name="x", attribute="color")
    key = line.split()[0]
    trainer_table = text.index("[trainer]\n")
    own = re.compile(rf"^{key} = .*$", re.M)
    head, tail = text[:trainer_table], text[trainer_table:]
    tail = own.sub(line, tail, count=1) if own.search(tail.split("[trainer.sampler]")[0]) else tail.replace(
        "[trainer]\n", f"[trainer]\n{line}\n", 1)
    recipe.write_text(head + tail)
    with pytest.raises(InvalidInputError) as err:
        load_recipe(recipe)
    assert str(err.value) == f"{recipe}: {needle}"
    result = runner.invoke(app, ["train", str(recipe), "--out", str(tmp_path / "run"), "--no-progress"])
    _one_line_error(result, str(recipe), needle)
    assert not (tmp_path / "run").exists()  # refused before anything ran


def test_an_unknown_top_level_key_in_config_json_is_an_error(tmp_path):
    save_model(_mlp(), tmp_path / "m")
    payload = json.loads((tmp_path / "m" / CONFIG_NAME).read_text())
    payload["sampler_settings"] = {"steps": 3}
    (tmp_path / "m" / CONFIG_NAME).write_text(json.dumps(payload))
    with pytest.raises(ModelFileError, match=r"unknown key\(s\) \['sampler_settings'\]; valid keys: \['model_type'"):
        load_model(tmp_path / "m")


def test_a_second_run_on_a_folder_in_use_is_refused_and_a_stale_lock_is_taken_over(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": owner.pid}))
        with pytest.raises(FolderLockedError, match=f"is in use by process {owner.pid}; wait for it"):
            Trainer(_mlp(), torch.randn(32, 2), _tiny_trainer_config(), out_dir=tmp_path)
        recipe = tmp_path / "r.toml"
        recipe.write_text(TINY_RECIPE.format(name="x", attribute="color"))
        result = runner.invoke(app, ["train", str(recipe), "--out", str(tmp_path), "--no-progress"])
        _one_line_error(result, f"in use by process {owner.pid}")
    finally:
        owner.kill()
        owner.wait()
    trainer = Trainer(_mlp(), torch.randn(32, 2), _tiny_trainer_config(), out_dir=tmp_path)  # the owner is gone
    assert trainer.lock.took_over == {"host": socket.gethostname(), "pid": owner.pid}
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    trainer.close()
    assert not (tmp_path / ".lock").exists()


def test_a_torn_last_log_line_is_dropped_with_a_warning_and_the_run_resumes(tmp_path):
    trainer = Trainer(_mlp(), torch.randn(32, 2), _tiny_trainer_config(steps=4), out_dir=tmp_path)
    trainer.fit(2)
    trainer.close()
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"step": 3, "e_di')  # a kill mid-write
    with pytest.warns(UserWarning, match="dropped a torn last line"):
        assert [r["step"] for r in read_log(tmp_path) if "e_diff" in r] == [1, 2]
    again = Trainer(_mlp(), torch.randn(32, 2), _tiny_trainer_config(steps=4), out_dir=tmp_path)
    with pytest.warns(UserWarning, match="torn"):
        assert again.resume()
    again.fit(4)
    again.close()
    assert [r["step"] for r in read_log(tmp_path) if "e_diff" in r] == [1, 2, 3, 4]


def test_an_image_is_written_in_the_format_its_suffix_names_or_refused(tmp_path):
    save_model(ResNetEnergy(tiny_config(name="m")), tmp_path / "m")
    result = runner.invoke(app, ["sample", str(tmp_path / "m"), "-n", "2", "--steps", "1", "-o", str(tmp_path / "x.txt")])
    _one_line_error(result, "x.txt", "valid suffixes: ['.jpeg', '.jpg', '.png', '.webp']")
    assert not (tmp_path / "x.txt").exists()
    result = runner.invoke(app, ["sample", str(tmp_path / "m"), "-n", "2", "--steps", "1", "-o", str(tmp_path / "x.jpg")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x.jpg").read_bytes()[:3] == b"\xff\xd8\xff"  # JPEG, not a PNG under a .jpg name


# --------------------------------------------------------------------------- 4. untrusted configs
def _max_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize(
    "config, message",
    [
        ({"name": "huge", "dim": 2, "hidden": 40000, "depth": 3}, r"MLPConfig.hidden must be an integer in \[1, 8192\]"),
        ({"name": "huge", "dim": 2, "hidden": 8192, "depth": 200}, r"describes 13,\d{3},\d{3},\d{3} weights; at most"),
    ],
)
def test_a_config_asking_for_a_huge_network_is_refused_before_any_allocation(tmp_path, config, message):
    save_model(_mlp(), tmp_path / "m")  # a 14 KB folder ...
    payload = json.loads((tmp_path / "m" / CONFIG_NAME).read_text())
    payload["config"].update(config)  # ... whose config asks for gigabytes
    (tmp_path / "m" / CONFIG_NAME).write_text(json.dumps(payload))
    before = _max_rss_mb()
    with pytest.raises(ModelFileError, match=message):
        load_model(tmp_path / "m")
    assert _max_rss_mb() - before < 200  # the peak did not grow by the network's size (GBs)


def test_weights_whose_header_disagrees_with_the_config_are_refused_before_the_network_is_built(tmp_path, monkeypatch):
    save_model(_mlp(hidden=8), tmp_path / "m")
    payload = json.loads((tmp_path / "m" / CONFIG_NAME).read_text())
    payload["config"]["hidden"] = 4096
    (tmp_path / "m" / CONFIG_NAME).write_text(json.dumps(payload))
    built = []
    monkeypatch.setattr(MLPEnergy, "_linear", lambda self, i, o: built.append(torch.empty(0).device) or torch.nn.Linear(i, o))
    with pytest.raises(ModelFileError, match=r"weights do not match config.json \(mis-shaped: net.0.bias, net.0.weight"):
        load_model(tmp_path / "m")
    assert built and all(d.type == "meta" for d in built)  # only the meta-device skeleton was ever built


# --------------------------------------------------------------------------- 5. one clear line
def _model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "m"
    save_model(ResNetEnergy(tiny_config(name="m")), folder)
    return folder


def _rewrite_weights(folder: Path, change) -> None:
    weights = load_file(folder / WEIGHTS_NAME)
    change(weights)
    save_file(weights, folder / WEIGHTS_NAME)


BAD_MODEL_FOLDERS = {
    "truncated weights": (lambda f: (f / WEIGHTS_NAME).write_bytes((f / WEIGHTS_NAME).read_bytes()[:-100]),
                          "not a readable safetensors file"),
    "empty weights": (lambda f: (f / WEIGHTS_NAME).write_bytes(b""), "not a readable safetensors file"),
    "missing tensor": (lambda f: _rewrite_weights(f, lambda w: w.pop(sorted(w)[0])), "missing: "),
    "extra tensor": (lambda f: _rewrite_weights(f, lambda w: w.update(extra=torch.zeros(2))), "unexpected: extra"),
    "mis-shaped tensor": (lambda f: _rewrite_weights(f, lambda w: w.update({sorted(w)[0]: torch.zeros(3)})),
                          "mis-shaped: "),
    "config is a list": (lambda f: (f / CONFIG_NAME).write_text("[1, 2]"), "must hold a JSON object, got list"),
    "config lacks config": (lambda f: (f / CONFIG_NAME).write_text('{"model_type": "resnet"}'),
                            "missing 'config'"),
    "wrong type in config": (lambda f: (f / CONFIG_NAME).write_text(
        (f / CONFIG_NAME).read_text().replace('"image_size": 8', '"image_size": "8"')),
        "ResNetConfig.image_size must be an integer, got a string '8'"),
    "bad JSON": (lambda f: (f / CONFIG_NAME).write_text('{"model_type": '), "config.json: not valid JSON"),
    "no weights": (lambda f: (f / WEIGHTS_NAME).unlink(), "has no model.safetensors"),
}


@pytest.mark.parametrize("case", sorted(BAD_MODEL_FOLDERS))
def test_a_bad_model_folder_is_one_line_at_the_cli_and_a_library_error_in_the_api(tmp_path, case):
    folder = _model_folder(tmp_path)
    damage, needle = BAD_MODEL_FOLDERS[case]
    damage(folder)
    with pytest.raises(CebmError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        load_model(folder)
    result = runner.invoke(app, ["sample", str(folder), "-n", "2", "-o", str(tmp_path / "s.png")])
    _one_line_error(result, str(folder), needle)
    result = runner.invoke(app, ["--debug", "sample", str(folder), "-n", "2", "-o", str(tmp_path / "s.png")])
    assert result.exit_code == 2 and "Traceback" in result.output  # --debug: the traceback, the same exit status


@pytest.mark.parametrize("content, needle", [(b"", "is empty (0 bytes)"), (b"PK\x03\x04garbage", "is not a readable checkpoint")])
def test_a_corrupt_checkpoint_on_resume_names_the_file_and_the_way_out(tmp_path, content, needle):
    recipe = tmp_path / "r.toml"
    recipe.write_text(TINY_RECIPE.format(name="x", attribute="color"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(content)
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress"])
    _one_line_error(result, str(run / "checkpoint.pt"), needle, "--no-resume")
    assert (run / "checkpoint.pt").read_bytes() == content  # nothing overwritten
    assert not (run / ".lock").exists()  # the lock is released on failure
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--no-resume", "--steps", "1"])
    # a fresh start is asked for; the files named are checkpoint.pt (and tensorboard/ where it is installed)
    _one_line_error(result, "holds another run (checkpoint.pt", "--overwrite")
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--no-resume", "--overwrite",
                                 "--steps", "1"])
    assert result.exit_code == 0, result.output
    (aside,) = run.glob("replaced-*")
    assert (aside / "checkpoint.pt").read_bytes() == content  # kept aside, not destroyed


def test_no_resume_on_a_finished_run_keeps_it_and_never_mixes_the_logs(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(TINY_RECIPE.format(name="x", attribute="color"))
    run = tmp_path / "run"
    assert runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--steps", "4"]).exit_code == 0
    before = {name: (run / name).read_bytes() for name in ("checkpoint.pt", "log.jsonl")}
    model = (run / "model" / WEIGHTS_NAME).read_bytes()
    steps_before = [r["step"] for r in read_log(run / "log.jsonl") if "step" in r and "event" not in r]
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--no-resume", "--steps", "2"])
    _one_line_error(result, str(run), "holds another run (checkpoint.pt, log.jsonl, model", "--overwrite")
    assert {name: (run / name).read_bytes() for name in before} == before  # refused: nothing touched
    assert (run / "model" / WEIGHTS_NAME).read_bytes() == model
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--no-resume", "--overwrite",
                                 "--steps", "2"])
    assert result.exit_code == 0, result.output
    (aside,) = run.glob("replaced-*")
    assert {name: (aside / name).read_bytes() for name in before} == before
    assert (aside / "model" / WEIGHTS_NAME).read_bytes() == model
    steps_after = [r["step"] for r in read_log(run / "log.jsonl") if "step" in r and "event" not in r]
    assert steps_before and steps_before[-1] == 4 and steps_after and steps_after[-1] == 2
    assert steps_after == sorted(steps_after)  # the new log holds the new run only


def test_a_checkpoint_of_another_model_names_the_file(tmp_path):
    trainer = Trainer(_mlp(hidden=8), torch.randn(32, 2), _tiny_trainer_config(), out_dir=tmp_path)
    trainer.fit(1)
    trainer.close()
    other = Trainer(_mlp(hidden=16), torch.randn(32, 2), _tiny_trainer_config(), out_dir=tmp_path)
    with pytest.raises(ModelFileError, match=r"checkpoint.pt does not fit this model or is damaged .*--no-resume"):
        other.resume()
    other.close()


def test_cli_edge_cases_are_one_line_with_the_right_exit_status(tmp_path, bundled_name="shapes-color"):
    result = runner.invoke(app, ["compose", "(" * 250 + bundled_name + ")" * 250, "-o", str(tmp_path / "c.png")])
    _one_line_error(result, "nests deeper than 32 levels")
    if not torch.cuda.is_available():
        result = runner.invoke(app, ["sample", bundled_name, "--device", "cuda", "-o", str(tmp_path / "c.png")])
        _one_line_error(result, "--device cuda: no such CUDA device on this machine; valid choices here: ['cpu'")
    result = runner.invoke(app, ["sample", bundled_name, "--device", "gpu", "-o", str(tmp_path / "c.png")])
    _one_line_error(result, "--device 'gpu' is not a device name")
    result = runner.invoke(app, ["compose", "shapes-color & shapes-shape", "-o", str(tmp_path / "c.png")])
    _one_line_error(result, "valid operators: + - * / |")
    result = runner.invoke(app, ["sample", bundled_name, "--precision", "float8", "--steps", "1", "-o", str(tmp_path / "c.png")])
    _one_line_error(result, "precision", "float32")
    result = runner.invoke(app, ["sample", bundled_name, "-n", "0", "-o", str(tmp_path / "c.png")])
    _one_line_error(result, "Invalid value for '-n'", AT_LEAST_1, "--help")
    result = runner.invoke(app, ["train", str(tmp_path / "none.toml"), "--out", str(tmp_path / "run")])
    _one_line_error(result, "no recipe at")


def test_api_errors_name_the_problem():
    color = cebm.load("shapes-color")
    with pytest.raises(TypeError, match=r"energy weights are Python numbers \(e.g. float\(w\) \* energy\)"):
        torch.tensor(2.0) * color
    with pytest.raises(TypeError, match="energy weights are Python numbers"):
        color * torch.tensor(2.0)
    with pytest.raises(InvalidInputError, match="n must be a whole number from 1 to 1,048,576 .the number of samples., got 2.5"):
        color.condition(color="red").sample(n=2.5)
    with pytest.raises(ValueError, match=r"attribute 'color' is already bound in shapes-color\[red\]"):
        color.condition(color="red").condition(color="blue")
    with pytest.raises(InvalidInputError, match=r"valid operators: \+ - \* / \|"):
        parse_expression("shapes-color ^ 2", cebm.load)


# --------------------------------------------------------------------------- 6. files a user can share
def test_model_folders_checkpoints_and_plots_follow_the_users_umask(tmp_path):
    old = os.umask(0o022)
    try:
        recipe = tmp_path / "r.toml"
        recipe.write_text(TINY_RECIPE.format(name="x", attribute="color"))
        result = runner.invoke(app, ["train", str(recipe), "--out", str(tmp_path / "run"), "--no-progress"])
        assert result.exit_code == 0, result.output
        run = tmp_path / "run"
        for path in (run / "model" / CONFIG_NAME, run / "model" / WEIGHTS_NAME, run / "model" / "README.md",
                     run / "checkpoint.pt", run / "health.png", run / "log.jsonl"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
        assert stat.S_IMODE((run / "model").stat().st_mode) == 0o755
    finally:
        os.umask(old)


# --------------------------------------------------------------------------- configs that pass every type check
def test_a_tiny_config_cannot_ask_for_gigabytes_of_activations_or_endless_sampling(tmp_path):
    folder = _model_folder(tmp_path)
    payload = json.loads((folder / CONFIG_NAME).read_text())
    payload["config"].update(image_size=4096, stem_channels=64)
    (folder / CONFIG_NAME).write_text(json.dumps(payload))
    with pytest.raises(ModelFileError, match=r"config.json: ResNetConfig: image_size 4096 with stem_channels 64 .* activation elements per image; at most"):
        load_model(folder)
    with pytest.raises(InvalidInputError, match=r"= 17,592,186,044,416 Langevin steps; at most 1,048,576"):
        SamplerConfig(steps=1 << 24, rounds=1 << 20)
    SamplerConfig(steps=1000, rounds=1000)  # a million steps is still allowed
    # the shipped and paper networks fit with room to spare
    assert ResNetConfig.paper_128().activation_elements() < (1 << 28) // 4
    with pytest.raises(InvalidInputError, match=r"ContrastiveConfig.buffer_size 16,777,216 of inputs \(3, 32, 32\) .* at most"):
        Trainer(ResNetEnergy(ResNetConfig(image_size=32, stem_channels=8, groups=4, blocks=[], multiscale=False)),
                torch.rand(4, 3, 32, 32),
                TrainerConfig(objective=ContrastiveConfig(buffer_size=1 << 24)))


def test_saving_over_a_symlinked_model_folder_follows_the_link(tmp_path):
    target = save_model(_mlp("v1"), tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    _mlp("v2").save_pretrained(link)
    assert link.is_symlink() and load_model(link).name == "v2" and load_model(target).name == "v2"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "elsewhere" / "model", target_is_directory=True)
    save_model(_mlp("v3"), dangling)
    assert dangling.is_symlink() and load_model(tmp_path / "elsewhere" / "model").name == "v3"
    # cebm train writing OUT/model when it is a link
    recipe = tmp_path / "r.toml"
    recipe.write_text(TINY_RECIPE.format(name="x", attribute="color"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "model").symlink_to(target, target_is_directory=True)
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--steps", "1"])
    assert result.exit_code == 0, result.output
    assert (run / "model").is_symlink() and load_model(target).name == "x"


def test_type_confusions_and_damaged_small_files_are_one_line(tmp_path):
    classifier = "shapes-classifier"
    _one_line_error(runner.invoke(app, ["sample", classifier, "-n", "1", "-o", str(tmp_path / "s.png")]),
                    "shapes-classifier is an AttributeClassifier, not an energy")
    _one_line_error(runner.invoke(app, ["compose", f"{classifier} + shapes-color[color=red]", "-n", "1",
                                        "-o", str(tmp_path / "s.png")]), "not an energy; only energy models compose")
    _one_line_error(runner.invoke(app, ["eval", "ood", classifier, "--in", "shapes", "--out", "noise", "-n", "4"]),
                    "not an energy")
    _one_line_error(runner.invoke(app, ["eval", "compose", "shapes-color[color=red]", "--classifier", "shapes-color",
                                        "-t", "color=red", "-n", "1"]), "--classifier shapes-color is a ResNetEnergy")
    # an attribute bound twice draws neither silently
    with pytest.raises(InvalidInputError, match="color is bound twice"):
        parse_expression("shapes-color[color=red,color=blue]", cebm.load)
    _one_line_error(runner.invoke(app, ["sample", "shapes-color", "-c", "color=red", "-c", "color=blue", "-n", "1",
                                        "-o", str(tmp_path / "s.png")]), "color is bound twice (red and blue)")
    # a log line that is JSON but not a record, on resume and in plot
    recipe = tmp_path / "r.toml"
    recipe.write_text(TINY_RECIPE.format(name="x", attribute="color"))
    run = tmp_path / "run"
    assert runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--steps", "2"]).exit_code == 0
    with open(run / "log.jsonl", "a") as f:
        f.write("42\n")
    _one_line_error(runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--steps", "3"]),
                    "log.jsonl, line", "not a log record", "remove the line")
    _one_line_error(runner.invoke(app, ["plot", str(run), "-o", str(tmp_path / "h.png")]), "not a log record")
    # a lock naming a process id no process can have is damaged: one line naming the file, not an OverflowError and
    # not a run that trains as if no lock were there
    lines = (run / "log.jsonl").read_text().splitlines()[:-1]
    (run / "log.jsonl").write_text("".join(line + "\n" for line in lines))
    (run / ".lock").write_text(json.dumps({"pid": 10**20, "host": socket.gethostname()}))
    _one_line_error(runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--steps", "3"]),
                    ".lock is damaged", "delete it if no run uses")
    (run / ".lock").unlink()
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--steps", "3"])
    assert result.exit_code == 0, result.output


def test_unsafe_advice_and_unbounded_images_and_nameless_messages(tmp_path, monkeypatch):
    from PIL import Image

    # a .pth holding pickled objects: one line, and never the advice to unpickle it
    bad = tmp_path / "f.pth"
    torch.save({"net": torch.nn.Linear(2, 2)}, bad)
    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(folder / "a.png")
    line = _one_line_error(runner.invoke(app, ["eval", "fid", str(folder), str(folder), "--features", str(bad)]),
                           str(bad), "pickled Python objects")
    assert "weights_only" not in line
    # a decompression bomb names the file and the limit
    bomb = tmp_path / "bomb"
    bomb.mkdir()
    Image.new("1", (14000, 14000)).save(bomb / "big.png")
    _one_line_error(runner.invoke(app, ["eval", "fid", str(bomb), str(folder), "--features", "shapes-classifier"]),
                    "big.png: 196,000,000 pixels, more than the", "decompression-bomb limit")
    _one_line_error(runner.invoke(app, ["eval", "fid", str(folder), str(folder), "--features", "shapes-classifier",
                                        "--limit", "-1"]), "limit must be a positive number of images, got -1")
    # seeds out of range name the option's range
    _one_line_error(runner.invoke(app, ["sample", "shapes-color", "-c", "color=red", "-n", "1", "--seed", str(2**64),
                                        "-o", str(tmp_path / "s.png")]), "Invalid value for '--seed'", ("less than or equal to 9223372036854775807", "x<=9223372036854775807"))
    # text files that are not UTF-8, and attribute tables with a bad count line, name the file
    from composable_ebm.data import read_attribute_table

    table = tmp_path / "list_attr_celeba.txt"
    table.write_bytes(b"\xff\xfe2\nYoung\na.jpg 1\n")
    with pytest.raises(InvalidInputError, match=r"list_attr_celeba.txt: not UTF-8 text \(byte 0\)"):
        read_attribute_table(table)
    table.write_text("two\nYoung\na.jpg 1\n")
    with pytest.raises(InvalidInputError, match=r"list_attr_celeba.txt:1: the first line is the number of images"):
        read_attribute_table(table)
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_bytes(b'{"step": 1}\n\xff\n')
    _one_line_error(runner.invoke(app, ["plot", str(run), "-o", str(tmp_path / "h.png")]), "log.jsonl: not UTF-8 text")


def test_a_checkpoint_write_that_fails_midway_is_one_line_and_keeps_the_previous(tmp_path, monkeypatch):
    recipe = tmp_path / "r.toml"
    recipe.write_text(TINY_RECIPE.format(name="x", attribute="color"))
    run = tmp_path / "run"
    assert runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--steps", "2"]).exit_code == 0
    before = (run / "checkpoint.pt").read_bytes()
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):  # what torch's zip writer says when the disk fills mid-write
        real_save({"partial": torch.zeros(10)}, f)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file"
                           " data/0: file write failed")

    monkeypatch.setattr("composable_ebm.training.checkpoint.torch.save", disk_full)
    result = runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--steps", "4"])
    line = _one_line_error(result, "could not write", "checkpoint.pt", "file write failed", "disk full", code=1)
    assert "enforce fail" not in line
    assert (run / "checkpoint.pt").read_bytes() == before
    assert not list(run.glob(".checkpoint.pt.*.tmp"))


def test_inputs_that_used_to_give_silent_wrong_results_are_refused(tmp_path):
    out = tmp_path / "a.png"
    _one_line_error(runner.invoke(app, ["sample", "shapes-color", "-c", "color=red", "-n", "1", "-o", str(out),
                                        "--chain", str(out)]), "the chain strip would replace the grid")
    assert not out.exists()
    for key, value, needle in (("blur_sigma", "[0.0, 0.0]", "blur_sigma must satisfy 0 < low"),
                               ("color_strength", "nan", "color_strength must be a number in [0, 16], got nan")):
        recipe = tmp_path / f"{key}.toml"
        recipe.write_text(TINY_RECIPE.format(name="x", attribute="color") + f"\n[trainer.chain_augment]\n{key} = {value}\n")
        with pytest.raises(CebmError, match=re.escape(needle)):
            load_recipe(recipe)
    empty = tmp_path / "empty.toml"
    empty.write_text("[data]\ndataset = \"shapes\"\nn = 64\nsize = 16\n")
    result = runner.invoke(app, ["train", str(empty), "--out", str(tmp_path / "run"), "--no-progress", "--steps", "1"])
    _one_line_error(result, "[model] table names no network", "preset")
    for text, needle in (("0 * shapes-color[color=red]", "a weight of 0 removes its term"),
                         ("shapes-color[color=red] * 0", "* 0 removes its term"),
                         ("shapes-color[color=red] / 0", "a temperature (/ T) must be a number > 0")):
        with pytest.raises(InvalidInputError, match=re.escape(needle)):
            parse_expression(text, cebm.load)
    _one_line_error(runner.invoke(app, ["compose", "shapes-color[color=red]", "-n", "1", "--steps", "0",
                                        "-o", str(out)]), "Invalid value for '--steps'", AT_LEAST_1)
