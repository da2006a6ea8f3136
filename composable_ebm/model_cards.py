"""Model cards (the README.md saved beside config.json and model.safetensors)."""

from __future__ import annotations

import json

from torch import nn

from composable_ebm.configs import config_to_dict
from composable_ebm.energy import Energy, NoiseConditioned
from composable_ebm.errors import a_type, utf8_text

CITATION = """@inproceedings{du2021improved,
  title={Improved Contrastive Divergence Training of Energy-Based Models},
  author={Du, Yilun and Li, Shuang and Tenenbaum, Joshua and Mordatch, Igor},
  booktitle={International Conference on Machine Learning (ICML)},
  year={2021}
}"""


ARXIV_ID = "2012.01316"
"""The paper's arXiv id (Du, Li, Tenenbaum, Mordatch, "Improved Contrastive Divergence Training of
Energy-Based Models"); the Hub links a model to the paper from its ``arxiv:`` tag."""

TAGS = ["energy-based-model", "composable-ebm", "pytorch", f"arxiv:{ARXIV_ID}"]


def card_metadata(datasets: list[str] | None = None, metrics: list[str] | None = None, license: str | None = None,
                  model_name: str | None = None, eval_results: list[dict] | None = None,
                  pipeline_tag: str | None = None) -> str:
    """The card's YAML header through ``huggingface_hub.ModelCardData`` (what the Hub shows and filters on).

    ``eval_results`` rows (``{"task", "dataset", "metric", "value", "name"}``) become the card's
    ``model-index`` through ``huggingface_hub.EvalResult``, so the Hub shows the measured numbers."""
    from huggingface_hub import EvalResult, ModelCardData

    results = None
    if eval_results:
        results = [EvalResult(task_type=r["task"], dataset_type=r["dataset"], dataset_name=r["dataset"],
                              metric_type=r["metric"], metric_value=r["value"], metric_name=r.get("name"))
                   for r in eval_results]
    data = ModelCardData(library_name="composable_ebm", tags=TAGS, license=license, datasets=datasets, metrics=metrics,
                         pipeline_tag=pipeline_tag, model_name=model_name if results else None, eval_results=results)
    return f"---\n{data.to_yaml()}\n---"


def recipe_text(path) -> list[tuple[str, str]]:
    """A recipe file and every base it starts from as ``(file name, text)``, the base first, comments
    removed (a card states facts about its own run, not the notes written beside the shipped weights), so
    the card holds the whole recipe."""
    from pathlib import Path

    import tomllib

    chain, path = [], Path(path)
    while path is not None and len(chain) < 16:
        text = path.read_text()
        chain.append((path.name, text))
        base = tomllib.loads(text).get("base")
        path = (path.parent / base) if isinstance(base, str) else None
    parts = []
    for name, text in reversed(chain):
        lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        lines = [line.split("  #")[0].rstrip() if "  #" in line else line for line in lines]
        lines = [FOLDER_ROOT if line.replace(" ", "").startswith("root=") else line for line in lines]
        parts.append((name, "\n".join(lines)))
    return parts


FOLDER_ROOT = 'root = "IMAGES"'
"""What a card's recipe says for a folder dataset's ``root``: where the images lay on the trainer's machine is no
fact about the model (and a path there is the owner's business)."""


def shown_location(location: str | None) -> str | None:
    """A model's folder as its card's usage block loads it: as given when it is a relative path inside the folder
    the command ran in, else none (an absolute path or one that leaves that folder names the trainer's machine)."""
    from pathlib import PurePath

    if location is None:
        return None
    path = PurePath(location)
    return None if path.is_absolute() or ".." in path.parts else location


def pipeline_tag(model: nn.Module) -> str | None:
    """The Hub task of a model: an image energy without conditions generates unconditionally; a conditional one
    generates what it is conditioned on, which no Hub task names (so none is claimed); another model claims its
    class's (`composable_ebm.pretrained.Pretrained.hub_task`: a classifier classifies, an autoencoder claims none)."""
    if not isinstance(model, Energy):
        return model.hub_task
    if len(getattr(model, "input_shape", ())) == 3 and not getattr(model, "attributes", None):
        return "unconditional-image-generation"
    return None


