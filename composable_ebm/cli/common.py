"""What every ``cebm`` command shares: the app, its error handling, the thread and device options, the option types
and the model loaders. The commands live beside it, one module per group.

Every failure the library expects ends in one line on stderr that names the file or option,
the problem and the valid choices (``--debug`` shows the traceback instead). Exit status: 0 on
success, 1 on a failure at run time (a diverged run, a failed download), 2 on bad usage or bad input.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from composable_ebm.errors import BUG_EXIT_CODE, InvalidInputError, a_type, bug_line, exit_code_for, one_line

if TYPE_CHECKING:  # torch is imported by the commands that need it, so `cebm --help` starts at once
    import torch

DEBUG_KEY = "cebm.debug"
MAX_THREADS = 1024
"""Most CPU threads --threads may ask torch for."""
MAX_SAMPLES = 1 << 20
"""Most samples one command draws (-n): `composable_ebm.sampling.runner.MAX_SAMPLES`, written out so that `cebm --help`
imports no torch."""


GLOBAL_OPTIONS = {"--threads": 1, "--debug": 0}
"""The options of `cebm` itself that may also be written after the command (how many values each takes)."""


def hoisted(args: list[str]) -> list[str]:
    """``args`` with `GLOBAL_OPTIONS` written after the command moved before it, so ``cebm compose ... --threads 1``
    means ``cebm --threads 1 compose ...``; nothing after a ``--`` moves (it is an argument there)."""
    front, rest, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        name = arg.split("=", 1)[0]
        if name in GLOBAL_OPTIONS:  # before or after the command's name: with its value, before it
            width = 0 if "=" in arg else GLOBAL_OPTIONS[name]
            front += args[i:i + 1 + width]
            i += 1 + width
            continue
        (rest if rest or not arg.startswith("-") else front).append(arg)
        i += 1
    return front + rest


class _Group(TyperGroup):
    """Reports the library's errors as one line and an exit status instead of a traceback; takes `cebm`'s own
    options after the command too (`hoisted`)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoisted(list(args)))

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


_EXPRESSION_MARKS = set("[]()|+*:/ ")
"""Characters of an expression that no option value of the expression commands holds (``-ogrid.png`` is ``-o``)."""


def expression_first(args: list[str], takes_value: set[str], flags: set[str]) -> list[str]:
    """``args`` with an expression that begins with a minus (``-a``, ``-(a | b)``, ``-1 : a | b``) moved behind a
    ``--``, so that it is read as the expression and not as an option: the one token that starts with ``-`` and is
    none of the command's options (``takes_value``: names of options that take a value; ``flags``: the others), when
    no other argument is given. A ``--`` already there, or more than one such token, leaves ``args`` as they are (an
    unknown option is then reported as one)."""
    loose, others, i = [], 0, 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args
        name = arg.split("=", 1)[0]
        if arg in takes_value:
            i += 2
            continue
        if name in takes_value | flags or (arg[:2] in takes_value and not _EXPRESSION_MARKS & set(arg)):
            i += 1  # --name=value, a flag, or a short option with its value attached (-n16)
            continue
        if arg.startswith("-") and arg != "-":
            loose.append(i)
        else:
            others += 1
        i += 1
    if len(loose) != 1 or others:
        return args
    return [a for j, a in enumerate(args) if j != loose[0]] + ["--", args[loose[0]]]


class ExpressionCommand(TyperCommand):
    """A command whose argument is an expression: one that begins with a minus is read as the expression
    (`expression_first`), as the algebra writes it."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        takes_value, flags = set(), set()
        for param in self.get_params(ctx):
            if param.param_type_name == "option":
                names = [*param.opts, *param.secondary_opts]
                (flags if getattr(param, "is_flag", False) or getattr(param, "count", False) else takes_value).update(names)
        return super().parse_args(ctx, expression_first(list(args), takes_value, flags))


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
"""The sampling commands' options that override the model's sampler settings (checked by its chain)."""

CHAIN_FIELDS = ("step_size", "noise", "steps", "rounds", "final_steps", "method", "leapfrog", "augment", "clamp",
                "precision", "init_scale", "adapt", "target_acceptance")
"""A Langevin chain's settings (`composable_ebm.sampling.SamplerConfig`), written out so that ``--help`` imports no
torch; tests/test_cli.py checks that they agree."""
LADDER_FIELDS = ("levels", "sigma_min", "sigma_max", "spacing", "method", "steps", "step_size", "predictor", "churn",
                 "denoise", "first_steps", "final_steps", "leapfrog", "precision")
"""A noise ladder's settings (`composable_ebm.sampling.LadderConfig`), likewise."""


def _overrides(set_: list[str] | None = None, **given: Any) -> dict:
    """The sampler settings given on the command line (its options and ``--set KEY=VALUE``), the rest left to the
    model; a setting given twice is one line."""
    out = {k: v for k, v in given.items() if k in SAMPLER_SETTINGS and v is not None}
    for item in set_ or []:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InvalidInputError(f"--set takes KEY=VALUE (e.g. --set levels=12), got {item!r}")
        if key in out:
            raise InvalidInputError(f"{key} is given twice (--set {item} and another option); give it once")
        out[key] = _setting_value(text.strip())
    return out


def _setting_value(text: str) -> Any:
    """A ``--set`` value as TOML reads it (``12``, ``0.5``, ``true``, ``"exact"``, ``[0.5, 1.0]``, ``{crop_scale =
    [0.5, 1.0]}``), else the text itself (``--set method=mala``)."""
    import tomllib

    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


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

StepsOpt = Annotated[Optional[int], typer.Option(min=1, help="Both families: transitions per round (a Langevin chain)"
                                                               " or per level (a noise ladder); default: the model's.")]
RoundsOpt = Annotated[Optional[int], typer.Option(min=1, help="A Langevin chain's: augmentation rounds (Algorithm 2).")]
StepSizeOpt = Annotated[Optional[float], typer.Option("--step-size", min=0.0, help="Both families: the step size (a"
                                                      " ladder's is per sigma^2).")]
SetOpt = Annotated[list[str], typer.Option(
    "--set", metavar="KEY=VALUE",
    help="Any setting of the model's chain (repeatable). A Langevin chain (SamplerConfig; models without noise levels):"
         f" {', '.join(CHAIN_FIELDS)}. A noise ladder (LadderConfig; noise-conditioned models): {', '.join(LADDER_FIELDS)}."
         " The other family's is one line naming it.")]
PrecisionOpt = Annotated[Optional[Precision], typer.Option(help="Autocast for the energy (default: the model's).")]
MethodOpt = Annotated[Optional[str], typer.Option(
    help="Sampler: langevin, mala, or another registered method (default: the model's).")]
NoiseOpt = Annotated[Optional[str], typer.Option(parser=_noise, metavar="NUMBER|exact",
                                                 help="A Langevin chain's: noise std per step, or 'exact' for"
                                                      " sqrt(2 * step size) (a ladder's noise is always exact).")]
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
    from composable_ebm.models import load_model

    model = load_model(name, device, refresh=refresh)
    if not isinstance(model, cls):
        raise InvalidInputError(message(a_type(model)))
    return model


def _load_expression(expression: str, device: torch.device, refresh: bool = False):
    """The composite energy of an expression, each named model loaded once onto ``device``."""
    from composable_ebm.expression import parse_expression
    from composable_ebm.models import load_model

    return parse_expression(expression, lambda name: load_model(name, device, refresh=refresh))
