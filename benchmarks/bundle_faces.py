"""Copy trained faces runs and the faces classifier into the package (``composable_ebm/bundled``) with model cards
that carry their measured quality.

    python -m benchmarks.bundle_faces --run smiling=runs/faces-smiling@"2-core CPU, one thread" ... \
        [--stage smiling=runs/gpu/faces-smiling@"one H200 GPU"] --classifier runs/faces-classifier --table bundled

``--run ATTRIBUTE=RUN@DEVICE[@PRECISION[@SETTINGS]]`` names each of smiling, glasses, hat and hair's run (``cebm
train --out RUN``: its ``model/`` and its log), where it trained, and what it changed over the recipe: ``--precision``,
and ``--set`` settings separated by ``;`` (``trainer.batch_size=512;trainer.lr=3e-4``). A model made in stages
(trained, then fine-tuned with ``cebm train --init``, perhaps more than once) names its earlier runs with ``--stage``,
first one first: the card gives every stage and the commands that make them. Each model's ``[sampling]`` settings
are its recipe's as they stand (``recipes/faces-<attribute>.toml``, its guidance scale). The cards give the rows of
``python -m benchmarks.faces --models bundled --label TABLE`` (its shards in ``runs/faces-table``); before that
table exists they say nothing measured, so bundle, measure, then bundle again. Writes each card into
``model_cards/`` and into the model's folder (tests/test_bundled.py checks that they agree); ``python -m
benchmarks.bundle --sync-cards`` refreshes their recipe and config blocks after an edit.

    python -m benchmarks.bundle_faces --extend smiling=runs/wide-smiling@"2-core CPU, one thread" ... --table bundled

bundles each named model from a run fine-tuned from the bundled one (``cebm train recipes/faces-<attribute>.toml
--init faces-<attribute> --allow-config-change``, the model settings the recipe has now): the card keeps the earlier
stages, read from the old card, with ``--set`` settings that give the model settings they trained with
(``--before``, as ``;``-separated ``--set`` settings), and adds this one.

    python -m benchmarks.bundle_faces --cards-only --table bundled

keeps the bundled weights and classifier and writes the four models' cards again: their training facts read from
the old cards, their settings from the recipes as they stand, their quality from the table.

    python -m benchmarks.bundle_faces --style lorelei \
        --run smiling=runs/latent/faces64-smiling@"2-core CPU, one thread" ... --table bundled

bundles the 64-px lorelei models over latents (``faces64-<attribute>``, ``recipes/latent/faces64-<attribute>.toml``;
their table is ``python -m benchmarks.faces --style lorelei``), keeping the bundled faces64-classifier. A model's
weights are stored in float16 when rounding them changes its denoising loss (`rounding_cost`) by less than
`HALF_TOLERANCE`, in float32 otherwise; the card says which.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
from pathlib import Path

import torch

from benchmarks.bundle import CARDS_DIR, _training_minutes, bundle_classifier_as
from benchmarks.bundle_faces64 import rounded, trained_minutes
from benchmarks.faces import PIXEL_ART, TABLES, FacesTable, alone_table
from composable_ebm.data import faces
from composable_ebm.data.faces import GENERATOR, STYLES
from composable_ebm.model_cards import model_card, recipe_text
from composable_ebm.models import BUNDLED_DIR, load_model, save_model
from composable_ebm.recipes import load_recipe, parse_setting
from composable_ebm.sampling import SamplingDefaults
from composable_ebm.accel.precision import PRECISIONS
from composable_ebm.training import read_log

ROOT = Path(__file__).resolve().parents[1]
CLASSIFIER = "faces-classifier"
HALF_TOLERANCE = 1e-3
"""The largest relative change of the denoising loss that rounding the weights to float16 may make for them to be
stored so."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One training run of a bundled model: its folder, where it ran, and what it changed over the recipe."""

    run: Path
    device: str
    precision: str | None  # None: the recipe's
    settings: tuple[str, ...] = ()  # `cebm train --set` settings

    @property
    def steps(self) -> int:
        return max(r["step"] for r in read_log(self.run) if "step" in r)

    @property
    def changes_model(self) -> bool:
        """Whether the stage set a model setting (``--set model.autoencoder=...``): the next stage, fine-tuned from
        it with the recipe's own, starts from a model of other settings (``--allow-config-change``)."""
        return any(s.startswith("model.") for s in self.settings)

    def describe(self) -> str:
        return (f"{self.steps} iterations on {self.device}" + (f" in {self.precision}" if self.precision else "")
                + (" with " + " ".join(f"`--set {s}`" for s in self.settings) if self.settings else "")
                + f", about {_training_minutes(self.run):.0f} minutes")

    def command(self, name: str, out: str, init: str | None, config_change: bool = False,
                recipes: str = "recipes") -> str:
        """The stage's ``cebm train`` line (``config_change``: its model settings differ from ``init``'s) for the
        recipe ``RECIPES/NAME.toml``."""
        return (f"cebm train {recipes}/{name}.toml --out {out}" + (f" --init {init}" if init else "")
                + (" --allow-config-change" if config_change else "") + f" --steps {self.steps}" + (f" --precision {self.precision}" if self.precision else "")
                + "".join(f" --set {s}" for s in self.settings))


