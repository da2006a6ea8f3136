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
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
from pathlib import Path

from benchmarks.bundle import CARDS_DIR, _training_minutes, bundle_classifier_as
from benchmarks.faces import ATTRIBUTES, HELD_OUT, alone_table
from composable_ebm.data import FACES_ATTRIBUTES, faces
from composable_ebm.data.faces import GENERATOR
from composable_ebm.model_cards import model_card, recipe_text
from composable_ebm.models import BUNDLED_DIR, load_model, save_model
from composable_ebm.recipes import load_recipe, parse_setting
from composable_ebm.sampling import SamplingDefaults
from composable_ebm.accel.precision import PRECISIONS
from composable_ebm.training import read_log

ROOT = Path(__file__).resolve().parents[1]
CLASSIFIER = "faces-classifier"


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

    def describe(self) -> str:
        return (f"{self.steps} iterations on {self.device}" + (f" in {self.precision}" if self.precision else "")
                + (" with " + " ".join(f"`--set {s}`" for s in self.settings) if self.settings else "")
                + f", about {_training_minutes(self.run):.0f} minutes")

    def command(self, name: str, out: str, init: str | None, config_change: bool = False) -> str:
        """The stage's ``cebm train`` line (``config_change``: its model settings differ from ``init``'s)."""
        return (f"cebm train recipes/{name}.toml --out {out}" + (f" --init {init}" if init else "")
                + (" --allow-config-change" if config_change else "") + f" --steps {self.steps}" + (f" --precision {self.precision}" if self.precision else "")
                + "".join(f" --set {s}" for s in self.settings))


def _table(label: str) -> list[dict]:
    rows = []
    for path in sorted((ROOT / "runs" / "faces-table").glob(f"faces-{label}-shard*.json")):
        rows += json.loads(path.read_text())["rows"]
    if not rows:
        print(f"no rows of `python -m benchmarks.faces --label {label}` in runs/faces-table: cards without them")
    return sorted(rows, key=lambda r: r["index"])


def _stages(items: list[str], flag: str) -> dict[str, list[Stage]]:
    """``ATTRIBUTE=RUN@DEVICE[@PRECISION[@SETTINGS]]`` -> {attribute: [Stage, ...] in the order given}."""
    out: dict[str, list[Stage]] = {}
    for item in items:
        attribute, _, rest = item.partition("=")
        run, _, where = rest.partition("@")
        device, _, where = where.partition("@")
        precision, _, settings = where.partition("@")
        sets = tuple(s.strip() for s in settings.split(";") if s.strip())
        if attribute not in ATTRIBUTES or not run or not device or precision not in ("", *PRECISIONS):
            raise SystemExit(f"{flag} {item!r}: write ATTRIBUTE=RUN@DEVICE[@PRECISION[@SETTINGS]] with ATTRIBUTE one"
                             f" of {list(ATTRIBUTES)}, PRECISION one of {list(PRECISIONS)} (or empty) and SETTINGS"
                             " as cebm train --set takes them, separated by ';'")
        for setting in sets:
            parse_setting(setting)  # one line, now, for a malformed one
        out.setdefault(attribute, []).append(Stage(Path(run), device, precision or None, sets))
    return out


