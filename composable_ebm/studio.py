"""``cebm studio``: compose models in the browser.

A local web app (Gradio, the optional ``studio`` extra: ``pip install -e ".[studio]"``) that edits a list
of terms, shows the expression ``cebm compose`` would take for them, samples it through the same pipeline
(`composable_ebm.pipeline.sample`) and shows each sample with the reading of a classifier that covers the models'
attributes (`covering_classifier`). Its controls show the tree of the one expression grammar
(`composable_ebm.expression.parse_tree`).

The first half of this module holds the page's logic as plain functions (terms to expression and back,
readings, one generation), tested without a browser; `build_app` wires them to Gradio components.
"""

from __future__ import annotations

import base64
import html
import io
import logging
import math
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composable_ebm.errors import InvalidInputError, bug_line, exit_code_for, one_line
from composable_ebm.expression import (GuidedNode, ModelNode, Node, Or, Sum, Temperature, Weighted, parse_expression,
                                       parse_tree, tokenize)

log = logging.getLogger(__name__)

OPERATORS = ("and", "and not", "or")
"""How a term joins the terms before it: ``+``, ``-`` (a weighted negation) or ``|`` (a new alternative)."""
FORMS = ("auto", "guided", "plain")
"""How the page samples its expression, as `cebm compose`'s ``--form`` does (`page_form`): ``auto`` (the default, as
in Python and the command line: a sum of conditioned models with a null condition in its guided form, anything
else as written), ``guided`` (the text says ``guided(a + b)``) or ``plain`` (as written). The note under the
expression names the command."""
MAX_MODELS = 8
"""Most models the studio keeps loaded at once (`ModelCache`, least recently used first out)."""
MAX_UPLOAD_BYTES = 1
"""Gradio's own bound on an uploaded file: the studio takes none (`HostGuard` refuses the upload route first)."""
MAX_KEPT_GRIDS = 16
"""Most generated PNGs the studio keeps on disk for Download; older ones are removed."""
MAX_TERMS = 8
"""Most terms the controls show; a longer expression is still sampled, as typed."""
MAX_SAMPLES = 64
"""Most samples one Generate draws (the library's own bound is far larger)."""
MAX_STEPS = 1000
"""Most Langevin steps of one Generate's chains (``rounds x steps + final_steps``)."""
MAX_WORK = 64 * 240
"""Most sample-steps (samples x steps) of one Generate: 64 samples of 240 steps, 16 of 960. On the 2-core CPU of
the benchmarks the bundled composite runs about 600 sample-steps a second, so a request holds the studio for about
half a minute at most."""
CLASSIFIER = "shapes-classifier"
"""The classifier tried first; any other bundled or cached classifier that covers the models is used too."""
INSTALL_LINE = 'pip install -e ".[studio]"  (from a clone; or pip install "composable_ebm[studio]")'


@dataclass
class Term:
    """One row of the page: a model, the values it is conditioned on, a weight, how it joins the terms
    before it and an optional temperature."""

    model: str
    bindings: dict[str, str] = field(default_factory=dict)
    weight: float = 1.0
    op: str = "and"
    temperature: float | None = None

    def check(self) -> None:
        if not self.model.strip():
            raise InvalidInputError("a term has no model; pick one or remove the term")
        if self.op not in OPERATORS:
            raise InvalidInputError(f"unknown operator {self.op!r}; valid choices: {list(OPERATORS)}")
        if not (isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and self.weight > 0):
            raise InvalidInputError(f"the weight of {self.model} must be a number > 0, got {self.weight!r};"
                                    " to subtract a term, use the operator 'and not'")
        if self.temperature is not None and not (math.isfinite(self.temperature) and self.temperature > 0):
            raise InvalidInputError(f"the temperature of {self.model} must be a number > 0, got {self.temperature!r}")


def _number(x: float) -> str:
    """A number as the expression grammar reads it: 2, 0.5, 1e-05."""
    return format(float(x), "g")


def term_text(term: Term) -> str:
    """One term as an expression: ``2*shapes-color[color=red] / 0.5``."""
    text = term.model.strip()
    if term.bindings:
        text += "[" + ", ".join(f"{a}={v}" for a, v in term.bindings.items()) + "]"
    if term.weight != 1:
        text = f"{_number(term.weight)}*{text}"
    if term.temperature is not None and term.temperature != 1:
        text += f" / {_number(term.temperature)}"
    return text


def alternatives(terms: Sequence[Term]) -> list[list[Term]]:
    """The terms split at each ``or``: the sums whose disjunction the expression is."""
    groups: list[list[Term]] = []
    for term in terms:
        if not groups or term.op == "or":
            groups.append([])
        groups[-1].append(term)
    return groups


def terms_to_expression(terms: Sequence[Term], form: str = "auto") -> str:
    """The expression ``cebm compose`` takes for ``terms``: ``and`` is ``+``, ``and not`` is ``-``, ``or``
    starts a new alternative (``|``); in the guided form each alternative is wrapped in ``guided(...)``."""
    if form not in FORMS:
        raise InvalidInputError(f"unknown form {form!r}; valid choices: {list(FORMS)}")
    if not terms:
        raise InvalidInputError("no terms: add a term to compose")
    parts = []
    for group in alternatives(terms):
        text = ""
        for i, term in enumerate(group):
            term.check()
            negative = term.op == "and not"
            if i == 0:
                text = ("-" if negative else "") + term_text(term)
            else:
                text += (" - " if negative else " + ") + term_text(term)
        parts.append(f"guided({text})" if form == "guided" else text)
    return " | ".join(parts)


