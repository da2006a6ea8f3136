"""Bundle the 64-px faces autoencoder (``composable_ebm/bundled/faces64-autoencoder``) with a card that carries what
it was measured to keep.

    python -m benchmarks.bundle_faces64 autoencoder --run runs/ae/c4 --command "cebm train-autoencoder ..." \
        --device "2-core x86-64 CPU, one thread"

    python -m benchmarks.bundle_faces64 autoencoder --run runs/ae/tuned --earlier runs/old64/faces64-autoencoder \
        --command "cebm train-autoencoder ... --init faces64-autoencoder ..."

bundles a run fine-tuned from an earlier autoencoder (``cebm train-autoencoder --init``), whose card's training
facts are kept as the first stage (``--earlier``: a copy of that autoencoder's folder).

    python -m benchmarks.bundle_faces64 remeasure

measures the bundled one again (its card's training facts kept) and writes what it measured for ``report``.

    python -m benchmarks.bundle_faces64 alone --models runs/exp/base --attribute smiling --key base \
        --about "faces64-smiling from the unconditional base"

draws one latent model alone (``MODELS/faces64-<attribute>/model``: another way to train it, such as from a shared
unconditional base or by contrastive divergence), keeps its rows and writes the ``faces64-alone`` section of
docs/benchmarks.md from every model drawn so far, in the order of their keys.

Measures the run's ``model/`` on 500 fresh lorelei renders (`benchmarks.autoencoder.measure`: PSNR and how often
faces64-classifier reads each attribute of a reconstruction as it reads the render, the ceiling of every latent
model's accuracy), in float32 and with its weights rounded to float16. The bundled weights are float16 when the
rounding changes no attribute's agreement and the PSNR by less than 0.05 dB, float32 otherwise; the card says which.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import re
from pathlib import Path

import torch

from benchmarks.autoencoder import measure_model
from benchmarks._report import machine, write_section
from benchmarks.bundle import CARDS_DIR
from benchmarks.faces64 import RESULTS
from composable_ebm.model_cards import model_card
from composable_ebm.models import BUNDLED_DIR, load_model, save_model
from composable_ebm.training import read_log

NAME = "faces64-autoencoder"


def rounded(model: torch.nn.Module) -> torch.nn.Module:
    """A copy whose weights went through float16 and back (what loading float16 weights gives)."""
    again = copy.deepcopy(model)
    with torch.no_grad():
        for p in again.parameters():
            p.copy_(p.half().float())
    return again


def _card_lines(folder: Path, start: str) -> list[str]:
    """The lines of an autoencoder's card that begin with ``start``, in order: "Trained for" gives each stage's own
    account (steps, images, minutes, PSNR), "Trained " those and where and how each stage ran."""
    return [line for line in (folder / "README.md").read_text().splitlines() if line.startswith(start)]


def trained_line(folder: Path) -> str:
    """An autoencoder's own account of its (first) training, from its card: steps, images, minutes, PSNR."""
    return _card_lines(folder, "Trained for")[0]


def trained_minutes(folder: Path = BUNDLED_DIR / NAME) -> float:
    """The minutes an autoencoder trained for, as its card states them (the bundled one by default), every stage
    together."""
    return sum(float(re.search(r" in ([0-9.]+) minutes", line).group(1))
               for line in _card_lines(folder, "Trained for"))


def bundle_autoencoder(run: Path, command: str, device: str, n: int = 500, earlier: Path | None = None) -> None:
    model = load_model(run / "model")
    full, half = measure_model(model, n), measure_model(rounded(model), n)
    use_half = half["agreement"] == full["agreement"] and abs(half["psnr"] - full["psnr"]) < 0.05
    model.config = dataclasses.replace(model.config, name=NAME)
    trained = trained_line(run / "model")
    agreement = ", ".join(f"{a} {v:.3f}" for a, v in full["agreement"].items())
    before = [] if earlier is None else [
        "Made in two stages; the first trained the autoencoder it was fine-tuned from:", "",
        *(line for first in _card_lines(earlier, "Trained ") for line in (first, "")), "Then:", ""]
    notes = "\n".join([
        *before,
        trained.strip(),
        "",
        f"Trained on {device} with `{command}`.",
        "",
        f"**What it keeps** (`python -m benchmarks.autoencoder`, {n} fresh lorelei renders from seed 1, which it never"
        f" saw): PSNR {full['psnr']:.2f} dB; faces64-classifier reads each attribute of a reconstruction as it reads"
        f" the render: {agreement}. That agreement is the ceiling of a latent model's accuracy on the attribute.",
        "",
        "Weights stored in " + ("float16: rounding them changes no agreement above and the PSNR by"
                                f" {half['psnr'] - full['psnr']:+.3f} dB" if use_half else
                                f"float32: float16 weights read {half['agreement']} at {half['psnr']:.2f} dB")
        + "; it loads, encodes and decodes in float32.",
    ])
    card = model_card(model, location=NAME, notes=notes)
    stored = model.half() if use_half else model
    save_model(stored, BUNDLED_DIR / NAME, card=card)
    CARDS_DIR.mkdir(exist_ok=True)
    (CARDS_DIR / f"{NAME}.md").write_text(card)
    print(f"bundled {NAME} ({'float16' if use_half else 'float32'}): PSNR {full['psnr']:.2f} dB; {agreement}")
    keep(full, n, trained_minutes(BUNDLED_DIR / NAME), model.config.latent_channels,
         "float16" if use_half else "float32")


