"""The ``cebm`` command line: train, sample, compose, eval, plot, info.

Every failure the library expects ends in one line on stderr that names the file or option,
the problem and the valid choices (``--debug`` shows the traceback instead). Exit status: 0 on
success, 1 on a failure at run time (a diverged run, a failed download), 2 on bad usage or bad input.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

import typer
from typer.core import TyperGroup

from composable_ebm.errors import BUG_EXIT_CODE, InvalidInputError, a_type, bug_line, exit_code_for, one_line

if TYPE_CHECKING:  # torch is imported by the commands that need it, so `cebm --help` starts at once
    import torch

DEBUG_KEY = "cebm.debug"
MAX_THREADS = 1024
"""Most CPU threads --threads may ask torch for."""
MAX_SAMPLES = 1 << 20
"""Most samples one command draws (-n): `composable_ebm.sampling.runner.MAX_SAMPLES`, written out so that `cebm --help`
imports no torch."""


class _Group(TyperGroup):
    """Reports the library's errors as one line and an exit status instead of a traceback."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except typer.BadParameter as err:  # an option out of its range or choices, checked by typer: one line too
            where = f"; see {err.ctx.command_path} --help" if err.ctx is not None else ""
            typer.secho(f"error: {err.format_message().rstrip('.')}{where}", fg=typer.colors.RED, err=True)
            raise typer.Exit(2) from err
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # typer's own: help, exits
        except Exception as err:
            code = exit_code_for(err)
            if ctx.meta.get(DEBUG_KEY):  # the traceback, and the exit status the error has without --debug
                import traceback

                traceback.print_exc()
                raise typer.Exit(BUG_EXIT_CODE if code is None else code) from err
            if code is None:
                typer.secho(f"error: {bug_line(err)}", fg=typer.colors.RED, err=True)
                raise typer.Exit(BUG_EXIT_CODE) from err
            typer.secho(f"error: {one_line(err)}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code) from err


# rich_markup_mode=None: help text is shown as written, so the [attr=value] of the examples stays visible
app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True, invoke_without_command=True,
                  help="Energy-based models that compose.", rich_markup_mode=None,
                  pretty_exceptions_enable=False)
eval_app = typer.Typer(no_args_is_help=True, help="Evaluate models: compositional accuracy, OOD AUROC, FID.",
                       rich_markup_mode=None)
app.add_typer(eval_app, name="eval")


@app.callback()
def _main(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback of an error.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", is_eager=True)] = False,
    threads: Annotated[Optional[int], typer.Option(
        "--threads", help="CPU threads for torch (default: CEBM_THREADS, else OMP_NUM_THREADS, else the CPUs this "
                          "process may use). With several jobs on one machine, give each 1.")] = None,
) -> None:
    if version:
        from composable_ebm import __version__

        typer.echo(f"composable_ebm {__version__}")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)
    ctx.meta[DEBUG_KEY] = debug
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise typer.BadParameter(f"--threads must be a whole number from 1 to {MAX_THREADS}, got {threads}")
    _THREADS["n"] = default_threads() if threads is None else threads


_THREADS: dict[str, int] = {}


def default_threads() -> int:
    """``CEBM_THREADS``, else ``OMP_NUM_THREADS``, else the CPUs this process may run on (its affinity,
    which containers and ``taskset`` restrict; torch's own default counts the machine's cores)."""
    for name in ("CEBM_THREADS", "OMP_NUM_THREADS"):
        text = os.environ.get(name, "").strip()
        if text:
            if not text.isdigit() or int(text) < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {text!r}")
            return int(text)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _torch():
    """torch, with the thread count chosen by --threads (imported only by the commands that need it)."""
    import torch

    if _THREADS.get("n") and torch.get_num_threads() != _THREADS["n"]:
        torch.set_num_threads(_THREADS["n"])
    return torch


def _device(device: str | None) -> torch.device:
    """``--device``, checked: a malformed name or a device this machine lacks is one clear line."""
    torch = _torch()
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    here = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise InvalidInputError(f"--device {device!r} is not a device name; valid choices here: {here}") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise InvalidInputError(f"--device {device}: no such CUDA device on this machine; valid choices here: {here}")
    if dev.type not in ("cpu", "cuda"):
        raise InvalidInputError(f"--device {device}: unsupported device type {dev.type!r}; valid choices here: {here}")
    return dev