class Stopped(Exception):
    """The page's Stop: raised between two Langevin steps of the generation it stops."""


class _Unshowable(Exception):
    """The expression is valid grammar but the controls cannot show it."""


def _tree_terms(tree: Node) -> tuple[list[Term], str]:
    """The terms and form of an expression's tree (`composable_ebm.expression.parse_tree`): a disjunction of
    (guided) sums of weighted, tempered models; anything else is `_Unshowable`."""
    terms: list[Term] = []
    forms = set()
    for alternative in tree.alternatives if isinstance(tree, Or) else (tree,):
        guided = isinstance(alternative, GuidedNode)
        body = alternative.node if guided else alternative
        forms.add("guided" if guided else "auto")
        group = [_tree_term(node, "and not" if sign < 0 else "and")
                 for sign, node in (body.terms if isinstance(body, Sum) else ((1, body),))]
        if terms:
            group[0].op = "or"
        terms += group
    if len(forms) != 1 or len(terms) > MAX_TERMS:
        raise _Unshowable
    return terms, forms.pop()


def _tree_term(node: Node, op: str) -> Term:
    weight, temperature = 1.0, None
    while not isinstance(node, ModelNode):
        if isinstance(node, Weighted):
            weight *= node.weight
        elif isinstance(node, Temperature) and temperature is None:
            temperature = node.temperature
        else:  # a sum, a disjunction or a guided form inside a term, or a second temperature
            raise _Unshowable
        node = node.node
    if weight <= 0 or (temperature is not None and temperature <= 0):
        raise _Unshowable
    return Term(node.name, dict(node.bindings), weight, op, temperature)


def expression_to_terms(text: str) -> tuple[list[Term], str] | None:
    """The terms and form (``guided`` for text in ``guided(...)``, else ``auto``) the controls show for ``text``, read from the one grammar's tree
    (`composable_ebm.expression.parse_tree`), or ``None`` when they cannot show it (nested parentheses, a weight on
    a parenthesised group, more than `MAX_TERMS` terms ...) or the text is not yet a whole expression. Such an
    expression is still sampled as typed. Raises `InvalidInputError` only for text the grammar cannot tokenize."""
    if not text.strip():
        return None
    tokenize(text)  # a character the grammar has no place for: one line naming it
    try:
        return _tree_terms(parse_tree(text))
    except (_Unshowable, InvalidInputError):
        return None


# ----------------------------------------------------------------------------------------- readings
@dataclass
class Reading:
    """The classifier's reading of one sample: ``(attribute, value read, mark)`` per attribute, where the
    mark is ``True`` (as asked), ``False`` (not as asked) or ``None`` (not asked)."""

    values: list[tuple[str, str, bool | None]]

    @property
    def as_asked(self) -> bool | None:
        marks = [m for _, _, m in self.values if m is not None]
        return all(marks) if marks else None


def asked_attributes(terms: Sequence[Term]) -> list[tuple[dict[str, str], dict[str, str]]]:
    """Per alternative: the values asked for (``and`` terms) and those asked against (``and not`` terms)."""
    out = []
    for group in alternatives(terms):
        want = {a: v for t in group if t.op != "and not" for a, v in t.bindings.items()}
        avoid = {a: v for t in group if t.op == "and not" for a, v in t.bindings.items()}
        out.append((want, avoid))
    return out


def read_samples(images: Any, classifier: Any, asked: Sequence[tuple[Mapping[str, str], Mapping[str, str]]] | None
                 ) -> list[Reading]:
    """The classifier's reading of each image, marked against the alternative of ``asked`` it matches best
    (an ``or`` is right when any alternative is); attributes the classifier does not know stay unmarked."""
    attributes = classifier.config.attributes
    device = next(classifier.parameters()).device
    pred = {a: v.cpu().tolist() for a, v in classifier.predict(images.float().to(device)).items()}
    readings = []
    for i in range(images.shape[0]):
        read = {a: attributes[a][pred[a][i]] for a in attributes}
        best: dict[str, bool] = {}
        for want, avoid in asked or []:
            marks = {a: read[a] == v for a, v in want.items() if a in read}
            marks |= {a: read[a] != v for a, v in avoid.items() if a in read}
            if not best or sum(marks.values()) - len(marks) > sum(best.values()) - len(best):
                best = marks
        readings.append(Reading([(a, read[a], best.get(a)) for a in attributes]))
    return readings


