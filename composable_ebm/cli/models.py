"""``cebm list``, ``push``, ``plot``, ``info`` and ``studio``: the models at hand and what to do with them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from composable_ebm.cli.common import DeviceOpt, RefreshOpt, _device, app
from composable_ebm.errors import InvalidInputError



@app.command("list")
def list_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the models that load without a download: bundled ones and those in the local Hub cache.

    \b
    Example: cebm list
    """
    from composable_ebm.models import list_models

    rows = list_models()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        attrs = "; ".join(f"{a}: {', '.join(v)}" for a, v in row["attributes"].items()) or "(unconditional)"
        kind = row["type"] or f"unreadable ({row['error']})"
        typer.echo(f"{row['name']:<28} {kind:<22} {attrs}   [{row['source'].split(' (')[0]}]")


@app.command()
def push(
    model_dir: Annotated[Path, typer.Argument(help="A saved model folder (config.json + model.safetensors).")],
    repo_id: Annotated[str, typer.Argument(help="Hub repository, org/name (created if needed).")],
    revision: Annotated[Optional[str], typer.Option(help="Branch to commit to (created if needed).")] = None,
    private: Annotated[bool, typer.Option("--private", help="Create the repository private.")] = False,
    message: Annotated[Optional[str], typer.Option("--message", "-m", help="Commit message.")] = None,
    token: Annotated[Optional[str], typer.Option(
        "--token", help="Hub token (default: HF_TOKEN or the one `hf auth login` saved).")] = None,
) -> None:
    """Publish a model folder to the Hugging Face Hub (token from --token, HF_TOKEN or `hf auth login`).

    \b
    Example: cebm push runs/color/model my-org/shapes-color --revision v1
    """
    from composable_ebm.models import push_folder

    if not model_dir.is_dir():
        raise InvalidInputError(f"no model folder at {model_dir}")
    url = push_folder(model_dir, repo_id, revision=revision, private=private, token=token, commit_message=message)
    typer.echo(f"pushed {model_dir} to {repo_id}" + (f"@{revision}" if revision else "") + f": {url}")


@app.command()
def plot(
    run: Annotated[Path, typer.Argument(help="A run folder (or its log.jsonl).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG to write.")] = Path("health.png"),
) -> None:
    """Plot training health: energy difference and |grad L_CD| vs |grad L_KL|.

    \b
    Example: cebm plot runs/color -o health.png
    """
    from composable_ebm.evaluation import plot_training_health

    typer.echo(f"wrote {plot_training_health(run, output)}")


@app.command()
def info(model: Annotated[str, typer.Argument(help="Model folder, bundled name or org/name.")],
         refresh: RefreshOpt = False,
         as_json: Annotated[bool, typer.Option("--json", help="Print the whole config.json as JSON instead.")] = False,
         ) -> None:
    """Show a model's type, attributes, size and default sampler settings.

    \b
    Example: cebm info shapes-color
    """
    from composable_ebm.models import resolve_source, typed_configs
    from composable_ebm.persistence import WEIGHTS_NAME, read_config, weights_header

    folder = resolve_source(model, refresh=refresh)
    payload = read_config(folder)
    _, defaults = typed_configs(folder, payload)  # refuses a config that could not be loaded
    import math

    tensors = sum(math.prod(shape) for shape, _ in weights_header(folder / WEIGHTS_NAME).values())
    if as_json:
        typer.echo(json.dumps({"folder": str(folder), "tensor_elements": tensors, **payload}, indent=2))
        return
    config = payload["config"]
    rows = [("name", config.get("name", "")), ("type", payload["model_type"]), ("folder", str(folder)),
            ("weights", f"{tensors:,}")]
    if "image_size" in config:
        rows.append(("input", f"{config.get('in_channels', 3)} x {config['image_size']} x {config['image_size']}"))
    attributes = config.get("attributes") or {}
    rows += [(f"attribute {a}", ", ".join(v)) for a, v in attributes.items()] or [("attributes", "(unconditional)")]
    if "null_condition" in config and attributes:
        rows.append(("unconditional energy", "trained (label dropout)" if config["null_condition"] else "no"))
    if config.get("input_transforms"):
        rows.append(("input transforms", ", ".join(config["input_transforms"])))
    if "sigma_min" in config and "sigma_max" in config:
        rows.append(("noise levels trained", f"{config['sigma_min']:g} to {config['sigma_max']:g}"))
    if defaults is not None:
        interval = defaults.guidance_interval
        rows += [("sampler", defaults.sampler.summary()), ("guidance scale", f"{defaults.guidance_scale:g}"
                                                            + (f" at noise levels ({interval[0]:g}, {interval[1]:g}],"
                                                               " 1 elsewhere" if interval else "")
                                                            + (" (alone too)" if defaults.guided_alone else ""))]
        if defaults.alone:
            rows.append(("sampler alone", defaults.alone_sampler().summary()))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width}}  {value}")


@app.command()
def studio(
    host: Annotated[str, typer.Option(help="Address to serve on (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[Optional[int], typer.Option(help="Port (default: the first free one from 7860).",
                                                 min=1, max=65535)] = None,
    device: DeviceOpt = None,
    allowed_host: Annotated[list[str], typer.Option(
        "--allowed-host", help="Another host name the page may be reached by (repeatable); the host served on and "
                               "localhost are always allowed, any other Host is refused (403).")] = [],  # noqa: B006
    allowed_origin: Annotated[list[str], typer.Option(
        "--allowed-origin", help="Another origin (scheme://host:port) whose pages may call the studio (repeatable); "
                                 "by default only the studio's own page may.")] = [],  # noqa: B006
    models_root: Annotated[Optional[Path], typer.Option(
        "--models-root", help="A folder whose model folders the page may load by path; without it, the page loads "
                              "bundled models and models already in the Hub cache only.")] = None,
) -> None:
    """Compose models in the browser: terms, weights, negation, the expression, samples with their readings.

    Needs the studio extra: pip install -e ".[studio]". It works offline (no analytics, local fonts).

    \b
    Example: cebm studio --port 7860
    """
    import importlib.util

    if importlib.util.find_spec("gradio") is None:
        typer.secho('error: cebm studio needs Gradio, the studio extra: pip install -e ".[studio]" (from a clone)'
                    ' or pip install "composable_ebm[studio]"', fg=typer.colors.RED, err=True)
        raise typer.Exit(2)
    from composable_ebm.studio import launch

    launch(host=host, port=port, device=str(_device(device)), allowed_host=tuple(allowed_host),
           allowed_origin=tuple(allowed_origin), models_root=models_root)
