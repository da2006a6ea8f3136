"""The 64-px faces (DiceBear lorelei, `recipes/faces64-*.toml`): training on a lent GPU, and how far a CPU gets.

Realism against training time, one point per kept snapshot of a run (``benchmarks.realism_curve --watch`` keeps
them) and a contact sheet of the last one beside renders::

    python -m benchmarks.faces64 curve --run runs/faces64/faces64-smiling [--every 200 | --steps 300 600 929] [--n 64]

Each point samples ``--n`` faces per value of the model's attribute as a user does (``sample(n, seed=...)`` with the
recipe's defaults), reads them with the 64-px faces classifier (``--classifier``) and scores them against fresh
renders of that value (FID in the classifier's features over the floor of as many fresh renders). The time is the
run's logged step times.

The estimate `cebm train` prints before a run beside what the run measured (its log's ``estimate`` and
``measured`` records)::

    python -m benchmarks.faces64 estimate --run runs/faces64/faces64-smiling [--run ...]

On a lent GPU (the device tool), the data travels packed, since the machine has no Node.js to render it::

    python -m benchmarks.faces64 pack --out runs/faces64-carry       # here: the recipes' renders, xz-compressed
    # kornia's wheels, which the GPU machine's image lacks (its python is 3.12), into .whl (ignored):
    pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl \
        kornia==0.9.0 kornia_rs==0.2.0
    # the device tool's command, carrying runs/faces64-carry and .whl:
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
        PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.faces64 gpu --minutes 8

``gpu`` unpacks the renders into the cache folder the recipes read, trains the four models side by side on the one
GPU (one process each, ``--max-minutes``), writes each model folder as ``$OUT/faces64-<attribute>.tar`` and the logs
beside them, then runs ``tests/test_cuda.py``. On the same machine, a second call resumes each run from its
checkpoint (the runs live in /tmp/faces64-runs there). A call on a fresh machine starts each run from the weights
of an earlier call where they are carried (``--init DIR``: DIR/faces64-<attribute>/ model folders, as the tars
unpack; a model's float32 weights are 12 MB, and the tree a call carries holds 64 MiB, the repository included).
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

from benchmarks._report import machine, shown, write_section
from composable_ebm import save_image_grid
from composable_ebm.data import combination_mask
from composable_ebm.data.faces import STYLES, faces, faces_folder
from composable_ebm.evaluation.conditional import value_distribution
from composable_ebm.evaluation.realism import contact_sheet, realism
from composable_ebm.models import BUNDLED_DIR, load_model
from composable_ebm.recipes import build_model_from_shapes, load_recipe
from composable_ebm.training import read_log

ROOT = Path(__file__).resolve().parents[1]
BASE = tomllib.loads((ROOT / "recipes" / "faces64-base.toml").read_text())
DATA = BASE["data"]
HELD_OUT, = DATA["holdout"]  # no model saw it
ATTRIBUTES = tuple(STYLES[DATA["style"]].attributes)
VALUES = STYLES[DATA["style"]].attributes


# ----------------------------------------------------------------------------- the data, packed for a GPU
def pack(out: Path, data: dict = DATA) -> Path:
    """The renders of a recipe's ``[data]`` as one xz-compressed uint8 array (the recipes' 20,000 renders: 246 MB
    in 2 MB) and their table, in ``out``; returns it."""
    folder = faces_folder(data["n"], data.get("seed", 0), data["size"], data["style"])
    names = sorted(p.name for p in folder.glob("*.png"))
    images = np.stack([np.asarray(Image.open(folder / name).convert("RGB")) for name in names])
    out.mkdir(parents=True, exist_ok=True)
    (out / "images.u8.xz").write_bytes(lzma.compress(images.tobytes(), preset=9))
    shutil.copyfile(folder / "list_attr_celeba.txt", out / "list_attr_celeba.txt")
    (out / "folder.json").write_text(json.dumps({"folder": folder.name, "names": names,
                                                 "shape": list(images.shape)}))
    print(f"packed {len(names):,} renders into {out} ({(out / 'images.u8.xz').stat().st_size / 2**20:.1f} MiB)")
    return out


def unpack(carry: Path, cache: Path) -> Path:
    """The packed renders as the folder the recipes read (same pixels, PNG again), in ``cache``."""
    info = json.loads((carry / "folder.json").read_text())
    folder = cache / info["folder"]
    if (folder / "list_attr_celeba.txt").is_file():
        return folder
    images = np.frombuffer(lzma.decompress((carry / "images.u8.xz").read_bytes()), np.uint8).reshape(info["shape"])
    staging = cache / f".{info['folder']}-unpacking"
    staging.mkdir(parents=True, exist_ok=True)
    for name, image in zip(info["names"], images, strict=True):
        Image.fromarray(image).save(staging / name)
    shutil.copyfile(carry / "list_attr_celeba.txt", staging / "list_attr_celeba.txt")
    os.replace(staging, folder)
    return folder


def gpu(carry: Path, minutes: float, init: Path | None, out: Path, device: str = "cuda") -> int:
    """Train the four models side by side on this machine's GPU (``device``; ``cpu`` rehearses the call here), tar
    their model folders into ``out``, then run tests/test_cuda.py; returns the worst exit status."""
    cache = Path(os.environ.setdefault("CEBM_CACHE", "/tmp/cebm-cache"))
    print(f"renders in {unpack(carry, cache)}", flush=True)
    runs = Path("/tmp/faces64-runs")
    jobs = {}
    for attribute in ATTRIBUTES:
        command = [sys.executable, "-m", "composable_ebm", "train", str(ROOT / "recipes" / f"faces64-{attribute}.toml"),
                   "--out", str(runs / f"faces64-{attribute}"), "--device", device, "--max-minutes", str(minutes),
                   "--no-progress"]
        if init is not None and (init / f"faces64-{attribute}").is_dir():
            command += ["--init", str(init / f"faces64-{attribute}")]
        log = open(out / f"faces64-{attribute}.log", "w")  # noqa: SIM115 (closed below)
        jobs[attribute] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log)
    for attribute, (job, log) in jobs.items():
        job.wait()
        log.close()
        model = runs / f"faces64-{attribute}" / "model"
        if job.returncode == 0 and model.is_dir():
            shutil.copyfile(runs / f"faces64-{attribute}" / "log.jsonl", model / "log.jsonl")
            with tarfile.open(out / f"faces64-{attribute}.tar", "w") as tar:
                tar.add(model, arcname=f"faces64-{attribute}")
        print(f"faces64-{attribute}: exit {job.returncode}", flush=True)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                            str(ROOT / "tests" / "test_cuda.py")], cwd=ROOT)
    return max([tests.returncode] + [job.returncode for job, _ in jobs.values()])


# ----------------------------------------------------------------------------- the classifier
CLASSIFIER = "faces64-classifier"


def bundle_classifier(source: Path) -> dict[str, float]:
    """Copy the 64-px faces classifier under its short name with a card giving its accuracy on 2,000 fresh renders
    (another seed than its training renders)."""
    from benchmarks.bundle import bundle_classifier_as

    data = faces(2000, seed=123, size=DATA["size"], style=DATA["style"])  # renders no model or classifier saw
    return bundle_classifier_as(
        load_model(source), CLASSIFIER, data.images.float() / 255, data.labels, "faces",
        f"Reads the four attributes (smiling, glasses, beard, hair) of a 64x64 face of the faces dataset's lorelei"
        f" style ({STYLES['lorelei'].generator}); `benchmarks/faces64.py` scores the 64-px models' samples with it,"
        " and its penultimate features are the space of their FID ratio. It reads only what it was trained on: clean"
        " renders. Artefacts in samples can still be read as an attribute, so look at the samples too. Trained by"
        " `cebm train-classifier FOLDER --size 64 --steps 3000 --pooling flatten` on the 64-px recipes' 20,000"
        " renders (`cebm data faces --style lorelei --size 64 -n 20000`), 10% of them kept aside: its heads read"
        " the whole last feature map, since a smile at 64 px is a few pixels of curve in one place.",
        "Accuracy on 2,000 fresh renders (`faces(2000, seed=123, size=64, style=\"lorelei\")`, every combination;"
        " `python -m benchmarks.faces64 bundle-classifier`):")


# ----------------------------------------------------------------------------- the estimate against the run
def estimates(runs: list[Path]) -> None:
    rows = []
    for run in runs:
        records = [r for r in read_log(run / "log.jsonl") if r.get("event") in ("estimate", "measured")]
        pairs = [(a, b) for a, b in zip(records, records[1:], strict=False)
                 if a["event"] == "estimate" and b["event"] == "measured"]
        for guess, seen in pairs:
            rows.append({"run": shown(run), "steps": seen["step"] - guess["step"],
                         "estimated_s": guess["seconds_per_step"], "measured_s": seen["seconds_per_step"],
                         "estimated_gb": (guess["peak_bytes"] or 0) / 2**30,
                         "measured_gb": (seen["peak_bytes"] or 0) / 2**30})
    for row in rows:
        print(json.dumps(row))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "estimates.json").write_text(json.dumps(rows, indent=1))


# ----------------------------------------------------------------------------- seconds for the sentence
SENTENCE = {"smiling": "yes", "glasses": "yes", "beard": "yes"}
"""The composition timed: the held-out triple, as `(smiling + glasses + beard).sample(n=16)` draws it."""


def speed(models: Path | None, n: int, threads: list[int], recipes: Path = ROOT / "recipes") -> dict:
    """Seconds for ``n`` draws of the sentence at 64 px (its guided form, the recipes' sampling defaults), after a
    warm-up draw, at each thread count; the models of ``models`` (``faces64-<attribute>/model``; ``bundled``: the
    bundled ones), or where absent the networks of the recipes in ``recipes`` untrained (the time does not depend on
    the weights: every draw makes the same evaluations; ``recipes/latent``: the latent models, their draws decoded by
    the bundled autoencoder)."""
    import time

    terms, trained = [], []
    for attribute, value in SENTENCE.items():
        folder = models / f"faces64-{attribute}" / "model" if models is not None else None
        if str(models) == "bundled":
            folder = BUNDLED_DIR / f"faces64-{attribute}"
        if folder is not None and folder.is_dir():
            energy = load_model(folder)
            trained.append(attribute)
        else:
            spec = load_recipe(recipes / f"faces64-{attribute}.toml")
            energy = build_model_from_shapes(spec)
        terms.append(energy.eval().condition(**{attribute: value}))
    sentence = terms[0] + terms[1] + terms[2]
    row = {"n": n, "trained": trained, "recipes": str(recipes.relative_to(ROOT)), "seconds": {}}
    for count in threads:
        torch.set_num_threads(count)
        sentence.sample(2, seed=0)  # warm-up
        start = time.perf_counter()
        sentence.sample(n, seed=1)
        row["seconds"][count] = time.perf_counter() - start
        print(json.dumps({"threads": count, "seconds": row["seconds"][count]}), flush=True)
    return row


# ----------------------------------------------------------------------------- realism against time
def renders_of(attribute: str, value: str, n: int, seed: int) -> torch.Tensor:
    """``n`` fresh renders (another seed than the training data's) whose ``attribute`` is ``value``, outside the
    held-out combination, as float images."""
    data = faces(max(8 * n, 2000), seed=seed, size=DATA["size"], style=DATA["style"])
    keep = (data.labels[attribute] == VALUES[attribute].index(value)) & ~combination_mask(data.labels, VALUES,
                                                                                           [HELD_OUT])
    picked = data.images[keep]
    if picked.shape[0] < n:
        raise SystemExit(f"only {picked.shape[0]} fresh renders of {attribute}={value}; ask for fewer")
    return picked[:n].float() / 255


def seconds_at(run: Path, step: int) -> float:
    """Training seconds up to ``step`` from the run's log: each logged step's time stands for the interval before it,
    and the last one's for the steps after it (a run stopped between two logged steps)."""
    total, last, per_step = 0.0, 0, float("nan")
    for record in read_log(run / "log.jsonl"):
        if "seconds" in record and "step" in record and record["step"] <= step:
            total += record["seconds"] * (record["step"] - last)
            last, per_step = record["step"], record["seconds"]
    return total + per_step * (step - last) if step > last else total


def snapshot_samples(run: Path, recipe: Path, n: int, every: int, steps: list[int] | None = None) -> dict[int, Path]:
    """The samples of every kept snapshot whose step is a multiple of ``every``, and of the last: ``n`` per value
    of the model's attribute (seed: the value's index) and the contact sheet's 8 (seed 50 + the index), drawn with
    the recipe's defaults and kept in ``RUN/snapshot-samples/`` (drawn once: the scoring needs the classifier, the
    drawing not). ``steps``: these snapshots instead."""
    from safetensors.torch import save_file

    spec = load_recipe(recipe)
    model = build_model_from_shapes(spec).eval()
    (attribute, values), = model.attributes.items()
    kept = {}
    snaps = sorted((run / "snapshots").glob("ema-*.safetensors"))
    for snap in snaps:
        step = int(snap.stem.split("-")[1])
        if steps is not None and step not in steps:
            continue
        if steps is None and (step == 0 or (step % every and snap != snaps[-1])):  # the last snapshot always
            continue
        out = run / "snapshot-samples" / f"n{n}-step{step:06d}.safetensors"
        if not out.is_file():
            model.load_state_dict(load_file(snap), strict=True)
            drawn = {}
            for i, value in enumerate(values):
                drawn[value] = model.condition(**{attribute: value}).sample(n, seed=i).contiguous()
                drawn[f"sheet-{value}"] = model.condition(**{attribute: value}).sample(8, seed=50 + i).contiguous()
            out.parent.mkdir(parents=True, exist_ok=True)
            save_file(drawn, out)
            print(f"drew {out}", flush=True)
        kept[step] = out
    return kept


def curve(run: Path, recipe: Path, classifier_path: str, n: int, every: int, steps: list[int] | None = None
          ) -> list[dict]:
    """One point per kept snapshot (`snapshot_samples`): each value's FID ratio and read-right share."""
    kept = snapshot_samples(run, recipe, n, every, steps)
    classifier = load_model(classifier_path).eval()
    attribute = load_recipe(recipe).data.attributes[0]
    values = VALUES[attribute]
    fresh = {v: (renders_of(attribute, v, 1000, seed=100 + i), renders_of(attribute, v, 4 * n, seed=200 + i))
             for i, v in enumerate(values)}
    points = []
    for step, path in sorted(kept.items()):
        drawn = load_file(path)
        point = {"run": shown(run), "step": step, "minutes": seconds_at(run, step) / 60, "values": {}}
        for value in values:
            reference, real = fresh[value]
            score = realism(drawn[value], real, reference, classifier.features)
            read = value_distribution(classifier.predict(drawn[value])[attribute], values)
            point["values"][value] = {"fid_ratio": score.fid_ratio, "accuracy": read[value]}
        ratios = [v["fid_ratio"] for v in point["values"].values()]
        reads = [v["accuracy"] for v in point["values"].values()]
        point.update(fid_ratio_median=statistics.median(ratios), fid_ratio_worst=max(ratios),
                     accuracy_mean=statistics.mean(reads), accuracy_worst=min(reads))
        points.append(point)
        print(json.dumps(point), flush=True)
    if kept:  # the last snapshot's samples of every value beside renders of it
        drawn = load_file(kept[max(kept)])
        rows = [(drawn[f"sheet-{v}"], fresh[v][1][:8]) for v in values]
        save_image_grid(contact_sheet(rows, per_row=8, scale=1)[None],
                        ROOT / "docs" / "images" / f"faces64-curve-{run.name}.png", scale=2)
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "faces64-carry")
    g = verbs.add_parser("gpu")
    g.add_argument("--carry", type=Path, default=ROOT / "runs" / "faces64-carry")
    g.add_argument("--minutes", type=float, default=8.0)
    g.add_argument("--init", type=Path, default=None)
    g.add_argument("--device", default="cuda", help="cpu: rehearse the call on this machine")
    g.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "runs" / "faces64-gpu")))
    b = verbs.add_parser("bundle-classifier")
    b.add_argument("--classifier", type=Path, default=ROOT / "runs" / "faces64" / "classifier")
    t = verbs.add_parser("speed")
    t.add_argument("--models", type=Path, default=None)
    t.add_argument("--n", type=int, default=16)
    t.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    t.add_argument("--recipes", type=Path, default=ROOT / "recipes",
                   help="where the recipes of untrained models are: recipes (pixels) or recipes/latent")
    e = verbs.add_parser("estimate")
    e.add_argument("--run", type=Path, nargs="+", required=True)
    c = verbs.add_parser("curve")
    c.add_argument("--run", type=Path, nargs="+", required=True)
    c.add_argument("--classifier", default="faces64-classifier")
    c.add_argument("--n", type=int, default=64)
    c.add_argument("--every", type=int, default=200)
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--steps", type=int, nargs="+", default=None, help="these snapshots (instead of --every)")
    c.add_argument("--draw-only", action="store_true", help="draw and keep the snapshots' samples; score later")
    verbs.add_parser("report")
    args = parser.parse_args()
    if args.verb == "pack":
        pack(args.out)
    elif args.verb == "gpu":
        args.out.mkdir(parents=True, exist_ok=True)
        raise SystemExit(gpu(args.carry, args.minutes, args.init, args.out, args.device))
    elif args.verb == "estimate":
        estimates([run.resolve() for run in args.run])
    elif args.verb == "bundle-classifier":
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "classifier.json").write_text(json.dumps(bundle_classifier(args.classifier)))
    elif args.verb == "report":
        report()
    elif args.verb == "speed":
        row = speed(args.models, args.n, args.threads, args.recipes.resolve())
        RESULTS.mkdir(parents=True, exist_ok=True)
        name = "speed.json" if args.recipes.resolve() == ROOT / "recipes" else "speed-latent.json"
        (RESULTS / name).write_text(json.dumps(row, indent=1))
    else:
        if args.threads:
            torch.set_num_threads(args.threads)
        points = []
        for run in args.run:
            run = run.resolve()
            recipe = ROOT / "recipes" / f"{run.name}.toml"
            if args.draw_only:
                snapshot_samples(run, recipe, args.n, args.every, args.steps)
            else:
                points += curve(run, recipe, args.classifier, args.n, args.every, args.steps)
        if args.draw_only:
            return
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "curve.json").write_text(json.dumps(points, indent=1))


