"""The `cebm` command line, through typer's CliRunner, on tiny recipes."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from composable_ebm.cli import app
from composable_ebm.evaluation import AttributeClassifier, ClassifierConfig
from composable_ebm.expression import parse_expression
from composable_ebm.models import load_model, save_model
from composable_ebm.recipes import build_dataset, build_model, load_recipe

ROOT = Path(__file__).resolve().parents[1]

TINY_RECIPE = """
[model]
name = "{name}"
stem_channels = 8
groups = 4
blocks = [{{ channels = 8 }}, {{ channels = 8, down = true }}, {{ kind = "attention" }}, {{ channels = 16, down = true }}]

[data]
dataset = "shapes"
attributes = ["{attribute}"]
n = 200
size = 8

[trainer]
steps = 4
batch_size = 8
label_dropout = 0.1
buffer_size = 64
ent_bank = 8
ent_min_buffer = 8
log_every = 2
checkpoint_every = 2

[trainer.sampler]
step_size = 10.0
steps = 3

[sampling]
step_size = 10.0
steps = 2
rounds = 2

[sampling.augment]
crop_scale = [0.5, 1.0]
"""

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name, attribute in (("color", "color"), ("shape", "shape")):
        recipe = root / f"{name}.toml"
        recipe.write_text(TINY_RECIPE.format(name=name, attribute=attribute))
        invoke("train", recipe, "--out", root / name, "--no-progress")
    return root


def test_train_writes_model_checkpoint_log_card_and_health_plot(trained):
    run = trained / "color"
    for name in ("checkpoint.pt", "log.jsonl", "health.png", "model/config.json", "model/model.safetensors", "model/README.md"):
        assert (run / name).is_file(), name
    model = load_model(run / "model")
    assert model.attributes == {"color": ("red", "green", "blue")}
    assert model.sampling_defaults.sampler.rounds == 2 and model.sampling_defaults.sampler.augment.crop_scale == (0.5, 1.0)
    card = (run / "model" / "README.md").read_text()
    assert "library_name: composable_ebm" in card and "`color`: `red`, `green`, `blue`" in card


def test_train_resumes_and_extends(trained):
    recipe = trained / "color.toml"
    result = invoke("train", recipe, "--out", trained / "color", "--steps", "6", "--no-progress")
    assert "resumed from step 4" in result.output and "trained 6 steps" in result.output


def test_sample_and_compose_write_grids(trained, tmp_path):
    invoke("sample", trained / "color" / "model", "-n", "4", "-c", "color=red", "-o", tmp_path / "s.png",
           "--chain", tmp_path / "chain.png", "--seed", "1")
    with Image.open(tmp_path / "s.png") as im:
        assert im.size == (2 * 64 + 3 * 2, 2 * 64 + 3 * 2)  # 8-pixel images shown 64 pixels wide by default
    assert (tmp_path / "chain.png").is_file()
    expr = f"{trained / 'color' / 'model'}[color=red] + 2*{trained / 'shape' / 'model'}[shape=circle]"
    result = invoke("compose", expr, "-n", "4", "-o", tmp_path / "c.png", "--steps", "2", "--scale", "3")
    assert "(color[red] + 2.0 * shape[circle])" in result.output
    with Image.open(tmp_path / "c.png") as im:
        assert im.size == (2 * 24 + 3 * 2, 2 * 24 + 3 * 2)
    bad = runner.invoke(app, ["compose", expr, "--scale", "0", "-o", str(tmp_path / "z.png")])
    assert bad.exit_code == 2 and "--scale" in bad.output
    assert (tmp_path / "c.png").is_file()


def test_compose_reports_bad_attributes_clearly(trained, tmp_path):
    result = runner.invoke(app, ["compose", f"{trained / 'color' / 'model'}[color=pink]", "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and "valid values: ['red', 'green', 'blue']" in result.output


def test_plot_info_and_eval(trained, tmp_path):
    invoke("plot", trained / "color", "-o", tmp_path / "h.png")
    assert (tmp_path / "h.png").is_file()
    info = json.loads(invoke("info", trained / "color" / "model", "--json").output)
    assert info["model_type"] == "resnet" and info["config"]["attributes"] == {"color": ["red", "green", "blue"]}
    table = invoke("info", trained / "color" / "model").output
    assert "attribute color" in table and "red, green, blue" in table and "resnet" in table
    torch.manual_seed(0)
    clf = AttributeClassifier(ClassifierConfig(image_size=8, width=8, attributes={"color": ("red", "green", "blue")}))
    save_model(clf, tmp_path / "clf")
    out = invoke("eval", "compose", f"{trained / 'color' / 'model'}[color=red]", "--classifier", tmp_path / "clf",
                 "-t", "color=red", "-n", "8", "--steps", "1")
    score = json.loads(out.stdout)  # the progress bar goes to stderr
    # one attribute: the joint hits are its hits, a whole number of the 8 samples
    assert set(score["per_attribute"]) == {"color"} and score["n"] == 8
    assert score["joint"] == score["per_attribute"]["color"] and (score["joint"] * 8).is_integer()
    ood = json.loads(invoke("eval", "ood", trained / "color" / "model", "--in", "shapes", "--out", "noise", "-n", "32").output)
    from composable_ebm.data import shapes
    from composable_ebm.evaluation import ood_auroc

    energy = load_model(trained / "color" / "model")  # the same data the command draws (seed 0 and 1)
    x_in, x_out = shapes(32, 8, seed=0, split="all").images, torch.rand(32, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    assert ood["auroc"] == pytest.approx(ood_auroc(energy, x_in, x_out), abs=1e-6)


def test_expression_grammar_matches_the_algebra(trained):
    color = load_model(trained / "color" / "model")
    shape = load_model(trained / "shape" / "model")
    models = {"c": color, "s": shape}
    e = parse_expression("c[color=red] + 2*s[shape=circle] - 0.5 * s[shape=square]", models.__getitem__)
    assert repr(e) == "(color[red] + 2.0 * shape[circle] - 0.5 * shape[square])"
    e = parse_expression("(c[color=red] | c[color=blue]) / 2", models.__getitem__)
    assert repr(e) == "(0.5 * (color[red] | color[blue]))"
    x = torch.rand(3, 3, 8, 8)
    manual = color.condition(color="red") + 2 * shape.condition(shape="circle")
    torch.testing.assert_close(parse_expression("c[color=red]+2*s[shape=circle]", models.__getitem__)(x), manual(x))
    with pytest.raises(ValueError, match="expected"):
        parse_expression("c[color=red] +", models.__getitem__)


RECIPES = sorted((ROOT / "recipes").rglob("*.toml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_bundled_recipe_parses_into_a_network_and_data_of_one_shape(path):
    """Every shipped recipe parses, and what it builds fits together: its network takes the images its data
    describes, with the attributes the recipe conditions on (a recipe whose [model] and [data] disagree fails)."""
    from composable_ebm.recipes import build_model_from_shapes

    recipe = load_recipe(path)
    assert recipe.trainer.steps > 0 and recipe.sampling is not None
    try:
        attributes, shape = recipe.data.describe(recipe.folder)
    except FileNotFoundError as err:  # a template's folder, CelebA's or CIFAR-10's files are the user's to give
        pytest.skip(f"its data is not here: {err}")
    with torch.device("meta"):
        model = build_model_from_shapes(recipe)
    assert tuple(model.sample_shape) == tuple(shape)  # a latent model's samples are decoded images of the data's shape
    assert dict(model.attributes) == {a: tuple(attributes[a]) for a in recipe.data.attributes}


def test_shapes_recipe_builds_its_network_and_data():
    recipe = load_recipe(ROOT / "recipes" / "shapes-color.toml")
    from dataclasses import replace

    data = build_dataset(replace(recipe.data, n=16))
    model = build_model(recipe, data)
    assert model.attributes == {"color": ("red", "green", "blue")} and model.input_shape == (3, 16, 16)
    assert model(data.images[:2], {"color": torch.zeros(2, dtype=torch.long)}).shape == (2,)


def test_recipe_errors_name_the_file_and_valid_settings(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[trainer]\nstepz = 3\n")
    with pytest.raises(ValueError, match=r"bad.toml: unknown TrainerConfig setting\(s\) \['stepz'\]"):
        load_recipe(bad)
    result = runner.invoke(app, ["train", str(bad), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "stepz" in result.output


def test_toy_recipe_trains_and_samples_to_a_scatter_plot(tmp_path):
    recipe = tmp_path / "toy.toml"
    recipe.write_text(
        (ROOT / "recipes" / "toy-8gaussians.toml").read_text().replace("n = 20000", "n = 500")
        .replace("batch_size = 256", "batch_size = 32").replace("hidden = 128", "hidden = 16")
    )
    invoke("train", recipe, "--out", tmp_path / "run", "--steps", "3", "--no-progress")
    invoke("sample", tmp_path / "run" / "model", "-n", "50", "-o", tmp_path / "points.png", "--steps", "5")
    with Image.open(tmp_path / "points.png") as im:
        assert im.size[0] > 100
    result = runner.invoke(app, ["sample", str(tmp_path / "run" / "model"), "--chain", str(tmp_path / "c.png")])
    assert result.exit_code == 2 and "image strips" in result.output


def test_help_shows_the_expression_syntax_unmangled():
    """Square brackets are shown as written (no rich markup) in the help text."""
    out = runner.invoke(app, ["compose", "--help"], terminal_width=200, max_content_width=200).output
    assert '"shapes-color[color=red] + 2*shapes-shape[shape=circle]"' in out and "[attr=value]" in out


def test_version_and_every_commands_help_shows_a_worked_example():
    from composable_ebm import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"composable_ebm {__version__}"
    listing = runner.invoke(app, ["--help"]).output
    commands = [["train"], ["sample"], ["compose"], ["push"], ["plot"], ["info"], ["studio"], ["eval", "compose"],
                ["eval", "ood"]]
    for command in commands:
        assert command[0] in listing
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0 and "Example: cebm " + command[0] in " ".join(result.output.split()), command


def test_sampler_method_and_noise_options_are_honoured_and_checked(tmp_path):
    """MALA at the model's step size with exact noise proposes moves of std 6 in [0, 1] images: every proposal is
    rejected, so the samples would be the starting noise. That is refused in one line; a step size whose proposals
    land samples correctly."""
    result = runner.invoke(app, ["sample", "shapes-color", "-c", "color=blue", "-n", "2", "--steps", "10", "--method",
                                 "mala", "--noise", "exact", "-o", str(tmp_path / "m.png")])
    assert result.exit_code == 2 and "mala accepted none of 10 steps' proposals" in result.output
    assert "lower the step size or the noise" in result.output and not (tmp_path / "m.png").exists()
    result = runner.invoke(app, ["sample", "shapes-color", "-c", "color=blue", "-n", "2", "--steps", "10", "--method",
                                 "mala", "--noise", "exact", "--step-size", "0.00001", "-o", str(tmp_path / "m.png")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["sample", "shapes-color", "--method", "gibbs", "-o", str(tmp_path / "h.png")])
    assert result.exit_code == 2 and "unknown sampler method 'gibbs'; valid choices: ['hmc', 'langevin', 'mala']" in result.output
    result = runner.invoke(app, ["compose", "shapes-color", "--noise", "lots", "-o", str(tmp_path / "h.png")])
    assert result.exit_code == 2 and "'--noise': must be a number or 'exact', got 'lots'" in result.output


def test_the_commands_choices_are_the_librarys():
    import dataclasses
    from typing import get_args

    from composable_ebm.cli import common as cli
    from composable_ebm.pipeline import FORMS
    from composable_ebm.sampling import SamplerConfig
    from composable_ebm.accel.precision import Precision

    assert get_args(cli.Precision) == get_args(Precision)
    assert get_args(cli.Form) == FORMS
    assert set(cli.SAMPLER_SETTINGS) <= {f.name for f in dataclasses.fields(SamplerConfig)}
    from composable_ebm.sampling import LadderConfig

    assert set(cli.CHAIN_FIELDS) == {f.name for f in dataclasses.fields(SamplerConfig)}
    assert set(cli.LADDER_FIELDS) == {f.name for f in dataclasses.fields(LadderConfig)}


def test_sample_and_compose_share_their_sampling_options():
    from composable_ebm.cli import compose, sample

    def options(command):
        return [p for p in inspect.signature(command).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]

    shared = options(compose)
    assert [p.name for p in shared] == [p.name for p in options(sample)] and len(shared) == 14
    for command in ("sample", "compose"):
        text = runner.invoke(app, [command, "--help"]).output
        assert all(f"--{p.name.rstrip('_').replace('_', '-')}" in text or p.name == "n" for p in shared), command


def test_eval_fid_between_image_folders_with_a_classifiers_features(tmp_path):
    from composable_ebm.data import shapes
    from composable_ebm.images import as_float_images, to_pil

    for name, seed in (("real", 1), ("same", 2)):
        (tmp_path / name).mkdir()
        for i, image in enumerate(shapes(64, 16, seed=seed, split="all").images):
            to_pil(as_float_images(image)).save(tmp_path / name / f"{i:03d}.png")
    (tmp_path / "noise").mkdir()
    for i in range(64):
        Image.fromarray(torch.randint(0, 256, (16, 16, 3), dtype=torch.uint8).numpy()).save(tmp_path / "noise" / f"{i}.png")
    scores = {}
    for other in ("same", "noise"):
        result = runner.invoke(app, ["eval", "fid", str(tmp_path / "real"), str(tmp_path / other),
                                     "--features", "shapes-classifier"])
        assert result.exit_code == 0, result.output
        # the JSON line (a progress bar on stderr may interleave with it under load)
        out = json.loads(result.output[result.output.rindex('{"fid"'):].splitlines()[0])
        assert out["real"] == out["fake"] == 64
        scores[other] = out["fid"]
    assert 0 <= scores["same"] < scores["noise"] / 5, scores  # fresh Shapes are close, noise is far
    print(f"FID real vs fresh Shapes {scores['same']:.3f}, vs noise {scores['noise']:.3f}")
    result = runner.invoke(app, ["eval", "fid", str(tmp_path / "real"), str(tmp_path / "nowhere"), "--features",
                                 "shapes-classifier"])
    assert result.exit_code == 2 and "no image folder at" in result.output
    result = runner.invoke(app, ["eval", "fid", str(tmp_path / "real"), str(tmp_path / "same"), "--features", "shapes-color"])
    assert result.exit_code == 2 and "valid choices: an Inception v3 weights file or an attribute classifier" in result.output


# extra arguments that make each example quick here (a later option overrides the example's own)
_QUICK = {"train": ["--steps", "2", "--no-progress"], "sample": ["-n", "2", "--steps", "2", "--no-progress"],
          "compose": ["-n", "2", "--steps", "2", "--no-progress"], "eval compose": ["-n", "2", "--steps", "2"],
          "eval ood": ["-n", "16"], "eval fid": ["--limit", "4"], "train-classifier": ["--steps", "3"],
          "train-autoencoder": ["--steps", "2", "--widths", "8,8,8", "--batch-size", "4", "--held-out", "3"]}
_ORDER = ["train", "push", "plot", "export"]  # push, plot and export use what the train example wrote


def _help_examples() -> dict[str, list[str]]:
    import shlex

    import typer.main

    group = typer.main.get_command(app)
    examples = {}
    for name, command in group.commands.items():
        leaves = command.commands.items() if hasattr(command, "commands") else [(None, command)]
        for sub, leaf in leaves:
            key = f"{name} {sub}" if sub else name
            lines = [line.strip() for line in (leaf.help or "").splitlines() if line.strip().startswith("Example: cebm ")]
            assert len(lines) == 1, f"`cebm {key} --help` should give one example, gives {lines}"
            examples[key] = shlex.split(lines[0].removeprefix("Example: cebm "))
    return examples


def test_every_help_example_parses_and_runs(tmp_path, monkeypatch):
    import importlib.util
    import shutil

    from huggingface_hub import constants

    from tests.hub_server import HubServer

    examples = _help_examples()
    assert {"train", "sample", "compose", "push", "plot", "info", "list", "eval compose", "eval fid",
            "eval ood", "export", "train-classifier", "train-autoencoder"} <= set(examples)
    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "recipes", tmp_path / "recipes")
    for folder in ("data/real", "samples"):
        (tmp_path / folder).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (16, 16), (40 * i, 200, 30)).save(tmp_path / folder / f"{i}.png")
    from tests.test_own_data import make_faces

    make_faces(tmp_path / "data" / "faces", n=12)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    served = []  # the studio example would serve until stopped: record what it would serve instead
    monkeypatch.setattr("composable_ebm.studio.launch", lambda **kwargs: served.append(kwargs))
    order = [k for k in _ORDER if k in examples] + sorted(k for k in examples if k not in _ORDER)
    has_studio = importlib.util.find_spec("gradio") is not None  # the studio extra (in dev; absent elsewhere)
    order = [k for k in order if has_studio or k != "studio"]
    with HubServer() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        for key in order:
            args = examples[key] + _QUICK.get(key, [])
            result = runner.invoke(app, ["--threads", "1", *args])
            assert result.exit_code == 0, (key, args, result.output, result.exception)
        assert "my-org/shapes-color" in hub.repos  # the push example reached the Hub
    device = "cuda" if torch.cuda.is_available() else "cpu"
    studio_args = {"host": "127.0.0.1", "port": 7860, "device": device, "allowed_host": (), "allowed_origin": (),
                   "models_root": None}
    assert served == ([studio_args] if has_studio else [])
    assert (tmp_path / "health.png").is_file() and (tmp_path / "grid.png").is_file()


def test_help_shows_the_bracketed_conditions_and_the_cli_imports_no_torch():
    import subprocess
    import sys

    result = runner.invoke(app, ["compose", "--help"], env={"COLUMNS": "200"})
    assert 'cebm compose "shapes-color[color=red] + shapes-shape[shape=circle]"' in result.output
    result = runner.invoke(app, ["eval", "compose", "--help"], env={"COLUMNS": "200"})
    assert '"shapes-color[color=red] + shapes-shape[shape=circle]" --classifier shapes-classifier' in result.output
    code = ("import sys, composable_ebm.cli as c, typer.main; from typer.testing import CliRunner; "
            "r = CliRunner().invoke(c.app, ['--help']); assert r.exit_code == 0, r.output; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
    out = subprocess.run([sys.executable, "-m", "composable_ebm", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("composable_ebm ")


def test_a_users_card_loads_the_users_model_states_only_this_run_and_sets_no_license(tmp_path, monkeypatch):
    """The usage block loads the model from the folder as it was given (relative to where the command ran); an
    absolute --out, and a folder recipe's root, name no path of the trainer's machine."""
    import re
    import tomllib

    from composable_ebm.model_cards import FOLDER_ROOT, recipe_text

    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "mine.toml"
    recipe.write_text("# a note about other weights that must not reach the card\n" + TINY_RECIPE.format(
        name="mine", attribute="color"))
    run = tmp_path / "run"
    assert runner.invoke(app, ["train", "mine.toml", "--out", "run", "--no-progress", "--steps", "2"]).exit_code == 0
    card = (run / "model" / "README.md").read_text()
    (usage,) = re.findall(r"```python\n(.*?)\n```", card, re.DOTALL)
    namespace: dict = {}
    exec(usage, namespace)  # noqa: S102 - the card's example, as the user would paste it
    assert namespace["model"].name == "mine" and 'cebm.load("run/model")' in usage
    elsewhere = tmp_path / "elsewhere"
    assert runner.invoke(app, ["train", str(recipe), "--out", str(elsewhere), "--no-progress", "--steps", "2"]).exit_code == 0
    assert str(tmp_path) not in (elsewhere / "model" / "README.md").read_text()
    folder_recipe = tmp_path / "folder.toml"
    folder_recipe.write_text('[data]\ndataset = "folder"\nroot = "/home/someone/private/faces"\n')
    assert recipe_text(folder_recipe) == [("folder.toml", f'[data]\ndataset = "folder"\n{FOLDER_ROOT}')]
    assert "license" not in card.split("---")[1] and "must not reach" not in card
    assert "arxiv:2012.01316" in card and "pipeline_tag" not in card  # conditional: no Hub task names it
    (embedded,) = re.findall(r"```toml\n(.*?)\n```", card, re.DOTALL)  # one file: its recipe has no base
    assert tomllib.loads(embedded)["model"]["name"] == "mine"  # complete: it parses on its own
    assert runner.invoke(app, ["train", str(recipe), "--out", str(run), "--no-progress", "--steps", "3",
                               "--license", "apache-2.0"]).exit_code == 0
    assert "license: apache-2.0" in (run / "model" / "README.md").read_text()


def test_list_threads_and_push_token(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from composable_ebm import MLPConfig, MLPEnergy
    from tests.hub_server import HubServer

    # cebm list: the bundled models, then a model in the Hub cache under its revision
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "cache" / "models--someorg--toy"
    save_model(MLPEnergy(MLPConfig(name="toy", hidden=8, depth=1)), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "v1").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    result = runner.invoke(app, ["list", "--json"])
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["shapes-color"]["attributes"] == {"color": ["red", "green", "blue"]}
    assert rows["someorg/toy@v1"]["type"] == "mlp" and rows["shapes-color"]["source"] == "bundled"
    assert "shapes-classifier" in runner.invoke(app, ["list"]).output
    # --threads sets torch's thread count for the command
    before = torch.get_num_threads()
    try:
        assert runner.invoke(app, ["--threads", "1", "info", "shapes-color"]).exit_code == 0
        runner.invoke(app, ["--threads", "1", "sample", "shapes-color", "-c", "color=red", "-n", "1", "--steps", "1",
                            "--no-progress", "-o", str(tmp_path / "s.png")])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert runner.invoke(app, ["--threads", "0", "info", "shapes-color"]).exit_code == 2
    # push --token: the token given, not the environment's
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    folder = save_model(MLPEnergy(MLPConfig(name="toy", hidden=8, depth=1)), tmp_path / "m")
    with HubServer() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        result = runner.invoke(app, ["push", str(folder), "someorg/pushed", "--token", "hf_given"])
        assert result.exit_code == 0, result.output
        assert "Bearer hf_given" in hub.auth and "someorg/pushed" in hub.repos


def test_a_bug_is_reported_as_a_bug_with_debug_advice_not_as_bad_input(monkeypatch):
    def broken(folder):
        return {}["model_type"]  # a programming error inside the library

    monkeypatch.setattr("composable_ebm.persistence.read_config", broken)
    result = runner.invoke(app, ["info", "shapes-color"])
    assert result.exit_code == 1
    line = result.output.strip()
    assert line.startswith("error: internal error (KeyError:") and "--debug" in line and "bug" in line
    assert "\n" not in line and "Traceback" not in result.output
    debug = runner.invoke(app, ["--debug", "info", "shapes-color"])
    assert debug.exit_code == 1 and "Traceback" in debug.output and "KeyError" in debug.output  # the traceback


def test_debug_shows_the_traceback_and_keeps_the_exit_status(tmp_path):
    """--debug prints the traceback of bad input and still exits 2 (bad input), not 1."""
    plain = runner.invoke(app, ["info", str(tmp_path / "nowhere")])
    debug = runner.invoke(app, ["--debug", "info", str(tmp_path / "nowhere")])
    assert plain.exit_code == debug.exit_code == 2
    assert "Traceback" in debug.output and "Traceback" not in plain.output


def test_compose_form_option_picks_the_sampled_energy_and_refuses_an_unknown_form(tmp_path):
    """The default (auto) samples a sum of bundled models in its guided form; --form plain as written."""
    expression = "shapes-color[color=red] + shapes-shape[shape=circle]"
    auto = runner.invoke(app, ["--threads", "1", "compose", expression, "-n", "2", "--steps", "1",
                               "-o", str(tmp_path / "a.png"), "--no-progress"])
    assert auto.exit_code == 0, auto.output
    assert "sampling guided(shapes-color[red] + shapes-shape[circle])" in auto.output
    plain = runner.invoke(app, ["--threads", "1", "compose", expression, "-n", "2", "--steps", "1", "--form", "plain",
                                "-o", str(tmp_path / "p.png"), "--no-progress"])
    assert plain.exit_code == 0 and "sampling (shapes-color[red] + shapes-shape[circle])" in plain.output
    bad = runner.invoke(app, ["compose", expression, "--form", "mixed", "-o", str(tmp_path / "b.png")])
    assert bad.exit_code == 2 and "'mixed' is not one of 'auto', 'plain', 'guided'" in bad.output


def test_the_threads_option_is_taken_after_the_command_too(tmp_path):
    """`cebm compose ... --threads 1` is `cebm --threads 1 compose ...`; after `--` it is an argument; out of range
    it is one line wherever it is written."""
    from composable_ebm.cli.common import _THREADS, hoisted

    assert hoisted(["compose", "e", "-n", "1", "--threads", "1"]) == ["--threads", "1", "compose", "e", "-n", "1"]
    assert hoisted(["eval", "compose", "e", "--threads=2", "--debug"]) == ["--threads=2", "--debug", "eval", "compose", "e"]
    assert hoisted(["compose", "--", "--threads", "1"]) == ["compose", "--", "--threads", "1"]
    out = tmp_path / "g.png"
    result = runner.invoke(app, ["compose", "shapes-color[color=red]", "-n", "1", "--steps", "1", "--threads", "1",
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file() and _THREADS["n"] == 1
    bad = runner.invoke(app, ["compose", "shapes-color[color=red]", "-n", "1", "--threads", "0", "-o", str(out)])
    assert bad.exit_code == 2 and "--threads must be a whole number from 1" in bad.output


def test_a_classifier_of_another_image_size_is_one_line_not_a_silent_score(tmp_path):
    """`cebm eval compose` with a 32-px classifier on 16-px samples: one line naming both sizes and --size."""
    clf = AttributeClassifier(ClassifierConfig(name="clf32", image_size=32, attributes={"color": ("red", "green", "blue")}))
    save_model(clf, tmp_path / "clf32")
    result = runner.invoke(app, ["--threads", "1", "eval", "compose", "shapes-color[color=red]", "--classifier",
                                 str(tmp_path / "clf32"), "-t", "color=red", "-n", "2", "--steps", "1"])
    assert result.exit_code == 2, result.output
    assert "reads 32x32 images with 3 channel(s), got images of shape (3, 16, 16)" in result.output
    assert "cebm train-classifier --size" in result.output