def _table(label: str, t: FacesTable = PIXEL_ART) -> list[dict]:
    rows = []
    for path in sorted((ROOT / "runs" / "faces-table").glob(f"{t.prefix}-{label}-shard*.json")):
        rows += json.loads(path.read_text())["rows"]
    if not rows:
        print(f"no rows of `python -m benchmarks.faces --label {label}` in runs/faces-table: cards without them")
    return sorted(rows, key=lambda r: r["index"])


def _stages(items: list[str], flag: str, t: FacesTable = PIXEL_ART) -> dict[str, list[Stage]]:
    """``ATTRIBUTE=RUN@DEVICE[@PRECISION[@SETTINGS]]`` -> {attribute: [Stage, ...] in the order given}."""
    out: dict[str, list[Stage]] = {}
    for item in items:
        attribute, _, rest = item.partition("=")
        run, _, where = rest.partition("@")
        device, _, where = where.partition("@")
        precision, _, settings = where.partition("@")
        sets = tuple(s.strip() for s in settings.split(";") if s.strip())
        if attribute not in t.attributes or not run or not device or precision not in ("", *PRECISIONS):
            raise SystemExit(f"{flag} {item!r}: write ATTRIBUTE=RUN@DEVICE[@PRECISION[@SETTINGS]] with ATTRIBUTE one"
                             f" of {list(t.attributes)}, PRECISION one of {list(PRECISIONS)} (or empty) and SETTINGS"
                             " as cebm train --set takes them, separated by ';'")
        for setting in sets:
            parse_setting(setting)  # one line, now, for a malformed one
        out.setdefault(attribute, []).append(Stage(Path(run), device, precision or None, sets))
    return out


def _quality(attribute: str, rows: list[dict], t: FacesTable = PIXEL_ART) -> list[str]:
    """The card's measured section: the model alone per value, and the composites that name its attribute."""
    alone = [r for r in rows if r["kind"] == "alone" and attribute in r["want"]]
    style = "" if t is PIXEL_ART else f" --style {t.style}"
    if not alone:
        return ["## Measured quality", "", f"Not measured yet (`python -m benchmarks.faces{style} --models bundled`)."]
    n = alone[0]["n"]
    lines = ["## Measured quality", "",
             f"`python -m benchmarks.faces{style}` ({n} samples per row with the model's own sampler settings, read by"
             f" `{t.classifier}`). FID ratio: FID in the classifier's features against fresh renders of the value,"
             " over the floor of as many fresh renders (1 = as close as real images); HF ratio: high-frequency energy"
             " over the renders'; gap: the largest difference between the samples' mix of another attribute and the"
             " renders' under that value, every render or the training split (the held-out triple left out, as this"
             " model saw them).", "", *alone_table(alone, model_column=False)]
    named = [r for r in rows if r["kind"] == "conjunction" and attribute in r["target"]]
    if named:
        lines += ["", "Every conjunction with the other faces models that names this model's attribute:", ""]
        for form in ("guided", "plain"):
            for arity in (2, 3):
                joint = [r["joint"] for r in named if r["form"] == form and r["arity"] == arity]
                if joint:
                    lines.append(f"- {form}, {arity} attributes: {len(joint)} composites, mean joint accuracy"
                                 f" {statistics.mean(joint):.3f}, worst {min(joint):.3f}")
        held = {r["form"]: r["joint"] for r in named if r["target"] == t.held_out}
        if held:
            lines.append(f"- the held-out triple `{' + '.join(t.held_out)}`: "
                         + ", ".join(f"{form} {joint:.3f}" for form, joint in sorted(held.items())))
    return lines


