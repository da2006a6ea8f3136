"""The energy algebra of the bundled models, both families: every operator, what it should do, what it does.

    python -m benchmarks.algebra [--n 256]

On two cores, as two one-thread shards and a merge::

    python -m benchmarks.algebra --shard 0/2 --threads 1 & python -m benchmarks.algebra --shard 1/2 --threads 1
    python -m benchmarks.algebra --merge 2

The 64-px faces over latents (the bundled `faces64-*` models, read by `faces64-classifier`) are their own table,
``--table faces64`` (with the same ``--shard`` and ``--merge``)::

    python -m benchmarks.algebra --table faces64 --n 64

Every row is drawn as a user draws it (``energy.sample(n, seed=..., form=...)``, the models' own settings, form
``auto`` unless the row names another) and read by its family's bundled classifier: the noise-conditioned faces
models (`faces-*`, read by `faces-classifier`) and the contrastive-divergence Shapes models (`shapes-*`, read by
`shapes-classifier`); a faces row's accuracy is read by its second judge too (`faces-judge`, `faces64-judge`:
benchmarks.faces). A row reads the share of the values it names, its accuracy (a sample that matches one of the
row's alternatives in every attribute) and, for a temperature, the spread of its samples (the per-pixel standard
deviation across them). A row whose form the pipeline refuses records its one line. The ``energy`` rows run the
expression's energy as written through the low-level sampler (`composable_ebm.sampling.sample`): a disjunction's
``-logsumexp`` of its parts' unnormalised energies, which is what the pipeline's mixture replaces.

Contact sheets put each row's first samples beside renders of what it asks for; the table goes into
docs/benchmarks.md.

Another model in place of a bundled one (``--model faces-hair=runs/hair/model --only 0 2``), and how often a model's
lowest-energy condition reads the attribute of noised renders (its levels compared across conditions)::

    python -m benchmarks.algebra --implicit-classifier faces-hair hair
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

from benchmarks._report import machine, write_section
from composable_ebm import load, save_image_grid, shapes
from composable_ebm.data import FACES_ATTRIBUTES, SHAPES_ATTRIBUTES, combination_mask, faces
from composable_ebm.data.faces import STYLES
from composable_ebm.errors import InvalidInputError
from composable_ebm.evaluation.realism import contact_sheet
from composable_ebm.expression import parse_expression
from composable_ebm.pipeline import plan
from composable_ebm.sampling import sample as run_sampler

ROOT = Path(__file__).resolve().parents[1]
SHEET_SAMPLES = 8
VALUES = {"faces": FACES_ATTRIBUTES, "shapes": SHAPES_ATTRIBUTES, "faces64": STYLES["lorelei"].attributes}
CLASSIFIER = {"faces": "faces-classifier", "shapes": "shapes-classifier", "faces64": "faces64-classifier"}
JUDGE = {"faces": "faces-judge", "faces64": "faces64-judge"}
"""The faces families' second judges (benchmarks.faces): a row's accuracy by them is given beside the classifier's."""
TABLES = {"both": ("faces", "shapes"), "faces64": ("faces64",)}
"""The tables by ``--table``: which families' rows each measures (a row keeps its index, its seed, in every table)."""
SECTION = {"both": "algebra", "faces64": "algebra-faces64"}


def face(attribute: str, value: str) -> str:
    return f"faces-{attribute}[{attribute}={value}]"


def shape(attribute: str, value: str) -> str:
    return f"shapes-{attribute}[{attribute}={value}]"


def face64(attribute: str, value: str) -> str:
    return f"faces64-{attribute}[{attribute}={value}]"