def model_card(model: nn.Module, recipe: str | list[tuple[str, str]] | None = None, recipe_name: str | None = None, steps: int | None = None,
               notes: str | None = None, repo_id: str | None = None, datasets: list[str] | None = None,
               metrics: list[str] | None = None, location: str | None = None, license: str | None = None,
               eval_results: list[dict] | None = None) -> str:
    """A Markdown card with Hub metadata, what the model is, how to use it and how it was trained.

    The usage block loads from where the model lives: ``repo_id`` (a pushed model), else ``location``
    (a folder or a bundled name), else a placeholder to replace. ``license`` is the owner's to set
    (none by default). Only what is passed in is stated: the card knows nothing else about the run.
    """
    config = config_to_dict(model.config)
    name = config.get("name", type(model).__name__)
    params = sum(p.numel() for p in model.parameters())
    attributes = config.get("attributes") or {}
    energy = isinstance(model, Energy)
    kind = a_type(model)
    lines = [
        card_metadata(datasets, metrics, license, name, eval_results, pipeline_tag(model)),
        "",
        f"# {name}",
        "",
        f"{kind[:1].upper()}{kind[1:]} with {params:,} parameters, saved by composable_ebm as `config.json` +",
        "`model.safetensors`.",
    ]
    if energy and model.latent_source is not None:
        lines += ["", f"An energy over the latents `{model.input_shape}` of the autoencoder `{model.latent_source}`,"
                  " which loading it loads too; its samples are decoded once, after the chain, into images."]
    elif energy:
        lines += ["", f"Input shape: `{model.input_shape}`; value range: `{model.value_range}`."]
    if attributes:
        lines += ["", "Attributes it is conditioned on:" if energy else "Attributes it predicts:", ""]
        lines += [f"- `{a}`: {', '.join(f'`{v}`' for v in values)}" for a, values in attributes.items()]
    lines += _usage(config, energy, repo_id or shown_location(location))
    if steps is not None or recipe:
        lines += ["", "## Training", ""]
        if steps is not None:
            objective = ("denoising score matching" if isinstance(model, NoiseConditioned)
                         else "improved contrastive divergence")
            lines.append(f"Trained for {steps} iterations with {objective} (EMA weights).")
        files = [(recipe_name or "recipe.toml", recipe)] if isinstance(recipe, str) else list(recipe or [])
        if files:
            lines += ["", f"Recipe (`{recipe_name or files[-1][0]}`" + (", after the recipes it starts from" if
                                                                         len(files) > 1 else "") + "):"]
            for name, text in files:
                lines += ["", f"`{name}`:", "", "```toml", text.strip(), "```"]
    if notes:
        lines += ["", notes.strip()]
    lines += ["", "## Config", "", "```json", json.dumps(config, indent=2), "```", "", "## Citation", "",
              f"[arXiv:{ARXIV_ID}](https://arxiv.org/abs/{ARXIV_ID})", "",
              "```bibtex", CITATION, "```", ""]
    return utf8_text("\n".join(lines))


def _usage(config: dict, energy: bool, where: str | None) -> list[str]:
    """The card's "Use" block: an energy sampled (conditioned on its first value), an autoencoder's round trip, a
    classifier reading images; none for a classifier of no attribute. ``where``: the folder or Hub id it loads from (None: a placeholder)."""
    load = f'cebm.load("{where}")' if where else 'cebm.load("PATH_OR_ORG/NAME")  # the folder or Hub id it lives in'
    attributes = config.get("attributes") or {}
    if energy:
        example = ""
        if attributes:
            a, values = next(iter(attributes.items()))
            example = f'.condition({a}="{values[0]}")'
        return ["", "## Use", "", "```python", "import composable_ebm as cebm", "", f"model = {load}",
                f"images = model{example}.sample(n=16, seed=0)", "```"]
    if "latent_channels" in config:  # an autoencoder
        return ["", "## Use", "", "```python", "import torch", "import composable_ebm as cebm", "",
                f"autoencoder = {load}", f"images = torch.rand(4, {config['in_channels']}, {config['image_size']},"
                f" {config['image_size']})  # in [0, 1]", "latents = autoencoder.encode(images)  # standardised",
                "again = autoencoder.decode(latents).clamp(0, 1)", "```"]
    if not attributes:
        return []
    size, channels = config.get("image_size", 32), config.get("in_channels", 3)
    return ["", "## Use", "", "```python", "import torch", "import composable_ebm as cebm", "", f"classifier = {load}",
            f"images = torch.rand(4, {channels}, {size}, {size})  # or samples, in [0, 1]",
            "readings = classifier.predict(images)  # {attribute: value index per image}", "```"]


def refresh_card(card: str, recipe: list[tuple[str, str]] | None, config: dict) -> str:
    """``card`` with its recipe blocks (each `` `name`: `` followed by a TOML block) and its Config block written
    again from ``recipe`` (`recipe_text`) and ``config`` (the model's config as a dict): the card of a model whose
    files moved on while its measured text stays. A file the card does not name is refused."""
    import re

    for name, text in recipe or []:
        pattern = re.compile(rf"(`{re.escape(name)}`:\n\n```toml\n).*?(\n```)", re.S)
        if not pattern.search(card):
            raise ValueError(f"the card has no recipe block for {name}")
        card = pattern.sub(lambda m: m.group(1) + text.strip() + m.group(2), card, count=1)
    pattern = re.compile(r"(## Config\n\n```json\n).*?(\n```)", re.S)
    if not pattern.search(card):
        raise ValueError("the card has no Config block")
    return pattern.sub(lambda m: m.group(1) + json.dumps(config, indent=2) + m.group(2), card, count=1)
