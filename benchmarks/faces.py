"""Faces attribute models over the whole table: each model alone and every conjunction.

    python -m benchmarks.faces [--models bundled] [--classifier faces-classifier] [--n 64] [--label bundled]

On two cores, as two one-thread shards and a merge::

    python -m benchmarks.faces --shard 0/2 --threads 1 & python -m benchmarks.faces --shard 1/2 --threads 1
    python -m benchmarks.faces --merge 2

On a GPU the models sample there (``--device cuda``) and the classifier reads on the CPU; shards share the GPU as
processes, and the merge runs on the same machine, so the report names its device. A GPU's cuDNN rounds differently
from the CPU and from run to run, so a row there is not the CPU's row from the same seed: compare tables measured
on one device::

    for i in 0 1 2 3; do python -m benchmarks.faces --device cuda --threads 2 --shard $i/4 & done; wait
    python -m benchmarks.faces --device cuda --merge 4

A shard saves its rows as it goes: ``--resume`` (with the same settings, the models unchanged) goes on from the last
row an interrupted shard measured, with the same samples, as each row draws from its own seed.

Reads ``MODELS/faces-<attribute>/model`` for smiling, glasses, hat and hair (or a bundled name, with ``--models
bundled``), samples every row as a user does (``energy.sample(n, seed=...)`` with the models' own settings) and
reads the samples with the faces classifier and, beside it, with a second judge (``--judge``: another network,
trained on renders of other seeds over random background colours, never used to choose a setting); every table
gives both, and lists the rows whose joint accuracy the two read more than 0.05 apart:

- alone: every value of every model: accuracy, the largest gap between the other attributes' mix and the data's
  under that value (beside what an exact sampler of the training split reads at as many samples: the gap's floor),
  FID ratio (in the classifier's features, over the floor of as many fresh renders) and high-frequency ratio
  against fresh renders of that value;
- every conjunction of 2 and 3 of smiling, glasses and hat, every value (12 pairs, 8 triples), in the plain form
  (``a + b``) and the guided form (``guided(a + b)``): joint accuracy (every conditioned attribute read right at
  once) and realism against fresh renders of that combination; smiling + glasses + hat is held out of every
  model's training data;
Negation, OR, weights and temperature: ``python -m benchmarks.algebra``, the algebra's one table.

Contact sheets put samples beside renders of the same row; the table goes into docs/benchmarks.md.

A guidance screen measures the guided conjunctions alone, with the guidance scales given instead of the models'
own (``--scales smiling=1,glasses=1,hat=1``), and writes a short table::

    python -m benchmarks.faces --only guided --scales smiling=1,glasses=1,hat=1 --label scale1

Guidance intervals replace the models' own where scales would (``--intervals smiling=0:0.3,...``: each model's scale
applies at noise levels 0 < sigma <= 0.3, and 1 above; `composable_ebm.energy.Guided`).

A sampler screen measures each model alone with another noise ladder (``--levels``: how many levels; ``--steps``:
transitions at each; ``--first-steps``: transitions at the first level before the descent) than the models' own, or
with other guidance scales or intervals for the models drawn guided on their own (``--scales``, ``--intervals``)::

    python -m benchmarks.faces --only alone --levels 30 --n 128 --label levels30

With none of those, ``--only alone`` measures each model alone with its own settings at another number of samples
per row; at 256 the gaps' floor (below) is low enough to judge the 0.10 target (a value's floor averages over as
many whole sets of fresh renders as there are, at most 4)::

    python -m benchmarks.faces --only alone --n 256 --label n256

The FID ratio of a row moves with its seed: ``--repeats R`` (with ``--only alone``) draws each model alone R times,
the first from the row's own seed (the numbers of a run without it) and the others from that seed plus
1000, 2000, ..., and gives each row's mean and range over them::

    python -m benchmarks.faces --only alone --repeats 4 --label seeds4

The gaps' floor: what an exact sampler of the training split would read as the largest gap of each alone row, at
``N`` samples per row (``N`` of the training renders of that value drawn at random, read by the classifier, many
times), so that a measured gap can be told from the noise of its ``--n`` samples::

    python -m benchmarks.faces --gap-floor 64 128 256 [--draws 500]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from benchmarks._report import machine, write_section
from composable_ebm import load, save_image_grid
from composable_ebm.atomic import write_atomic
from composable_ebm.cli.common import _device as checked_device
from composable_ebm.data import combination_mask, faces
from composable_ebm.data.faces import STYLES
from composable_ebm.configs import check_interval
from composable_ebm.energy import Guided
from composable_ebm.errors import InvalidInputError
from composable_ebm.evaluation.conditional import max_deviation, value_distribution
from composable_ebm.evaluation.realism import contact_sheet, realism
from composable_ebm.expression import parse_expression
from composable_ebm.pipeline import composed, has_guided_form

ROOT = Path(__file__).resolve().parents[1]
FORMS = ("plain", "guided")
SHEET_SAMPLES = 8


@dataclass(frozen=True)
class FacesTable:
    """What one style's table measures: its models (``PREFIX-<attribute>``), their attributes and values, the three
    composed, the held-out triple (from the base recipe), the classifier that reads the samples and the renders, and
    the second judge that reads the samples beside it."""

    style: str
    prefix: str
    size: int
    recipe: Path  # the base recipe: its held-out triple
    classifier: str
    composed: tuple[str, str, str]
    judge: str = ""  # a second classifier, of another network and other renders, read beside the first
    note: str = ""  # what the table's gaps read beyond an exact sampler's, where measured
    alone_targets: str = ("every value >= 0.95, gaps <= 0.10, median FID ratio <= 3, worst <= 6, HF ratio <= 1.5")
    conjunction_targets: str = ("mean joint >= 0.95 / 0.92 for 2 / 3 attributes, worst >= 0.75, the held-out triple"
                                " >= 0.85, composites' median FID ratio <= 4")
    algebra: str = "The algebra, both families"  # the docs section with its negation, OR, weights and temperature

    @property
    def values(self) -> dict[str, tuple[str, ...]]:
        return dict(STYLES[self.style].attributes)

    @property
    def attributes(self) -> tuple[str, ...]:
        return tuple(self.values)

    @property
    def held_out(self) -> dict[str, str]:
        held, = tomllib.loads(self.recipe.read_text())["data"]["holdout"]  # no model saw it
        return held

    def renders(self, n: int, seed: int):
        return faces(n, seed=seed, size=self.size, style=self.style)


TABLES = {
    "pixel-art": FacesTable("pixel-art", "faces", 16, ROOT / "recipes" / "faces-base.toml", "faces-classifier",
                            ("smiling", "glasses", "hat"), "faces-judge",
                            ", and to every render 0.16-0.17 more in the `yes` rows of smiling, glasses and hat and"
                            " about 0.07 more in the hair rows, which the held-out triple shifts"),
    "lorelei": FacesTable("lorelei", "faces64", 64, ROOT / "recipes" / "latent" / "faces64-base.toml",
                          "faces64-classifier", ("smiling", "glasses", "beard"), "faces64-judge",
                          alone_targets="every value >= 0.97, median FID ratio <= 3, worst <= 6",
                          conjunction_targets="mean joint >= 0.95 / 0.92 for 2 / 3 attributes, the held-out triple"
                                              " >= 0.90",
                          algebra="The algebra of the 64-px faces over latents"),
}
"""The tables by ``--style``: the 16-px pixel-art faces and the 64-px lorelei faces (latent models)."""
PIXEL_ART = TABLES["pixel-art"]
ATTRIBUTES, COMPOSED, HELD_OUT = PIXEL_ART.attributes, PIXEL_ART.composed, PIXEL_ART.held_out


def term(attribute: str, value: str, t: FacesTable = PIXEL_ART) -> str:
    return f"{t.prefix}-{attribute}[{attribute}={value}]"


def jobs(t: FacesTable = PIXEL_ART) -> list[dict]:
    """Every row of the table, in a fixed order (its index seeds its samples). Each names its expression, what a
    right sample reads (``want``: attribute -> accepted values) and which renders it is compared with."""
    out: list[dict] = []
    values, held = t.values, t.held_out
    for a in t.attributes:
        for v in values[a]:
            out.append({"kind": "alone", "expression": term(a, v, t), "want": {a: [v]}, "form": "auto"})
    for form in FORMS:
        for arity in (2, 3):
            for names in itertools.combinations(t.composed, arity):
                for combo in itertools.product(*(values[a] for a in names)):
                    target = dict(zip(names, combo, strict=True))
                    text = " + ".join(term(a, v, t) for a, v in target.items())
                    out.append({"kind": "conjunction", "arity": arity, "form": form, "target": target,
                                "expression": f"guided({text})" if form == "guided" else text,
                                "want": {a: [v] for a, v in target.items()}, "held_out": target == held})
        out += [{"kind": "moved"}] * 2  # two negation rows, now benchmarks.algebra's: the seeds after them stay
    out += [{"kind": "moved"}] * 2  # two OR rows, as well
    out = [dict(job, index=i) for i, job in enumerate(out)]  # a row's index is its seed, kept when a row leaves
    return [job for job in out if job["kind"] != "moved"]


def _hits(labels: dict[str, torch.Tensor], want: dict[str, list[str]], t: FacesTable = PIXEL_ART) -> torch.Tensor:
    """Per attribute of ``want``, whether each image's value is one of those accepted, ``(A, N)`` bool."""
    return torch.stack([torch.isin(labels[a], torch.tensor([t.values[a].index(v) for v in values]))
                        for a, values in want.items()])