def faces64_rows() -> list[dict]:
    """OR, AND with OR and NOT of the 64-px latent faces models: the rows of the faces table's form."""
    blond, red = face64("hair", "blond"), face64("hair", "red")
    smiling, glasses, beard = face64("smiling", "yes"), face64("glasses", "yes"), face64("beard", "yes")
    colours, others = {"hair": ["blond", "red"]}, {"hair": ["brown", "grey"]}
    either = {"hair=blond": (0.40, 0.60), "hair=red": (0.40, 0.60), "others": (0.0, 0.05)}
    return [
        {"family": "faces64", "operator": "OR", "expression": f"{blond} | {red}", "form": "auto",
         "reads": {**colours}, "others": others, "want": [colours], "expect": "each colour half the time",
         "targets": either},
        {"family": "faces64", "operator": "weighted OR", "expression": f"3 : {blond} | {red}", "form": "auto",
         "reads": {**colours}, "others": others, "want": [colours], "expect": "blond three times as often as red",
         "targets": {"hair=blond": (0.65, 0.85)}},
        {"family": "faces64", "operator": "AND with OR", "expression": f"{smiling} + ({blond} | {red})",
         "form": "auto", "reads": {"smiling": ["yes"], **colours}, "others": others,
         "want": [{"smiling": ["yes"], **colours}], "expect": "every face smiling, each colour half the time",
         "targets": {"smiling=yes": (0.95, 1.0), "hair=blond": (0.40, 0.60), "hair=red": (0.40, 0.60)}},
        {"family": "faces64", "operator": "AND with OR", "expression": f"({beard} | {glasses}) + {smiling}",
         "form": "auto", "reads": {"beard": ["yes"], "glasses": ["yes"], "smiling": ["yes"]},
         "want": [{"beard": ["yes"], "smiling": ["yes"]}, {"glasses": ["yes"], "smiling": ["yes"]}],
         "expect": "smiling, with a beard or glasses (each about half)",
         "targets": {"accuracy": (0.95, 1.0), "beard=yes": (0.30, 1.0), "glasses=yes": (0.30, 1.0)}},
        {"family": "faces64", "operator": "NOT", "expression": f"{glasses} - {beard}", "form": "auto",
         "reads": {"glasses": ["yes"], "beard": ["yes"]}, "want": [{"glasses": ["yes"], "beard": ["no"]}],
         "expect": "glasses, no beard", "targets": {"accuracy": (0.95, 1.0)}},
        {"family": "faces64", "operator": "NOT", "expression": f"{beard} - {smiling}", "form": "auto",
         "reads": {"beard": ["yes"], "smiling": ["yes"]}, "want": [{"beard": ["yes"], "smiling": ["no"]}],
         "expect": "a beard, no smile", "targets": {"accuracy": (0.95, 1.0)}},
    ]