def _quality(attribute: str, rows: list[dict], classifier_name: str) -> list[str]:
    """The card's measured section: the model alone per value, and the composites that name its attribute."""
    alone = [r for r in rows if r["kind"] == "alone" and attribute in r["want"]]
    if not alone:
        return ["## Measured quality", "", "Not measured yet (`python -m benchmarks.faces --models bundled`)."]
    n = alone[0]["n"]
    lines = ["## Measured quality", "",
             f"`python -m benchmarks.faces` ({n} samples per row with the model's own sampler settings, read by"
             f" `{classifier_name}`). FID ratio: FID in the classifier's features against fresh renders of the value,"
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
        held = {r["form"]: r["joint"] for r in named if r["target"] == HELD_OUT}
        if held:
            lines.append("- the held-out triple `smiling + glasses + hat`: "
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


def _trained_from_runs(name: str, chain: list[Stage]) -> tuple[int, str, list[str]]:
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
    reproduce = [stage.command(name, out, f"{outs[k - 1]}/model" if k else None)
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


def _extended(card: str, name: str, stage: Stage, before: tuple[str, ...]) -> tuple[int, str, list[str]]:
    """A bundled model's training facts (its old card) with one more stage: ``stage``, fine-tuned from it with the
    recipe as it stands; the earlier stages' commands get ``before`` (the model settings they trained with)."""
    steps, trained, reproduce = _trained_from_card(card)
    earlier = len(reproduce) + 1
    final = f"--out runs/{name} "
    if sum(final in line for line in reproduce) != 1:
        raise SystemExit(f"--extend {name}: its card's Reproduce block has no single `{final.strip()}` to build on")
    reproduce = [line.replace(final, f"--out runs/{name}-stage{earlier - 1} ") + "".join(f" --set {s}" for s in before)
                 for line in reproduce]
    reproduce.append(stage.command(name, f"runs/{name}", f"runs/{name}-stage{earlier - 1}/model", config_change=True))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    runs, stages = _stages(args.run, "--run"), _stages(args.stage, "--stage")
    extend = _stages(args.extend, "--extend")
    before = tuple(s.strip() for s in args.before.split(";") if s.strip())
    for setting in before:
        parse_setting(setting)
    if (args.cards_only or extend) and (runs or stages):
        raise SystemExit("--cards-only and --extend keep the bundled classifier and the earlier stages: give no --run"
                         " or --stage with them")
    if extend and (any(len(r) != 1 for r in extend.values()) or not before):
        raise SystemExit("--extend: one run per attribute, and --before naming the model settings the earlier stages"
                         " trained with")
    if not (args.cards_only or extend) and (set(runs) != set(ATTRIBUTES) or any(len(r) != 1 for r in runs.values())):
        raise SystemExit(f"give one --run for each of {list(ATTRIBUTES)}")
    rows = _table(args.table)
    if not (args.cards_only or extend):
        bundle_classifier(args.classifier)
    for attribute in ATTRIBUTES:
        name = f"faces-{attribute}"
        if extend and attribute not in extend:
            continue
        if extend:
            stage = extend[attribute][0]
            model = load_model(stage.run / "model")
            card = (CARDS_DIR / f"{name}.md").read_text()
            steps, trained, reproduce = _extended(card, name, stage, before)
        elif args.cards_only:
            model = load_model(BUNDLED_DIR / name)
            steps, trained, reproduce = _trained_from_card((CARDS_DIR / f"{name}.md").read_text())
        else:
            model = load_model(runs[attribute][0].run / "model")
            steps, trained, reproduce = _trained_from_runs(name, [*stages.get(attribute, []), runs[attribute][0]])
        recipe = ROOT / "recipes" / f"{name}.toml"
        spec = load_recipe(recipe)
        model.sampling_defaults = spec.sampling  # the recipe's [sampling] as it stands (its guidance scale)
        values = ", ".join(FACES_ATTRIBUTES[attribute])
        notes = "\n".join([
            "## Data and limitations", "",
            f"Trained on the faces dataset (`cebm data faces`: {GENERATOR}), 16x16, 20,000 renders with every smiling"
            f" face that wears glasses and a hat held out; conditioned on `{attribute}` ({values}). A noise-conditioned"
            " energy (docs/diffusion.md): sampled down a ladder of noise levels. Label dropout trained its"
            " unconditional energy, so sums with the other faces models sample in the guided form by default. "
            + _guidance(spec.sampling), "",
            trained + " Small, briefly trained models: check the accuracies below before relying on a combination.",
            "", "## Reproduce", "", "```bash", *reproduce, "```", "",
            *_quality(attribute, rows, CLASSIFIER),
        ])
        evals = [{"task": "unconditional-image-generation", "dataset": "faces", "metric": "accuracy",
                  "value": round(r["joint"], 3), "name": f"{r['want'][attribute][0]} read right by {CLASSIFIER}"}
                 for r in rows if r["kind"] == "alone" and attribute in r["want"]]
        card = model_card(model, recipe=recipe_text(recipe), recipe_name=recipe.name, steps=steps, notes=notes,
                          metrics=["accuracy"], location=name, license="mit", datasets=None, eval_results=evals)
        (CARDS_DIR / f"{name}.md").write_text(card)
        save_model(model, BUNDLED_DIR / name, card=card)
        print(f"bundled {name}")


if __name__ == "__main__":
    main()
