"""Noise-conditioned energies against contrastive divergence on Shapes: the two families side by side.

Both families' four attribute models were trained on the same data (red circles of every size and position held out)
and are read by the same classifier and realism measure as the rest of docs/benchmarks.md:

- each model alone, per value: FID ratio, high-frequency ratio, accuracy, the other attributes' largest gap to the
  data's mix (``benchmarks/realism.py``'s `measure_model`), with a contact sheet per family;
- the whole composition table, guided and plain, from each family's ``benchmarks/composition.py`` JSON;
- training minutes (each run's logged step times) and the cost of one sampling call (64 samples of one model and
  of a guided pair, on this machine, in this run).

    cebm train recipes/diffusion/shapes-<attribute>.toml --out runs/diffusion/shapes-<attribute> --max-minutes 25
    # copy each run's model/ to runs/diffusion/models/shapes-<attribute>, and the bundled shapes-classifier beside them
    python -m benchmarks.composition --models runs/diffusion/models --recipes recipes/diffusion --quick \\
        --out runs/composition-diffusion  # (sharded as that script says)
    python -m benchmarks.composition --quick --out runs/composition-cd
    python -m benchmarks.families --diffusion runs/diffusion/models --diffusion-runs runs/diffusion \\
        --cd-table runs/composition-cd/composition-quick.json \\
        --diffusion-table runs/composition-diffusion/composition-quick.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks._report import machine, write_section
from benchmarks.realism import measure_model
from composable_ebm.evaluation.realism import contact_sheet
from composable_ebm.images import save_image, to_pil
from composable_ebm.models import BUNDLED_DIR, load_model
from composable_ebm.training import read_log

ROOT = Path(__file__).resolve().parents[1]
ATTRIBUTES = ("shape", "color", "size", "position")


def training_minutes(run: Path) -> float:
    """Minutes of training in a run's log: the logged step times, each standing for its interval."""
    total, last = 0.0, 0
    for record in read_log(run / "log.jsonl"):
        if "seconds" in record and "step" in record:
            total += record["seconds"] * (record["step"] - last)
            last = record["step"]
    return total / 60


def sampling_seconds(models: dict, repeats: int = 2) -> dict[str, float]:
    """Seconds for 64 samples of one model and of a guided pair (the best of ``repeats``)."""
    one = models["shape"].condition(shape="circle")
    pair = one + models["color"].condition(color="red")
    out = {}
    for label, energy in (("one model", one), ("guided pair", pair)):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            energy.sample(64, seed=0)
            times.append(time.perf_counter() - start)
        out[label] = min(times)
    return out