def rows() -> list[dict]:
    """The table, in a fixed order (a row's index seeds its samples). A row names its family, operator, expression,
    form, the values it reads (``reads``: attribute -> values), what a right sample is (``want``: alternatives, each
    attribute -> accepted values), the expected effect in words and its targets (``targets``: measure -> (lo, hi))."""
    blond, red = face("hair", "blond"), face("hair", "red")
    smiling, glasses, hat = face("smiling", "yes"), face("glasses", "yes"), face("hat", "yes")
    colours = {"hair": ["blond", "red"]}
    others = {"hair": ["brown", "dark"]}
    out = [
        {"family": "faces", "operator": "OR", "expression": f"{blond} | {red}", "form": "auto",
         "reads": {**colours}, "others": others, "want": [colours], "expect": "each colour half the time",
         "targets": {"hair=blond": (0.40, 0.60), "hair=red": (0.40, 0.60), "others": (0.0, 0.05)}},
        {"family": "faces", "operator": "OR", "expression": f"{blond} | {red}", "form": "plain",
         "reads": {**colours}, "others": others, "want": [colours], "expect": "each colour half the time",
         "targets": {"hair=blond": (0.40, 0.60), "hair=red": (0.40, 0.60), "others": (0.0, 0.05)}},
        {"family": "faces", "operator": "OR", "expression": f"{blond} | {red}", "form": "energy",
         "reads": {**colours}, "others": others, "want": [colours],
         "expect": "the parts' unnormalised energies compared (not what the pipeline samples)", "targets": {}},
        {"family": "faces", "operator": "weighted OR", "expression": f"3 : {blond} | {red}", "form": "auto",
         "reads": {**colours}, "others": others, "want": [colours], "expect": "blond three times as often as red",
         "targets": {"hair=blond": (0.65, 0.85)}},
        {"family": "faces", "operator": "AND with OR", "expression": f"{smiling} + ({blond} | {red})", "form": "auto",
         "reads": {"smiling": ["yes"], **colours}, "others": others, "want": [{"smiling": ["yes"], **colours}],
         "expect": "every face smiling, each colour half the time",
         "targets": {"smiling=yes": (0.95, 1.0), "hair=blond": (0.40, 0.60), "hair=red": (0.40, 0.60)}},
        {"family": "faces", "operator": "AND with OR", "expression": f"{smiling} + ({blond} | {red})", "form": "plain",
         "reads": {"smiling": ["yes"], **colours}, "others": others, "want": [{"smiling": ["yes"], **colours}],
         "expect": "every face smiling, each colour half the time", "targets": {}},
        {"family": "faces", "operator": "AND with OR", "expression": f"({hat} | {glasses}) + {smiling}",
         "form": "auto", "reads": {"hat": ["yes"], "glasses": ["yes"], "smiling": ["yes"]},
         "want": [{"hat": ["yes"], "smiling": ["yes"]}, {"glasses": ["yes"], "smiling": ["yes"]}],
         "expect": "smiling, with a hat or glasses (each about half)",
         "targets": {"accuracy": (0.95, 1.0), "hat=yes": (0.30, 1.0), "glasses=yes": (0.30, 1.0)}},
        {"family": "faces", "operator": "NOT", "expression": f"{glasses} - {hat}", "form": "auto",
         "reads": {"glasses": ["yes"], "hat": ["yes"]}, "want": [{"glasses": ["yes"], "hat": ["no"]}],
         "expect": "glasses, no hat", "targets": {"accuracy": (0.95, 1.0)}},
        {"family": "faces", "operator": "NOT", "expression": f"{glasses} - {hat}", "form": "plain",
         "reads": {"glasses": ["yes"], "hat": ["yes"]}, "want": [{"glasses": ["yes"], "hat": ["no"]}],
         "expect": "refused: the plain negation of a guided model", "targets": {}},
        {"family": "faces", "operator": "NOT", "expression": f"{glasses} - 0.5 * {hat}", "form": "plain",
         "reads": {"glasses": ["yes"], "hat": ["yes"]}, "want": [{"glasses": ["yes"], "hat": ["no"]}],
         "expect": "refused: the plain negation of a guided model", "targets": {}},
    ]
    for w in (0.25, 1, 2):
        out.append({"family": "faces", "operator": "weight", "expression": f"{w} * {smiling} + {glasses}",
                    "form": "auto", "reads": {"smiling": ["yes"], "glasses": ["yes"]},
                    "want": [{"smiling": ["yes"], "glasses": ["yes"]}], "probability": ("smiling", "yes"),
                    "expect": "more smiles as the weight grows", "targets": {}})
    for t in (0.5, 1, 2):
        out.append({"family": "faces", "operator": "temperature", "expression": f"{smiling} / {t}", "form": "auto",
                    "reads": {"smiling": ["yes"]}, "want": [{"smiling": ["yes"]}], "spread": True,
                    "expect": "wider spread as T grows", "targets": {}})
    r, b = shape("color", "red"), shape("color", "blue")
    square = shape("shape", "square")
    out += [
        {"family": "shapes", "operator": "OR", "expression": f"{r} | {b}", "form": "auto",
         "reads": {"color": ["red", "blue"]}, "others": {"color": ["green"]}, "want": [{"color": ["red", "blue"]}],
         "expect": "each colour half the time",
         "targets": {"color=red": (0.40, 0.60), "color=blue": (0.40, 0.60), "others": (0.0, 0.05)}},
        {"family": "shapes", "operator": "OR", "expression": f"{r} | {b}", "form": "energy",
         "reads": {"color": ["red", "blue"]}, "others": {"color": ["green"]}, "want": [{"color": ["red", "blue"]}],
         "expect": "the parts' unnormalised energies compared (not what the pipeline samples)", "targets": {}},
        {"family": "shapes", "operator": "weighted OR", "expression": f"3 : {r} | {b}", "form": "auto",
         "reads": {"color": ["red", "blue"]}, "want": [{"color": ["red", "blue"]}],
         "expect": "red three times as often as blue", "targets": {"color=red": (0.65, 0.85)}},
        {"family": "shapes", "operator": "NOT", "expression": b, "form": "auto",
         "reads": {"color": ["blue"], "shape": ["square"]}, "want": [{"color": ["blue"]}],
         "expect": "blue, of every shape (the base of the rows below)", "targets": {}},
    ]
    for form in ("auto", "plain"):
        for w in (1, 2):
            text = f"{b} - {square}" if w == 1 else f"{b} - {w} * {square}"
            out.append({"family": "shapes", "operator": "NOT", "expression": text, "form": form,
                        "reads": {"color": ["blue"], "shape": ["square"]},
                        "want": [{"color": ["blue"], "shape": ["circle", "triangle"]}],
                        "expect": "refused: the plain negation of a guided model" if form == "plain" else
                        "blue, no squares", "targets": {} if form == "plain" else {"shape=square": (0.0, 0.05)}})
    triangle, green = shape("shape", "triangle"), shape("color", "green")
    for w in (0.1, 0.3, 1):
        out.append({"family": "shapes", "operator": "weight", "expression": f"{green} + {w} * {triangle}",
                    "form": "auto", "reads": {"shape": ["triangle"], "color": ["green"]},
                    "want": [{"shape": ["triangle"], "color": ["green"]}], "probability": ("shape", "triangle"),
                    "expect": "more triangles as the weight grows", "targets": {}})
    for t in (0.5, 1, 2):
        out.append({"family": "shapes", "operator": "temperature", "expression": f"{shape('shape', 'circle')} / {t}",
                    "form": "auto", "reads": {"shape": ["circle"]}, "want": [{"shape": ["circle"]}], "spread": True,
                    "expect": "wider spread as T grows", "targets": {}})
    out += faces64_rows()
    for i, row in enumerate(out):
        row["index"] = i
    return out


