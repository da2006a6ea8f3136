"""Fuzzing the loaders: a few hundred randomly corrupted model folders, recipes and checkpoints.

Each load either succeeds (a model with finite energies, a recipe, a resumed trainer) or raises the
library's own error (:class:`~composable_ebm.errors.CebmError`) with a one-line message: never
another exception, a hang or an allocation beyond the limits. The counts are printed (``-s``).
"""

from __future__ import annotations

import io
import json
import random
import resource
import time
from collections import Counter

import numpy as np
import pytest
import torch

from composable_ebm import MLPConfig, MLPEnergy
from composable_ebm.errors import CebmError
from composable_ebm.persistence import CONFIG_NAME, WEIGHTS_NAME
from composable_ebm.models import load_model, save_model
from composable_ebm.nets import ResNetEnergy
from composable_ebm.recipes import load_recipe
from composable_ebm.sampling import SamplerConfig
from composable_ebm.training import ContrastiveConfig, Trainer, TrainerConfig
from tests.conftest import tiny_config
from tests.test_cli import TINY_RECIPE

pytestmark = pytest.mark.fuzz

STRANGE_VALUES = ["x", "", -1, 0, 1.5, 10**9, 10**30, -(10**12), None, [], {}, True, [1, 2, 3], {"a": 1}, float("nan"),
                  float("inf"), "NaN", 40000]


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


def _flip_bits(data: bytes, rng: random.Random, near_start: bool = False) -> bytes:
    out = bytearray(data)
    span = min(len(out), 400) if near_start else len(out)  # headers live at the start
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(span)
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    yield path


def _mutate_json(payload, rng: random.Random):
    payload = json.loads(json.dumps(payload))
    paths = [p for p in _leaves(payload) if p]
    path = rng.choice(paths)
    parent = payload
    for key in path[:-1]:
        parent = parent[key]
    action = rng.random()
    if action < 0.15 and isinstance(parent, dict):
        del parent[path[-1]]
    elif action < 0.25 and isinstance(parent, dict):
        parent[f"extra_{rng.randrange(100)}"] = rng.choice(STRANGE_VALUES)
    else:
        parent[path[-1]] = rng.choice(STRANGE_VALUES)
    return payload


def _expect_clean(run, outcomes: Counter, what: str) -> None:
    """Run one load: success or a one-line CebmError; anything else fails the test with the case."""
    t0 = time.perf_counter()
    try:
        run()
        outcomes[f"{what}: loaded"] += 1
    except CebmError as err:
        message = str(err)
        assert message and "\n" not in message, (what, message)
        outcomes[f"{what}: {type(err).__name__}"] += 1
    assert time.perf_counter() - t0 < 10, what  # no hang


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, bytes | dict]:
    root = tmp_path_factory.mktemp("originals")
    torch.manual_seed(0)
    random.seed(0)  # the checkpoint holds the global RNG states: the same bytes in every run
    np.random.seed(0)
    save_model(ResNetEnergy(tiny_config(name="r", attributes={"color": ("red", "green")})), root / "resnet")
    save_model(MLPEnergy(MLPConfig(name="m", hidden=8, depth=2)), root / "mlp")
    trainer = Trainer(MLPEnergy(MLPConfig(hidden=8, depth=1)), torch.randn(32, 2), _trainer_config(), out_dir=root / "run")
    trainer.fit(2)
    trainer.close()
    return {
        "resnet": root / "resnet",
        "mlp": root / "mlp",
        "checkpoint": (root / "run" / "checkpoint.pt").read_bytes(),
        "recipe": TINY_RECIPE.format(name="f", attribute="color"),
    }


def _trainer_config() -> TrainerConfig:
    return TrainerConfig(steps=2, batch_size=8, log_every=1, checkpoint_every=1,
                         objective=ContrastiveConfig(sampler=SamplerConfig(step_size=0.05, noise=0.01, steps=2),
                                                     chain_augment=None, buffer_size=32, ent_bank=4, ent_min_buffer=4))