def bundle_classifier(source: Path) -> None:
    """Copy the faces classifier under its short name with a card giving its accuracy on fresh renders."""
    classifier = load_model(source)
    data = faces(2000, seed=123, size=classifier.config.image_size)  # renders no model or classifier saw
    bundle_classifier_as(
        classifier, CLASSIFIER, data.images.float() / 255, data.labels, "faces",
        f"Reads the four attributes of a 16x16 face of the faces dataset ({GENERATOR}); `benchmarks/faces.py` scores"
        " samples and compositions with it, its penultimate features are the space of their FID ratio, and the studio"
        " reads the faces models' samples with it. It reads only what it was trained on: clean renders. Artefacts in"
        " samples can still be read as an attribute, so look at the samples too.",
        "Accuracy on 2,000 fresh renders (`faces(2000, seed=123)`, every combination; `python -m"
        " benchmarks.bundle_faces`):")


def _trained_from_runs(name: str, chain: list[Stage], recipes: str = "recipes") -> tuple[int, str, list[str]]:
    """A model's iterations, its sentence on how it trained and its commands to reproduce, from its runs."""
    steps = sum(stage.steps for stage in chain)
    if len(chain) > 1:
        words = {2: "two", 3: "three", 4: "four"}
        trained = (f"Trained in {words.get(len(chain), len(chain))} stages: {chain[0].describe()} (`cebm train`)"
                   + "".join(f", then {stage.describe()} from those weights" for stage in chain[1:])
                   + " (`cebm train --init`, a fresh optimiser" + (" each time)." if len(chain) > 2 else ")."))
    else:
        trained = f"Trained for {chain[0].describe()}."
    outs = [f"runs/{name}-stage{k + 1}" for k in range(len(chain) - 1)] + [f"runs/{name}"]
    reproduce = [stage.command(name, out, f"{outs[k - 1]}/model" if k else None, recipes=recipes,
                               config_change=k > 0 and chain[k - 1].changes_model)
                 for k, (stage, out) in enumerate(zip(chain, outs, strict=True))]
    return steps, trained, reproduce


def _trained_from_card(card: str) -> tuple[int, str, list[str]]:
    """The same three, read back from a card this script wrote (`--cards-only`: the runs are gone)."""
    steps = re.search(r"^Trained for (\d+) iterations with ", card, re.M)
    trained = re.search(r"^(Trained (?:in|for) .*?) Small, briefly trained models:", card, re.M)
    reproduce = re.search(r"## Reproduce\n\n```bash\n(.*?)\n```", card, re.S)
    if not (steps and trained and reproduce):
        raise SystemExit("--cards-only: the card has no training facts to keep (its iterations, how it trained, its"
                         " Reproduce block); bundle from the runs with --run instead")
    return int(steps.group(1)), trained.group(1), reproduce.group(1).splitlines()


def _extended(card: str, name: str, stage: Stage, before: tuple[str, ...],
              recipes: str = "recipes") -> tuple[int, str, list[str]]:
    """A bundled model's training facts (its old card) with one more stage: ``stage``, fine-tuned from it with the
    recipe as it stands; the earlier stages' commands get ``before`` (the model settings they trained with)."""
    steps, trained, reproduce = _trained_from_card(card)
    earlier = len(reproduce) + 1
    final = f"--out runs/{name} "
    if sum(final in line for line in reproduce) != 1:
        raise SystemExit(f"--extend {name}: its card's Reproduce block has no single `{final.strip()}` to build on")
    reproduce = [line.replace(final, f"--out runs/{name}-stage{earlier - 1} ") + "".join(f" --set {s}" for s in before)
                 for line in reproduce]
    reproduce.append(stage.command(name, f"runs/{name}", f"runs/{name}-stage{earlier - 1}/model", config_change=True,
                                   recipes=recipes))
    changed = " ".join(f"`--set {s}`" for s in before)
    trained = (f"{trained} Then a further stage: {stage.describe()} from those weights (`cebm train --init"
               " --allow-config-change`, a fresh optimiser), with the recipe's model settings as they stand; the stages"
               f" before it trained with {changed}.")
    return steps + stage.steps, trained, reproduce