def table_rows(table: str) -> list[dict]:
    """The rows of one ``--table``."""
    return [row for row in rows() if row["family"] in TABLES[table]]


def draw(row: dict, n: int, models: dict) -> torch.Tensor:
    """The row's ``n`` samples: ``energy.sample`` in the row's form, or for form ``energy`` the pipeline's settings
    and energy with its disjunction as written (``-logsumexp``), through the low-level sampler."""
    def model(name: str):
        if name not in models:
            models[name] = load(name)
        return models[name]

    energy = parse_expression(row["expression"], model)
    if row["form"] != "energy":
        return energy.sample(n, seed=row["index"], form=row["form"])
    settings = plan(energy).config
    return run_sampler(energy, n, settings, seed=row["index"]).samples


def matches(family: str, labels: dict[str, torch.Tensor], want: list[dict[str, list[str]]]) -> torch.Tensor:
    """Which images match one of the alternatives ``want`` in every attribute it names (each attribute at one of the
    values listed), ``(N,)`` bool."""
    combinations = [dict(zip(alternative, values, strict=True))
                    for alternative in want for values in itertools.product(*alternative.values())]
    return combination_mask(labels, VALUES[family], combinations)


def measure(row: dict, n: int, models: dict, classifiers: dict,
            judges: dict | None = None) -> tuple[dict, torch.Tensor | None]:
    """One row's measures and its first samples (``None`` for a refused row); a family with a judge in ``judges``
    gets the row's accuracy as the judge reads it too (``judge_accuracy``)."""
    out = {k: row[k] for k in ("index", "family", "operator", "expression", "form", "expect", "targets")}
    t0 = time.perf_counter()
    try:
        samples = draw(row, n, models).cpu()
    except InvalidInputError as err:  # a form the pipeline refuses: its one line is the row's result
        out["refused"] = str(err)
        return out, None
    out["seconds"] = time.perf_counter() - t0
    classifier = classifiers[row["family"]]
    read = classifier.predict(samples)
    measured = {"accuracy": float(matches(row["family"], read, row["want"]).float().mean())}
    for a, values in row["reads"].items():
        for v in values:
            measured[f"{a}={v}"] = float((read[a] == VALUES[row["family"]][a].index(v)).float().mean())
    if "others" in row:
        measured["others"] = float(sum(matches(row["family"], read, [{a: vs}]).float().mean()
                                       for a, vs in row["others"].items()))
    if "probability" in row:
        a, v = row["probability"]
        with torch.no_grad():
            p = torch.cat([classifier(chunk)[a].softmax(dim=1) for chunk in samples.split(256)])
        measured[f"p({a}={v})"] = float(p[:, VALUES[row["family"]][a].index(v)].mean())
    if row.get("spread"):
        measured["spread"] = float(samples.std(dim=0).mean())
    out["measured"] = measured
    if judges and row["family"] in judges:
        out["judge_accuracy"] = float(matches(row["family"], judges[row["family"]].predict(samples),
                                              row["want"]).float().mean())
    out["n"] = n
    out["met"] = all(lo - 1e-9 <= measured[k] <= hi + 1e-9 for k, (lo, hi) in row["targets"].items())
    return out, samples[:SHEET_SAMPLES]


