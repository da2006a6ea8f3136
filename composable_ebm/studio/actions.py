"""What the page does, as plain functions tested without a browser: one generation through the pipeline, the models it
may load, and the classifier's readings of the samples."""

from __future__ import annotations

import base64
import html
import io
import logging
import math
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composable_ebm.errors import InvalidInputError, ModelNotFoundError, bug_line, exit_code_for, one_line
from composable_ebm.expression import parse_expression
from composable_ebm.studio.terms import Term, alternatives, expression_to_terms


log = logging.getLogger(__name__)


MAX_MODELS = 8
"""Most models the studio keeps loaded at once (`ModelCache`, least recently used first out)."""


MAX_KEPT_GRIDS = 16
"""Most generated PNGs the studio keeps on disk for Download; older ones are removed."""


MAX_SAMPLES = 64
"""Most samples one Generate draws (the library's own bound is far larger)."""


MAX_STEPS = 1000
"""Most Langevin steps of one Generate's chains (``rounds x steps + final_steps``)."""


MAX_WORK = 64 * 240
"""Most sample-steps (samples x steps) of one Generate: 64 samples of 240 steps, 16 of 960. On the 2-core CPU of
the benchmarks the bundled composite runs about 600 sample-steps a second, so a request holds the studio for about
half a minute at most."""


CLASSIFIER = "faces-classifier"
"""The classifier tried first; any other bundled or cached classifier that covers the models is used too."""


class Stopped(Exception):
    """The page's Stop: raised between two Langevin steps of the generation it stops."""


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
    from composable_ebm.models import bundled_models, load_model

    name = str(name).strip()
    if name in bundled_models():
        return load_model(name, device)
    if models_root is not None:
        root = Path(models_root).expanduser().resolve()
        path = (root / name).resolve()
        if path.is_relative_to(root) and path.is_dir():
            _check_autoencoder_inside(path, root)
            return load_model(path, device)
    repo, _, revision = name.partition("@")
    if is_repo_id(repo) and not name.startswith((".", "~")):
        try:
            snapshot = hub_snapshot(repo, revision or None, local_files_only=True)
        except ModelNotFoundError:
            raise ModelNotFoundError(f"{name} is not in the local Hub cache, and the studio downloads nothing: run"
                                     f" `cebm info {name}` once on this machine to fetch it, then use it here") from None
        return load_model(snapshot, device)
    where = f"folders under {models_root}" if models_root is not None else \
        "folders under the --models-root the studio is started with (none was given)"
    raise InvalidInputError(f"the studio does not load {name!r}: it serves the bundled models (`cebm list` names"
                            f" them), models already in the Hub cache (org/name) and {where}")


def _check_autoencoder_inside(folder: Path, root: Path) -> None:
    """A latent model under the models root may name its autoencoder by a bundled name, a Hub id (from the cache) or a
    folder under the root; a folder elsewhere is one line, before anything there is read."""
    from composable_ebm.configs import load_json
    from composable_ebm.folders import CONFIG_NAME
    from composable_ebm.hub import is_repo_id
    from composable_ebm.models import bundled_models

    config = folder / CONFIG_NAME
    try:
        payload = load_json(config.read_bytes(), str(config)) if config.is_file() else None
    except ValueError:
        return  # not JSON: the load says so in its own line
    source = payload.get("config", {}).get("autoencoder") if isinstance(payload, dict) and \
        isinstance(payload.get("config"), dict) else None
    if not isinstance(source, str) or source in bundled_models():
        return
    local = folder / source
    if local.exists() and local.resolve().is_relative_to(root):
        return
    if not local.exists() and is_repo_id(source) and not source.startswith((".", "~")):
        studio_loader(source)  # from the Hub cache only: one line where it is not there
        return
    if not local.exists() and not Path(source).expanduser().exists():
        return  # nothing there to read: the load says so in its own line
    raise InvalidInputError(f"the studio does not load {folder.name}: its autoencoder {source!r} is a folder outside"
                            f" {root}; serve the autoencoder from under the root, bundled or from the Hub cache")


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
    """The first classifier (`CLASSIFIER`, then the others `list_models` finds; only those whose ``config.json`` names
    the attributes are loaded) that reads every attribute of the expression's models with the same values, at the
    models' input shape; ``None`` when none does, and then the page shows the samples without readings rather than
    another dataset's."""
    from composable_ebm.models import list_models

    wanted = model_attributes(energy)
    if not wanted:
        return None
    if candidates is None:  # the classifiers whose config.json names the attributes: only those are loaded
        found = [row["name"] for row in list_models() if row.get("type") and "classifier" in row["type"]
                 and all(tuple(row["attributes"].get(a, ())) == v for a, v in wanted.items())]
        candidates = [CLASSIFIER, *(name for name in found if name != CLASSIFIER)] if CLASSIFIER in found else found
    for name in candidates:
        classifier = models(name)
        config = getattr(classifier, "config", None)
        known = {a: tuple(v) for a, v in getattr(config, "attributes", {}).items()}
        shape = (getattr(config, "in_channels", None), getattr(config, "image_size", None),
                 getattr(config, "image_size", None))
        if all(known.get(a) == v for a, v in wanted.items()) and shape == tuple(energy.sample_shape):
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
    from composable_ebm.pipeline import plan, run

    if not _whole(n, 1, MAX_SAMPLES):
        raise InvalidInputError(f"the number of samples must be a whole number from 1 to {MAX_SAMPLES}, got {n!r}")
    if not _whole(seed, 0, 2**63 - 1):
        raise InvalidInputError(f"seed must be a whole number from 0 to 2**63 - 1, got {seed!r}")
    energy = models.energy(expression)
    if len(energy.sample_shape) != 3:
        raise InvalidInputError(f"the studio draws images; {expression!r} takes inputs of shape {energy.sample_shape}")
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
    result = run(chosen, int(n), seed=int(seed), keep_every=max(1, total // 10), callback=callback)
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
    return f"its own sampler: {cfg.summary()}" + (f" ({cfg.total_steps} steps in all)" if cfg.total_steps else "")


def error_line(err: BaseException) -> str:
    """The one line the page shows for a failure: the library's message for what it expects (bad input,
    a missing model, a Hub that cannot be reached), a bug-report line for anything else."""
    if exit_code_for(err) is not None:
        return f"error: {one_line(err)}"
    log.error("studio: unexpected error", exc_info=err)
    return bug_line(err, "please report it with the traceback in the server's log")


def energy_models() -> list[str]:
    """The bundled and cached energy models the model lists offer (classifiers are left out)."""
    from composable_ebm.models import list_models

    return [row["name"] for row in list_models() if row.get("type") and "classifier" not in row["type"]]


DEFAULT_TERMS = (
    Term("faces-smiling", {"smiling": "yes"}),
    Term("faces-glasses", {"glasses": "yes"}),
    Term("faces-hat", {"hat": "yes"}),
)
"""The page's first expression: the README's, three face models held out together in training."""