def _guidance(sampling: SamplingDefaults) -> str:
    """The card's sentence on the model's guidance settings (`SamplingDefaults`)."""
    scale = sampling.guidance_scale
    interval = sampling.guidance_interval
    where = (f", at noise levels {interval[0]:g} < sigma <= {interval[1]:g} only (`guidance_interval`; 1 at the"
             " others)" if interval is not None else "")
    return (f"Its guidance scale is {scale:g} (`[sampling] guidance_scale`){where}: in a guided composite its term"
            f" pulls {scale:g} times as hard as the weight written in the expression"
            + (", and on its own it is sampled guided too (`guided_alone`: classifier-free guidance at that scale)."
               if sampling.guided_alone else "."))


def rounding_cost(model, t: FacesTable, attribute: str, n: int = 512) -> float:
    """How much rounding ``model``'s weights to float16 changes its denoising loss on ``n`` fresh renders (their
    latents, for a latent model), relative to the loss: the same noise and levels for both."""
    from composable_ebm.training.denoising import DenoisingObjective

    data = t.renders(n, seed=1)
    x = data.images.float() / 255 if data.images.dtype == torch.uint8 else data.images
    if model.latent_space is not None:
        x = model.latent_space.encode(x)
    labels = {attribute: data.labels[attribute]}

    def loss(m) -> float:
        objective, generator = DenoisingObjective(m.eval()), torch.Generator().manual_seed(0)
        return sum(float(objective(chunk, {attribute: y}, generator).loss.detach())
                   for chunk, y in zip(x.split(128), labels[attribute].split(128), strict=True))

    full = loss(model)
    return abs(loss(rounded(model)) - full) / full


def data_text(t: FacesTable, attribute: str) -> str:
    """The card's sentence on what the model was trained on and what it is."""
    values = ", ".join(t.values[attribute])
    held = ", ".join(f"{a}={v}" for a, v in t.held_out.items())
    if t is PIXEL_ART:
        return (f"Trained on the faces dataset (`cebm data faces`: {GENERATOR}), 16x16, 20,000 renders with every"
                f" smiling face that wears glasses and a hat held out; conditioned on `{attribute}` ({values}). A"
                " noise-conditioned energy (docs/diffusion.md): sampled down a ladder of noise levels.")
    return (f"Trained on the latents of `faces64-autoencoder` (docs/latent.md) of the {t.style} faces dataset"
            f" (`cebm data faces --style {t.style} --size {t.size}`: {STYLES[t.style].generator}),"
            f" {t.size}x{t.size}, 20,000 renders"
            f" with every face of {held} held out (of the autoencoder's data too); conditioned on"
            f" `{attribute}` ({values}). A noise-conditioned energy (docs/diffusion.md) over the autoencoder's"
            " standardised latents: sampled down a ladder of noise levels, then decoded to images once. It was made in"
            f" stages: the autoencoder ({trained_minutes():.0f} minutes of one thread in all, once for every"
            f" {t.prefix} model; its card gives each of its stages), the training images encoded once by each"
            f" autoencoder a stage below trained over ({ENCODE_MINUTES} minutes of one thread each, kept in the cache"
            " for the next model), then the training below; a stage that sets `model.autoencoder` trained over the"
            " latents of that earlier autoencoder (`runs/ae/c4/model`: the first stage of `faces64-autoencoder`).")