def _png_data_uri(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def readings_html(images: Any, readings: Sequence[Reading], avoid: Mapping[str, str] | None = None,
                  classifier: str | None = CLASSIFIER) -> str:
    """Each sample (upscaled, pixels kept crisp) with its reading beside it: a tick for a value as asked,
    a cross for one not as asked. Without a classifier, the samples alone and a line saying why."""
    from composable_ebm.images import image_grid

    if classifier is None:
        return ("<p class='cebm-summary'>no classifier at hand reads every attribute of these models: the samples"
                " are shown without readings</p>")
    name = html.escape(classifier)
    asked = [r.as_asked for r in readings if r.as_asked is not None]
    head = (f"<p class='cebm-summary'>{sum(asked)} of {len(asked)} samples read as asked (classifier:"
            f" {name})</p>" if asked else f"<p class='cebm-summary'>read by {name}</p>")
    cells = []
    for i, reading in enumerate(readings):
        uri = _png_data_uri(image_grid(images[i:i + 1], padding=0))
        lines = []
        for attr, value, mark in reading.values:
            tag = "" if mark is None else (" <span class='cebm-right'>&#10003;</span>" if mark
                                           else " <span class='cebm-wrong'>&#10007;</span>")
            lines.append(f"<span title='{html.escape(attr)}'>{html.escape(value)}</span>{tag}")
        state = {True: "right", False: "wrong", None: "unmarked"}[reading.as_asked]
        cells.append(f"<figure class='cebm-sample cebm-{state}'><img src='{uri}' alt='sample {i + 1}'>"
                     f"<figcaption>{'<br>'.join(lines)}</figcaption></figure>")
    return head + "<div class='cebm-samples'>" + "".join(cells) + "</div>"


# --------------------------------------------------------------------------------------- generation
class ModelCache:
    """Loads each model once per name (``loader``, default `studio_loader`), so editing terms does not reload weights;
    at most `MAX_MODELS` stay loaded, the least recently used leaving first."""

    def __init__(self, device: str = "cpu", loader: Callable[..., Any] | None = None,
                 models_root: str | Path | None = None, size: int = MAX_MODELS) -> None:
        self.device = device
        self.models: OrderedDict[str, Any] = OrderedDict()
        self.size = size
        self._loader = loader or (lambda name, device: studio_loader(name, device, models_root))

    def __call__(self, name: str) -> Any:
        if name in self.models:
            self.models.move_to_end(name)
        else:
            self.models[name] = self._loader(name, self.device)
            while len(self.models) > self.size:
                self.models.popitem(last=False)
        return self.models[name]

    def attributes(self, name: str) -> dict[str, tuple[str, ...]]:
        return dict(getattr(self(name), "attributes", {}) or {})

    def energy(self, expression: str) -> Any:
        return parse_expression(expression, self)


def studio_loader(name: str, device: str = "cpu", models_root: str | Path | None = None) -> Any:
    """Load a model the studio may serve: a bundled name, a folder under ``models_root`` (``cebm studio
    --models-root``), or an ``org/name[@revision]`` already in the Hub cache (the studio downloads nothing). Anything
    else is one line naming those sources, the same whether or not such a path exists: the names are read as
    text, and no path outside the root is looked at."""
    from composable_ebm.hub import hub_snapshot, is_repo_id
    from composable_ebm.persistence import bundled_models, load_model

    name = str(name).strip()
    if name in bundled_models():
        return load_model(name, device)
    if models_root is not None:
        root = Path(models_root).expanduser().resolve()
        path = (root / name).resolve()
        if path.is_relative_to(root) and path.is_dir():
            return load_model(path, device)
    repo, _, revision = name.partition("@")
    if is_repo_id(repo) and not name.startswith((".", "~")):
        return load_model(hub_snapshot(repo, revision or None, local_files_only=True), device)
    where = f"folders under {models_root}" if models_root is not None else \
        "folders under the --models-root the studio is started with (none was given)"
    raise InvalidInputError(f"the studio does not load {name!r}: it serves bundled models"
                            f" ({', '.join(bundled_models())}), models already in the Hub cache (org/name) and {where}")


@dataclass
class Generation:
    """What one press of Generate made."""

    samples: Any  # (n, C, H, W) in [0, 1]
    grid: Any  # PIL image
    chain: Any  # PIL image: chains from noise (left) to samples (right)
    readings: list[Reading]
    seconds: float  # sampling only (models loaded, no drawing)
    expression: str  # the composite as the library writes it
    png: Path
    classifier: str | None = None  # the classifier that read the samples; None: none covers the models


def model_attributes(energy: Any) -> dict[str, tuple[str, ...]]:
    """Every attribute (with its values) of the models an expression's energy is made of."""
    out: dict[str, tuple[str, ...]] = {}
    stack = [energy]
    while stack:
        node = stack.pop()
        base = getattr(node, "base", None)
        if base is not None:
            stack.append(base)
        elif hasattr(node, "terms"):
            stack.extend(node.terms)
        else:
            out.update({a: tuple(v) for a, v in getattr(node, "attributes", {}).items()})
    return out


def covering_classifier(models: ModelCache, energy: Any, candidates: Sequence[str] | None = None) -> str | None:
    """The first classifier (`CLASSIFIER`, then the others `list_models` finds) that reads every attribute of the
    expression's models with the same values, at the models' input shape; ``None`` when none does, and then the
    page shows the samples without readings rather than another dataset's."""
    from composable_ebm.persistence import list_models

    wanted = model_attributes(energy)
    if not wanted:
        return None
    if candidates is None:
        found = [row["name"] for row in list_models() if row.get("type") and "classifier" in row["type"]]
        candidates = [CLASSIFIER, *(name for name in found if name != CLASSIFIER)] if CLASSIFIER in found else found
    for name in candidates:
        classifier = models(name)
        config = getattr(classifier, "config", None)
        known = {a: tuple(v) for a, v in getattr(config, "attributes", {}).items()}
        shape = (getattr(config, "in_channels", None), getattr(config, "image_size", None),
                 getattr(config, "image_size", None))
        if all(known.get(a) == v for a, v in wanted.items()) and shape == tuple(energy.input_shape):
            return name
    return None


def sampler_overrides(steps: str | int | None, step_size: str | float | None) -> dict[str, Any]:
    """The sampler settings the page changes; empty fields keep the composite's own."""
    overrides: dict[str, Any] = {}
    steps = str(steps).strip() if steps is not None else ""
    step_size = str(step_size).strip() if step_size is not None else ""
    if steps:
        if not steps.isdigit() or int(steps) < 1:
            raise InvalidInputError(f"steps must be a whole number >= 1 (empty: the composite's own), got {steps!r}")
        overrides["steps"] = int(steps)
    if step_size:
        try:
            value = float(step_size)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise InvalidInputError(f"step size must be a number > 0 (empty: the composite's own), got {step_size!r}")
        overrides["step_size"] = value
    return overrides


def _whole(value: Any, low: int, high: int) -> bool:
    """Whether a page field holds a whole number in ``[low, high]`` (an empty field holds none)."""
    if value is None or isinstance(value, bool):
        return False
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number.is_integer() and low <= number <= high


def generate(models: ModelCache, expression: str, n: int = 16, seed: int = 0, steps: str | int | None = None,
             step_size: str | float | None = None, on_step: Callable[[int, int], None] | None = None,
             out_dir: Path | None = None, form: str = "auto") -> Generation:
    """Sample ``expression`` through the pipeline, as ``cebm compose`` and ``.sample()`` do
    (`composable_ebm.pipeline.sample`), and read the samples with a classifier that covers the models' attributes
    (`covering_classifier`), when there is one."""
    from composable_ebm.images import chain_strip, image_grid
    from composable_ebm.pipeline import plan, sample

    if not _whole(n, 1, MAX_SAMPLES):
        raise InvalidInputError(f"the number of samples must be a whole number from 1 to {MAX_SAMPLES}, got {n!r}")
    if not _whole(seed, 0, 2**63 - 1):
        raise InvalidInputError(f"seed must be a whole number from 0 to 2**63 - 1, got {seed!r}")
    energy = models.energy(expression)
    if len(energy.input_shape) != 3:
        raise InvalidInputError(f"the studio draws images; {expression!r} takes inputs of shape {energy.input_shape}")
    overrides = sampler_overrides(steps, step_size)
    chosen = plan(energy, form, **overrides)
    total = chosen.config.total_steps
    if total > MAX_STEPS:
        raise InvalidInputError(f"{total} Langevin steps in all; the studio runs at most {MAX_STEPS} a request"
                                " (cebm compose has no such bound)")
    if int(n) * total > MAX_WORK:
        raise InvalidInputError(f"{int(n)} samples x {total} steps = {int(n) * total:,} sample-steps; the studio runs at"
                                f" most {MAX_WORK:,} a request: fewer samples or steps (cebm compose has no such bound)")
    callback = (lambda record: on_step(record["step"], total)) if on_step is not None else None
    start = time.perf_counter()
    result = sample(energy, int(n), form=form, seed=int(seed), keep_every=max(1, total // 10), callback=callback,
                    **overrides)
    seconds = time.perf_counter() - start
    parsed = expression_to_terms(expression)
    asked = asked_attributes(parsed[0]) if parsed is not None else None
    reader = covering_classifier(models, energy)
    readings = read_samples(result.samples, models(reader), asked) if reader is not None else []
    grid = image_grid(result.samples)
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="cebm-studio-"))
    png = out_dir / f"composed-seed{int(seed)}.png"
    grid.save(png)
    _keep_newest(out_dir, MAX_KEPT_GRIDS)
    return Generation(result.samples, grid, chain_strip(result.chain), readings, seconds, chosen.energy.expression(),
                      png, reader)