def _parse_bindings(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        for part in item.split(","):
            if "=" not in part:
                raise typer.BadParameter(f"expected attr=value, got {part!r}")
            key, value = part.split("=", 1)
            if key.strip() in out:
                raise InvalidInputError(f"{key.strip()} is bound twice ({out[key.strip()]} and {value.strip()});"
                                        " an attribute takes one value (for either, compose with |)")
            out[key.strip()] = value.strip()
    return out


SAMPLER_SETTINGS = ("steps", "rounds", "step_size", "precision", "method", "noise")
"""The sampling commands' options that override the model's sampler settings (checked by ``SamplerConfig``)."""


def _overrides(**given: Any) -> dict:
    """The sampler settings given on the command line, the rest left to the model."""
    return {k: v for k, v in given.items() if k in SAMPLER_SETTINGS and v is not None}


def _noise(text: str | None) -> float | str | None:
    """``--noise``: a number, or ``exact``."""
    if text is None or text == "exact":
        return text
    try:
        return float(text)
    except ValueError:
        raise typer.BadParameter(f"must be a number or 'exact', got {text!r}") from None


# the choices are the library's own (SamplerConfig's fields, pipeline.FORMS), written here so that `cebm --help`
# does not import torch; tests/test_cli.py checks that they agree. Sampler methods come from a registry, so
# --method takes any name and the library checks it (one line naming the registered ones).
Precision = Literal["float32", "bfloat16"]
Form = Literal["auto", "plain", "guided"]

StepsOpt = Annotated[Optional[int], typer.Option(min=1, help="Langevin steps per round (default: the model's).")]
RoundsOpt = Annotated[Optional[int], typer.Option(min=1, help="Augmentation rounds (Algorithm 2).")]
StepSizeOpt = Annotated[Optional[float], typer.Option("--step-size", min=0.0, help="Langevin step size.")]
PrecisionOpt = Annotated[Optional[Precision], typer.Option(help="Autocast for the energy (default: the model's).")]
MethodOpt = Annotated[Optional[str], typer.Option(
    help="Sampler: langevin, mala, or another registered method (default: the model's).")]
NoiseOpt = Annotated[Optional[str], typer.Option(parser=_noise, metavar="NUMBER|exact",
                                                 help="Noise std per step, or 'exact' for sqrt(2 * step size).")]
DeviceOpt = Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:1 ... (default: cuda if available).")]
ProgressOpt = Annotated[bool, typer.Option(help="Show a progress bar.")]
FormOpt = Annotated[Form, typer.Option(
    help="auto: a sum of conditioned models with unconditional energies is sampled in its guided form (better for the"
         " bundled models); plain: the expression as written; guided: guided(expression).")]
CountOpt = Annotated[int, typer.Option("-n", min=1, max=MAX_SAMPLES, help="Number of samples.")]
RefreshOpt = Annotated[bool, typer.Option("--refresh", help="Ask the Hub for the newest revision of org/name models and "
                                          "download them again, even when cached.")]
OverwriteOpt = Annotated[bool, typer.Option(
    help="Write into an --out that is not empty: its model files are replaced, other files stay.")]
ScaleOpt = Annotated[Optional[int], typer.Option(
    min=1, max=64, help="Upscale each image this many times, nearest neighbour (default: to at least 64 pixels).")]


@app.command()
def train(
    recipe: Annotated[Path, typer.Argument(help="A TOML recipe (see recipes/).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder: checkpoint, log, model.")],
    steps: Annotated[Optional[int], typer.Option(help="Override the recipe's number of steps.")] = None,
    resume: Annotated[bool, typer.Option(help="Resume from OUT/checkpoint.pt if it exists.")] = True,
    overwrite: Annotated[bool, typer.Option(
        help="With --no-resume: start a new run in an OUT that holds another run's files (they are moved to "
             "OUT/replaced-<time>/, never mixed with the new run's).")] = False,
    allow_config_change: Annotated[
        bool, typer.Option(help="Resume even if the recipe's training settings differ from the checkpoint's; with --init, start "
                              "from a model whose [model] settings differ where its weights' shapes do not.")
    ] = False,
    device: DeviceOpt = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    license: Annotated[Optional[str], typer.Option(
        help="License of the trained model, written into its card (e.g. mit, apache-2.0; default: none).")] = None,
    init: Annotated[Optional[str], typer.Option(
        help="Start a new run from this model's weights (a folder, bundled name or org/name; a fresh optimiser): "
             "fine-tuning. A run resumed from its checkpoint ignores it.")] = None,
    max_minutes: Annotated[Optional[float], typer.Option(
        "--max-minutes", min=0.0, help="Stop after this many minutes of training, saving the checkpoint and the model "
                                       "(the same command resumes).")] = None,
    precision: Annotated[Optional[str], typer.Option(
        help="float32 or bfloat16: the arithmetic of a noise-conditioned model's denoising loss ([trainer] "
             "precision; default: the recipe's). A resumed run may change it.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", metavar="TABLE.KEY=VALUE",
        help="Change one recipe setting over the file's (repeatable; VALUE in TOML, or a bare word), e.g. --set "
             "trainer.batch_size=512 --set trainer.lr=3e-4. The card lists them; resume with the same ones.")] = None,
) -> None:
    """Train an energy with Algorithm 1 and save its EMA weights to OUT/model.

    Ctrl-C (SIGINT), SIGTERM and --max-minutes stop after the step in progress and save the checkpoint and the model;
    the same command resumes. `cebm export OUT` makes a model folder from the checkpoint of any run.

    \b
    Example: cebm train recipes/shapes-color.toml --out runs/color
    """
    import signal

    from composable_ebm.runs import train_recipe

    run = train_recipe(recipe, out, steps=steps, resume=resume, overwrite=overwrite,
                       allow_config_change=allow_config_change, device=_device(device), progress=progress,
                       license=license, init=init, echo=typer.echo, max_minutes=max_minutes, precision=precision,
                       settings=set_ or ())
    if run.stopped is not None and run.stopped.startswith("SIG"):
        raise typer.Exit(128 + int(getattr(signal, run.stopped)))  # the shell's status for a signalled command


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="A run folder (cebm train --out), finished or not.")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Model folder to write (default: RUN/model).")] = None,
    recipe: Annotated[Optional[Path], typer.Option(
        help="The run's recipe, for a run written before runs kept their network.json.")] = None,
    license: Annotated[Optional[str], typer.Option(help="License written into the model's card.")] = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Write a model folder from the EMA weights of a run's latest checkpoint, without resuming it.

    \b
    Example: cebm export runs/color --out models/color
    """
    from composable_ebm.runs import export_run

    typer.echo(f"wrote {export_run(run, out, recipe=recipe, license=license, overwrite=overwrite)}")


@app.command("data")
def data_command(
    name: Annotated[str, typer.Argument(help="A dataset that is drawn, not read (faces, shapes ...).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write (a new one).")],
    n: Annotated[Optional[int], typer.Option("-n", "--n", min=1, max=1 << 24, help="Number of images.")] = None,
    seed: Annotated[Optional[int], typer.Option(min=0, help="Seed of the draw.")] = None,
    size: Annotated[Optional[int], typer.Option(min=4, help="Image side.")] = None,
) -> None:
    """Write a drawn dataset as an image folder with a CelebA-format attribute table (the folder dataset reads it).

    \b
    Example: cebm data faces --out data/rendered-faces --n 64 --seed 0
    """
    from composable_ebm.configs import config_from_dict
    from composable_ebm.data import DATASETS

    cls = DATASETS.get(name, "cebm data: ")
    given = {k: v for k, v in {"n": n, "seed": seed, "size": size}.items() if v is not None}
    config = config_from_dict(cls, given)
    typer.echo(f"wrote {config.render(out)}")


@app.command("train-classifier")
def train_classifier_command(
    folder: Annotated[Path, typer.Argument(help="An image folder with a CelebA-format attribute table.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Classifier folder to write.")],
    attributes: Annotated[list[str], typer.Option(
        "--attribute", "-a", help="A column to read (repeatable; default: every column).")] = [],  # noqa: B006
    attribute_file: Annotated[str, typer.Option(help="The table, relative to FOLDER.")] = "list_attr_celeba.txt",
    size: Annotated[int, typer.Option(min=8, help="Image side the classifier reads (your models' size).")] = 32,
    steps: Annotated[int, typer.Option(min=1, help="Training steps (Adam, batch 64).")] = 1500,
    held_out: Annotated[float, typer.Option(
        min=0.0, max=0.5, help="Share of the rows kept aside to measure accuracy.")] = 0.1,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the split and the training.")] = 0,
    device: DeviceOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Train an attribute classifier on a folder's attributes, so `cebm eval compose` can score your compositions.

    \b
    Example: cebm train-classifier data/faces --out runs/faces-classifier -a Smiling -a Hat --size 16
    """
    from composable_ebm.evaluation.classifier import fit_folder_classifier

    result = fit_folder_classifier(folder, out, attributes or None, attribute_file, size, steps, held_out, seed,
                                   _device(device), overwrite=overwrite)
    for attr, acc in result.accuracy.items():
        typer.echo(f"{attr}: {acc:.3f} read right on {result.held_out} held-out images")
    typer.echo(f"wrote {result.folder}")


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


