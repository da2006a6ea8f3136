"""The ``cebm`` command line: train, sample, compose, eval, plot, info."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import torch
import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Energy-based models that compose.")
eval_app = typer.Typer(no_args_is_help=True, help="Evaluate models: compositional accuracy, OOD AUROC.")
app.add_typer(eval_app, name="eval")


def _device(device: str | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _parse_bindings(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        for part in item.split(","):
            if "=" not in part:
                raise typer.BadParameter(f"expected attr=value, got {part!r}")
            key, value = part.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def _overrides(steps: int | None, rounds: int | None, step_size: float | None, precision: str | None) -> dict:
    given = {"steps": steps, "rounds": rounds, "step_size": step_size, "precision": precision}
    return {k: v for k, v in given.items() if v is not None}


def _fail(err: Exception) -> typer.Exit:
    typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=2)


StepsOpt = Annotated[Optional[int], typer.Option(help="Langevin steps per round (default: the model's).")]
RoundsOpt = Annotated[Optional[int], typer.Option(help="Augmentation rounds (Algorithm 2).")]
StepSizeOpt = Annotated[Optional[float], typer.Option("--step-size", help="Langevin step size.")]
PrecisionOpt = Annotated[Optional[str], typer.Option(help="float32 or bfloat16 (autocast for the energy).")]
DeviceOpt = Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:1 ... (default: cuda if available).")]


@app.command()
def train(
    recipe: Annotated[Path, typer.Argument(help="A TOML recipe (see recipes/).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder: checkpoint, log, model.")],
    steps: Annotated[Optional[int], typer.Option(help="Override the recipe's number of steps.")] = None,
    resume: Annotated[bool, typer.Option(help="Resume from OUT/checkpoint.pt if it exists.")] = True,
    allow_config_change: Annotated[
        bool, typer.Option(help="Resume even if the recipe's training settings differ from the checkpoint's.")
    ] = False,
    device: DeviceOpt = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Train an energy with Algorithm 1 and save its EMA weights to OUT/model."""
    from tqdm.auto import tqdm

    from composable_ebm.evaluation import plot_training_health
    from composable_ebm.hub import save_model
    from composable_ebm.model_cards import model_card
    from composable_ebm.recipes import build_dataset, build_model, load_recipe
    from composable_ebm.training import Trainer, TrainingDiverged, init_distributed, read_log

    try:
        spec = load_recipe(recipe)
        init_distributed()
        data = build_dataset(spec.data)
        model = build_model(spec, data)
    except (ValueError, FileNotFoundError, ModuleNotFoundError) as err:
        raise _fail(err) from err
    trainer = Trainer(model, data, spec.trainer, out_dir=out, device=_device(device))
    try:
        if resume and trainer.resume(allow_config_change=allow_config_change):
            typer.echo(f"resumed from step {trainer.step}")
    except ValueError as err:
        raise _fail(err) from err
    total = steps if steps is not None else spec.trainer.steps
    bar = tqdm(total=total, initial=trainer.step, disable=not progress or trainer.rank != 0, desc="training")

    def tick(step: int, stats: dict) -> None:
        bar.update(step - bar.n)
        bar.set_postfix(e_diff=f"{stats['e_diff']:+.3f}", refresh=False)

    try:
        summary = trainer.fit(total, callback=tick)
    except TrainingDiverged as err:
        raise _fail(err) from err
    finally:
        bar.close()
    if trainer.rank == 0:
        ema = trainer.ema
        ema.sampler_config = model.sampler_config
        card = model_card(ema, recipe=recipe.read_text(), recipe_name=recipe.name, steps=summary.steps)
        save_model(ema, out / "model", card=card)
        log = out / Trainer.LOG
        if log.is_file() and any("e_diff" in r for r in read_log(log)):  # a run shorter than log_every has none
            plot_training_health(out, out / "health.png", title=recipe.stem)
        typer.echo(f"trained {summary.steps} steps ({summary.rollbacks} rollbacks); model in {out / 'model'}")