@pytest.mark.parametrize("seed", [1234, 7, 99])
def test_corrupted_model_folders_recipes_and_checkpoints_load_or_raise_the_librarys_error(tmp_path, originals, capsys,
                                                                                        seed):
    rng = random.Random(seed)
    outcomes: Counter = Counter()
    peak_before = _peak_mb()
    # 1. model folders: config.json mutated as JSON or as bytes, weights truncated or bit-flipped
    for i in range(200):
        source = originals["resnet" if i % 2 else "mlp"]
        folder = tmp_path / f"model{i}"
        folder.mkdir()
        config = (source / CONFIG_NAME).read_bytes()
        weights = (source / WEIGHTS_NAME).read_bytes()
        kind = rng.choice(["json", "json", "json", "config bytes", "truncate weights", "flip header", "flip weights"])
        if kind == "json":
            config = json.dumps(_mutate_json(json.loads(config), rng)).encode()
        elif kind == "config bytes":
            config = _flip_bits(config, rng) if rng.random() < 0.5 else _truncate(config, rng)
        elif kind == "truncate weights":
            weights = _truncate(weights, rng)
        elif kind == "flip header":
            weights = _flip_bits(weights, rng, near_start=True)
        else:
            weights = _flip_bits(weights, rng)
        (folder / CONFIG_NAME).write_bytes(config)
        (folder / WEIGHTS_NAME).write_bytes(weights)

        def load(folder=folder):
            model = load_model(folder)
            x = torch.rand(3, *model.input_shape)
            labels = {a: torch.zeros(3, dtype=torch.long) for a in model.attributes}
            assert torch.isfinite(model(x, labels or None)).all()

        _expect_clean(load, outcomes, f"model ({kind})")
    # 2. recipes: a value replaced, bytes flipped or the file cut short
    recipe = originals["recipe"]
    for i in range(100):
        path = tmp_path / f"recipe{i}.toml"
        action = rng.random()
        if action < 0.6:
            lines = recipe.splitlines()
            candidates = [j for j, line in enumerate(lines) if " = " in line]
            j = rng.choice(candidates)
            key = lines[j].split(" = ")[0]
            value = rng.choice(['"x"', "-1", "0", "1.5", "1000000000000", "true", "[]", "{}", "nan", "inf", "40000",
                                '[1, "a"]', "{ a = 1 }"])
            lines[j] = f"{key} = {value}"
            path.write_text("\n".join(lines))
        elif action < 0.8:
            path.write_bytes(_flip_bits(recipe.encode(), rng))
        else:
            path.write_bytes(_truncate(recipe.encode(), rng))
        _expect_clean(lambda path=path: load_recipe(path), outcomes, "recipe")
    # 3. checkpoints: truncated or bit-flipped, then resumed
    for i in range(60):
        run = tmp_path / f"run{i}"
        run.mkdir()
        data = originals["checkpoint"]
        data = _truncate(data, rng) if rng.random() < 0.5 else _flip_bits(data, rng)
        (run / "checkpoint.pt").write_bytes(data)
        trainer = Trainer(MLPEnergy(MLPConfig(hidden=8, depth=1)), torch.randn(32, 2), _trainer_config(), out_dir=run)
        try:
            _expect_clean(trainer.resume, outcomes, "checkpoint")
        finally:
            trainer.close()
    assert _peak_mb() - peak_before < 500  # no case allocated what a hostile size asked for
    total = sum(outcomes.values())
    assert total == 360
    loaded = sum(v for k, v in outcomes.items() if k.endswith("loaded"))
    assert 0 < loaded < total  # the corruptions are neither all harmless nor all fatal
    with capsys.disabled():
        print(f"\nfuzz (seed {seed}): {total} corrupted files; " + "; ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))


REVISION_PIECES = ["..", "/", "\\", "\x00", "\x1f", "\x7f", "~", "^", ":", "?", "*", "[", " ", "@{", "@", ".", ".lock",
                   "main", "v1", "refs", "pr", "é", "🙂", "a" * 300, "%2e%2e", "victim.txt"]


@pytest.mark.filterwarnings("ignore:.*dropped a torn last line")
def test_new_families_load_or_raise_the_librarys_error(tmp_path, originals, monkeypatch, capsys):
    """Revisions and names as a remote or a user might send them, configs that ask for huge activations or
    endless sampling, symlinked files, damaged log lines: each a one-line CebmError or a clean result."""
    from huggingface_hub import constants

    from composable_ebm.training.log import read_log

    rng = random.Random(5)
    outcomes: Counter = Counter()
    peak_before = _peak_mb()
    cache = tmp_path / "cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # nothing leaves the machine; the cache answers or not
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    # 1. revisions and repository names
    for _ in range(150):
        revision = "".join(rng.choice(REVISION_PIECES) for _ in range(rng.randint(1, 4)))
        name = rng.choice(["someorg/toy", "someorg/../toy", "../../x/y", "a/b/c", "someorg/" + "x" * 200, "org/na me"])
        _expect_clean(lambda: load_model(f"{name}@{revision}"), outcomes, "revision")
    assert victim.read_text() == "keep" and not [p for p in tmp_path.rglob("*") if p.is_file() and p != victim
                                                and "cache" not in p.parts]
    # 2. configs that ask for huge activations or sampler work
    config = json.loads((originals["resnet"] / CONFIG_NAME).read_text())
    weights = (originals["resnet"] / WEIGHTS_NAME).read_bytes()
    for i in range(60):
        payload = json.loads(json.dumps(config))
        if i % 2:
            payload["config"]["image_size"] = rng.choice([16, 64, 1024, 2048, 4096])
            payload["config"]["stem_channels"] = rng.choice([4, 64, 512, 8192])
        else:
            payload["sampler"] = {"step_size": 1.0, "noise": 0.01, "steps": rng.choice([0, 1, 2**10, 2**20, 2**24]),
                                  "rounds": rng.choice([1, 2**10, 2**20]), "final_steps": rng.choice([0, 2**24])}
        folder = tmp_path / f"big{i}"
        folder.mkdir()
        (folder / CONFIG_NAME).write_text(json.dumps(payload))
        (folder / WEIGHTS_NAME).write_bytes(weights)
        _expect_clean(lambda folder=folder: load_model(folder), outcomes, "size config")
    # 3. symlinks: a linked folder, files linked to a folder, /dev/null, nowhere, or themselves
    targets = {"folder": originals["resnet"], "dir": tmp_path, "null": "/dev/null", "nowhere": tmp_path / "nowhere",
               "loop": None}
    for i, (kind, target) in enumerate(targets.items()):
        for linked in (CONFIG_NAME, WEIGHTS_NAME, "."):
            folder = tmp_path / f"link{i}{linked.replace('.', '_')}"
            if linked == ".":
                folder.symlink_to(target if target is not None else folder, target_is_directory=True)
            else:
                folder.mkdir()
                for name in (CONFIG_NAME, WEIGHTS_NAME):
                    if name != linked:
                        (folder / name).write_bytes((originals["resnet"] / name).read_bytes())
                (folder / linked).symlink_to(target if target is not None else folder / linked)
            _expect_clean(lambda folder=folder: load_model(folder), outcomes, f"symlink ({kind})")
    # 4. damaged log lines
    pieces = ['{"step": 1, "e_diff": 0.1}', "42", '"text"', "[1, 2]", "{}", '{"step": "x"}', '{"step": 1.5}', "null",
              '{"event": "fault", "step": 2}', "\xff", "{", '{"step": 3', "", "   "]
    for i in range(80):
        path = tmp_path / f"log{i}.jsonl"
        path.write_text("\n".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) + "\n", encoding="utf-8",
                        errors="surrogateescape")
        _expect_clean(lambda path=path: read_log(path), outcomes, "log")
    assert _peak_mb() - peak_before < 500
    assert outcomes["size config: loaded"] > 0 and outcomes["size config: ModelFileError"] > 0
    with capsys.disabled():
        print("\nfuzz (new families): " + "; ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))


@pytest.mark.parametrize("word, position", [(-1, 0), (2**32, 0), (5, 625)])
def test_a_checkpoint_whose_python_rng_state_is_out_of_range_is_one_line(tmp_path, originals, word, position):
    """A bit flip can leave Python's generator state with a word outside 32 bits (``random.setstate`` then raises
    OverflowError) or a position past 624: refused as a damaged file, one line, before anything is restored."""
    from composable_ebm.errors import ModelFileError

    state = torch.load(io.BytesIO(originals["checkpoint"]), weights_only=True)
    state["rng"]["python"]["internal"][0] = word
    state["rng"]["python"]["internal"][-1] = position if position else state["rng"]["python"]["internal"][-1]
    run = tmp_path / "run"
    run.mkdir()
    torch.save(state, run / "checkpoint.pt")
    trainer = Trainer(MLPEnergy(MLPConfig(hidden=8, depth=1)), torch.randn(32, 2), _trainer_config(), out_dir=run)
    with pytest.raises(ModelFileError, match=r"rng\.python is not a state") as err:
        trainer.resume()
    assert "\n" not in str(err.value)


def test_folder_tables_and_studio_requests_load_or_raise_the_librarys_error(tmp_path, capsys):
    """Attribute tables as a user or a stranger might write them (rows outside the folder, duplicated columns and
    files, words and numbers, damaged images) and studio requests as any page might send them: each a one-line
    CebmError or a clean result, nothing read outside the folder."""
    from PIL import Image

    from composable_ebm import studio
    from composable_ebm.data import attribute_folder

    rng = random.Random(11)
    outcomes: Counter = Counter()
    root = tmp_path / "faces"
    root.mkdir()
    for i in range(4):
        Image.new("RGB" if i % 2 else "L", (16, 16), 90 * i).save(root / f"{i}.png")
    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 20)
    outside = tmp_path / "secret.png"
    Image.new("RGB", (16, 16)).save(outside)
    names = ["0.png", "1.png", "2.png", "3.png", "broken.png", "../secret.png", str(outside), "missing.png",
             "sub/../0.png", "0.png"]
    values = ["1", "-1", "0", "yes", "red", "7", "--1", "1.5", "x" * 50]
    for i in range(120):
        columns = rng.sample(["Smiling", "Hat", "hair", "Smiling", "-Hat", "digit"], rng.randint(1, 3))
        pick = lambda pool, good: rng.choice(good if rng.random() < 0.85 else pool)  # noqa: E731 - mostly valid
        rows = [(pick(names, names[:4]), [pick(values, values[:2]) for _ in columns]) for _ in range(rng.randint(0, 4))]
        if len({n for n, _ in rows}) < len(rows):  # a repeated file is its own case, not the usual one
            rows = rows[:1] if rng.random() < 0.7 else rows
        count = len(rows) if rng.random() < 0.8 else len(rows) + 1
        table = root / "list_attr_celeba.txt"
        table.write_text("\n".join([str(count), " ".join(columns), *(f"{n} {' '.join(v)}" for n, v in rows)]) + "\n")
        holdout = rng.choice([(), (), ({"Smiling": "yes"},), ({"nope": "1"},)])
        _expect_clean(lambda: attribute_folder(root, image_size=rng.choice([8, 16, 16, 128]), holdout=holdout),
                      outcomes, "folder table")
    models = studio.ModelCache("cpu")
    expressions = ["shapes-color[color=red]", "shapes-color[color=red] - shapes-color[color=red]", "", "((((",
                   "shapes-color[color=purple]", "guided(shapes-color)", "1e308*shapes-color[color=red]"]
    fields = [None, "", "0", "-1", "1e9", "abc", "3", 2**70, float("nan"), 16, 65, True]
    for i in range(40):
        expression = rng.choice(expressions)
        valid = rng.random() < 0.3  # some requests the studio serves, most it refuses
        _expect_clean(lambda: studio.generate(models, expression if not valid else expressions[0],
                                              n=rng.choice(fields) if not valid else 2,
                                              seed=rng.choice(fields) if not valid else i,
                                              steps=rng.choice(["", "1", "0", "1048576", "x"]) if not valid else "1",
                                              step_size=rng.choice(["", "1", "-1", "nan"]) if not valid else "",
                                              out_dir=tmp_path),
                      outcomes, "studio request")
    assert outcomes["folder table: loaded"] > 0 and outcomes["folder table: InvalidInputError"] > 0
    assert outcomes["studio request: loaded"] > 0 and outcomes["studio request: InvalidInputError"] > 0
    with capsys.disabled():
        print("\nfuzz (folder tables, studio requests): " + "; ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