def keep(measured: dict, n: int, minutes: float, latent_channels: int, stored: str) -> None:
    """Write what the bundled autoencoder was measured to keep, for `report`."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "autoencoder.json").write_text(json.dumps({
        "n": n, "psnr": measured["psnr"], "agreement": measured["agreement"], "worst_cell": measured["worst_cell"],
        "minutes": minutes, "latent_channels": latent_channels, "stored": stored}, indent=1))


def remeasure(n: int = 500) -> None:
    """Measure the bundled autoencoder again (as loaded: float32 from its stored weights) for `report`."""
    model = load_model(BUNDLED_DIR / NAME)
    stored = "float16" if "Weights stored in float16" in (BUNDLED_DIR / NAME / "README.md").read_text() else "float32"
    measured = measure_model(model, n)
    keep(measured, n, trained_minutes(), model.config.latent_channels, stored)
    print(json.dumps(measured))


def alone(models: Path, attribute: str, key: str, about: str, n: int = 64) -> dict:
    """Draw ``MODELS/faces64-ATTRIBUTE/model`` alone, every value, as the faces table draws a model alone
    (`benchmarks.faces.measure`: its rows and seeds, both judges, FID ratio against fresh renders of the value), and
    keep the rows with what the model is (``about``) and its training minutes (each sitting's measured seconds per
    step in its run's log) as ``alone-KEY.json``; then `alone_report`."""
    from benchmarks.faces import TABLES, jobs, measure
    from composable_ebm import load

    t = TABLES["lorelei"]
    classifier, judge = load(t.classifier), load(t.judge)
    data, fresh = t.renders(20000, seed=0), t.renders(4000, seed=1)
    run = models / f"{t.prefix}-{attribute}"
    rows = [measure(job, str(models), classifier, data, fresh, n, t=t, judge=judge)[0]
            for job in jobs(t) if job["kind"] == "alone" and set(job["want"]) == {attribute}]
    step, seconds = 0, 0.0  # each sitting's measured seconds per step over its steps
    for record in read_log(run / "log.jsonl"):
        if record.get("event") == "measured":
            seconds += record["seconds_per_step"] * (record["step"] - step)
            step = record["step"]
    kept = {"about": about, "n": n, "attribute": attribute, "minutes": seconds / 60, "steps": step,
            "rows": [{"value": r["want"][attribute][0], "accuracy": r["joint"], "judge": r["judge"]["joint"],
                      "fid_ratio": r["fid_ratio"]} for r in rows]}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"alone-{key}.json").write_text(json.dumps(kept, indent=1))
    print(json.dumps(kept))
    alone_report()
    return kept


def alone_report() -> None:
    """The ``faces64-alone`` section of docs/benchmarks.md: every model `alone` drew (``alone-*.json``), in the
    order of their keys."""
    lines = ["## Faces at 64 px over latents: other ways to train a model", "",
             "`python -m benchmarks.bundle_faces64 alone` on " + machine() + ": each value of the model's attribute"
             " drawn as the faces table draws a model alone (64 samples, its own sampling settings), read by"
             " faces64-classifier / faces64-judge; FID ratio as in the table. The bundled faces64-smiling (4,000"
             " steps from its recipe's initialisation over the first autoencoder's latents, then 1,000 over these;"
             " about 50 CPU-minutes) is the table's first two rows (\"Faces64"
             " models (bundled)\").", ""]
    ways: dict[str, list[dict]] = {}  # one line per way, its runs in the order of their keys
    for path in sorted(RESULTS.glob("alone-*.json")):
        kept = json.loads(path.read_text())
        ways.setdefault(kept["about"], []).append(kept)
    for about, runs in ways.items():
        lines.append(f"- {about}: " + "; ".join(
            f"{kept['steps']} steps ({kept['minutes']:.0f} CPU-minutes) " + ", ".join(
                f"{kept['attribute']}={r['value']} {r['accuracy']:.3f} / {r['judge']:.3f}, FID ratio"
                f" {r['fid_ratio']:.1f}" for r in kept["rows"]) for kept in runs) + ".")
    short = "\n".join(lines[:2] + [" ".join(line.removeprefix("- ") for line in lines[2:] if line)])
    write_section("faces64-alone", "\n".join(lines), short=short)