ENCODE_MINUTES = 4
"""Minutes of one CPU thread that encoding the 17,540 training images of a 64-px model took (once, then cached)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--style", choices=sorted(TABLES), default="pixel-art",
                        help="which faces models: the 16-px pixel-art ones (faces-*) or the 64-px lorelei ones over"
                             " latents (faces64-*)")
    parser.add_argument("--run", action="append", default=[], metavar="ATTRIBUTE=RUN@DEVICE[@PRECISION[@SETTINGS]]",
                        help="each model's run (cebm train --out RUN) and where it trained")
    parser.add_argument("--stage", action="append", default=[], metavar="ATTRIBUTE=RUN@DEVICE[@PRECISION[@SETTINGS]]",
                        help="an earlier stage of a model fine-tuned from it (cebm train --init RUN/model); repeat"
                             " for several, first one first")
    parser.add_argument("--table", default="bundled", help="the --label of the benchmarks.faces run that measured them")
    parser.add_argument("--classifier", type=Path, default=ROOT / "runs" / "faces-classifier")
    parser.add_argument("--cards-only", action="store_true",
                        help="keep the bundled weights and classifier; write their cards again (the training facts"
                             " read from the old cards, the settings from the recipes, the quality from --table)")
    parser.add_argument("--extend", action="append", default=[], metavar="ATTRIBUTE=RUN@DEVICE[@PRECISION[@SETTINGS]]",
                        help="a run fine-tuned from the bundled model (cebm train --init faces-ATTRIBUTE): bundle it,"
                             " its card's earlier stages kept; the others stay as they are")
    parser.add_argument("--before", default="",
                        help="with --extend: the earlier stages' model settings, as ';'-separated --set settings"
                             " (model.sigma_max=1.0)")
    args = parser.parse_args()
    t = TABLES[args.style]
    runs, stages = _stages(args.run, "--run", t), _stages(args.stage, "--stage", t)
    extend = _stages(args.extend, "--extend", t)
    before = tuple(s.strip() for s in args.before.split(";") if s.strip())
    for setting in before:
        parse_setting(setting)
    if (args.cards_only or extend) and (runs or stages):
        raise SystemExit("--cards-only and --extend keep the bundled classifier and the earlier stages: give no --run"
                         " or --stage with them")
    if extend and (any(len(r) != 1 for r in extend.values()) or not before):
        raise SystemExit("--extend: one run per attribute, and --before naming the model settings the earlier stages"
                         " trained with")
    if not (args.cards_only or extend) and (set(runs) != set(t.attributes)
                                            or any(len(r) != 1 for r in runs.values())):
        raise SystemExit(f"give one --run for each of {list(t.attributes)}")
    rows = _table(args.table, t)
    if not (args.cards_only or extend) and t is PIXEL_ART:  # the lorelei classifier is bundled on its own
        bundle_classifier(args.classifier)
    recipes = t.recipe.parent.relative_to(ROOT).as_posix()
    for attribute in t.attributes:
        name = f"{t.prefix}-{attribute}"
        if extend and attribute not in extend:
            continue
        if extend:
            stage = extend[attribute][0]
            model = load_model(stage.run / "model")
            card = (CARDS_DIR / f"{name}.md").read_text()
            steps, trained, reproduce = _extended(card, name, stage, before, recipes)
        elif args.cards_only:
            model = load_model(BUNDLED_DIR / name)
            steps, trained, reproduce = _trained_from_card((CARDS_DIR / f"{name}.md").read_text())
        else:
            model = load_model(runs[attribute][0].run / "model")
            steps, trained, reproduce = _trained_from_runs(name, [*stages.get(attribute, []), runs[attribute][0]],
                                                           recipes)
        recipe = t.recipe.parent / f"{name}.toml"
        spec = load_recipe(recipe)
        model.sampling_defaults = spec.sampling  # the recipe's [sampling] as it stands (its guidance scale)
        stored = ""
        old_card = (CARDS_DIR / f"{name}.md").read_text() if args.cards_only else ""
        kept = re.search(r" Weights stored in .*? it loads and samples in float32\.", old_card)  # measured before
        # the weights were rounded
        if kept:
            stored = kept.group(0)
            model = model.half() if "stored in float16" in stored else model
        elif t is not PIXEL_ART:  # float16 weights where rounding them measures nil
            cost = rounding_cost(model, t, attribute)
            half = cost < HALF_TOLERANCE
            stored = (f" Weights stored in {'float16' if half else 'float32'}: rounding them to float16 changes the"
                      f" denoising loss on 512 fresh renders by {cost:.1e} of itself; it loads and samples in float32.")
            model = model.half() if half else model
        notes = "\n".join([
            "## Data and limitations", "",
            data_text(t, attribute) + " Label dropout trained its unconditional energy, so sums with the other faces"
            " models sample in the guided form by default. " + _guidance(spec.sampling), "",
            trained + " Small, briefly trained models: check the accuracies below before relying on a combination."
            + stored, "", "## Reproduce", "", "```bash", *reproduce, "```", "",
            *_quality(attribute, rows, t),
        ])
        evals = [{"task": "unconditional-image-generation", "dataset": "faces", "metric": "accuracy",
                  "value": round(r["joint"], 3), "name": f"{r['want'][attribute][0]} read right by {t.classifier}"}
                 for r in rows if r["kind"] == "alone" and attribute in r["want"]]
        card = model_card(model, recipe=recipe_text(recipe), recipe_name=recipe.name, steps=steps, notes=notes,
                          metrics=["accuracy"], location=name, license="mit", datasets=None, eval_results=evals)
        (CARDS_DIR / f"{name}.md").write_text(card)
        save_model(model, BUNDLED_DIR / name, card=card)
        print(f"bundled {name}" + stored)


if __name__ == "__main__":
    main()
