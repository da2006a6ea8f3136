"""Paths users run today, each ending in one clear line, losing nothing: old config.json forms, expressions that begin
with a minus, weights and temperatures as typed, a recipe under a folder whose name is not UTF-8, a save that fails
after training, Node and npm failures, pickled checkpoints, and the caller's Hub variables."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from composable_ebm.cli import app
from composable_ebm.energy import MAX_BRANCHES
from composable_ebm.errors import InvalidInputError, ModelFileError, RunFailure, one_line
from composable_ebm.expression import parse_expression
from composable_ebm.models import BUNDLED_DIR
from composable_ebm.sampling import LadderConfig, SamplingDefaults
from tests.test_cli import TINY_RECIPE
from tests.test_reliability import _one_line_error

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

# ------------------------------------------------------------------------------------------ old config.json forms
LADDER = {"levels": 4, "sigma_max": 2.0, "first_steps": 6}
OLD_LADDER = {"step_size": 0.3, "noise": None, "steps": 2, "rounds": 1, "final_steps": 0, "method": "mala",
              "ladder": LADDER, "augment": None, "clamp": False, "init_scale": 1, "guidance_scale": 2.0}

OLD_FORMS = {  # (the family's table saved in an old form, what it reads as)
    "nested ladder with the chain's neutral values": (True, OLD_LADDER, {"levels": 4, "first_steps": 6}),
    "nested ladder in alone too": (True, {**OLD_LADDER, "alone": {"steps": 3, "ladder": {"first_steps": 9}}},
                                   {"alone": {"steps": 3, "first_steps": 9}}),
    "alone without a nested ladder": (True, {**OLD_LADDER, "alone": {"steps": 3}}, {"alone": {"steps": 3}}),
    "alone.ladder null": (True, {**OLD_LADDER, "alone": {"ladder": None}}, {"alone": {}}),
    "predictor true": (True, {"predictor": True}, {"predictor": "ancestral"}),
    "predictor false": (True, {"predictor": False}, {"predictor": "none"}),
    "noise null": (False, {"noise": None, "steps": 3}, {"noise": "exact"}),
    "ladder null beside a chain": (False, {"ladder": None, "steps": 3}, {"steps": 3}),
}

MALFORMED = {  # (the family, the table, what the one line names)
    "ladder a string": (True, {**OLD_LADDER, "ladder": "fast"}, "sampler.ladder must be a table"),
    "ladder a number": (True, {**OLD_LADDER, "ladder": 3}, "sampler.ladder must be a table"),
    "ladder a list": (True, {**OLD_LADDER, "ladder": [4, 2.0]}, "sampler.ladder must be a table"),
    "ladder a string beside a chain": (False, {"ladder": "fast", "steps": 3}, "sampler.ladder must be a table"),
    "alone a number": (True, {**OLD_LADDER, "alone": 5}, "sampler.alone must be a table"),
    "alone a list": (True, {**OLD_LADDER, "alone": [5]}, "sampler.alone must be a table"),
    "alone.ladder a number": (True, {**OLD_LADDER, "alone": {"ladder": 5}}, "sampler.alone.ladder must be a table"),
    "alone.ladder a string": (True, {**OLD_LADDER, "alone": {"ladder": "x"}}, "sampler.alone.ladder must be a table"),
    "a chain value that was not neutral": (True, {**OLD_LADDER, "rounds": 2}, "['rounds'] belong to the other family"),
    "predictor a number": (True, {"predictor": 3}, "predictor must be one of"),
    "noise a list": (False, {"noise": [1]}, "noise"),
    "alone a number beside a chain": (False, {"steps": 3, "alone": 5}, "alone must be a table"),
}


def _folder_with_sampler(tmp_path: Path, ladder: bool, table: dict) -> Path:
    folder = tmp_path / "old"
    source = BUNDLED_DIR / ("faces-hat" if ladder else "shapes-color")
    shutil.copytree(source, folder)
    payload = json.loads((folder / "config.json").read_text())
    payload["sampler"] = table
    (folder / "config.json").write_text(json.dumps(payload))
    return folder


@pytest.mark.parametrize("name", OLD_FORMS)
def test_every_old_sampler_form_reads_as_todays(name):
    ladder, table, expected = OLD_FORMS[name]
    defaults = SamplingDefaults.from_flat(table, ladder=ladder, saved=True)
    for key, value in expected.items():
        got = getattr(defaults, key) if key == "alone" else getattr(defaults.sampler, key)
        assert got == value, (key, got, value)
    assert isinstance(defaults.sampler, LadderConfig) == ladder


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_old_form_is_one_line_naming_its_field(tmp_path, name):
    ladder, table, needle = MALFORMED[name]
    with pytest.raises(InvalidInputError, match=None) as info:
        SamplingDefaults.from_flat(table, ladder=ladder, saved=True)
    assert needle in str(info.value)
    folder = _folder_with_sampler(tmp_path, ladder, table)
    _one_line_error(runner.invoke(app, ["info", str(folder)]), str(folder / "config.json"), needle)


# --------------------------------------------------------------------------------- expressions as the algebra writes
@pytest.mark.parametrize("expression", ["-(shapes-color[color=red] + shapes-shape[shape=circle])",
                                        "-shapes-shape[shape=circle] + shapes-color[color=red]",
                                        "-2 * shapes-shape[shape=circle] + shapes-color[color=red]"])
def test_an_expression_that_begins_with_a_minus_is_the_expression_not_an_option(tmp_path, expression):
    out = tmp_path / "grid.png"
    for args in (["compose", expression, "-n", "2", "--steps", "1", "-o", str(out)],
                 ["compose", "-n2", "--steps=1", expression, "--no-progress", "-o", str(out)]):
        result = runner.invoke(app, ["--threads", "1", *args])
        assert result.exit_code == 0, result.output
        assert out.is_file()
        out.unlink()


def test_a_minus_before_a_parts_weight_or_an_unknown_option_is_one_line():
    result = runner.invoke(app, ["compose", "-1 : shapes-color[color=red] | shapes-shape[shape=circle]", "-n", "2"])
    _one_line_error(result, "a part's weight", "(0, 1e+06]", "got '-1'")
    result = runner.invoke(app, ["compose", "shapes-color[color=red]", "--stesp", "3"])  # a typo stays an option
    assert result.exit_code == 2 and "No such option: --stesp" in result.output


@pytest.mark.parametrize("typed, needle", [
    ("nan : a | b", "a part's weight (N : ...) is its share of the samples, a number in (0, 1e+06]; got 'nan'"),
    ("inf : a | b", "got 'inf'"),
    ("2e6 : a | b", "got '2e6'"),
    ("a | -3 : b", "got '-3'"),
    ("a / -2", "a temperature (/ T) must be a number > 0, got '-2'"),
    ("a / 0", "a temperature (/ T) must be a number > 0, got '0'"),
    ("a / nan", "got 'nan'"),
    ("a /", "got nothing"),
    ("a * -2", "a weight after * must be a number (a negative weight: a minus before the term"),
    ("a * 0", "* 0 removes its term"),
])
def test_weights_and_temperatures_are_refused_naming_what_was_typed_and_the_range(typed, needle, color_model):
    with pytest.raises(InvalidInputError) as info:
        parse_expression(typed, lambda name: color_model)
    assert needle in str(info.value) and repr(typed) in str(info.value)


def test_a_tiny_part_weight_is_kept_as_typed_and_samples(color_model):
    from composable_ebm.pipeline import composed

    red, blue = color_model.condition(color="red"), color_model.condition(color="blue")
    energy = parse_expression("1e-7 : a | b", {"a": red, "b": blue}.__getitem__)
    assert energy.weights == (1e-7, 1.0)
    assert composed(energy, "plain").expression() == "(1e-07 : " + red.expression() + " | " + blue.expression() + ")"


def test_too_many_branches_is_the_count_and_the_bound_not_the_expression(color_model):
    red, green = color_model.condition(color="red"), color_model.condition(color="green")
    text = " + ".join(["(a | b)"] * 8) + " + (a | b | c)"  # 2^8 * 3 = 768 branches
    energy = parse_expression(text, {"a": red, "b": green, "c": color_model}.__getitem__)
    from composable_ebm.energy import branches

    with pytest.raises(InvalidInputError) as info:
        branches(energy)
    message = str(info.value)
    assert f"768 branches" in message and f"at most {MAX_BRANCHES}" in message and len(message) < 200
    wide = parse_expression(" | ".join(["a"] * (MAX_BRANCHES + 1)), {"a": red}.__getitem__)
    with pytest.raises(InvalidInputError, match=f"{MAX_BRANCHES + 1} branches"):
        branches(wide)


def test_a_long_message_keeps_its_sentence_and_shortens_its_longest_name():
    from composable_ebm.errors import MAX_LINE

    name = "org-" + "x" * 900 + "/model"
    line = one_line(ValueError(f"{name} is not in the local Hub cache, and the studio downloads nothing: fetch it"
                               " once, then use it here"))
    assert len(line) <= MAX_LINE and line.endswith("fetch it once, then use it here") and "\u2026" in line
    assert line.startswith("org-xxx") and line.split(" ")[0].endswith("xxx/model")


# ------------------------------------------------------------------------------------ a run that trains to the end
def test_a_recipe_under_a_folder_whose_name_is_not_utf8_trains_and_saves_its_model(tmp_path):
    from composable_ebm.runs import export_run, train_recipe

    folder = Path(os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9-\xff"))
    folder.mkdir()
    recipe = folder / os.fsdecode(b"color-\xfe.toml")
    recipe.write_text(TINY_RECIPE.format(name="x", attribute="color"))
    run = train_recipe(recipe, folder / os.fsdecode(b"run-\xfd"), steps=2)
    model = folder / os.fsdecode(b"run-\xfd") / "model"
    assert run.steps == 2 and (model / "model.safetensors").is_file()
    card = (model / "README.md").read_text(encoding="utf-8")
    assert "color-\ufffd.toml" in card  # the bytes UTF-8 cannot hold shown as U+FFFD
    export_run(folder / os.fsdecode(b"run-\xfd"), out=folder / os.fsdecode(b"export-\xfc"))
    assert (folder / os.fsdecode(b"export-\xfc") / "README.md").is_file()


def test_a_model_save_that_fails_after_training_says_how_to_export_the_checkpoint(tmp_path, monkeypatch):
    from composable_ebm import models
    from composable_ebm.runs import export_run, train_recipe

    recipe = tmp_path / "r.toml"
    recipe.write_text(TINY_RECIPE.format(name="x", attribute="color"))

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(models, "save_model", full_disk)
    with pytest.raises(RunFailure) as info:
        train_recipe(recipe, tmp_path / "run", steps=2)
    message = str(info.value)
    assert "trained 2 steps" in message and "No space left on device" in message
    assert f"cebm export {tmp_path / 'run'}" in message and "\n" not in message
    monkeypatch.undo()
    assert (export_run(tmp_path / "run") / "model.safetensors").is_file()  # the checkpoint held the weights


def test_a_file_where_the_run_saves_its_model_is_refused_before_the_first_step(tmp_path):
    from composable_ebm.runs import train_recipe

    recipe = tmp_path / "r.toml"
    recipe.write_text(TINY_RECIPE.format(name="x", attribute="color"))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model").write_text("notes")
    with pytest.raises(InvalidInputError, match="model is a file; a run saves its model as a folder there"):
        train_recipe(recipe, tmp_path / "run", steps=2)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["model"]  # nothing trained, nothing written


# ------------------------------------------------------------------------------------------- Node, npm, pickles
def _fake_tool(folder: Path, name: str, stderr: str) -> None:
    folder.mkdir(exist_ok=True)
    script = folder / name
    script.write_text(f"#!/bin/sh\ncat >&2 <<'EOF'\n{stderr}\nEOF\nexit 1\n")
    script.chmod(0o755)


NODE_ENOSPC = """node:fs:2420
    return binding.writeFileUtf8(
                   ^

Error: ENOSPC: no space left on device, write
    at Object.writeFileSync (node:fs:2420:20)
    at file:///cache/render.mjs:120:8 {
  errno: -28,
  syscall: 'write',
  code: 'ENOSPC'
}

