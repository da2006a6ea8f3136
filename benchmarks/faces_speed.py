"""How fast the faces models compose, and what the speed costs: network evaluations per draw, seconds, quality.

    python -m benchmarks.faces_speed [--models bundled] [--setting NAME:levels=8,steps=1 ...] [--threads 1 2]

For the README's composition (``smiling + glasses + hat``, sampled as a user does: its guided form) and for each
model alone (one value each), and for each setting compared (``own``: the models' own settings, always first; then
every ``--setting``, a name and `LadderConfig` fields that replace the models' own):

- network evaluations per draw: calls of each model's energy in one draw, counted;
- seconds for ``--n`` (16) draws at each ``--threads`` count on the CPU, and on CUDA when it is present (after a
  warm-up draw);
- the joint accuracy and FID ratio of ``--quality-n`` (64) draws, read as `benchmarks.faces` reads its rows (the
  faces classifier; fresh renders), from the row's own seed there;
- the transitions' Metropolis acceptance rate level by level, in the first timed draws: where they change the
  result.

A setting that comes to a row's own settings is listed as such and not measured again.

Writes the ``faces-speed`` section of docs/benchmarks.md (``--no-doc``: print only).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks._report import machine, write_section
from benchmarks.faces import jobs, measure, model_loader
from composable_ebm import load
from composable_ebm.data import faces
from composable_ebm.expression import parse_expression
from composable_ebm.pipeline import plan
from composable_ebm.sampling import SampleResult

ROWS = ("guided(faces-smiling[smiling=yes] + faces-glasses[glasses=yes] + faces-hat[hat=yes])",
        "faces-smiling[smiling=yes]", "faces-glasses[glasses=yes]", "faces-hat[hat=yes]", "faces-hair[hair=blond]")
"""The README's composition (``.sample`` draws a sum of these models in its guided form) and each model alone."""


def parse_setting(text: str) -> tuple[str, dict[str, float | int | str | bool]]:
    """``NAME:field=value,...`` -> (name, {field: value}); a value is an integer, a number, ``true``/``false`` or
    else a word (``predictor=heun``), as the field reads it."""
    name, _, fields = text.partition(":")
    if not name or not fields:
        raise SystemExit(f"--setting {text!r}: write NAME:field=value,... (LadderConfig fields), e.g. fast:levels=8")
    out: dict[str, float | int | str | bool] = {}
    for item in fields.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not key or not sep or not value:
            raise SystemExit(f"--setting {text!r}: {item!r} is not field=value")
        out[key] = _value(value)
    return name, out


def _value(text: str) -> float | int | str | bool:
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def count_evaluations(expression: str, models: str, overrides: dict) -> float:
    """Calls of each model's energy in one draw (the same for every model of a composite), counted on the CPU."""
    calls = {"n": 0}
    made: list = []

    def counting(name: str):
        model = model_loader(models, "cpu")(name)
        energy = model.energy

        def counted(*args, **kwargs):
            calls["n"] += 1
            return energy(*args, **kwargs)

        model.energy = counted
        made.append(model)
        return model

    parse_expression(expression, counting).sample(1, seed=0, **overrides)
    return calls["n"] / len(made)