def report() -> None:
    """The ``faces64-latent`` section of docs/benchmarks.md from what was measured: the autoencoder
    (``autoencoder.json``, written when it is bundled), the sentence's seconds (``python -m benchmarks.faces64 speed
    --recipes recipes/latent``) and the decoder's log-volume (``python -m benchmarks.autoencoder --jacobian``,
    ``jacobian.json``)."""
    def read(name: str):
        path = RESULTS / name
        return json.loads(path.read_text()) if path.is_file() else None

    lines = ["## Faces at 64 px over latents: the autoencoder, seconds, the plain sum's Jacobian", "",
             "`python -m benchmarks.bundle_faces64 autoencoder` (or `remeasure`), `python -m benchmarks.faces64 speed"
             " --models bundled --recipes recipes/latent` and `python -m benchmarks.autoencoder faces64-autoencoder"
             " --jacobian 6` (then"
             f" `python -m benchmarks.bundle_faces64 report`) on {machine()}; the models are"
             " `recipes/latent/faces64-*.toml` over the latents of `faces64-autoencoder` (docs/latent.md)."]
    kept = read("autoencoder.json")
    if kept:
        lines += ["", f"**faces64-autoencoder** ({kept['minutes']:.0f} CPU-minutes; 64 x 64 x 3 to 16 x 16 x"
                  f" {kept['latent_channels']}) on {kept['n']} fresh renders: PSNR {kept['psnr']:.1f} dB;"
                  " faces64-classifier reads a reconstruction as it reads the render (the ceiling of a latent model's"
                  " accuracy): " + ", ".join(f"{a} {v:.3f}" for a, v in kept["agreement"].items())
                  + " (target: 0.98 each); lowest in one value of another attribute: "
                  + ", ".join(f"{a}={u} {low:.3f} where {b}={v}" for a, (u, b, v, low) in kept["worst_cell"].items())
                  + f"; weights stored in {kept['stored']}."]
    timed = read("speed-latent.json")
    if timed:
        lines += ["", "**16 faces of `(smiling + glasses + beard)`** (guided, decoding included, models loaded; "
                  + ("untrained networks: the time does not depend on the weights" if not timed["trained"]
                     else f"trained: {', '.join(timed['trained'])}")
                  + "): " + ", ".join(f"{sec:.1f} s on {t} thread{'s' if int(t) > 1 else ''}"
                                      for t, sec in timed["seconds"].items()) + " (target: 10 s on 2 threads)."]
    jac = read("jacobian.json")
    if jac:
        data, normal = jac["log_det_J"]["renders"], jac["log_det_J"]["normal"]
        lines += ["", f"**The plain sum's Jacobian term**: log abs det J of the decoder, in nats, at the latents of"
                  f" {jac['n']} fresh renders: mean {data['mean']:.0f}, std {data['std']:.0f} ({data['min']:.0f} to"
                  f" {data['max']:.0f}); at {jac['n']} standard normal latents: mean {normal['mean']:.0f}. A plain sum"
                  f" of K latent energies adds -(K - 1) log abs det J: for three models, {2 * data['std']:.0f} nats"
                  f" across faces and {2 * (normal['mean'] - data['mean']):.0f} nats in favour of latents off the"
                  " data; a guided sum adds nothing."]
    bold = [line for line in lines if line.startswith("**")]
    write_section("faces64-latent", "\n".join(lines), short="\n".join(lines[:2] + [" ".join([lines[2], *bold])]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    ae = sub.add_parser("autoencoder", help="bundle a cebm train-autoencoder run as faces64-autoencoder")
    ae.add_argument("--run", type=Path, required=True)
    ae.add_argument("--command", required=True, help="the command that trained it, for the card")
    ae.add_argument("--device", default="a 2-core x86-64 CPU, one thread")
    ae.add_argument("--n", type=int, default=500)
    ae.add_argument("--earlier", type=Path, default=None,
                    help="the autoencoder the run was fine-tuned from (a folder with its card): its stage is kept")
    sub.add_parser("report", help="the faces64-latent section of docs/benchmarks.md")
    drawn = sub.add_parser("alone", help="draw one latent model alone, every value (section faces64-alone)")
    drawn.add_argument("--models", type=Path, required=True, help="a folder of faces64-<attribute>/ runs")
    drawn.add_argument("--attribute", required=True)
    drawn.add_argument("--key", required=True, help="its place in the section's order (alone-KEY.json)")
    drawn.add_argument("--about", required=True, help="what the model is, for the section")
    drawn.add_argument("--n", type=int, default=64)
    again = sub.add_parser("remeasure", help="measure the bundled autoencoder again, for report")
    again.add_argument("--n", type=int, default=500)
    args = parser.parse_args()
    if args.what == "report":
        report()
    elif args.what == "alone":
        torch.set_num_threads(1)
        alone(args.models, args.attribute, args.key, args.about, args.n)
    elif args.what == "remeasure":
        torch.set_num_threads(1)
        remeasure(args.n)
    else:
        torch.set_num_threads(1)
        bundle_autoencoder(args.run, args.command, args.device, args.n, args.earlier)


if __name__ == "__main__":
    main()