@app.command()
def sample(
    model: Annotated[str, typer.Argument(help="Model folder, bundled name or org/name on the Hub.")],
    n: Annotated[int, typer.Option("-n", help="Number of samples.")] = 16,
    condition: Annotated[list[str], typer.Option("--condition", "-c", help="attr=value (repeatable).")] = [],  # noqa: B006
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG grid to write.")] = Path("samples.png"),
    chain: Annotated[Optional[Path], typer.Option(help="Also write the chains as a PNG strip.")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    steps: StepsOpt = None,
    rounds: RoundsOpt = None,
    step_size: StepSizeOpt = None,
    precision: PrecisionOpt = None,
    device: DeviceOpt = None,
) -> None:
    """Sample one model (optionally conditioned) into an image grid."""
    from composable_ebm.hub import load_model

    try:
        energy = load_model(model, _device(device))
        bindings = _parse_bindings(condition)
        if bindings:
            energy = energy.condition(**bindings)
        _sample_to_files(energy, n, seed, output, chain, _overrides(steps, rounds, step_size, precision))
    except (ValueError, FileNotFoundError) as err:
        raise _fail(err) from err


@app.command()
def compose(
    expression: Annotated[str, typer.Argument(help='e.g. "color\\[color=red] + 2*shape\\[shape=circle]".')],
    n: Annotated[int, typer.Option("-n", help="Number of samples.")] = 16,
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG grid to write.")] = Path("composed.png"),
    chain: Annotated[Optional[Path], typer.Option(help="Also write the chains as a PNG strip.")] = None,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    steps: StepsOpt = None,
    rounds: RoundsOpt = None,
    step_size: StepSizeOpt = None,
    precision: PrecisionOpt = None,
    device: DeviceOpt = None,
) -> None:
    """Compose models with the energy algebra (+, -, *, /, |, \\[attr=value]) and sample an image grid."""
    try:
        energy = _load_expression(expression, _device(device))
        typer.echo(f"sampling {energy.expression()}")
        _sample_to_files(energy, n, seed, output, chain, _overrides(steps, rounds, step_size, precision))
    except (ValueError, FileNotFoundError) as err:
        raise _fail(err) from err


def _load_expression(expression: str, device: torch.device):
    """The composite energy of an expression, each named model loaded once onto ``device``."""
    from composable_ebm.expression import parse_expression
    from composable_ebm.hub import load_model

    return parse_expression(expression, lambda name: load_model(name, device))


def _sample_to_files(energy, n: int, seed: int, output: Path, chain: Path | None, overrides: dict) -> None:
    from composable_ebm.images import save_chain_strip, save_image_grid, save_scatter
    from composable_ebm.sampling import sample as run_sampler

    images = len(energy.input_shape) == 3
    if chain is not None and not images:
        raise ValueError(f"--chain draws image strips; this energy takes inputs of shape {energy.input_shape}")
    total = (overrides.get("steps") or 0) * (overrides.get("rounds") or 1)
    keep = max(1, total // 10) if chain is not None and total else (4 if chain is not None else 0)
    result = run_sampler(energy, n, seed=seed, progress=True, keep_every=keep, **overrides)
    if images:
        save_image_grid(result.samples, output)
    elif energy.input_shape == (2,):
        save_scatter(result.samples, output, energy.value_range)
    else:
        raise ValueError(f"cannot draw samples of shape {energy.input_shape}; use composable_ebm.sample in Python")
    typer.echo(f"wrote {output}")
    if chain is not None:
        save_chain_strip(result.chain, chain)
        typer.echo(f"wrote {chain}")


@app.command()
def plot(
    run: Annotated[Path, typer.Argument(help="A run folder (or its log.jsonl).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG to write.")] = Path("health.png"),
) -> None:
    """Plot training health: energy difference and |grad L_CD| vs |grad L_KL|."""
    from composable_ebm.evaluation import plot_training_health

    try:
        typer.echo(f"wrote {plot_training_health(run, output)}")
    except (ValueError, FileNotFoundError) as err:
        raise _fail(err) from err


@app.command()
def info(model: Annotated[str, typer.Argument(help="Model folder, bundled name or org/name.")]) -> None:
    """Show a model's type, attributes, size and default sampler settings."""
    from composable_ebm.hub import read_config, resolve_source

    try:
        folder = resolve_source(model)
        payload = read_config(folder)
    except (ValueError, FileNotFoundError) as err:
        raise _fail(err) from err
    from safetensors.torch import load_file

    tensors = sum(t.numel() for t in load_file(folder / "model.safetensors").values())
    typer.echo(json.dumps({"folder": str(folder), "tensor_elements": tensors, **payload}, indent=2))


@eval_app.command("compose")
def eval_compose(
    expression: Annotated[str, typer.Argument(help="Composition expression, as for `cebm compose`.")],
    classifier: Annotated[str, typer.Option(help="Attribute classifier (folder or name).")],
    target: Annotated[list[str], typer.Option("--target", "-t", help="attr=value the samples should show.")],
    n: Annotated[int, typer.Option("-n")] = 64,
    seed: int = 0,
    steps: StepsOpt = None,
    rounds: RoundsOpt = None,
    step_size: StepSizeOpt = None,
    device: DeviceOpt = None,
) -> None:
    """Compositional accuracy: how often the classifier finds every target attribute in composed samples."""
    from composable_ebm.evaluation import compositional_accuracy
    from composable_ebm.hub import load_model
    from composable_ebm.sampling import sample as run_sampler

    dev = _device(device)
    try:
        energy = _load_expression(expression, dev)
        clf = load_model(classifier, dev)
        samples = run_sampler(energy, n, seed=seed, **_overrides(steps, rounds, step_size, None)).samples
        score = compositional_accuracy(samples, clf, _parse_bindings(target))
    except (ValueError, FileNotFoundError) as err:
        raise _fail(err) from err
    typer.echo(json.dumps({"expression": energy.expression(), "n": score.n, "per_attribute": score.per_attribute,
                           "joint": score.joint}, indent=2))


@eval_app.command("ood")
def eval_ood(
    model: Annotated[str, typer.Argument(help="Model folder, bundled name or org/name.")],
    in_data: Annotated[str, typer.Option("--in", help="In-distribution data: shapes, digits.")],
    out_data: Annotated[str, typer.Option("--out", help="Out-of-distribution data: shapes, digits, noise.")],
    n: Annotated[int, typer.Option("-n")] = 500,
    seed: int = 0,
    device: DeviceOpt = None,
) -> None:
    """OOD AUROC of -E(x) between two datasets (resized to the model's input shape)."""
    import torch.nn.functional as F

    from composable_ebm.data import digits, shapes
    from composable_ebm.evaluation import ood_auroc
    from composable_ebm.hub import load_model

    try:
        energy = load_model(model, _device(device))
    except (ValueError, FileNotFoundError) as err:
        raise _fail(err) from err
    c, h, w = energy.input_shape

    def images(name: str, offset: int) -> torch.Tensor:
        if name == "shapes":
            x = shapes(n, h, seed=seed + offset, split="all").images
        elif name == "digits":
            x = digits(h).images[:n]
        elif name == "noise":
            x = torch.rand(n, c, h, w, generator=torch.Generator().manual_seed(seed + offset))
        else:
            raise typer.BadParameter(f"unknown data {name!r}; valid choices: ['digits', 'noise', 'shapes']")
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False) if x.shape[-1] != w else x
        return x.expand(-1, c, -1, -1) if x.shape[1] == 1 and c == 3 else x[:, :c]

    typer.echo(json.dumps({"auroc": ood_auroc(energy, images(in_data, 0), images(out_data, 1)), "n": n}))


if __name__ == "__main__":  # `python -m composable_ebm.cli`, e.g. under torchrun
    app()