def timed(expression: str, models: str, overrides: dict, n: int, device: str) -> tuple[float, SampleResult]:
    """Wall time of ``n`` draws from one seed, after a warm-up draw (models loaded once), and the draws."""
    energy = parse_expression(expression, model_loader(models, device))
    energy.sample(1, seed=1, **overrides)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = energy.sample_result(n, seed=0, **overrides)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def acceptance_by_level(result: SampleResult) -> str:
    """A draw's Metropolis acceptance rate at each noise level, highest first (``-`` where no transition ran): where
    the corrector steps change the result."""
    accepted = result.diagnostics.acceptance
    if accepted is None:
        return "-"
    out, start = [], 0
    for count in result.config.transitions_per_level():
        out.append(f"{float(accepted[start:start + count].mean()):.2f}" if count else "-")
        start += count
    return " ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bundled", help="bundled, or a folder of faces-<attribute>/model runs")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME:FIELD=VALUE,...")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--n", type=int, default=16, help="draws timed")
    parser.add_argument("--quality-n", type=int, default=64, help="draws read for accuracy and realism")
    parser.add_argument("--classifier", default="faces-classifier")
    parser.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    settings = [("own", {})] + [parse_setting(s) for s in args.setting]
    devices = [f"cpu:{t}" for t in args.threads] + (["cuda"] if torch.cuda.is_available() else [])
    classifier = load(args.classifier)
    data, fresh = faces(20000, seed=0, size=16), faces(4000, seed=1, size=16)
    by_expression = {j["expression"]: j for j in jobs()}
    lines = ["| row | setting | evaluations per draw | " + " | ".join(
        f"s for {args.n}, {d.replace('cpu:', 'CPU ')}" + (" thread" + "s" * (d != "cpu:1") if "cpu" in d else "")
        for d in devices) + " | joint accuracy | FID ratio |", "| --- | --- | ---: | " + "---: | " * len(devices)
        + "---: | ---: |"]
    summary: dict[str, list[float]] = {}
    accepted: list[str] = []
    composite: list[str] = []
    for expression in ROWS:
        job = by_expression[expression]
        energy = parse_expression(expression, model_loader(args.models, "cpu"))
        own = plan(energy).config
        for name, overrides in settings:
            if name != "own" and plan(energy, **overrides).config == own:
                lines.append(f"| `{expression}` | {name} | the models' own settings | " + "| " * (len(devices) + 1)
                             + "|")
                continue
            evaluations = count_evaluations(expression, args.models, overrides)
            times, draws = [], []
            for device in devices:
                kind, _, threads = device.partition(":")
                if threads:
                    torch.set_num_threads(int(threads))
                elapsed, result = timed(expression, args.models, overrides, args.n, kind)
                times.append(elapsed)
                draws.append(result)
            accepted.append(f"- `{expression}`, {name}: {acceptance_by_level(draws[0])}")
            torch.set_num_threads(max(args.threads))
            row, _ = measure(job, args.models, classifier, data, fresh, args.quality_n, ladder=overrides)
            summary.setdefault(name, []).append(times[0])
            if expression == ROWS[0]:
                composite.append(f"{name} {evaluations:.0f} evaluations, " + " / ".join(f"{t:.1f}" for t in times)
                                 + f" s, joint {row['joint']:.3f}, FID ratio {row['fid_ratio']:.1f}")
            lines.append(f"| `{expression}` | {name} | {evaluations:.0f} | " + " | ".join(f"{t:.1f}" for t in times)
                         + f" | {row['joint']:.3f} | {row['fid_ratio']:.1f} |")
            print(lines[-1], flush=True)
    given = "".join(f" --setting {s}" for s in args.setting)
    settings_words = "; ".join(f"`{n}`: " + (", ".join(f"{k} = {v}" for k, v in o.items()) or "the models' own")
                               for n, o in settings)
    body = "\n".join([
        "## Faces: evaluations, seconds and quality per setting",
        "",
        f"`python -m benchmarks.faces_speed --models {args.models}{given} --threads {' '.join(map(str, args.threads))}`"
        f" on {machine()}. Settings: {settings_words}. Seconds: {args.n} draws after a warm-up draw; accuracy and FID"
        f" ratio: {args.quality_n} draws from the row's seed in `benchmarks.faces`.",
        "",
        f"**The README's composition** (evaluations per draw; seconds for {args.n} draws on "
        + " / ".join(d.replace("cpu:", "CPU ") + (" thread" + "s" * (d != "cpu:1") if "cpu" in d else "")
                     for d in devices) + "; joint accuracy and FID ratio of its row): " + "; ".join(composite) + ".",
        "",
        *lines,
        "",
        "Median seconds over the rows, first thread count: " + ", ".join(
            f"{n} {statistics.median(v):.1f} s" for n, v in summary.items()) + ".",
    ])
    body += ("\n\nMetropolis acceptance of the transitions at each level, highest first (`-`: none ran there), over"
             f" {args.n} draws:\n\n" + "\n".join(accepted))
    print(body)
    if not args.no_doc:
        write_section("faces-speed", body)


if __name__ == "__main__":
    main()