def _scores(read: dict[str, torch.Tensor], want: dict[str, list[str]], t: FacesTable = PIXEL_ART) -> dict:
    """A reading's ``joint`` accuracy (every attribute of ``want`` right at once) and ``per_attribute`` accuracy."""
    hits = _hits(read, want, t)
    return {"joint": float(hits.all(dim=0).float().mean()),
            "per_attribute": {a: float(h.float().mean()) for a, h in zip(want, hits, strict=True)}}


def _matching(labels: dict[str, torch.Tensor], want: dict[str, list[str]], t: FacesTable = PIXEL_ART) -> torch.Tensor:
    """Which images have every attribute of ``want`` at an accepted value, ``(N,)`` bool."""
    return _hits(labels, want, t).all(dim=0)


def floor_sets(pool: torch.Tensor, n: int, most: int = 4) -> torch.Tensor:
    """The fresh renders the realism floor averages over: as many whole sets of ``n`` as ``pool`` holds, at most
    ``most`` (a value a quarter of the renders have holds fewer than 4 sets of 256). Empty when it holds fewer than
    ``n``, which `realism` refuses in one line."""
    return pool[: min(most, pool.shape[0] // n) * n]


def model_loader(models_dir: str, device: str = "cpu"):
    """Loads a faces model by its bundled name (``models_dir`` "bundled") or from ``models_dir/NAME/model``."""
    def load_one(name: str):
        return load(name if models_dir == "bundled" else str(Path(models_dir) / name / "model"), device=device)
    return load_one


def measure(job: dict, models_dir: str, classifier, data, fresh, n: int,
            scales: dict[str, float] | None = None, ladder: dict[str, int] | None = None,
            data_read: dict[str, torch.Tensor] | None = None,
            intervals: dict[str, tuple[float, float]] | None = None,
            device: str = "cpu", t: FacesTable = PIXEL_ART, judge=None) -> tuple[dict, torch.Tensor]:
    """One row: its scores and its first samples (for the sheets). ``scales`` (attribute -> guidance scale) replaces
    the models' own guidance scales in a guided row, a model drawn guided on its own included, and ``intervals``
    (attribute -> the noise levels ``(lo, hi)`` a scale applies at) their guidance intervals; ``ladder``
    (``levels``, ``steps``, ``first_steps``) the models' noise ladder's number of levels, transitions at each and
    transitions before the descent. With ``data_read`` (the classifier's readings of ``data``) an alone row also
    gets its gap's floor at ``n`` (`row_gap_floor`). The models sample on ``device``; the classifier reads their
    samples on the CPU, and ``judge`` (a second classifier) beside it: ``row["judge"]``."""

    energy = parse_expression(job["expression"], model_loader(models_dir, device))
    given = scales or intervals
    if given and not isinstance(energy, Guided) and job["form"] != "plain" and has_guided_form(energy):
        energy = composed(energy, job["form"])  # a model drawn guided on its own (`guided_alone`): that form
    if given and isinstance(energy, Guided):  # the same terms and weights, the given scales and intervals
        bound = [next(iter(t.bound)) for t in energy.terms]
        energy = Guided(energy.weights, list(energy.terms),
                        [(scales or {}).get(a, s) for a, s in zip(bound, energy.scales, strict=True)],
                        [(intervals or {}).get(a, i) for a, i in zip(bound, energy.intervals, strict=True)])
    samples = energy.sample(n, seed=job["index"], form=job["form"], **(ladder or {})).cpu()
    read = classifier.predict(samples)
    row = {k: job[k] for k in ("index", "kind", "form", "expression", "want") if k in job}
    row.update({k: job[k] for k in ("arity", "target", "held_out") if k in job})
    row.update(_scores(read, job["want"], t))
    if judge is not None:
        row["judge"] = _scores(judge.predict(samples), job["want"], t)
    real_pool = fresh.images[_matching(fresh.labels, job["want"], t)].float() / 255
    reference = data.images[_matching(data.labels, job["want"], t)][:500].float() / 255
    real = floor_sets(real_pool, n)
    score = realism(samples, real, reference, classifier.features)
    row.update({"fid_ratio": score.fid_ratio, "hf_ratio": score.hf_ratio, "n": n, "n_real": int(real.shape[0])})
    if job["kind"] == "alone":
        (a, (v,)), = job["want"].items()
        under = _matching(data.labels, job["want"], t)
        trained = under & ~combination_mask(data.labels, t.values, [t.held_out])  # as the models' data
        for key, among in (("gaps", under), ("gaps_training", trained)):  # to every render; to the models' data
            row[key] = {b: max_deviation(value_distribution(read[b], t.values[b]),
                                         value_distribution(data.labels[b][among], t.values[b]))
                        for b in t.attributes if b != a}
        if data_read is not None:  # what an exact sampler of the training split reads at this n
            floor = row_gap_floor(data_read, data.labels, a, v, n, FLOOR_DRAWS,
                                  torch.Generator().manual_seed(job["index"]), t)
            row["gap_floor"] = [round(float(g), 6) for g in floor]
    return row, samples[:SHEET_SAMPLES]


def _save_shard(table: Path, tensors: Path, rows: list[dict], samples: dict[str, torch.Tensor], minutes: float,
                settings: dict) -> None:
    """A shard's rows so far and their first samples, each file replaced whole (an interrupted write keeps the last)."""
    write_atomic(tensors, lambda tmp: save_file(samples, tmp))
    text = json.dumps({"rows": rows, "minutes": minutes, **settings}, indent=1)
    write_atomic(table, lambda tmp: Path(tmp).write_text(text))


def _resumed(table: Path, tensors: Path, settings: dict) -> tuple[list[dict], dict[str, torch.Tensor], float]:
    """The rows, samples and minutes an interrupted shard saved (none if it saved nothing). A shard measured with
    other settings is refused in one line, so a table never mixes two."""
    if not table.is_file():
        return [], {}, 0.0
    saved = json.loads(table.read_text())
    differ = {k: (saved.get(k), v) for k, v in settings.items() if saved.get(k) != v}
    if differ:
        raise SystemExit(f"--resume: {table} was measured with other settings ("
                         + ", ".join(f"{k} {old!r}, now {new!r}" for k, (old, new) in differ.items())
                         + "); rerun without --resume, or with its settings")
    samples = load_file(str(tensors))
    rows = [r for r in saved["rows"] if str(r["index"]) in samples]
    return rows, {str(r["index"]): samples[str(r["index"])] for r in rows}, saved["minutes"]


def _paths(out: Path, label: str, shard: tuple[int, int], t: FacesTable = PIXEL_ART) -> tuple[Path, Path]:
    stem = f"{t.prefix}-{label}-shard{shard[0]}of{shard[1]}"
    return out / f"{stem}.json", out / f"{stem}.safetensors"


def _sheet(rows: list[dict], samples: dict[str, torch.Tensor], fresh, path: Path, t: FacesTable = PIXEL_ART) -> None:
    pairs = []
    for row in rows:
        real = fresh.images[_matching(fresh.labels, row["want"], t)][:SHEET_SAMPLES].float() / 255
        pairs.append((samples[str(row["index"])], real))
    save_image_grid(contact_sheet(pairs, per_row=SHEET_SAMPLES, scale=1)[None], path, scale=max(1, 64 // t.size))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


JUDGES_APART = 0.05
"""Rows whose joint accuracy the classifier and the second judge read further apart than this are listed."""


def judged(rows: list[dict]) -> bool:
    """Whether every row was read by the second judge too."""
    return bool(rows) and all("judge" in r for r in rows)


def row_name(r: dict) -> str:
    """A row as a table names it: ``smiling=yes alone``, ``guided smiling=yes + glasses=no``."""
    want = " + ".join(f"{a}={'|'.join(v)}" for a, v in r["want"].items())
    return f"{want} alone" if r["kind"] == "alone" else f"{r['form']} {want}"


def _judge_cell(group: list[dict]) -> str:
    """A table cell: the second judge's mean and worst joint accuracy over ``group``."""
    return f" {_mean([r['judge']['joint'] for r in group]):.3f} / {min(r['judge']['joint'] for r in group):.3f} |"


def judges_sentence(rows: list[dict], t: FacesTable = PIXEL_ART) -> str:
    """Both judges over the table: each one's mean over the rows, and every row the two read more than
    `JUDGES_APART` apart (empty where the rows were read by one judge)."""
    if not judged(rows):
        return ""
    apart = sorted((r for r in rows if abs(r["joint"] - r["judge"]["joint"]) > JUDGES_APART),
                   key=lambda r: -abs(r["joint"] - r["judge"]["joint"]))
    listed = ("; ".join(f"{row_name(r)} {r['joint']:.3f} / {r['judge']['joint']:.3f}" for r in apart)
              if apart else "none")
    second, first = _mean([r["judge"]["joint"] for r in rows]), _mean([r["joint"] for r in rows])
    return (f"**Two judges.** {t.judge} (another network, trained on renders of other seeds over random background"
            f" colours; nothing here was chosen by it) reads the table's {len(rows)} rows {second:.3f} on average"
            f" against {first:.3f} by {t.classifier}. Rows the two read more than {JUDGES_APART} apart"
            f" ({t.classifier} / {t.judge}): {listed}.")


def _median_p95(values: torch.Tensor) -> str:
    return f"{float(values.median()):.2f} / {float(values.quantile(0.95)):.2f}"


REPEAT_SEED_STRIDE = 1000  # --repeats: the k-th draw of a row is from its seed plus k times this


def _repeats(rows: list[dict]) -> int:
    """How many draws every row has its FID ratio over (`--repeats`); 1 where a row has one only."""
    return min(len(r.get("fid_ratio_repeats", [None])) for r in rows)


def _mean_range(values: list[float]) -> str:
    return f"{_mean(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def alone_table(rows: list[dict], model_column: bool = True, t: FacesTable = PIXEL_ART) -> list[str]:
    """The table of each model alone: a line per value (a model card's table has no model column); where every row
    has its gap's floor (`row_gap_floor`), a column gives its median and 95th percentile, and where every row was
    drawn several times (`--repeats`), one its FID ratio's mean and range over the draws."""
    head = "| model " if model_column else ""
    floors = all("gap_floor" in r for r in rows)
    repeats = _repeats(rows)
    second = judged(rows)
    lines = [f"{head}| value | accuracy |" + (" second judge |" if second else "") + " FID ratio |"
             + (f" FID ratio over {repeats} seeds: mean (range) |" if repeats > 1 else "")
             + " HF ratio | largest gap (other attributes) to every render |"
             " to the training split |" + (" an exact sampler's (median / 95th percentile) |" if floors else ""),
             "| --- " * (6 + model_column + floors + (repeats > 1) + second) + "|"]
    for r in rows:
        (a, (v,)), = r["want"].items()
        gaps = [max(r[key].items(), key=lambda item: item[1]) for key in ("gaps", "gaps_training")]
        lines.append((f"| {t.prefix}-{a} " if model_column else "") + f"| {v} | {r['joint']:.3f} |"
                     + (f" {r['judge']['joint']:.3f} |" if second else "") + f" {r['fid_ratio']:.1f} |"
                     + (f" {_mean_range(r['fid_ratio_repeats'][:repeats])} |" if repeats > 1 else "")
                     + f" {r['hf_ratio']:.2f} |" + "".join(f" {b} {gap:.2f} |" for b, gap in gaps)
                     + (f" {_median_p95(torch.tensor(r['gap_floor']))} |" if floors else ""))
    return lines


def repeats_sentence(rows: list[dict]) -> str:
    """Where every row was drawn several times (`--repeats`): the rows' mean FID ratios over the draws, median and
    worst, and the worst row's range, as a sentence (empty otherwise)."""
    repeats = _repeats(rows)
    if repeats < 2:
        return ""
    means = sorted(((_mean(r["fid_ratio_repeats"][:repeats]), r) for r in rows), key=lambda item: item[0])
    worst, row = means[-1]
    (a, (v,)), = row["want"].items()
    draws = row["fid_ratio_repeats"][:repeats]
    return (f" Over {repeats} seeds per row (the row's own, then plus {REPEAT_SEED_STRIDE}, {2 * REPEAT_SEED_STRIDE},"
            f" ...), the rows' mean FID ratio: median {statistics.median(m for m, _ in means):.1f}, worst {worst:.1f}"
            f" (`{a}={v}`, which reads {min(draws):.1f}-{max(draws):.1f} across them).")


def largest_gaps(rows: list[dict]) -> str:
    """The alone rows' largest gap to every render and to the training split (and, where the rows have their floors,
    what an exact sampler of the training split reads as that largest gap), as a sentence's end."""
    text = (f"largest gap {max(max(r['gaps'].values()) for r in rows):.2f} to every render,"
            f" {max(max(r['gaps_training'].values()) for r in rows):.2f} to the training split")
    if all("gap_floor" in r for r in rows):
        headline = torch.tensor([r["gap_floor"] for r in rows]).amax(dim=0)
        text += f" (an exact sampler of it: {_median_p95(headline)}, median / 95th percentile)"
    return text


def spent(minutes: float, device: str) -> str:
    """What a table's shards took together: CPU-minutes, or minutes of processes that shared a device."""
    if device == "cpu":
        return f"{minutes:.0f} CPU-minutes"
    return f"{minutes:.0f} minutes of processes sharing one {device}"


def device_flag(device: str) -> str:
    """The command line's ``--device``, where it is not the CPU."""
    return "" if device == "cpu" else f" --device {device}"


def report(rows: list[dict], samples: dict[str, torch.Tensor], fresh, label: str, n: int, minutes: float,
           models: str, options: str = "", device: str = "cpu", t: FacesTable = PIXEL_ART) -> str:
    """The docs section and its contact sheets; ``options``: the command's settings beyond the models' own."""
    images = ROOT / "docs" / "images"
    alone = [r for r in rows if r["kind"] == "alone"]
    second = judged(rows)
    _sheet(alone, samples, fresh, images / f"{t.prefix}-{label}-alone.png", t)
    fid = sorted(r["fid_ratio"] for r in alone)
    style = "" if t is PIXEL_ART else f" --style {t.style}"
    triple = " + ".join(t.composed)
    lines = [
        f"## {t.prefix.capitalize()} models ({label})", "",
        f"`python -m benchmarks.faces{style} --models {models}{device_flag(device)}{options} --n {n} --label {label}`"
        f" (as shards and `--merge`) on {machine()}, {spent(minutes, device)}. Every row is {n} samples drawn as a user"
        f" draws them, read by {t.classifier} (a model on its own runs its `[sampling.alone]` settings, and is"
        " drawn guided where its settings say `guided_alone`); FID ratio in"
        " the classifier's features against fresh renders of what the row asks for (over the floor of as many fresh"
        " renders; it grows with the number of samples, so compare tables of one `--n`); HF ratio: high-frequency"
        " energy over the renders'. Gap: the largest difference between the samples' mix of another attribute, as"
        " the classifier reads it, and the renders' under the row's value, to every render and to the training split"
        " (the renders the models trained on, the held-out triple left out). A model that drew its training data"
        f" exactly reads to the training split only the noise of {n} samples (\"Faces: the gaps' floor\" below"
        + (f"; the last column: {n} of the training renders of the row's value drawn at random {FLOOR_DRAWS} times"
           if all("gap_floor" in r for r in alone) else "")
        + f"){t.note}.", "",
        f"**Each model alone** (targets: {t.alone_targets}): median FID ratio **{statistics.median(fid):.1f}**"
        f" (worst {fid[-1]:.1f}); accuracy mean"
        f" {_mean([r['joint'] for r in alone]):.3f} (worst {min(r['joint'] for r in alone):.3f}); {largest_gaps(alone)}.",
        "",
        *alone_table(alone, t=t),
    ]
    lines += ["", f"![{t.prefix} alone, {label}](images/{t.prefix}-{label}-alone.png)", "",
              "Samples (left) beside fresh renders (right), one row per value: "
              + ", ".join(f"{a} {'/'.join(v)}" for a, v in t.values.items()) + ".", "",
              f"**Every conjunction** of {', '.join(t.composed[:-1])} and {t.composed[-1]}, every value (targets:"
              f" {t.conjunction_targets}):", "",
              "| form | attributes | composites | mean joint | worst |"
              + (" second judge: mean / worst |" if second else "") + " median FID ratio | median HF ratio |",
              "| --- " * (7 + second) + "|"]
    for form in FORMS:
        for arity in (2, 3):
            group = [r for r in rows if r["kind"] == "conjunction" and r["form"] == form and r["arity"] == arity]
            worst = min(group, key=lambda r: r["joint"])
            lines.append(f"| {form} | {arity} | {len(group)} | {_mean([r['joint'] for r in group]):.3f} |"
                         f" {worst['joint']:.3f} ({', '.join(f'{a}={v}' for a, v in worst['target'].items())}) |"
                         + (_judge_cell(group) if second else "")
                         + f" {statistics.median(r['fid_ratio'] for r in group):.1f} |"
                         f" {statistics.median(r['hf_ratio'] for r in group):.2f} |")
    held = {r["form"]: r for r in rows if r.get("held_out")}
    lines += ["", f"The held-out triple `{triple}` (no model saw a face with all three): "
              + "; ".join(f"{form} joint {held[form]['joint']:.3f}"
                          + (f" ({held[form]['judge']['joint']:.3f} by {t.judge})" if second else "")
                          + f", FID ratio {held[form]['fid_ratio']:.1f}" for form in FORMS if form in held) + ".", "",
              "| composite | plain joint | guided joint |" + (" guided, second judge |" if second else "")
              + " plain FID ratio | guided FID ratio |",
              "| --- " * (5 + second) + "|"]
    conj = [r for r in rows if r["kind"] == "conjunction"]
    for target in [r["target"] for r in conj if r["form"] == "plain"]:
        pair = {r["form"]: r for r in conj if r["target"] == target}
        name = " + ".join(f"{a}={v}" for a, v in target.items()) + (" (held out)" if target == t.held_out else "")
        lines.append(f"| {name} | {pair['plain']['joint']:.3f} | {pair['guided']['joint']:.3f} |"
                     + (f" {pair['guided']['judge']['joint']:.3f} |" if second else "")
                     + f" {pair['plain']['fid_ratio']:.1f} | {pair['guided']['fid_ratio']:.1f} |")
    guided = [r for r in conj if r["form"] == "guided"]
    _sheet(guided, samples, fresh, images / f"{t.prefix}-{label}-guided.png", t)
    lines += ["", f"![guided {t.prefix} composites, {label}](images/{t.prefix}-{label}-guided.png)", "",
              "Guided composites (left) beside renders of the same combination (right), in the table's order; the"
              f" held-out triple is the last row. Negation, OR, weights and temperature: \"{t.algebra}\"."]
    if second:
        lines += ["", judges_sentence(rows, t)]
    return "\n".join(lines)


def given_settings(ladder: dict[str, int] | None = None, scales: str | None = None,
                   intervals: str | None = None) -> tuple[str, list[str]]:
    """The settings a run was given beyond the models' own: as the command line's flags (each after a space) and in
    words, one phrase each."""
    ladder = ladder or {}
    flags = ([f" --{k.replace('_', '-')} {v}" for k, v in ladder.items()]
             + [f" --scales {scales}"] * bool(scales) + [f" --intervals {intervals}"] * bool(intervals))
    words = ([f"{k.replace('_', ' ')} {v}" for k, v in ladder.items()]
             + [f"guidance scales {scales}"] * bool(scales) + [f"guidance intervals {intervals}"] * bool(intervals))
    return "".join(flags), words


def screen_report(rows: list[dict], label: str, n: int, minutes: float, models: str, scales: str | None,
                  intervals: str | None = None, ladder: dict[str, int] | None = None, device: str = "cpu",
                  t: FacesTable = PIXEL_ART, attributes: list[str] | None = None) -> str:
    """The short section of a screen over the guided conjunctions."""
    flags, given = given_settings(ladder, scales, intervals)
    flags = _table_flags(t, attributes) + flags
    second = judged(rows)
    lines = [f"## {t.prefix.capitalize()} guidance screen ({label})", "",
             f"`python -m benchmarks.faces --models {models}{device_flag(device)} --only guided{flags} --n {n}"
             f" --label {label}` on {machine()}, {spent(minutes, device)}"
             + (f" ({' and '.join(given)} instead of the models' own)" if given
                else " (the models' own guidance scales)") + ":", "",
             "| attributes | composites | mean joint | worst |" + (" second judge: mean / worst |" if second else "")
             + " median FID ratio | held-out triple joint |" + (" by the second judge |" if second else "")
             + " its FID ratio |",
             "| --- " * (7 + 2 * second) + "|"]
    for arity in (2, 3):
        group = [r for r in rows if r["kind"] == "conjunction" and r["arity"] == arity]
        held = [r for r in group if r["held_out"]]
        lines.append(f"| {arity} | {len(group)} | {_mean([r['joint'] for r in group]):.3f} |"
                     f" {min(r['joint'] for r in group):.3f} |"
                     + (_judge_cell(group) if second else "")
                     + f" {statistics.median(r['fid_ratio'] for r in group):.1f} |"
                     + (f" {held[0]['joint']:.3f} |" + (f" {held[0]['judge']['joint']:.3f} |" if second else "")
                        + f" {held[0]['fid_ratio']:.1f} |" if held else " - |" * (2 + second)))
    if second:
        lines += ["", judges_sentence(rows, t)]
    return "\n".join(lines)


def _table_flags(t: FacesTable, attributes: list[str] | None) -> str:
    """The command line's ``--style`` and ``--attributes``, where given."""
    return ("" if t is PIXEL_ART else f" --style {t.style}") + (f" --attributes {' '.join(attributes)}"
                                                                if attributes else "")


def sampler_report(rows: list[dict], label: str, n: int, minutes: float, models: str, ladder: dict[str, int],
                   scales: str | None = None, intervals: str | None = None, device: str = "cpu",
                   t: FacesTable = PIXEL_ART, attributes: list[str] | None = None) -> str:
    """The short section of each model alone: a screen with a given noise ladder or guidance scales, or (with neither)
    the models' own settings at another number of samples than the whole table's."""
    flags, given = given_settings(ladder, scales, intervals)
    repeats = _repeats(rows)
    command = (f"python -m benchmarks.faces --models {models}{device_flag(device)} --only alone"
               f"{_table_flags(t, attributes)}{flags}"
               + (f" --repeats {repeats}" if repeats > 1 else "") + f" --n {n} --label {label}")
    fid = sorted(r["fid_ratio"] for r in rows)
    kind = t.prefix.capitalize()
    title = f"{kind} sampler screen ({label})" if given else f"{kind} models alone, {n} samples per row ({label})"
    lines = [f"## {title}", "",
             f"`{command}` on {machine()}, {spent(minutes, device)} ("
             + (", ".join(given) + " instead of the models' own" if given else "the models' own settings")
             + f"): median FID ratio **{statistics.median(fid):.1f}** (worst"
             f" {fid[-1]:.1f}); accuracy mean {_mean([r['joint'] for r in rows]):.3f} (worst"
             f" {min(r['joint'] for r in rows):.3f}); {largest_gaps(rows)}." + repeats_sentence(rows), "",
             *alone_table(rows, t=t)]
    if judged(rows):
        lines += ["", judges_sentence(rows, t)]
    return "\n".join(lines)


FLOOR_DRAWS = 500  # draws of an exact sampler per alone row, for the gaps' floor


def row_gap_floor(read: dict[str, torch.Tensor], labels: dict[str, torch.Tensor], attribute: str, value: str, n: int,
                  draws: int, generator: torch.Generator, t: FacesTable = PIXEL_ART) -> torch.Tensor:
    """The largest gap to the training split that an exact sampler of it reads in the alone row ``attribute=value``
    at ``n`` samples, ``draws`` times ``(draws,)``: ``n`` of the training renders of that value at random (without
    replacement), read by the classifier as a row's samples are (``read``: its readings of every render), against the
    mix of the other attributes among all of them (``labels``: the renders' own)."""
    trained = _matching(labels, {attribute: [value]}, t) & ~combination_mask(labels, t.values, [t.held_out])
    pool = trained.nonzero().squeeze(1)
    if n > len(pool):
        raise SystemExit(f"{n} samples per row is more than the {len(pool)} training renders of {attribute}={value}")
    mix = {b: value_distribution(labels[b][trained], t.values[b]) for b in t.attributes if b != attribute}
    gaps = []
    for _ in range(draws):
        picked = pool[torch.randperm(len(pool), generator=generator)[:n]]
        gaps.append(max(max_deviation(value_distribution(read[b][picked], t.values[b]), mix[b]) for b in mix))
    return torch.tensor(gaps)


def gap_floor(data, classifier, ns: list[int], draws: int,
              t: FacesTable = PIXEL_ART) -> dict[tuple[str, str, int], torch.Tensor]:
    """`row_gap_floor` of every alone row at each ``n``: ``(attribute, value, n)`` -> ``(draws,)``."""
    read = classifier.predict(data.images.float() / 255)
    generator = torch.Generator().manual_seed(0)
    return {(a, v, n): row_gap_floor(read, data.labels, a, v, n, draws, generator, t)
            for a in t.attributes for v in t.values[a] for n in ns}


def gap_floor_report(floor: dict[tuple[str, str, int], torch.Tensor], ns: list[int], draws: int,
                     minutes: float, t: FacesTable = PIXEL_ART) -> str:
    """The floor per row and of the table's headline (the largest over the alone rows), median and 95th percentile."""
    rows = [(a, v) for a in t.attributes for v in t.values[a] if (a, v, ns[0]) in floor]
    headline = {n: torch.stack([floor[a, v, n] for a, v in rows]).amax(dim=0) for n in ns}
    return "\n".join([
        f"## {t.prefix.capitalize()}: the gaps' floor",
        "",
        f"`python -m benchmarks.faces{'' if t is PIXEL_ART else f' --style {t.style}'} --gap-floor"
        f" {' '.join(map(str, ns))} --draws {draws}` on {machine()},"
        f" {minutes:.1f} minutes: what an exact sampler of the models' training split reads as the largest gap of each"
        " alone row (the other attributes' mix against the training split's under that value, as the table above"
        f" reads it): N of the training renders of that value drawn at random, read by {t.classifier},"
        f" {draws} times. Median / 95th percentile.",
        "",
        "**The headline** (the largest gap over the 10 alone rows, target <= 0.10): "
        + "; ".join(f"N = {n}: {_median_p95(headline[n])}" for n in ns) + ".",
        "",
        "| model | value | " + " | ".join(f"N = {n}" for n in ns) + " |",
        "| --- | --- | " + " | ".join("---" for _ in ns) + " |",
        *(f"| {t.prefix}-{a} | {v} | " + " | ".join(_median_p95(floor[a, v, n]) for n in ns) + " |" for a, v in rows),
    ])


def _write(args, rows: list[dict], samples: dict[str, torch.Tensor], fresh, minutes: float, models: str,
           scales: str | None, ladder: dict[str, int], intervals: str | None = None, device: str = "cpu",
           t: FacesTable = PIXEL_ART) -> None:
    """The docs section of a whole table (`report`), of a guidance screen (`screen_report`) or of a sampler screen
    (`sampler_report`), printed too."""
    if args.only == "alone":
        text = sampler_report(rows, args.label, rows[0]["n"], minutes, models, ladder, scales, intervals, device, t,
                              args.attributes)
        write_section(f"{t.prefix}-screen-{args.label}", text)
    elif args.only is not None:
        text = screen_report(rows, args.label, rows[0]["n"], minutes, models, scales, intervals, ladder, device, t,
                             args.attributes)
        write_section(f"{t.prefix}-screen-{args.label}", text)
    else:
        text = report(rows, samples, fresh, args.label, rows[0]["n"], minutes, models,
                      given_settings(ladder, scales, intervals)[0], device, t)
        write_section(f"{t.prefix}-{args.label}", text)
    print(text)


def _scales(text: str | None, t: FacesTable = PIXEL_ART) -> dict[str, float] | None:
    if text is None:
        return None
    out = {}
    for item in text.split(","):
        attribute, _, value = item.partition("=")
        if attribute not in t.attributes or not value.replace(".", "", 1).isdigit():
            raise SystemExit(f"--scales {text!r}: write ATTRIBUTE=SCALE,... with ATTRIBUTE one of {list(t.attributes)}")
        out[attribute] = float(value)
    return out


def _intervals(text: str | None, t: FacesTable = PIXEL_ART) -> dict[str, tuple[float, float]] | None:
    if text is None:
        return None
    out = {}
    for item in text.split(","):
        attribute, _, value = item.partition("=")
        lo, _, hi = value.partition(":")
        try:
            interval = check_interval((float(lo), float(hi)))
        except (ValueError, InvalidInputError):
            interval = None
        if attribute not in t.attributes or interval is None:
            raise SystemExit(f"--intervals {text!r}: write ATTRIBUTE=LO:HI,... with ATTRIBUTE one of {list(t.attributes)}"
                             " and 0 <= LO < HI")
        out[attribute] = interval
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--style", choices=sorted(TABLES), default="pixel-art",
                        help="which faces: the 16-px pixel-art models (faces-*) or the 64-px lorelei ones (faces64-*)")
    parser.add_argument("--models", default="bundled", help="'bundled', or a folder of PREFIX-<attribute>/model runs")
    parser.add_argument("--classifier", default=None, help="a folder or a bundled name (default: the style's)")
    parser.add_argument("--judge", default=None,
                        help="the second judge that reads every row beside the classifier: a folder or a bundled name"
                             " (default: the style's); 'none' for the classifier alone")
    parser.add_argument("--n", type=int, default=64, help="samples per row")
    parser.add_argument("--label", default="bundled")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "faces-table")
    parser.add_argument("--shard", default="0/1", help="I/K: measure every K-th row from the I-th")
    parser.add_argument("--merge", type=int, default=None, metavar="K", help="merge K shards and write the report")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu",
                        help="where the models sample: cpu, cuda, cuda:1 ... (the classifier reads on the CPU); merge"
                             " a device's shards on a machine with that device, which the report names")
    parser.add_argument("--resume", action="store_true",
                        help="go on with the rows an interrupted shard of this --label saved (same settings only)")
    parser.add_argument("--only", choices=["guided", "alone"], default=None,
                        help="a screen: only the guided conjunctions, or each model alone, reported in a short table")
    parser.add_argument("--scales", default=None, metavar="ATTRIBUTE=SCALE,...",
                        help="guidance scales that replace the models' own in guided rows (and in the rows of a model"
                             " drawn guided on its own)")
    parser.add_argument("--intervals", default=None, metavar="ATTRIBUTE=LO:HI,...",
                        help="guidance intervals (the noise levels a model's guidance scale applies at; 1 at the others)"
                             " that replace the models' own where --scales would")
    parser.add_argument("--levels", type=int, default=None, help="noise levels that replace the models' own")
    parser.add_argument("--steps", type=int, default=None, help="transitions per level that replace the models' own")
    parser.add_argument("--first-steps", type=int, default=None,
                        help="transitions at the first level before the descent that replace the models' own")
    parser.add_argument("--repeats", type=int, default=1, metavar="R",
                        help="with --only alone: draw each row R times (its seed, then plus 1000, 2000, ...) and give"
                             " its FID ratio's mean and range")
    parser.add_argument("--gap-floor", type=int, nargs="+", default=None, metavar="N",
                        help="instead of sampling: the largest gap an exact sampler of the training split reads at N"
                             " samples per row (section faces-gap-floor)")
    parser.add_argument("--draws", type=int, default=500, help="random draws per row and N for --gap-floor")
    parser.add_argument("--attributes", nargs="+", default=None, metavar="A",
                        help="with --only: only the rows whose models are these attributes' (a screen of the models"
                             " that exist so far)")
    args = parser.parse_args()
    t = TABLES[args.style]
    args.classifier = args.classifier or t.classifier
    args.judge = args.judge or t.judge
    if args.gap_floor:
        start = time.perf_counter()
        if args.threads:
            torch.set_num_threads(args.threads)
        floor = gap_floor(t.renders(20000, seed=0), load(args.classifier), args.gap_floor, args.draws, t)
        text = gap_floor_report(floor, args.gap_floor, args.draws, (time.perf_counter() - start) / 60, t)
        write_section(f"{t.prefix}-gap-floor", text)
        print(text)
        return
    if args.device != "cpu":
        try:
            checked_device(args.device)
        except InvalidInputError as err:
            raise SystemExit(str(err)) from None
    if args.repeats < 1 or (args.repeats > 1 and args.only != "alone"):
        raise SystemExit(f"--repeats {args.repeats}: give a whole number >= 1, and more than 1 only with --only alone")
    scales, intervals = _scales(args.scales, t), _intervals(args.intervals, t)
    ladder = {k: v for k, v in (("levels", args.levels), ("steps", args.steps), ("first_steps", args.first_steps))
              if v is not None}
    if args.threads:
        torch.set_num_threads(args.threads)
    fresh = t.renders(4000, seed=1)  # renders no model saw: the floor, the real side of realism, the sheets
    todo = [j for j in jobs(t) if args.only is None or (args.only == "alone" and j["kind"] == "alone")
            or (j["kind"] == "conjunction" and j["form"] == args.only)]
    if args.attributes:
        if args.only is None:
            raise SystemExit("--attributes screens some models: give --only alone or --only guided with it")
        todo = [j for j in todo if set(j["want"]) <= set(args.attributes)]
    if args.merge:
        rows, samples, minutes = [], {}, 0.0
        for i in range(args.merge):
            table, tensors = _paths(args.out, args.label, (i, args.merge), t)
            part = json.loads(table.read_text())
            rows += part["rows"]
            minutes += part["minutes"]
            samples.update(load_file(str(tensors)))
        rows.sort(key=lambda r: r["index"])
        if [r["index"] for r in rows] != [j["index"] for j in todo]:
            raise SystemExit(f"the {args.merge} shards hold {len(rows)} of {len(todo)} rows; run every shard first")
        _write(args, rows, samples, fresh, minutes, part["models"], part.get("scales") or args.scales,
               part.get("ladder") or ladder, part.get("intervals") or args.intervals, part.get("device", "cpu"), t)
        return
    index, _, count = args.shard.partition("/")
    shard = (int(index), int(count))
    start = time.perf_counter()
    classifier = load(args.classifier)
    judge = None if args.judge == "none" else load(args.judge)
    data = t.renders(20000, seed=0)  # the training renders, held-out faces included: the reference set
    data_read = classifier.predict(data.images.float() / 255)  # for the gaps' floor
    table, tensors = _paths(args.out, args.label, shard, t)
    settings = {"models": args.models, "classifier": args.classifier, "judge": args.judge, "n": args.n,
                "scales": args.scales,
                "ladder": ladder, "only": args.only, **({"intervals": args.intervals} if args.intervals else {}),
                **({"repeats": args.repeats} if args.repeats > 1 else {}),
                **({"attributes": args.attributes} if args.attributes else {}),
                **({"device": args.device} if args.device != "cpu" else {})}
    rows, samples, before = _resumed(table, tensors, settings) if args.resume else ([], {}, 0.0)
    done = {r["index"] for r in rows}
    for job in todo[shard[0]::shard[1]]:
        if job["index"] in done:
            continue
        row, first = measure(job, args.models, classifier, data, fresh, args.n, scales, ladder, data_read, intervals,
                             args.device, t, judge)
        if args.repeats > 1:  # the same row from other seeds: its FID ratio's spread
            row["fid_ratio_repeats"] = [row["fid_ratio"]] + [
                measure({**job, "index": job["index"] + k * REPEAT_SEED_STRIDE}, args.models, classifier, data, fresh,
                        args.n, scales, ladder, None, intervals, args.device, t)[0]["fid_ratio"]
                for k in range(1, args.repeats)]
        rows.append(row)
        samples[str(job["index"])] = first.contiguous()
        minutes = before + (time.perf_counter() - start) / 60
        _save_shard(table, tensors, rows, samples, minutes, settings)  # after every row: --resume goes on from here
        print(json.dumps({k: row[k] for k in ("index", "expression", "joint", "fid_ratio")}), flush=True)
    minutes = before + (time.perf_counter() - start) / 60
    _save_shard(table, tensors, rows, samples, minutes, settings)
    if shard[1] == 1:
        _write(args, rows, samples, fresh, minutes, args.models, args.scales, ladder, args.intervals, args.device, t)


if __name__ == "__main__":
    main()