def _keep_newest(folder: Path, count: int) -> None:
    """Remove all but the ``count`` newest PNGs in ``folder``: the studio's disk use stays bounded."""
    pngs = sorted(folder.glob("*.png"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in pngs[count:]:
        old.unlink(missing_ok=True)


def page_form(radio: str) -> str:
    """The pipeline's form for the page's composition control: ``plain`` samples the expression as written
    (`cebm compose --form plain`); ``auto`` and ``guided`` sample it as `cebm compose` does by default (``auto``: the
    text is ``guided(...)``, or a sum the pipeline samples in its guided form)."""
    return "plain" if radio == "plain" else "auto"


def sampler_summary(models: ModelCache, expression: str, form: str = "auto") -> str:
    """The settings Generate uses when the sampler fields are empty: the composite's own."""
    from composable_ebm.pipeline import plan

    cfg = plan(models.energy(expression), form).config
    return f"its own sampler: {cfg.summary()} ({cfg.total_steps} steps in all)"


def error_line(err: BaseException) -> str:
    """The one line the page shows for a failure: the library's message for what it expects (bad input,
    a missing model, a Hub that cannot be reached), a bug-report line for anything else."""
    if exit_code_for(err) is not None:
        return f"error: {one_line(err)}"
    log.error("studio: unexpected error", exc_info=err)
    return bug_line(err, "please report it with the traceback in the server's log")


def energy_models() -> list[str]:
    """The bundled and cached energy models the model lists offer (classifiers are left out)."""
    from composable_ebm.persistence import list_models

    return [row["name"] for row in list_models() if row.get("type") and "classifier" not in row["type"]]


DEFAULT_TERMS = (
    Term("shapes-color", {"color": "red"}),
    Term("shapes-shape", {"shape": "circle"}),
    Term("shapes-size", {"size": "large"}),
)


# ---------------------------------------------------------------------------------------- the page
CSS = """
.cebm-samples { display: flex; flex-wrap: wrap; gap: 10px; }
.cebm-sample { margin: 0; display: flex; gap: 6px; align-items: flex-start; padding: 4px;
               border: 1px solid var(--border-color-primary); border-radius: 4px; }
.cebm-sample img { width: 64px; height: 64px; image-rendering: pixelated; }
.cebm-sample figcaption { font-size: 12px; line-height: 1.35; min-width: 72px; }
.cebm-right { color: #1a7f37; font-weight: 600; }
.cebm-wrong { color: #cf222e; font-weight: 600; }
#grid img, #chain img { image-rendering: pixelated; }
"""

SLOT_FIELDS = 5  # operator, model, values, weight, temperature


def value_choices(attributes: Mapping[str, Sequence[str]]) -> list[str]:
    return [f"{a}={v}" for a, values in attributes.items() for v in values]


def terms_from_slots(count: int, flat: Sequence[Any]) -> list[Term]:
    """The terms the first ``count`` rows of controls hold (``flat``: every row's five values in turn)."""
    terms = []
    for i in range(int(count)):
        op, model, values, weight, temperature = flat[i * SLOT_FIELDS:(i + 1) * SLOT_FIELDS]
        bindings: dict[str, str] = {}
        for item in values or []:
            attr, sep, value = str(item).partition("=")
            if not sep or not attr.strip() or not value.strip():
                raise InvalidInputError(f"value {item!r} of {model} is not attr=value, e.g. color=red")
            if attr.strip() in bindings:
                raise InvalidInputError(f"{model} binds {attr.strip()} twice ({bindings[attr.strip()]} and"
                                        f" {value.strip()}); an attribute takes one value (for either, use 'or')")
            bindings[attr.strip()] = value.strip()
        weight = 1.0 if weight in (None, "") else float(weight)
        temperature = None if temperature in (None, "") or float(temperature) == 1 else float(temperature)
        terms.append(Term(str(model or "").strip(), bindings, weight, op or "and", temperature))
    return terms


def build_app(device: str = "cpu", models: ModelCache | None = None, models_root: str | Path | None = None) -> Any:
    """The Gradio app (``gradio.Blocks``); ``cebm studio`` launches it, a Space's ``app.py`` too. Its models come from
    `studio_loader` (``models_root``: the folder under which model folders may be named)."""
    import gradio as gr

    models = models or ModelCache(device, models_root=models_root)
    offered = energy_models()
    out_dir = Path(tempfile.mkdtemp(prefix="cebm-studio-"))

    def choices_for(model: str) -> list[str]:
        try:
            return value_choices(models.attributes(model)) if model else []
        except Exception:  # noqa: BLE001 - a model that does not load offers no values; its error shows on Generate
            return []

    def slot_updates(terms: Sequence[Term]) -> list[Any]:
        updates = []
        for i in range(MAX_TERMS):
            if i < len(terms):
                t = terms[i]
                values = [f"{a}={v}" for a, v in t.bindings.items()]
                offered_values = choices_for(t.model)
                choices = offered_values + [v for v in values if v not in offered_values]
                updates += [gr.update(visible=True), gr.update(value=t.op if i else ("and not" if t.op == "and not" else "and")),
                            gr.update(value=t.model, choices=sorted(set(offered) | {t.model})),
                            gr.update(value=values, choices=choices), gr.update(value=t.weight),
                            gr.update(value=1.0 if t.temperature is None else t.temperature)]
            else:
                updates += [gr.update(visible=False), gr.update(value="and"), gr.update(value=None),
                            gr.update(value=[], choices=[]), gr.update(value=1.0), gr.update(value=1.0)]
        return updates

    def note_for(text: str, shown: bool = True, form: str = "auto") -> str:
        head = "The controls show this expression" if shown else \
            "The controls cannot show this expression; Generate samples it as typed"
        command = f'`cebm compose "{text}"' + (" --form plain`" if form == "plain" else "`")
        try:
            return (f"{head}; Generate samples it as {command} does, with"
                    f" {sampler_summary(models, text, page_form(form))}.")
        except Exception as err:  # noqa: BLE001 - shown in the page as one line
            return f"{head}. {error_line(err)}"

    def expression_and_note(count: int, form: str, flat: Sequence[Any]) -> tuple[str, str]:
        try:
            text = terms_to_expression(terms_from_slots(count, flat), form)
        except Exception as err:  # noqa: BLE001 - shown in the page as one line
            return "", error_line(err)
        return text, note_for(text, form=form)

    # delete_cache: every 10 minutes, files Gradio made for the page (grids, chains) older than an hour are removed
    with gr.Blocks(title="cebm studio", analytics_enabled=False, delete_cache=(600, 3600)) as app:
        gr.Markdown("# cebm studio\nCompose energy-based models: pick a model and its value for each term, join"
                    " the terms with *and*, *and not* or *or*, set weights, and generate.")
        count = gr.State(len(DEFAULT_TERMS))
        rows, fields, ups, removes = [], [], [], []
        for i in range(MAX_TERMS):
            t = DEFAULT_TERMS[i] if i < len(DEFAULT_TERMS) else None
            with gr.Row(visible=t is not None, elem_id=f"term-{i}", elem_classes=["cebm-term"]) as row:
                op = gr.Dropdown(list(OPERATORS), value="and", label="join", elem_id=f"term-{i}-op", scale=1,
                                 min_width=110)
                model = gr.Dropdown(offered, value=t.model if t else None, label="model", allow_custom_value=True,
                                    elem_id=f"term-{i}-model", scale=3, info="bundled, a cached org/name@rev, or a folder under --models-root")
                init_choices = choices_for(t.model) if t else []
                values = gr.Dropdown(init_choices, value=[f"{a}={v}" for a, v in t.bindings.items()] if t else [],
                                     multiselect=True, allow_custom_value=True, label="value",
                                     elem_id=f"term-{i}-values", scale=3)
                weight = gr.Number(1.0, label="weight", minimum=0, elem_id=f"term-{i}-weight", scale=1, min_width=90)
                temperature = gr.Number(1.0, label="temperature", elem_id=f"term-{i}-temperature", scale=1,
                                        min_width=90)
                up = gr.Button("↑", elem_id=f"term-{i}-up", scale=0, min_width=40)
                remove = gr.Button("✕", elem_id=f"term-{i}-remove", scale=0, min_width=40)
            rows.append(row)
            fields += [op, model, values, weight, temperature]
            ups.append(up)
            removes.append(remove)
        with gr.Row():
            add = gr.Button("Add term", elem_id="add-term", scale=0)
            form = gr.Radio(list(FORMS), value="auto", label="composition", elem_id="form", scale=2,
                            info="auto: as cebm compose and .sample() (guided where every model has a null"
                                 " condition); guided: guided(...) written out; plain: as written")
        expression = gr.Textbox(terms_to_expression(list(DEFAULT_TERMS), "auto"), label="expression",
                                buttons=["copy"], elem_id="expression", lines=1, max_lines=3)
        note = gr.Markdown(note_for(terms_to_expression(list(DEFAULT_TERMS), "auto")), elem_id="expression-note")
        with gr.Row():
            seed = gr.Number(0, label="seed", precision=0, elem_id="seed", minimum=0)
            n = gr.Number(16, label=f"samples (at most {MAX_SAMPLES})", precision=0, elem_id="n", minimum=1,
                          maximum=MAX_SAMPLES)
            steps = gr.Textbox("", label="steps per round", elem_id="steps", placeholder="the composite's own")
            step_size = gr.Textbox("", label="step size", elem_id="step-size", placeholder="the composite's own")
        with gr.Row():
            generate_button = gr.Button("Generate", variant="primary", elem_id="generate", scale=3)
            stop_button = gr.Button("Stop", variant="stop", elem_id="stop", scale=1)
        gr.Markdown(f"One request runs at a time; others wait in a queue that shows their place. Each request draws at"
                    f" most {MAX_SAMPLES} samples of at most {MAX_STEPS} steps, {MAX_WORK:,} sample-steps in all"
                    " (`cebm compose` has no such bounds).", elem_id="bounds")
        message = gr.Markdown("", elem_id="message")
        with gr.Row():
            grid = gr.Image(label="samples", type="pil", elem_id="grid", format="png", interactive=False)
            chain = gr.Image(label="chains from noise to sample", type="pil", elem_id="chain", format="png",
                             interactive=False)
        download = gr.DownloadButton("Download PNG", elem_id="download", visible=False)
        readings = gr.HTML(elem_id="readings")

        slot_outputs = []
        for i in range(MAX_TERMS):
            slot_outputs += [rows[i]] + fields[i * SLOT_FIELDS:(i + 1) * SLOT_FIELDS]

        def on_edit(c, f, *flat):
            return expression_and_note(c, f, flat)

        for component in fields + [form]:
            component.input(on_edit, [count, form, *fields], [expression, note], queue=False)

        def on_model(i):
            def handler(c, f, *flat):
                flat = list(flat)
                choices = choices_for(flat[i * SLOT_FIELDS + 1])
                kept = [v for v in flat[i * SLOT_FIELDS + 2] or [] if v in choices]
                flat[i * SLOT_FIELDS + 2] = kept
                text, line = expression_and_note(c, f, flat)
                return gr.update(choices=choices, value=kept), text, line
            return handler

        for i in range(MAX_TERMS):
            fields[i * SLOT_FIELDS + 1].input(on_model(i), [count, form, *fields],
                                              [fields[i * SLOT_FIELDS + 2], expression, note], queue=False)

        def rewrite(terms: list[Term], f: str):
            text, line = expression_and_note(len(terms), f, _flat(terms))
            return [len(terms), *slot_updates(terms), text, line]

        def _flat(terms: Sequence[Term]) -> list[Any]:
            flat: list[Any] = []
            for t in terms:
                flat += [t.op, t.model, [f"{a}={v}" for a, v in t.bindings.items()], t.weight, t.temperature]
            return flat

        structure_outputs = [count, *slot_outputs, expression, note]

        def restructure(change: Callable[[list[Term]], str | None]):
            """A handler that edits the list of terms (add, remove, move) and redraws every row."""
            def handler(c, f, *flat):
                try:
                    terms = terms_from_slots(c, flat)
                    refused = change(terms)
                except Exception as err:  # noqa: BLE001 - shown in the page as one line
                    refused = error_line(err)
                if refused:
                    return [c, *[gr.update() for _ in slot_outputs], gr.update(), refused]
                if terms and terms[0].op == "or":
                    terms[0].op = "and"
                return rewrite(terms, f)
            return handler

        def add_term(terms: list[Term]) -> str | None:
            if len(terms) >= MAX_TERMS:
                return f"error: the controls hold at most {MAX_TERMS} terms; type a longer expression instead"
            terms.append(Term(offered[0] if offered else "", {}))
            return None

        add.click(restructure(add_term), [count, form, *fields], structure_outputs, queue=False)

        def on_remove(i):
            def drop(terms: list[Term]) -> None:
                if i < len(terms):
                    del terms[i]
            return restructure(drop)

        def on_up(i):
            def move(terms: list[Term]) -> None:
                if 0 < i < len(terms):
                    terms[i - 1], terms[i] = terms[i], terms[i - 1]
            return restructure(move)

        for i in range(MAX_TERMS):
            removes[i].click(on_remove(i), [count, form, *fields], structure_outputs, queue=False)
            ups[i].click(on_up(i), [count, form, *fields], structure_outputs, queue=False)

        def on_expression(text, c, f, *flat):
            try:
                parsed = expression_to_terms(text)
            except Exception as err:  # noqa: BLE001 - shown in the page as one line
                return [c, *[gr.update() for _ in slot_outputs], gr.update(), f, error_line(err)]
            if parsed is None:
                return [c, *[gr.update() for _ in slot_outputs], gr.update(), f, note_for(text, shown=False, form=f)]
            terms, parsed_form = parsed
            if parsed_form == "auto" and f == "plain":  # unwrapped text keeps the page's plain choice
                parsed_form = "plain"
            try:  # a value the model does not have stays out of the controls: one line names the valid ones
                models.energy(text)
            except Exception as err:  # noqa: BLE001 - shown in the page as one line
                return [c, *[gr.update() for _ in slot_outputs], gr.update(), f, error_line(err)]
            return [len(terms), *slot_updates(terms), gr.update(), parsed_form, note_for(text, form=parsed_form)]

        for event in (expression.submit, expression.blur):
            event(on_expression, [expression, count, form, *fields], [count, *slot_outputs, expression, form, note],
                  queue=False)

        stops: dict[str, threading.Event] = {}  # per browser session: Stop asks its own generation to end

        def on_generate(text, form_value, seed_value, n_value, steps_value, step_size_value, request: gr.Request,
                        progress=gr.Progress()):
            stop = stops.setdefault(request.session_hash or "", threading.Event())
            stop.clear()

            def on_step(step: int, total: int) -> None:
                if stop.is_set():  # ends the chain between two steps: nothing keeps computing after Stop
                    raise Stopped
                progress((step, total), desc="sampling", unit="steps")

            try:
                progress(0, desc="loading models")
                made = generate(models, text, n=n_value, seed=seed_value, steps=steps_value,
                                step_size=step_size_value, on_step=on_step, out_dir=out_dir,
                                form=page_form(form_value))
            except Stopped:
                return None, None, gr.update(value=None, visible=False), "", "stopped"
            except Exception as err:  # noqa: BLE001 - the page shows the one line, clears the last results, stays usable
                return None, None, gr.update(value=None, visible=False), "", error_line(err)
            done = (f"sampled `{made.expression}`: {made.samples.shape[0]} samples in {made.seconds:.1f} s of sampling")
            return (made.grid, made.chain, gr.update(value=str(made.png), visible=True),
                    readings_html(made.samples, made.readings, classifier=made.classifier), done)

        def on_stop(request: gr.Request) -> None:
            stop = stops.get(request.session_hash or "")
            if stop is not None:
                stop.set()

        # Gradio finds its Request parameter by type hint; this module's hints are strings (postponed evaluation)
        # naming gr, which is imported here, not at module level: give the hints as objects
        on_generate.__annotations__ = {"request": gr.Request}
        on_stop.__annotations__ = {"request": gr.Request}
        generate_button.click(on_generate, [expression, form, seed, n, steps, step_size],
                              [grid, chain, download, readings, message], concurrency_limit=1)
        stop_button.click(on_stop, None, None, queue=False)
    app.cebm_css = CSS
    return app


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(host: str, extra: Sequence[str] = ()) -> frozenset[str]:
    """The host names the studio answers to: the one it serves on, the loopback names, and ``extra``."""
    names = {host.strip("[]").lower(), *LOOPBACK_NAMES, *(h.strip("[]").lower() for h in extra)}
    return frozenset(names - {"0.0.0.0", "::"})


def _hostname(value: str) -> str:
    """The host part of a ``Host`` header value (``name``, ``name:port``, ``[v6]:port``), lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of a URL or origin, lower case (``http://Studio.lan:7860/x`` -> ``http://studio.lan:7860``);
    one line for anything that is not an http(s) origin."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInputError(f"{url!r} is not an origin; write scheme://host[:port], e.g. http://studio.lan:7860")
    return f"{parts.scheme}://{parts.netloc.lower()}"


class HostGuard:
    """ASGI middleware that answers 403 to what a page elsewhere could send the studio:

    - a ``Host`` the studio was not started for (`allowed_hosts`): a page whose name resolves to 127.0.0.1 (DNS
      rebinding);
    - another origin: an ``Origin`` that is not the studio's own (the scheme, host and port the request was sent
      to) nor one allowed by name (``--allowed-origin``). ``Origin: null`` (sandboxed frames, ``data:`` and ``file:``
      pages) and a page on another port of the same host are other origins. A request without ``Origin`` whose
      ``Sec-Fetch-Site`` says ``cross-site`` or ``same-site`` is refused too;
    - an upload (Gradio's upload route, or any ``multipart/form-data`` body): the studio takes no files.
    """

    def __init__(self, app: Any, allowed: frozenset[str], origins: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.allowed = allowed
        self.origins = origins

    def problem(self, scope: dict) -> str | None:
        """Why a request is refused, ``None`` to serve it."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if _hostname(host) not in self.allowed:
            return (f"Host {host!r} is not a host this studio was started for ({', '.join(sorted(self.allowed))});"
                    " start it with --allowed-host NAME to add one")
        origin = headers.get("origin")
        scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
        own = f"{scheme}://{host.strip().lower()}"
        if origin is not None and origin.strip().lower() != own and origin.strip().lower() not in self.origins:
            return (f"Origin {origin!r} is another origin than this studio's ({own}); start it with --allowed-origin"
                    " URL to allow one")
        site = headers.get("sec-fetch-site", "").lower()
        if origin is None and site in ("cross-site", "same-site"):
            return f"a {site} request (Sec-Fetch-Site) without an Origin the studio allows"
        path = scope.get("path", "")
        if path.rstrip("/").rsplit("/", 1)[-1].startswith("upload") or \
                headers.get("content-type", "").lower().startswith("multipart/"):
            return "an upload: the studio takes no files"
        return None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            problem = self.problem(scope)
            if problem is not None:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                body = f"forbidden: {problem}\n".encode()
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def launch(host: str = "127.0.0.1", port: int | None = None, device: str = "cpu",
           allowed_host: Sequence[str] = (), allowed_origin: Sequence[str] = (),
           models_root: str | Path | None = None, **kwargs: Any) -> Any:
    """Serve the studio (blocking unless ``prevent_thread_lock=True``): analytics off, fonts from the app, one request
    at a time in a queue, only to the hosts it was started for (`allowed_hosts`; ``allowed_host`` adds names) and to
    pages of its own origin (``allowed_origin`` adds origins by name, `HostGuard`), no uploads, and only the models
    `studio_loader` serves (``models_root``: the folder whose model folders it may load)."""
    import os

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import gradio as gr
    from starlette.middleware import Middleware

    if models_root is not None and not Path(models_root).expanduser().is_dir():
        raise InvalidInputError(f"--models-root {models_root} is not a folder; name the folder whose model folders"
                                " the studio may load")
    origins = frozenset(origin_of(o) for o in allowed_origin)
    app = build_app(device, models_root=models_root)
    app.queue(default_concurrency_limit=1)
    guard = Middleware(HostGuard, allowed=allowed_hosts(host, allowed_host), origins=origins)
    block = not kwargs.pop("prevent_thread_lock", False)
    app.launch(server_name=host, server_port=port, theme=gr.themes.Default(), css=CSS, share=False,
               show_error=False, ssr_mode=False, max_file_size=MAX_UPLOAD_BYTES,
               app_kwargs={"middleware": [guard]}, prevent_thread_lock=True, **kwargs)
    _outermost(app.server_app, guard)
    if block:
        app.block_thread()
    return app


def _outermost(server: Any, guard: Any) -> None:
    """Put ``guard`` outside Gradio's own middleware, whose CORS layer would otherwise let a page on another
    localhost port read even the guard's refusals: the server rebuilds its stack on its next request."""
    server.user_middleware.remove(guard)
    server.user_middleware.insert(0, guard)
    server.middleware_stack = None
