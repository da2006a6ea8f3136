"""``cebm studio``: compose models in the browser.

A local web app (Gradio, the optional ``studio`` extra: ``pip install -e ".[studio]"``) that edits a list
of terms, shows the expression ``cebm compose`` would take for them, samples it through the same pipeline
(`composable_ebm.pipeline.sample`) and shows each sample with the reading of a classifier that covers the models'
attributes (`covering_classifier`). Its controls show the tree of the one expression grammar
(`composable_ebm.expression.parse_tree`).

- `terms`: the page's terms and the expression they write and read back;
- `actions`: what the page does, as plain functions tested without a browser (one generation, the models it may
  load, the readings);
- `layout`: the page, `build_app`, wiring the components to the actions;
- `server`: `launch`, which serves it only to its own hosts and origin, and takes no uploads (`HostGuard`).
"""

from composable_ebm.studio.actions import (
    CLASSIFIER, DEFAULT_TERMS, MAX_KEPT_GRIDS, MAX_MODELS, MAX_SAMPLES, MAX_STEPS, MAX_WORK, Generation, ModelCache,
    Reading, Stopped, asked_attributes, covering_classifier, energy_models, error_line, generate, model_attributes,
    page_form, read_samples, readings_html, sampler_overrides, sampler_summary, studio_loader,
)
from composable_ebm.studio.layout import CSS, SLOT_FIELDS, build_app, terms_from_slots, value_choices
from composable_ebm.studio.server import MAX_UPLOAD_BYTES, HostGuard, allowed_hosts, launch, origin_of
from composable_ebm.studio.terms import (
    FORMS, MAX_TERMS, OPERATORS, Term, alternatives, expression_to_terms, term_text, terms_to_expression,
)

__all__ = [
    "CLASSIFIER", "CSS", "DEFAULT_TERMS", "FORMS", "MAX_KEPT_GRIDS", "MAX_MODELS", "MAX_SAMPLES", "MAX_STEPS",
    "MAX_TERMS", "MAX_UPLOAD_BYTES", "MAX_WORK", "OPERATORS", "SLOT_FIELDS", "Generation", "HostGuard", "ModelCache",
    "Reading", "Stopped", "Term", "allowed_hosts", "alternatives", "asked_attributes", "build_app",
    "covering_classifier", "energy_models", "error_line", "expression_to_terms", "generate", "launch",
    "model_attributes", "origin_of", "page_form", "read_samples", "readings_html", "sampler_overrides",
    "sampler_summary", "studio_loader", "term_text", "terms_from_slots", "terms_to_expression", "value_choices",
]