RESULTS = ROOT / "runs" / "faces64"
"""Where each verb keeps what it measured (``curve.json``, ``estimates.json``, ``speed.json``, ``classifier.json``);
``report`` writes the docs section from them."""


def report() -> None:
    """The ``faces64`` section of docs/benchmarks.md from what the verbs measured."""
    def read(name: str):
        path = RESULTS / name
        return json.loads(path.read_text()) if path.is_file() else None

    lines = ["## Faces at 64 px: the classifier, the estimate, how far a CPU gets", "",
             f"`python -m benchmarks.faces64 bundle-classifier`, `estimate`, `speed` and `curve` (then `report`) on"
             f" {machine()}; the models are `recipes/faces64-*.toml` (lorelei faces, 64 px)."]
    accuracy = read("classifier.json")
    if accuracy:
        lines += ["", "**faces64-classifier** on 2,000 fresh renders: "
                  + ", ".join(f"{a} {v:.3f}" for a, v in accuracy.items()) + "."]
    guesses = read("estimates.json")
    if guesses:
        lines += ["", "**`cebm train`'s estimate against the run** (time per step; peak memory): " + "; ".join(
            f"{Path(g['run']).name}, {g['steps']} steps: {g['estimated_s']:.2f} s estimated, {g['measured_s']:.2f}"
            f" s measured ({g['estimated_s'] / g['measured_s'] - 1:+.0%}); {g['estimated_gb']:.2f} GB against"
            f" {g['measured_gb']:.2f} GB ({g['estimated_gb'] / max(g['measured_gb'], 1e-9) - 1:+.0%})"
            for g in guesses) + "."]
    timed = read("speed.json")
    if timed:
        lines += ["", "**16 faces of `(smiling + glasses + beard)`** (guided, the recipes' sampling defaults; "
                  + ("untrained networks, as" if not timed["trained"] else f"trained: {', '.join(timed['trained'])};")
                  + " the time does not depend on the weights): " + ", ".join(
                      f"{s:.0f} s on {t} thread{'s' if int(t) > 1 else ''}" for t, s in timed["seconds"].items())
                  + " (target: 30 s on a 2-core CPU)."]
    points = read("curve.json")
    if points:
        names = list(dict.fromkeys(Path(p["run"]).name for p in points))
        first = {name: next(p for p in points if Path(p["run"]).name == name) for name in names}
        last = {name: [p for p in points if Path(p["run"]).name == name][-1] for name in names}
        lines += ["", "**How far a CPU gets** (one thread, the recipe as it stands but with a checkpoint every 100 steps; the first and last snapshots measured): "
                  + "; ".join(f"{name}: step {first[name]['step']} ({first[name]['minutes']:.0f} min) FID ratio median"
                              f" {first[name]['fid_ratio_median']:.1f}, read right {first[name]['accuracy_mean']:.3f};"
                              f" step {last[name]['step']} ({last[name]['minutes']:.0f} min) FID ratio median"
                              f" {last[name]['fid_ratio_median']:.1f} (worst {last[name]['fid_ratio_worst']:.1f}),"
                              f" read right {last[name]['accuracy_mean']:.3f} (worst"
                              f" {last[name]['accuracy_worst']:.3f})" for name in names) + "."]
        lines += ["", "Realism against time: the EMA weights of a run on one CPU thread (the machine's two cores"
                  " shared with another run) every few hundred steps, 64 samples per value drawn with the recipe's"
                  " defaults, read by faces64-classifier; FID ratio against fresh renders of the value. Minutes: the"
                  " run's logged step times.", "",
                  "| model | step | minutes | FID ratio median (worst) | read right mean (worst) |",
                  "| --- | --- | --- | --- | --- |",
                  *(f"| {Path(p['run']).name} | {p['step']} | {p['minutes']:.0f} | {p['fid_ratio_median']:.1f}"
                    f" ({p['fid_ratio_worst']:.1f}) | {p['accuracy_mean']:.3f} ({p['accuracy_worst']:.3f}) |"
                    for p in points),
                  "", *(f"![{name}: the last snapshot's samples of each value (left) beside renders (right)]"
                        f"(images/faces64-curve-{name}.png)" for name in names)]
    # the headline: the heading, the command and the bold-led results as one paragraph
    bold = [line for line in lines if line.startswith("**")]
    write_section("faces64", "\n".join(lines), short="\n".join(lines[:3] + ["", " ".join(bold)]))


if __name__ == "__main__":
    main()
