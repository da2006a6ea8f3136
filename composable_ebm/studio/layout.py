"""The page (`build_app`): the Gradio components, and the events that wire them to `composable_ebm.studio.actions`."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from composable_ebm.errors import InvalidInputError
from composable_ebm.studio.actions import (DEFAULT_TERMS, MAX_SAMPLES, MAX_STEPS, MAX_WORK, ModelCache, Stopped,
                                           energy_models, error_line, generate, page_form, readings_html,
                                           sampler_summary)
from composable_ebm.studio.terms import FORMS, MAX_TERMS, OPERATORS, Term, expression_to_terms, terms_to_expression


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

    page = _Page(gr, models or ModelCache(device, models_root=models_root))
    # delete_cache: every 10 minutes, files Gradio made for the page (grids, chains) older than an hour are removed
    with gr.Blocks(title="cebm studio", analytics_enabled=False, delete_cache=(600, 3600)) as app:
        page.lay_out()
        page.wire()
    app.cebm_css = CSS
    return app


class _Page:
    """The studio's page: its components (`lay_out`), what the controls show, and what each event does (`wire`)."""

    def __init__(self, gr: Any, models: ModelCache) -> None:
        self.gr, self.models = gr, models
        self.offered = energy_models()
        self.out_dir = Path(tempfile.mkdtemp(prefix="cebm-studio-"))
        self.stops: dict[str, threading.Event] = {}  # per browser session: Stop asks its own generation to end

    # ------------------------------------------------------------ what the controls show
    def choices_for(self, model: str) -> list[str]:
        try:
            return value_choices(self.models.attributes(model)) if model else []
        except Exception:  # noqa: BLE001 - a model that does not load offers no values; its error shows on Generate
            return []

    def slot_updates(self, terms: Sequence[Term]) -> list[Any]:
        gr, updates = self.gr, []
        for i in range(MAX_TERMS):
            if i < len(terms):
                t = terms[i]
                values = [f"{a}={v}" for a, v in t.bindings.items()]
                offered_values = self.choices_for(t.model)
                choices = offered_values + [v for v in values if v not in offered_values]
                updates += [gr.update(visible=True), gr.update(value=t.op if i else ("and not" if t.op == "and not" else "and")),
                            gr.update(value=t.model, choices=sorted(set(self.offered) | {t.model})),
                            gr.update(value=values, choices=choices), gr.update(value=t.weight),
                            gr.update(value=1.0 if t.temperature is None else t.temperature)]
            else:
                updates += [gr.update(visible=False), gr.update(value="and"), gr.update(value=None),
                            gr.update(value=[], choices=[]), gr.update(value=1.0), gr.update(value=1.0)]
        return updates

    def note_for(self, text: str, shown: bool = True, form: str = "auto") -> str:
        head = "The controls show this expression" if shown else \
            "The controls cannot show this expression; Generate samples it as typed"
        command = f'`cebm compose "{text}"' + (" --form plain`" if form == "plain" else "`")
        try:
            return (f"{head}; Generate samples it as {command} does, with"
                    f" {sampler_summary(self.models, text, page_form(form))}.")
        except Exception as err:  # noqa: BLE001 - shown in the page as one line
            return f"{head}. {error_line(err)}"

    def expression_and_note(self, count: int, form: str, flat: Sequence[Any]) -> tuple[str, str]:
        try:
            text = terms_to_expression(terms_from_slots(count, flat), form)
        except Exception as err:  # noqa: BLE001 - shown in the page as one line
            return "", error_line(err)
        return text, self.note_for(text, form=form)

    # ------------------------------------------------------------ the components
    def lay_out(self) -> None:
        gr = self.gr
        gr.Markdown("# cebm studio\nCompose energy-based models: pick a model and its value for each term, join"
                    " the terms with *and*, *and not* or *or*, set weights, and generate.")
        self.count = gr.State(len(DEFAULT_TERMS))
        self._term_rows()
        self._controls()
        self._results()

    def _term_rows(self) -> None:
        gr = self.gr
        self.rows, self.fields, self.ups, self.removes = [], [], [], []
        for i in range(MAX_TERMS):
            t = DEFAULT_TERMS[i] if i < len(DEFAULT_TERMS) else None
            with gr.Row(visible=t is not None, elem_id=f"term-{i}", elem_classes=["cebm-term"]) as row:
                op = gr.Dropdown(list(OPERATORS), value="and", label="join", elem_id=f"term-{i}-op", scale=1,
                                 min_width=110)
                model = gr.Dropdown(self.offered, value=t.model if t else None, label="model", allow_custom_value=True,
                                    elem_id=f"term-{i}-model", scale=3, info="bundled, a cached org/name@rev, or a folder under --models-root")
                init_choices = self.choices_for(t.model) if t else []
                values = gr.Dropdown(init_choices, value=[f"{a}={v}" for a, v in t.bindings.items()] if t else [],
                                     multiselect=True, allow_custom_value=True, label="value",
                                     elem_id=f"term-{i}-values", scale=3)
                weight = gr.Number(1.0, label="weight", minimum=0, elem_id=f"term-{i}-weight", scale=1, min_width=90)
                temperature = gr.Number(1.0, label="temperature", elem_id=f"term-{i}-temperature", scale=1,
                                        min_width=90)
                up = gr.Button("↑", elem_id=f"term-{i}-up", scale=0, min_width=40)
                remove = gr.Button("✕", elem_id=f"term-{i}-remove", scale=0, min_width=40)
            self.rows.append(row)
            self.fields += [op, model, values, weight, temperature]
            self.ups.append(up)
            self.removes.append(remove)
        self.slot_outputs = []
        for i in range(MAX_TERMS):
            self.slot_outputs += [self.rows[i]] + self.fields[i * SLOT_FIELDS:(i + 1) * SLOT_FIELDS]

    def _controls(self) -> None:
        gr = self.gr
        with gr.Row():
            self.add = gr.Button("Add term", elem_id="add-term", scale=0)
            self.form = gr.Radio(list(FORMS), value="auto", label="composition", elem_id="form", scale=2,
                                 info="auto: as cebm compose and .sample() (guided where every model has a null"
                                      " condition); guided: guided(...) written out; plain: as written")
        self.expression = gr.Textbox(terms_to_expression(list(DEFAULT_TERMS), "auto"), label="expression",
                                     buttons=["copy"], elem_id="expression", lines=1, max_lines=3)
        self.note = gr.Markdown(self.note_for(terms_to_expression(list(DEFAULT_TERMS), "auto")),
                                elem_id="expression-note")
        with gr.Row():
            self.seed = gr.Number(0, label="seed", precision=0, elem_id="seed", minimum=0)
            self.n = gr.Number(16, label=f"samples (at most {MAX_SAMPLES})", precision=0, elem_id="n", minimum=1,
                               maximum=MAX_SAMPLES)
            self.steps = gr.Textbox("", label="steps per round", elem_id="steps", placeholder="the composite's own")
            self.step_size = gr.Textbox("", label="step size", elem_id="step-size", placeholder="the composite's own")
        with gr.Row():
            self.generate_button = gr.Button("Generate", variant="primary", elem_id="generate", scale=3)
            self.stop_button = gr.Button("Stop", variant="stop", elem_id="stop", scale=1)
        gr.Markdown(f"One request runs at a time; others wait in a queue that shows their place. Each request draws at"
                    f" most {MAX_SAMPLES} samples of at most {MAX_STEPS} steps, {MAX_WORK:,} sample-steps in all"
                    " (`cebm compose` has no such bounds).", elem_id="bounds")

    def _results(self) -> None:
        gr = self.gr
        self.message = gr.Markdown("", elem_id="message")
        with gr.Row():
            self.grid = gr.Image(label="samples", type="pil", elem_id="grid", format="png", interactive=False)
            self.chain = gr.Image(label="chains from noise to sample", type="pil", elem_id="chain", format="png",
                                  interactive=False)
        self.download = gr.DownloadButton("Download PNG", elem_id="download", visible=False)
        self.readings = gr.HTML(elem_id="readings")

    # ------------------------------------------------------------ the events
    def wire(self) -> None:
        self._wire_edits()
        self._wire_structure()
        self._wire_expression()
        self._wire_generate()

    def _wire_edits(self) -> None:
        """An edited control rewrites the expression; a new model offers its values."""
        gr, fields = self.gr, self.fields
        inputs = [self.count, self.form, *fields]

        def on_edit(c, f, *flat):
            return self.expression_and_note(c, f, flat)

        for component in fields + [self.form]:
            component.input(on_edit, inputs, [self.expression, self.note], queue=False)

        def on_model(i):
            def handler(c, f, *flat):
                flat = list(flat)
                choices = self.choices_for(flat[i * SLOT_FIELDS + 1])
                kept = [v for v in flat[i * SLOT_FIELDS + 2] or [] if v in choices]
                flat[i * SLOT_FIELDS + 2] = kept
                text, line = self.expression_and_note(c, f, flat)
                return gr.update(choices=choices, value=kept), text, line
            return handler

        for i in range(MAX_TERMS):
            fields[i * SLOT_FIELDS + 1].input(on_model(i), inputs, [fields[i * SLOT_FIELDS + 2], self.expression,
                                                                    self.note], queue=False)

    def _wire_structure(self) -> None:
        """Add, remove and move terms: each redraws every row."""
        gr, slot_outputs = self.gr, self.slot_outputs
        inputs = [self.count, self.form, *self.fields]
        outputs = [self.count, *slot_outputs, self.expression, self.note]

        def rewrite(terms: list[Term], f: str):
            flat: list[Any] = []
            for t in terms:
                flat += [t.op, t.model, [f"{a}={v}" for a, v in t.bindings.items()], t.weight, t.temperature]
            text, line = self.expression_and_note(len(terms), f, flat)
            return [len(terms), *self.slot_updates(terms), text, line]

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
            terms.append(Term(self.offered[0] if self.offered else "", {}))
            return None

        def drop(i: int) -> Callable[[list[Term]], None]:
            def change(terms: list[Term]) -> None:
                if i < len(terms):
                    del terms[i]
            return change

        def move_up(i: int) -> Callable[[list[Term]], None]:
            def change(terms: list[Term]) -> None:
                if 0 < i < len(terms):
                    terms[i - 1], terms[i] = terms[i], terms[i - 1]
            return change

        self.add.click(restructure(add_term), inputs, outputs, queue=False)
        for i in range(MAX_TERMS):
            self.removes[i].click(restructure(drop(i)), inputs, outputs, queue=False)
            self.ups[i].click(restructure(move_up(i)), inputs, outputs, queue=False)

    def _wire_expression(self) -> None:
        """Typed text fills the controls where they can show it; either way the note says how it is sampled."""
        gr, slot_outputs = self.gr, self.slot_outputs

        def on_expression(text, c, f, *flat):
            unchanged = [c, *[gr.update() for _ in slot_outputs], gr.update(), f]
            try:
                parsed = expression_to_terms(text)
            except Exception as err:  # noqa: BLE001 - shown in the page as one line
                return [*unchanged, error_line(err)]
            if parsed is None:
                return [*unchanged, self.note_for(text, shown=False, form=f)]
            terms, parsed_form = parsed
            if parsed_form == "auto" and f == "plain":  # unwrapped text keeps the page's plain choice
                parsed_form = "plain"
            try:  # a value the model does not have stays out of the controls: one line names the valid ones
                self.models.energy(text)
            except Exception as err:  # noqa: BLE001 - shown in the page as one line
                return [*unchanged, error_line(err)]
            return [len(terms), *self.slot_updates(terms), gr.update(), parsed_form,
                    self.note_for(text, form=parsed_form)]

        for event in (self.expression.submit, self.expression.blur):
            event(on_expression, [self.expression, self.count, self.form, *self.fields],
                  [self.count, *slot_outputs, self.expression, self.form, self.note], queue=False)

    def _wire_generate(self) -> None:
        """Generate samples the expression (one request at a time); Stop ends this session's chain between steps."""
        gr, stops, models = self.gr, self.stops, self.models
        out_dir = self.out_dir

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
        self.generate_button.click(on_generate, [self.expression, self.form, self.seed, self.n, self.steps,
                                                 self.step_size],
                                   [self.grid, self.chain, self.download, self.readings, self.message],
                                   concurrency_limit=1)
        self.stop_button.click(on_stop, None, None, queue=False)
