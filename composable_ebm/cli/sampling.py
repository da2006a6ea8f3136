"""``cebm compose`` and ``cebm sample``: expressions and models sampled into image grids."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from composable_ebm.cli.common import (
    CountOpt, DeviceOpt, FormOpt, MethodOpt, NoiseOpt, PrecisionOpt, ProgressOpt, RefreshOpt, RoundsOpt, ScaleOpt,
    SetOpt, StepSizeOpt, StepsOpt, ExpressionCommand, _device, _load_energy, _load_expression, _overrides, _parse_bindings, app,
)
from composable_ebm.errors import InvalidInputError



def _sampling_options() -> list[inspect.Parameter]:
    """The options of every command that samples into an image grid (`sample`, `compose`), defined once."""
    options = {
        "n": (CountOpt, 16),
        "chain": (Annotated[Optional[Path], typer.Option(help="Also write the chains as a PNG strip.")], None),
        "seed": (Annotated[int, typer.Option(min=0, max=2**63 - 1, help="Random seed.")], 0),
        "steps": (StepsOpt, None),
        "rounds": (RoundsOpt, None),
        "step_size": (StepSizeOpt, None),
        "precision": (PrecisionOpt, None),
        "method": (MethodOpt, None),
        "noise": (NoiseOpt, None),
        "set_": (SetOpt, []),
        "device": (DeviceOpt, None),
        "scale": (ScaleOpt, None),
        "refresh": (RefreshOpt, False),
        "progress": (ProgressOpt, True),
    }
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
            for name, (annotation, default) in options.items()]


def sampling_command(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command that takes ``**options`` the shared sampling options (`_sampling_options`)."""
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    command.__signature__ = signature.replace(parameters=own + _sampling_options())  # typer reads this signature
    return command


@app.command(cls=ExpressionCommand)
@sampling_command
def compose(
    expression: Annotated[str, typer.Argument(help='e.g. "shapes-color[color=red] + 2*shapes-shape[shape=circle]".')],
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG grid to write.")] = Path("composed.png"),
    form: FormOpt = "auto",
    **options: Any,
) -> None:
    """Compose models with the energy algebra (+, -, *, /, |, [attr=value], guided(...)) and sample an image grid.

    \b
    Example: cebm compose "shapes-color[color=red] + shapes-shape[shape=circle]" -n 16 -o grid.png
    """
    from composable_ebm.pipeline import plan

    _check_outputs(output, options["chain"])
    energy = _load_expression(expression, _device(options["device"]), options["refresh"])
    chosen = plan(energy, form, **_overrides(**options))
    typer.echo(f"sampling {chosen.energy.expression()}")
    _sample_to_files(chosen, output, **options)


@app.command()
@sampling_command
def sample(
    model: Annotated[str, typer.Argument(help="Model folder, bundled name or org/name on the Hub.")],
    condition: Annotated[list[str], typer.Option("--condition", "-c", help="attr=value (repeatable).")] = [],  # noqa: B006
    output: Annotated[Path, typer.Option("--output", "-o", help="PNG grid to write.")] = Path("samples.png"),
    **options: Any,
) -> None:
    """Sample one model (optionally conditioned) into an image grid: `cebm compose "MODEL[attr=value]"` for one
    model, with the same options.

    \b
    Example: cebm sample shapes-color --condition color=blue -n 16 -o blue.png --steps 80
    """
    from composable_ebm.pipeline import plan

    _check_outputs(output, options["chain"])
    energy = _load_energy(model, _device(options["device"]), options["refresh"])
    bindings = _parse_bindings(condition)
    _sample_to_files(plan(energy.condition(**bindings) if bindings else energy, **_overrides(**options)), output,
                     **options)


def _check_outputs(output: Path, chain: Path | None) -> None:
    """Refuse an output name with no image suffix before any model is loaded."""
    from composable_ebm.images import image_format

    image_format(output)
    if chain is not None:
        image_format(chain)
        if chain.resolve() == output.resolve():
            raise InvalidInputError(f"--chain and --output are both {output}; the chain strip would replace the grid")


def _sample_to_files(chosen, output: Path, *, n: int, seed: int, chain: Path | None, scale: int | None,
                     progress: bool, **options: Any) -> None:
    """Run a plan (`composable_ebm.pipeline.plan`: the energy in its form, its settings decided) and write the grid
    (and the chain strip)."""
    from composable_ebm.images import save_chain_strip, save_image_grid, save_scatter
    from composable_ebm.pipeline import run

    energy = chosen.energy
    images = len(energy.sample_shape) == 3
    if chain is not None and not images:
        raise ValueError(f"--chain draws image strips; this energy takes inputs of shape {energy.sample_shape}")
    total = chosen.config.total_steps
    keep = (max(1, total // 10) if total else 1) if chain is not None else 0
    result = run(chosen, n, seed=seed, progress=progress, keep_every=keep)
    if result.config.step_size != chosen.config.step_size:
        typer.echo(f"the step size adapted to {result.config.step_size:.3g} (from {chosen.config.step_size:g}) over"
                   f" {chosen.config.adapt} transitions")
    if images:
        save_image_grid(result.samples, output, scale=scale)
    elif energy.input_shape == (2,):
        save_scatter(result.samples, output, energy.value_range)
    else:
        raise ValueError(f"cannot draw samples of shape {energy.sample_shape}; use composable_ebm.sample in Python")
    typer.echo(f"wrote {output}")
    if chain is not None:
        save_chain_strip(result.chain, chain)
        typer.echo(f"wrote {chain}")