Node.js v20.19.2"""

NPM_OFFLINE = """npm error code ENOTFOUND
npm error syscall getaddrinfo
npm error errno ENOTFOUND
npm error network request to https://registry.example/@dicebear%2fcore failed, reason: getaddrinfo ENOTFOUND
npm error network This is a problem related to network connectivity.
npm error A complete log of this run can be found in: /root/.npm/_logs/debug-0.log"""


def test_a_full_disk_while_rendering_faces_is_one_line_saying_so(tmp_path, monkeypatch):
    import importlib

    faces = importlib.import_module("composable_ebm.data.faces")  # the module (the package exports a function faces)
    tools = tmp_path / "bin"
    _fake_tool(tools, "node", NODE_ENOSPC)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(faces, "_renderer", lambda: tmp_path)
    with pytest.raises(RunFailure) as info:
        faces.render_faces(tmp_path / "out", 4)
    message = str(info.value)
    assert "no space left on the disk that holds" in message and "nothing was written" in message
    assert "binding" not in message and "Node.js v" not in message and "\n" not in message
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out-*"))  # the partial render is removed


def test_a_tampered_npm_cache_offline_is_one_line_naming_the_check_and_the_registry(tmp_path, monkeypatch):
    from composable_ebm.data import npm
    from composable_ebm.data.faces import NODE_LINE, RENDERER, RENDERER_FILES

    tools = tmp_path / "bin"
    _fake_tool(tools, "npm", NPM_OFFLINE)
    _fake_tool(tools, "node", "")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CEBM_CACHE", str(tmp_path / "cache"))
    home = npm.cache_root() / f"faces-renderer-{npm.package_digest(RENDERER, RENDERER_FILES)}"
    (home / "node_modules").mkdir(parents=True)
    for name in RENDERER_FILES:
        shutil.copyfile(RENDERER / name, home / name)
    (home / npm.TREE_RECORD).write_text("a digest of other packages\n")  # the installed tree was changed
    with pytest.raises(RunFailure) as info:
        npm.installed(RENDERER, RENDERER_FILES, "faces-renderer", "the faces renderer", NODE_LINE)
    message = str(info.value)
    assert "the cached copy of the faces renderer" in message and "failed its check" in message
    assert "the npm registry could not be reached" in message and "npm error" not in message


def test_a_pickled_checkpoint_is_refused_in_one_line_without_torchs_warning(tmp_path):
    import pickle

    from composable_ebm.training import load_checkpoint

    for name, write in {"pickle": lambda p: p.write_bytes(pickle.dumps({"a": 1}, protocol=4)),
                        "legacy torch format": lambda p: torch.save({"a": torch.zeros(2)}, p,
                                                                    _use_new_zipfile_serialization=False)}.items():
        path = tmp_path / f"{name}.pt"
        write(path)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            with pytest.raises(ModelFileError, match="is not a readable checkpoint .*nothing else is unpickled here"):
                load_checkpoint(path)
        assert not said, (name, [str(w.message) for w in said])


# ------------------------------------------------------------------------------------- the caller's Hub variables
@pytest.mark.subprocess
def test_the_hub_tests_pass_with_an_offline_users_hub_variables(tmp_path):
    """An offline user's HF_HUB_OFFLINE, token, endpoint and cache do not reach the tests (tests/conftest.py)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_user", "HF_ENDPOINT": "http://127.0.0.1:9",
           "HF_HOME": str(tmp_path / "user-hf-home"), "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                           "-o", "addopts=", "tests/test_cli.py", "tests/test_hub_download.py", "-k",
                           "push or help_example or round_trip"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
    assert not (tmp_path / "user-hf-home").exists()  # nothing written to the user's Hub home