@app.command()
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
    from composable_ebm.pipeline import composed

    _check_outputs(output, options["chain"])
    energy = _load_expression(expression, _device(options["device"]), options["refresh"])
    typer.echo(f"sampling {composed(energy, form).expression()}")
    _sample_to_files(energy, output, form=form, **options)


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
    _check_outputs(output, options["chain"])
    energy = _load_energy(model, _device(options["device"]), options["refresh"])
    bindings = _parse_bindings(condition)
    _sample_to_files(energy.condition(**bindings) if bindings else energy, output, **options)


def _check_outputs(output: Path, chain: Path | None) -> None:
    """Refuse an output name with no image suffix before any model is loaded."""
    from composable_ebm.images import image_format

    image_format(output)
    if chain is not None:
        image_format(chain)
        if chain.resolve() == output.resolve():
            raise InvalidInputError(f"--chain and --output are both {output}; the chain strip would replace the grid")


def _load_energy(name: str, device: torch.device, refresh: bool = False):
    """A model that must be an energy (not a classifier)."""
    from composable_ebm.energy import Energy

    return _load_as(name, device, refresh, Energy,
                    lambda kind: f"{name} is {kind}, not an energy; sample, compose and eval ood take energy models")


def _load_classifier(name: str, device: torch.device, refresh: bool = False):
    """A model that must be an attribute classifier."""
    from composable_ebm.evaluation import AttributeClassifier

    return _load_as(name, device, refresh, AttributeClassifier,
                    lambda kind: f"--classifier {name} is {kind}, not an attribute classifier (e.g. shapes-classifier)")


