"""Model cards (the README.md saved beside config.json and model.safetensors)."""

from __future__ import annotations

import json

from torch import nn

from composable_ebm.configs import config_to_dict
from composable_ebm.energy import Energy

CITATION = """@inproceedings{du2021improved,
  title={Improved Contrastive Divergence Training of Energy-Based Models},
  author={Du, Yilun and Li, Shuang and Tenenbaum, Joshua and Mordatch, Igor},
  booktitle={International Conference on Machine Learning (ICML)},
  year={2021}
}"""


TAGS = ["energy-based-model", "composable-ebm", "pytorch"]


def card_metadata(datasets: list[str] | None = None, metrics: list[str] | None = None) -> str:
    """The card's YAML header, through ``huggingface_hub.ModelCardData`` (what the Hub shows and filters on)."""
    from huggingface_hub import ModelCardData

    data = ModelCardData(library_name="composable_ebm", tags=TAGS, license="mit", datasets=datasets, metrics=metrics)
    return f"---\n{data.to_yaml()}\n---"


def model_card(model: nn.Module, recipe: str | None = None, recipe_name: str | None = None, steps: int | None = None,
               notes: str | None = None, repo_id: str | None = None, datasets: list[str] | None = None,
               metrics: list[str] | None = None) -> str:
    """A Markdown card with Hub metadata, what the model is, how to use it and how it was trained.

    The usage block loads ``repo_id`` when given (a pushed model), else the model's name (a bundled model).
    """
    config = config_to_dict(model.config)
    name = config.get("name", type(model).__name__)
    params = sum(p.numel() for p in model.parameters())
    attributes = config.get("attributes") or {}
    lines = [
        card_metadata(datasets, metrics),
        "",
        f"# {name}",
        "",
        f"A `{type(model).__name__}` with {params:,} parameters, saved by composable_ebm as `config.json` +",
        "`model.safetensors`.",
    ]
    if isinstance(model, Energy):
        lines += ["", f"Input shape: `{model.input_shape}`; value range: `{model.value_range}`."]
    if attributes:
        lines += ["", "Attributes it is conditioned on:", ""]
        lines += [f"- `{a}`: {', '.join(f'`{v}`' for v in values)}" for a, values in attributes.items()]
    if isinstance(model, Energy):
        example = ""
        if attributes:
            a, values = next(iter(attributes.items()))
            example = f'.condition({a}="{values[0]}")'
        lines += ["", "## Use", "", "```python", "import composable_ebm as cebm", "",
                  f'model = cebm.load("{repo_id or name}")' + ("" if repo_id else "  # or the folder / Hub id it lives in"),
                  f"images = model{example}.sample(n=16, seed=0)", "```"]
    if steps is not None or recipe:
        lines += ["", "## Training", ""]
        if steps is not None:
            lines.append(f"Trained for {steps} iterations with improved contrastive divergence (EMA weights).")
        if recipe:
            lines += ["", f"Recipe (`{recipe_name or 'recipe.toml'}`):", "", "```toml", recipe.strip(), "```"]
    if notes:
        lines += ["", notes.strip()]
    lines += ["", "## Config", "", "```json", json.dumps(config, indent=2), "```", "", "## Citation", "",
              "```bibtex", CITATION, "```", ""]
    return "\n".join(lines)