def table_summary(path: Path) -> dict:
    """The summaries of a `benchmarks/composition.py` JSON, per form."""
    data = json.loads(path.read_text())
    return {"n": data["n"], "summaries": data["summaries"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cd", type=Path, default=BUNDLED_DIR, help="folder of the CD family's shapes-<attribute>")
    parser.add_argument("--diffusion", type=Path, required=True, help="folder of the noise-conditioned family's models")
    parser.add_argument("--diffusion-runs", type=Path, default=None, help="their run folders (training minutes)")
    parser.add_argument("--cd-table", type=Path, required=True, help="benchmarks/composition.py JSON of the CD models")
    parser.add_argument("--diffusion-table", type=Path, required=True, help="... and of the noise-conditioned ones")
    parser.add_argument("--n", type=int, default=64, help="samples per value for each model alone")
    parser.add_argument("--split", choices=("train", "all"), default="all",
                        help="renders each value is compared with (as benchmarks/realism.py; the bundled models' realism"
                             " section uses all)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "families")
    parser.add_argument("--no-doc", action="store_true")
    parser.add_argument("--report", action="store_true", help="write the section from OUT/families.json, measuring nothing")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    families = {"contrastive divergence": args.cd, "noise-conditioned": args.diffusion}
    if args.report:
        saved = json.loads((args.out / "families.json").read_text())
        report(args, families, saved["alone"], saved["cost"], saved["tables"], saved["minutes"],
               saved.get("machine", machine()))
        return
    classifier = load_model("shapes-classifier").eval()
    alone: dict[str, list[dict]] = {}
    cost: dict[str, dict[str, float]] = {}
    for family, folder in families.items():
        models = {a: load_model(folder / f"shapes-{a}").eval() for a in ATTRIBUTES}
        rows = []
        for a in ATTRIBUTES:
            rows += measure_model(models[a], classifier, args.n, seed=0, sampler_overrides={}, split=args.split)
        sheet = to_pil(contact_sheet([(r["samples"][:8], r["real"][:8]) for r in rows], per_row=8, scale=3))
        slug = "cd" if family.startswith("contrastive") else "diffusion"
        save_image(sheet, args.out / f"families-{slug}.png")
        if not args.no_doc:
            save_image(sheet, ROOT / "docs" / "images" / f"families-{slug}.png")
        alone[family] = [{k: v for k, v in r.items() if k not in ("samples", "real")} for r in rows]
        cost[family] = sampling_seconds(models)
        print(family, json.dumps(cost[family]), flush=True)
    tables = {"contrastive divergence": table_summary(args.cd_table),
              "noise-conditioned": table_summary(args.diffusion_table)}
    minutes = ({a: training_minutes(args.diffusion_runs / f"shapes-{a}") for a in ATTRIBUTES}
               if args.diffusion_runs else {})
    (args.out / "families.json").write_text(json.dumps({"alone": alone, "cost": cost, "tables": tables,
                                                        "minutes": minutes, "machine": machine()}, indent=1))
    if not args.no_doc:
        report(args, families, alone, cost, tables, minutes, machine())


def report(args, families: dict, alone: dict, cost: dict, tables: dict, minutes: dict, where: str) -> None:
    """The docs section: each model alone, the composition tables, the cost of sampling, the sheets."""

    def alone_line(family: str) -> str:
        rows = alone[family]
        fid = [r["fid_ratio"] for r in rows]
        hf = [r["hf_ratio"] for r in rows]
        acc = [r["accuracy"] for r in rows]
        gap = [max(r["coverage_gap"].values()) for r in rows]
        return (f"| {family} | {statistics.median(fid):.1f} / {max(fid):.1f} | {statistics.median(hf):.2f} /"
                f" {max(hf):.2f} | {statistics.mean(acc):.3f} / {min(acc):.3f} | {max(gap):.2f} |")

    def table_lines(family: str) -> list[str]:
        t = tables[family]
        out = []
        for form, s in t["summaries"].items():
            cells = " | ".join(f"{s[f'{a}_all']['mean']:.3f} / {s[f'{a}_all']['worst']:.3f}" for a in (2, 3, 4))
            out.append(f"| {family} | {form} | {t['n']} | {cells} | {s['held_out_mean']:.3f} |"
                       f" {s['fid_ratio_median']:.1f} / {s['fid_ratio_worst']:.1f} |")
        return out

    per_value = [f"| {family} | {r['model']} | {r['value']} | {r['fid_ratio']:.1f} | {r['hf_ratio']:.2f} |"
                 f" {r['accuracy']:.3f} | {max(r['coverage_gap'].values()):.2f} |"
                 for family in families for r in alone[family]]
    trained = (", ".join(f"{a} {m:.0f}" for a, m in minutes.items()) + " minutes") if minutes else "not given"
    guided = {f: tables[f]["summaries"]["guided"] for f in families}
    accurate = max(guided, key=lambda f: guided[f]["3_all"]["mean"])
    real = min(guided, key=lambda f: guided[f]["fid_ratio_median"])
    values = len(next(iter(alone.values())))
    lines = [
        "## Noise-conditioned energies against contrastive divergence on Shapes",
        "",
        f"`python -m benchmarks.families --diffusion {args.diffusion} --split {args.split} ...` (the commands are in the script's docstring)"
        f" on {where}. The same four attributes, the same training split (red circles held out of every model),"
        " the same classifier and realism measure as the sections above. Contrastive divergence: the bundled models"
        " (`recipes/shapes-*.toml`, 60 to 140 CPU-minutes each by their recipes' notes). Noise-conditioned:"
        f" `recipes/diffusion/shapes-*.toml`, each on one thread with two or three runs sharing the machine's two"
        f" cores: {trained}.",
        "",
        f"Guided composites: {accurate} leads on joint accuracy (3 attributes:"
        f" {guided[accurate]['3_all']['mean']:.3f} against"
        f" {min(g['3_all']['mean'] for g in guided.values()):.3f}), {real} on the composites' FID ratio (median"
        f" {guided[real]['fid_ratio_median']:.1f} against {max(g['fid_ratio_median'] for g in guided.values()):.1f}).",
        "",
        f"**Each model alone** ({args.n} samples per value against renders of every combination (`--split"
        f" {args.split}`); median / worst over the {values} values; accuracy mean / worst; the largest gap of another"
        " attribute's mix to the data's):",
        "",
        "| family | FID ratio | HF ratio | accuracy | coverage gap |",
        "| --- | --- | --- | --- | --- |",
        *(alone_line(f) for f in families),
        "",
        "**The whole composition table** (every conjunction of 2, 3 and 4 attributes; mean / worst joint accuracy;"
        " composites' FID ratio median / worst):",
        "",
        "| family | form | samples per composite | 2 attributes | 3 attributes | 4 attributes | held out mean |"
        " FID ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        *(line for f in families for line in table_lines(f)),
        "",
        "**Cost of one sampling call** (64 samples, seconds, this machine):",
        "",
        "| family | one model | guided pair |",
        "| --- | --- | --- |",
        *(f"| {f} | {cost[f]['one model']:.1f} | {cost[f]['guided pair']:.1f} |" for f in families),
        "",
        "Contact sheets (samples left, renders right; rows: every value of shape, colour, size, position):",
        "",
        "![contrastive divergence](images/families-cd.png) ![noise-conditioned](images/families-diffusion.png)",
        "",
        "<details><summary>Every value</summary>",
        "",
        "| family | model | value | FID ratio | HF ratio | accuracy | coverage gap |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *per_value,
        "",
        "</details>",
    ]
    write_section("families", "\n".join(lines))


if __name__ == "__main__":
    main()