def _load_as(name: str, device: torch.device, refresh: bool, cls: type, message: Callable[[str], str]):
    """``load_model``, refusing a model of another kind with ``message(kind found)``."""
    from composable_ebm.persistence import load_model

    model = load_model(name, device, refresh=refresh)
    if not isinstance(model, cls):
        raise InvalidInputError(message(a_type(model)))
    return model


def _load_expression(expression: str, device: torch.device, refresh: bool = False):
    """The composite energy of an expression, each named model loaded once onto ``device``."""
    from composable_ebm.expression import parse_expression
    from composable_ebm.persistence import load_model

    return parse_expression(expression, lambda name: load_model(name, device, refresh=refresh))


def _sample_to_files(energy, output: Path, *, n: int, seed: int, chain: Path | None, scale: int | None, progress: bool,
                     form: str = "auto", **options: Any) -> None:
    """Sample ``energy`` through the pipeline with the command's sampler settings and write the grid (and the chain
    strip)."""
    from composable_ebm.images import save_chain_strip, save_image_grid, save_scatter
    from composable_ebm.pipeline import sample as run_pipeline

    overrides = _overrides(**options)
    images = len(energy.input_shape) == 3
    if chain is not None and not images:
        raise ValueError(f"--chain draws image strips; this energy takes inputs of shape {energy.input_shape}")
    total = (overrides.get("steps") or 0) * (overrides.get("rounds") or 1)
    keep = max(1, total // 10) if chain is not None and total else (4 if chain is not None else 0)
    result = run_pipeline(energy, n, form=form, seed=seed, progress=progress, keep_every=keep, **overrides)
    if images:
        save_image_grid(result.samples, output, scale=scale)
    elif energy.input_shape == (2,):
        save_scatter(result.samples, output, energy.value_range)
    else:
        raise ValueError(f"cannot draw samples of shape {energy.input_shape}; use composable_ebm.sample in Python")
    typer.echo(f"wrote {output}")
    if chain is not None:
        save_chain_strip(result.chain, chain)
        typer.echo(f"wrote {chain}")


@app.command("list")
def list_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the models that load without a download: bundled ones and those in the local Hub cache.

    \b
    Example: cebm list
    """
    from composable_ebm.persistence import list_models

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
    from composable_ebm.persistence import push_folder

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
    from composable_ebm.persistence import WEIGHTS_NAME, read_config, resolve_source, typed_configs, weights_header

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


@eval_app.command("compose")
def eval_compose(
    expression: Annotated[str, typer.Argument(help="Composition expression, as for `cebm compose`.")],
    classifier: Annotated[str, typer.Option(help="Attribute classifier (folder or name).")],
    target: Annotated[list[str], typer.Option("--target", "-t", help="attr=value the samples should show.")],
    n: CountOpt = 64,
    seed: Annotated[int, typer.Option(min=0, max=2**63 - 1, help="Random seed.")] = 0,
    steps: StepsOpt = None,
    rounds: RoundsOpt = None,
    step_size: StepSizeOpt = None,
    device: DeviceOpt = None,
    refresh: RefreshOpt = False,
    form: FormOpt = "auto",
) -> None:
    """Compositional accuracy: how often the classifier finds every target attribute in composed samples.

    \b
    Example: cebm eval compose "shapes-color[color=red] + shapes-shape[shape=circle]" --classifier shapes-classifier -t color=red -t shape=circle
    """
    from composable_ebm.evaluation import compositional_accuracy
    from composable_ebm.pipeline import composed
    from composable_ebm.pipeline import sample as run_pipeline

    dev = _device(device)
    energy = _load_expression(expression, dev, refresh)
    clf = _load_classifier(classifier, dev, refresh)
    samples = run_pipeline(energy, n, form=form, seed=seed, progress=True,
                           **_overrides(steps=steps, rounds=rounds, step_size=step_size)).samples
    score = compositional_accuracy(samples, clf, _parse_bindings(target))
    typer.echo(json.dumps({"expression": composed(energy, form).expression(), "n": score.n, "per_attribute": score.per_attribute,
                           "joint": score.joint}, indent=2))


@eval_app.command("fid")
def eval_fid(
    real: Annotated[Path, typer.Argument(help="Folder of real images (.png, .jpg, .jpeg, .webp).")],
    fake: Annotated[Path, typer.Argument(help="Folder of generated images.")],
    features: Annotated[str, typer.Option(help="Inception v3 weights file (.pth or .safetensors), or an attribute "
                                                "classifier (folder or name) whose penultimate features are used.")],
    limit: Annotated[Optional[int], typer.Option(help="Use at most this many images of each folder.")] = None,
    batch_size: Annotated[int, typer.Option(help="Images per feature batch.")] = 100,
    device: DeviceOpt = None,
) -> None:
    """FID between two image folders under a feature network you supply.

    \b
    Example: cebm eval fid data/real samples/ --features shapes-classifier
    """
    from composable_ebm.evaluation import (
        AttributeClassifier,
        InceptionV3Features,
        extract_features,
        frechet_distance,
        gaussian_stats,
    )
    import torch

    from composable_ebm.persistence import load_model
    from composable_ebm.images import load_image_folder

    dev = _device(device)
    if batch_size < 1:
        raise InvalidInputError(f"--batch-size must be >= 1, got {batch_size}")
    if Path(features).is_file():
        size, feature_fn = None, InceptionV3Features(features).to(dev)
    else:
        network = load_model(features, dev)
        if not isinstance(network, AttributeClassifier):
            raise InvalidInputError(f"--features {features}: a {type(network).__name__}; valid choices: an Inception v3"
                                    " weights file or an attribute classifier")
        size, feature_fn = network.config.image_size, network.features
    stats, counts = [], []
    for folder in (real, fake):
        images = load_image_folder(folder, size=size, limit=limit)
        with torch.no_grad():
            stats.append(gaussian_stats(extract_features(images, feature_fn, batch_size, device=dev, progress=True)))
        counts.append(images.shape[0])
    value = frechet_distance(*stats[0], *stats[1])
    typer.echo(json.dumps({"fid": value, "real": counts[0], "fake": counts[1], "features": features}))


@eval_app.command("ood")
def eval_ood(
    model: Annotated[str, typer.Argument(help="Model folder, bundled name or org/name.")],
    in_data: Annotated[str, typer.Option(
        "--in", help="In-distribution data: a registered dataset (shapes, digits, faces ...) or a folder of images.")],
    out_data: Annotated[str, typer.Option(
        "--out", help="Out-of-distribution data: a registered dataset, noise, or a folder of images.")],
    condition: Annotated[list[str], typer.Option("--condition", "-c", help="attr=value (repeatable).")] = [],  # noqa: B006
    n: Annotated[int, typer.Option("-n", min=1, max=MAX_SAMPLES,
                                   help="Images of each side (a folder: at most this many).")] = 500,
    seed: int = 0,
    device: DeviceOpt = None,
) -> None:
    """OOD AUROC of -E(x) between two datasets or image folders (resized to the model's input shape).

    A registered dataset is drawn with its own defaults and, where its settings have them, n images at the model's
    size from the seed (the out side from seed + 1). A conditional model trained without label dropout needs its
    attributes bound (-c).

    \b
    Example: cebm eval ood shapes-color -c color=red --in shapes --out noise
    """
    import dataclasses

    import torch
    import torch.nn.functional as F

    from composable_ebm.configs import config_from_dict
    from composable_ebm.data import DATASETS
    from composable_ebm.evaluation import ood_auroc
    from composable_ebm.images import load_image_folder

    energy = _load_energy(model, _device(device))
    bindings = _parse_bindings(condition)
    if bindings:
        energy = energy.condition(**bindings)
    c, h, w = energy.input_shape

    def registered(name: str, offset: int) -> torch.Tensor:
        if name not in DATASETS.names():
            raise InvalidInputError(f"unknown data {name!r}; valid choices: a registered dataset"
                                    f" ({', '.join(DATASETS.names())}), noise, or a folder of images")
        cls = DATASETS.get(name)
        fields = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in {"n": n, "size": h, "seed": seed + offset}.items() if k in fields}
        data = config_from_dict(cls, given).build()
        x = getattr(data, "images", None)
        if x is None or x.ndim != 4:
            raise InvalidInputError(f"{name} is not a dataset of images; valid choices: an image dataset"
                                    f" ({', '.join(DATASETS.names())}), noise, or a folder of images")
        x = x[:n]
        return x.float() / 255 if x.dtype == torch.uint8 else x.float()

    def images(name: str, offset: int) -> torch.Tensor:
        if name == "noise":
            x = torch.rand(n, c, h, w, generator=torch.Generator().manual_seed(seed + offset))
        elif Path(name).is_dir():
            x = load_image_folder(name, size=h, limit=n)
        else:
            x = registered(name, offset)
        if c == 1 and x.shape[1] == 3:  # a grey model reads the images' luminance
            x = (0.299 * x[:, :1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:]).clamp(0, 1)
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False) if x.shape[-1] != w else x
        return x.expand(-1, c, -1, -1) if x.shape[1] == 1 and c == 3 else x[:, :c]

    typer.echo(json.dumps({"auroc": ood_auroc(energy, images(in_data, 0), images(out_data, 1)), "n": n}))


if __name__ == "__main__":  # `python -m composable_ebm.cli`, e.g. under torchrun
    app()
