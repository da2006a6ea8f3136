"""The studio's logic without a browser: terms and expressions, readings, one generation, the command."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from typer.testing import CliRunner

from composable_ebm import studio
from composable_ebm.cli import app
from composable_ebm.errors import InvalidInputError
from composable_ebm.studio import Term, expression_to_terms, terms_to_expression

RED_CIRCLE_LARGE = [Term("shapes-color", {"color": "red"}), Term("shapes-shape", {"shape": "circle"}),
                    Term("shapes-size", {"size": "large"})]


def test_terms_write_the_expression_cebm_compose_takes():
    assert terms_to_expression(RED_CIRCLE_LARGE) == \
        "shapes-color[color=red] + shapes-shape[shape=circle] + shapes-size[size=large]"
    terms = [Term("shapes-color", {"color": "blue"}), Term("shapes-shape", {"shape": "square"}, 0.5, "and not"),
             Term("shapes-size", {"size": "small"}, 2.0, "or", 0.5)]
    assert terms_to_expression(terms) == \
        "shapes-color[color=blue] - 0.5*shapes-shape[shape=square] | 2*shapes-size[size=small] / 0.5"
    assert terms_to_expression(terms, "guided") == \
        "guided(shapes-color[color=blue] - 0.5*shapes-shape[shape=square]) | guided(2*shapes-size[size=small] / 0.5)"
    assert terms_to_expression([Term("shapes-shape", {"shape": "square"}, op="and not")]) == \
        "-shapes-shape[shape=square]"


@pytest.mark.parametrize("form", ["auto", "guided"])
def test_every_expression_the_controls_write_reads_back_into_the_same_controls(form):
    cases = [
        RED_CIRCLE_LARGE,
        [Term("shapes-color", {"color": "blue"}), Term("shapes-shape", {"shape": "square"}, 0.5, "and not")],
        [Term("shapes-color", {"color": "red"}), Term("shapes-color", {"color": "blue"}, op="or")],
        [Term("org/model@v1", {"a": "1", "b": "x"}, 3.0, "and", 2.0), Term("./runs/x/model", {}, 1.5, "and not")],
    ]
    for terms in cases:
        parsed = expression_to_terms(terms_to_expression(terms, form))
        assert parsed == (terms, form)


def test_expressions_the_controls_cannot_show_are_recognised():
    for text in ["(shapes-color[color=red] + shapes-shape[shape=circle]) * 2",  # a weight on a group
                 "guided(shapes-color[color=red]) | shapes-shape[shape=circle]",  # guided and plain mixed
                 " + ".join(["shapes-color[color=red]"] * (studio.MAX_TERMS + 1)),
                 "shapes-color[color=red, color=blue]",
                 "shapes-color / 2 / 3"]:
        assert expression_to_terms(text) is None, text
    # the controls read expression.py's tree, where parentheses around one model leave no node: the same energy
    assert expression_to_terms("2*(shapes-color[color=red])") == (
        [Term("shapes-color", {"color": "red"}, 2.0, "and", None)], "auto")
    with pytest.raises(InvalidInputError, match="cannot parse"):
        expression_to_terms("shapes-color[color=red] & shapes-shape")


def test_a_term_the_grammar_cannot_write_is_one_line_naming_the_fix():
    with pytest.raises(InvalidInputError, match="'and not'"):
        terms_to_expression([Term("shapes-color", {"color": "red"}, weight=-1.0)])
    with pytest.raises(InvalidInputError, match="no model"):
        terms_to_expression([Term("  ")])
    with pytest.raises(InvalidInputError, match="binds color twice"):
        studio.terms_from_slots(1, ["and", "shapes-color", ["color=red", "color=blue"], 1, 1])
    with pytest.raises(InvalidInputError, match="not attr=value"):
        studio.terms_from_slots(1, ["and", "shapes-color", ["red"], 1, 1])
    assert studio.terms_from_slots(1, ["and not", "m", ["a=1"], 2, 1]) == [Term("m", {"a": "1"}, 2.0, "and not")]


class _FixedClassifier(torch.nn.Module):
    """Reads every image as the values given (a stand-in whose answer the test controls)."""

    def __init__(self, reads: dict[str, list[int]]) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(1))
        self.reads = reads
        self.config = type("C", (), {"attributes": {"color": ("red", "green", "blue"), "shape": ("circle", "square")}})

    def predict(self, x):
        return {a: torch.tensor(v[: x.shape[0]]) for a, v in self.reads.items()}


def test_readings_mark_asked_values_right_or_wrong_and_leave_the_rest_unmarked():
    clf = _FixedClassifier({"color": [0, 2, 2], "shape": [0, 0, 1]})
    asked = studio.asked_attributes([Term("m", {"color": "red"}), Term("s", {"shape": "square"}, op="and not")])
    readings = studio.read_samples(torch.zeros(3, 3, 4, 4), clf, asked)
    assert readings[0].values == [("color", "red", True), ("shape", "circle", True)]
    assert readings[1].values == [("color", "blue", False), ("shape", "circle", True)]
    assert [r.as_asked for r in readings] == [True, False, False]
    # an or is right when either alternative is: blue reads right against "red | blue"
    either = studio.asked_attributes([Term("m", {"color": "red"}), Term("m", {"color": "blue"}, op="or")])
    assert [r.as_asked for r in studio.read_samples(torch.zeros(3, 3, 4, 4), clf, either)] == [True, True, True]
    unasked = studio.read_samples(torch.zeros(3, 3, 4, 4), clf, None)
    assert [r.as_asked for r in unasked] == [None, None, None]
    page = studio.readings_html(torch.rand(3, 3, 4, 4), readings)
    assert page.count("<figure") == 3 and "1 of 3 samples read as asked" in page and page.count("&#10007;") == 3  # blue; blue and square


def test_generate_samples_the_expression_and_reads_it(tmp_path):
    models = studio.ModelCache("cpu")
    steps = []
    made = studio.generate(models, terms_to_expression(RED_CIRCLE_LARGE), n=4, seed=3, steps="5", step_size="",
                           on_step=lambda step, total: steps.append((step, total)), out_dir=tmp_path)
    assert made.samples.shape == (4, 3, 16, 16) and len(made.readings) == 4
    assert steps[-1] == (steps[-1][1], steps[-1][1]) and steps[-1][1] == 5  # one round of 5 (the models' own: 1 x 60)
    assert made.png.is_file() and made.grid.size == (2 * 66 + 2, 2 * 66 + 2)  # 16 px shown at 64 px, 2 px gaps
    assert all(m is not None for r in made.readings for a, _, m in r.values if a in ("color", "shape", "size"))
    again = studio.generate(models, terms_to_expression(RED_CIRCLE_LARGE), n=4, seed=3, steps=5, out_dir=tmp_path)
    assert torch.equal(again.samples, made.samples)  # same seed, same samples; models loaded once
    assert sorted(models.models) == ["shapes-classifier", "shapes-color", "shapes-shape", "shapes-size"]
    summary = studio.sampler_summary(models, "shapes-color[color=red]")
    assert "1 x 60 steps, step size 20" in summary and "(60 steps in all)" in summary


@pytest.mark.models
def test_faces_composites_are_read_by_the_bundled_faces_classifier(tmp_path):
    made = studio.generate(studio.ModelCache("cpu"), "faces-smiling[smiling=yes] + faces-hat[hat=yes]", n=2, seed=0,
                           out_dir=tmp_path)
    assert made.classifier == "faces-classifier" and made.samples.shape == (2, 3, 16, 16)
    assert all({"smiling", "hat"} <= {a for a, _, _ in r.values} for r in made.readings)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(n=0), "number of samples"), (dict(seed=-1), "seed"), (dict(steps="1.5"), "steps must be a whole number"),
    (dict(step_size="fast"), "step size must be a number"), (dict(expression="shapes-colour[color=red]"), "shapes-colour"),
    (dict(expression="shapes-color[color=purple]"), "purple"),
])
def test_bad_generate_input_is_one_line_naming_it(kwargs, needle):
    kwargs = {"expression": "shapes-color[color=red]", **kwargs}
    with pytest.raises(Exception) as info:
        studio.generate(studio.ModelCache("cpu"), **kwargs)
    line = studio.error_line(info.value)
    assert line.startswith("error: ") and needle in line and "\n" not in line


def test_a_bug_reads_as_a_bug_not_as_bad_input():
    assert studio.error_line(ZeroDivisionError("division by zero")).startswith("internal error (ZeroDivisionError")
    assert studio.error_line(InvalidInputError("bad")) == "error: bad"


def test_studio_without_gradio_prints_the_install_line_and_exits_2(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gradio" else real(name, *a))
    result = CliRunner().invoke(app, ["studio"])
    assert result.exit_code == 2
    assert 'pip install -e ".[studio]"' in result.output and "Traceback" not in result.output


def test_the_space_app_in_the_docs_builds_the_studio():
    gradio = pytest.importorskip("gradio")
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "studio.md").read_text()
    block = text.split("Its `app.py`:\n\n```python\n", 1)[1].split("```", 1)[0]
    namespace = {"__name__": "space_app"}  # not __main__: build the app without serving it
    exec(compile(block, "app.py", "exec"), namespace)
    demo = namespace["demo"]
    assert isinstance(demo, gradio.Blocks)
    ids = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    assert {"expression", "form", "generate", "stop", "grid", "readings", "download", *[f"term-{i}" for i in
            range(studio.MAX_TERMS)]} <= set(ids)
    assert ids["form"].value == "auto"  # as cebm compose and .sample() sample by default
    assert ids["expression"].value == terms_to_expression(list(studio.DEFAULT_TERMS), "auto")
    assert demo._queue.default_concurrency_limit == 1  # one request at a time


def _generate_over_http(url: str, expression: str) -> str:
    """Press Generate through the studio's HTTP API (as the page does) and return the event stream's end."""
    import http.client
    import json
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = f"{parts.hostname}:{parts.port}"
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    body = json.dumps({"data": [expression, "auto", 0, 1, "1", ""]})
    conn.request("POST", "/gradio_api/call/on_generate", body, {"Host": host, "Content-Type": "application/json"})
    response = conn.getresponse()
    event = json.loads(response.read())["event_id"]
    conn.request("GET", f"/gradio_api/call/on_generate/{event}", headers={"Host": host})
    text = conn.getresponse().read().decode()
    conn.close()
    return text


def test_the_studio_holds_at_most_its_cache_of_models_however_many_it_serves(tmp_path):
    """Driven over HTTP through 20 distinct model folders, the studio keeps the weights of at most `MAX_MODELS` of
    them alive: live parameter tensors counted by their bytes, with the cyclic garbage collector off, so a model kept
    only by a reference cycle counts as held (freed pages an allocator keeps are not counted)."""
    import gc
    import json
    import os

    from composable_ebm.models import BUNDLED_DIR

    pytest.importorskip("gradio")
    source = BUNDLED_DIR / "shapes-color"
    for i in range(20):  # distinct folders and names, the weights hard-linked: no copies on disk
        folder = tmp_path / f"color-{i}"
        folder.mkdir()
        config = json.loads((source / "config.json").read_text())
        config["config"]["name"] = f"served-{i}"
        (folder / "config.json").write_text(json.dumps(config))
        os.link(source / "model.safetensors", folder / "model.safetensors")
    model_bytes = (source / "model.safetensors").stat().st_size

    def served_weights() -> int:  # the parameters of every served model gc can still reach, by their storage's bytes
        storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for m in gc.get_objects()
                    if isinstance(m, torch.nn.Module) and str(getattr(getattr(m, "config", None), "name", "")
                                                              ).startswith("served-") for p in m.parameters()}
        return sum(storages.values())

    app = studio.launch("127.0.0.1", device="cpu", prevent_thread_lock=True, quiet=True, models_root=tmp_path)
    gc.collect()
    gc.disable()
    try:
        for i in range(20):
            end = _generate_over_http(app.local_url, f"color-{i}[color=red]")
            assert "event: complete" in end and "sampled" in end, end[-300:]
        held = served_weights()
    finally:
        gc.enable()
        app.close()
    assert 0 < held <= studio.MAX_MODELS * model_bytes, (held / model_bytes, studio.MAX_MODELS)


def test_the_studio_opens_on_the_sentence_the_readme_shows():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    first = re.search(r'cebm compose "([^"]+)"', readme).group(1)  # the README's first command
    assert terms_to_expression(list(studio.DEFAULT_TERMS)) == first
    models = studio.ModelCache("cpu")
    assert studio.covering_classifier(models, models.energy(first)) == "faces-classifier"
    assert sorted(models.models) == ["faces-classifier", "faces-glasses", "faces-hat", "faces-smiling"]  # none other


@pytest.mark.parametrize("name", ["someorg/not-cached", "someorg/not-cached@v2", "o" * 90 + "/" + "n" * 90])
def test_an_uncached_hub_name_in_the_studio_is_one_whole_line_saying_it_downloads_nothing(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(Exception) as info:
        studio.generate(studio.ModelCache("cpu"), f"{name}[x=1]", n=1)
    line = studio.error_line(info.value)
    assert line.startswith("error: ") and line.endswith("once on this machine to fetch it, then use it here"), line
    assert "the studio downloads nothing" in line and "\n" not in line