def renders(family: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Fresh renders of the family with their labels (none of them a model's training data)."""
    if family == "shapes":
        data = shapes(4000, 16, seed=11, split="all")
    else:
        data = faces(4000, seed=1, size=16) if family == "faces" else faces(4000, seed=1, size=64, style="lorelei")
    images = data.images.float() / 255 if data.images.dtype == torch.uint8 else data.images
    return images, data.labels


def sheet(results: list[dict], samples: dict[str, torch.Tensor], family: str, path: Path) -> None:
    """Each sampled row of ``family`` (its first samples) beside renders of what it asks for."""
    images, labels = renders(family)
    want = {job["index"]: job["want"] for job in rows()}
    pairs = [(samples[str(r["index"])], images[matches(family, labels, want[r["index"]])][:SHEET_SAMPLES])
             for r in results if r["family"] == family and str(r["index"]) in samples]
    save_image_grid(contact_sheet(pairs, per_row=SHEET_SAMPLES, scale=1)[None], path,
                    scale=4 if images.shape[-1] <= 16 else 1)


def measured_text(r: dict) -> str:
    if "refused" in r:
        return "refused: " + r["refused"].split(";")[0]
    m = r["measured"]
    parts = [f"{k} {v:.3f}" for k, v in m.items() if k != "accuracy"]
    judged = f" (second judge {r['judge_accuracy']:.3f})" if "judge_accuracy" in r else ""
    return f"accuracy {m['accuracy']:.3f}{judged}" + ("; " + ", ".join(parts) if parts else "")


def target_text(r: dict) -> str:
    if not r["targets"]:
        return "-"
    ranges = ", ".join(f"{k} {lo:g}-{hi:g}" if hi < 1 else f"{k} >= {lo:g}" for k, (lo, hi) in r["targets"].items())
    met = "met" if r.get("met") else "missed"
    return f"{ranges}: **{met}**" if "refused" not in r else f"{ranges}: refused"


def grouped(results: list[dict]) -> list[list[dict]]:
    """The rows as the headline table shows them: a run of rows of one family, operator and form that are all
    refused, or that vary a weight or a temperature, is one group; any other row is its own."""
    groups: list[list[dict]] = []
    for r in results:
        last = groups[-1][-1] if groups else None
        same = last is not None and all(last[k] == r[k] for k in ("family", "operator", "form"))
        if same and (("refused" in last and "refused" in r) or r["operator"] in ("weight", "temperature")):
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


def group_row(group: list[dict]) -> str:
    """One line of the headline table for a group of rows (`grouped`)."""
    first = group[0]
    text = "; ".join(f"`{r['expression']}`" for r in group).replace("|", "\\|")
    if len(group) == 1:
        measured = measured_text(first).replace("|", "\\|")
    elif "refused" in first:
        measured = "refused (a plain negation of a model with a null condition)"
    else:  # a weight or a temperature varied: each measure's values side by side
        measured = "; ".join(f"{k} " + " / ".join(f"{r['measured'][k]:.3f}" for r in group) for k in first["measured"])
    return (f"| {first['family']} | {first['operator']} | {text} | {first['form']} | {first['expect']} | {measured} |"
            f" {target_text(first) if len(group) == 1 else '-'} |")


def report(results: list[dict], samples: dict[str, torch.Tensor], n: int, minutes: float, write_doc: bool,
           out: Path, table: str = "both") -> None:
    print(json.dumps(results, indent=1), flush=True)
    images = ROOT / "docs" / "images" if write_doc else out
    for family in TABLES[table]:
        sheet(results, samples, family, images / f"algebra-{family}.png")
    if not write_doc:
        return
    head = faces64_head(n, minutes) if table == "faces64" else [
        "## The algebra, both families",
        "",
        f"`python -m benchmarks.algebra --n {n}` (as shards and `--merge`) on {machine()}, {minutes:.0f} CPU-minutes."
        f" {n} samples per row, drawn as a user draws them (`energy.sample(n, seed=..., form=...)`, the models' own"
        " settings); faces rows are the bundled noise-conditioned `faces-*` models read by `faces-classifier` (and"
        " their accuracy by the second judge `faces-judge`, where measured), Shapes"
        " rows the bundled contrastive-divergence `shapes-*` models read by `shapes-classifier`. Accuracy: a sample"
        " matches what the row asks for in every attribute (for an OR, one of its sides); `attr=value`: that value's"
        " share; `others`: the other colours' share; `p(...)`: the classifier's mean probability; `spread`: per-pixel"
        " standard deviation across the samples. Form `auto` is the default (a sum of models with a null condition is"
        " sampled guided, a disjunction as a mixture of its branches); `energy` runs the written energy, the"
        " disjunction's `-logsumexp` of unnormalised energies, through the low-level sampler.",
        "",
        "| family | operator | expression | form | expected | measured | target |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    sheets = []
    for family in TABLES[table]:
        sheets += [f"![algebra, {family}](images/algebra-{family}.png)", "",
                   f"{family.capitalize()}: each sampled row's first {SHEET_SAMPLES} samples (left) beside renders of"
                   " what it asks for (right), in the table's order.", ""]
    full = head + [group_row([r]) for r in results] + [""] + sheets
    short = head + [group_row(g) for g in grouped(results)] + [""] + sheets
    write_section(SECTION[table], "\n".join(full), short="\n".join(short))


def faces64_head(n: int, minutes: float) -> list[str]:
    """The heading of the 64-px faces' algebra table."""
    return [
        "## The algebra of the 64-px faces over latents",
        "",
        f"`python -m benchmarks.algebra --table faces64 --n {n}` on {machine()}, {minutes:.0f} CPU-minutes. {n} samples"
        " per row, drawn as a user draws them (the models' own settings, decoded to 64-px images) from the bundled"
        " latent `faces64-*` models, read by `faces64-classifier` (and each row's accuracy by the second judge"
        " `faces64-judge`, where measured); the measures as in \"The algebra, both families\".",
        "",
        "| family | operator | expression | form | expected | measured | target |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]


def implicit_classifier(model_path: str, attribute: str, levels: tuple[float, ...] = (0.1, 0.5, 2.0),
                        n: int = 512) -> dict[float, float]:
    """How often ``argmin_c E(x_sigma, sigma | c)`` reads the ``attribute`` of fresh face renders noised to each level:
    whether the model's conditions' energies sit at comparable levels (`DenoisingConfig.classifier_weight`)."""
    model = load(model_path).eval()
    images, labels = renders("faces")
    x, y = images[:n], labels[attribute][:n]
    values = model.attributes[attribute]
    generator = torch.Generator().manual_seed(0)
    out = {}
    for level in levels:
        noised = x + level * torch.randn(x.shape, generator=generator)
        sigma = torch.full((n,), level)
        with torch.no_grad():
            e = torch.stack([model(noised, {attribute: torch.full((n,), c)}, sigma=sigma) for c in range(len(values))], 1)
        out[level] = float((e.argmin(1) == y).float().mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="samples per row")
    parser.add_argument("--table", choices=sorted(TABLES), default="both",
                        help="both: the 16-px faces and the Shapes models; faces64: the 64-px latent faces models")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "algebra")
    parser.add_argument("--only", nargs="+", default=None, metavar="INDEX", type=int, help="measure these rows only")
    parser.add_argument("--shard", default=None, metavar="I/K", help="measure every K-th row from the I-th only")
    parser.add_argument("--merge", type=int, default=None, metavar="K", help="merge K shards' rows, then report")
    parser.add_argument("--no-doc", action="store_true", help="do not write docs/benchmarks.md or docs/images")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                        help="measure the model at PATH wherever a row names NAME (e.g. a fine-tuned faces-hair)")
    parser.add_argument("--implicit-classifier", nargs=2, metavar=("MODEL", "ATTRIBUTE"), default=None,
                        help="only read how often MODEL's lowest-energy condition is the ATTRIBUTE of noised renders")
    args = parser.parse_args()
    if args.implicit_classifier:
        print(json.dumps(implicit_classifier(*args.implicit_classifier)))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    stem_name = SECTION[args.table]
    from safetensors.torch import load_file, save_file

    if args.merge:
        parts = [json.loads((args.out / f"{stem_name}-shard{i}of{args.merge}.json").read_text())
                 for i in range(args.merge)]
        results = sorted((r for p in parts for r in p["rows"]), key=lambda r: r["index"])
        wanted = [r["index"] for r in table_rows(args.table)]
        if [r["index"] for r in results] != wanted or len({p["n"] for p in parts}) != 1:
            raise SystemExit("the shards do not cover the table at one --n: rerun every shard with the same settings")
        samples = {k: v for i in range(args.merge)
                   for k, v in load_file(str(args.out / f"{stem_name}-shard{i}of{args.merge}.safetensors")).items()}
        report(results, samples, parts[0]["n"], sum(p["minutes"] for p in parts), not args.no_doc, args.out,
               args.table)
        return
    shard, shards = (int(v) for v in args.shard.split("/")) if args.shard else (0, 1)
    given = dict(item.split("=", 1) for item in args.model)
    models: dict = {name: load(path) for name, path in given.items()}
    classifiers = {family: load(CLASSIFIER[family]).eval() for family in TABLES[args.table]}
    judges = {family: load(JUDGE[family]).eval() for family in TABLES[args.table] if family in JUDGE}
    results, samples = [], {}
    t0 = time.perf_counter()
    for position, row in enumerate(table_rows(args.table)):
        if position % shards != shard or (args.only and row["index"] not in args.only):
            continue
        result, first = measure(row, args.n, models, classifiers, judges)
        results.append(result)
        if first is not None:
            samples[str(row["index"])] = first.contiguous()
        print(f"{row['family']} | {row['expression']} | {row['form']} | {measured_text(result)}", flush=True)
    minutes = (time.perf_counter() - t0) / 60
    if given:  # another model's rows are no row of the table
        (args.out / "algebra-models.json").write_text(json.dumps({"models": given, "n": args.n, "rows": results}, indent=1))
        return
    if shards > 1 or args.only:
        stem = args.out / f"{stem_name}-shard{shard}of{shards}"
        stem.with_suffix(".json").write_text(json.dumps({"n": args.n, "minutes": minutes, "rows": results}, indent=1))
        save_file(samples, str(stem.with_suffix(".safetensors")))
        return
    report(results, samples, args.n, minutes, not args.no_doc, args.out, args.table)


if __name__ == "__main__":
    main()
