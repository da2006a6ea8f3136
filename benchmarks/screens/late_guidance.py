"""Screen: the guided form for the first steps of a chain, another energy for its last LATE steps (or, with
``first``, for its first LATE steps and the guided form after them: guidance in a limited interval). Every EVERY-th
composite of the whole table (``benchmarks/composition.py``'s targets and seeds, its renders with 256 real
samples), 64 samples each, against the rows of a composition run (``runs/composition/composition.json``: the same
composites in the library's form).

    PYTHONPATH=. python benchmarks/screens/late_guidance.py VARIANT LATE EVERY [THREADS [last|first]]

VARIANT for the last LATE of the 60 steps: ``unit`` (the guided form with every model's guidance scale 1),
``plain`` (the conditioned terms' mean: the plain sum at the step size divided by the number of terms), ``null``
(the mean of the terms' unconditional energies) or ``base`` (the library's form throughout).
"""
import json
import statistics
import sys
from pathlib import Path

import torch

import composable_ebm as cebm
from benchmarks.composition import read_composite, table
from composable_ebm import Guided
from composable_ebm.persistence import load_model

CHAIN = 60  # the bundled models' steps; the guided energy is evaluated once per step and once at the start


def main() -> None:
    variant, late, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if variant not in ("unit", "plain", "null", "base"):
        raise SystemExit(f"unknown variant {variant!r}; valid: base, null, plain, unit")
    torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 2)
    where = sys.argv[5] if len(sys.argv) > 5 else "last"
    if where not in ("last", "first"):
        raise SystemExit(f"unknown place {where!r}; valid: first, last")
    calls = [0]
    library_energy = Guided.energy

    def energy(self, x, labels):
        t = calls[0]
        calls[0] += 1
        guided_here = t >= late if where == "first" else t < CHAIN - late
        if guided_here or variant == "base":
            return library_energy(self, x, labels)
        nulls, conds, diffs = [], [], []
        for w, (cond, null) in zip(self.weights, self.term_energies(x)):
            nulls.append(null)
            conds.append(cond)
            diffs.append(w * (cond - null))
        if variant == "unit":
            return torch.stack(nulls).mean(0) + torch.stack(diffs).sum(0)
        if variant == "plain":
            return torch.stack(conds).mean(0)
        return torch.stack(nulls).mean(0)

    Guided.energy = energy
    classifier = load_model("shapes-classifier").eval()
    models = {a: cebm.load(f"shapes-{a}") for a in ("shape", "color", "size", "position")}
    base = {r["index"]: r for r in json.loads(Path("runs/composition/composition.json").read_text())["rows"]["guided"]}
    rows = []
    for i, target in table(every):
        terms = [models[a].condition(**{a: v}) for a, v in target.items()]
        calls[0] = 0
        x = sum(terms[1:], terms[0]).sample(64, seed=i)
        score, r = read_composite(x, target, i, classifier)
        joint = score.joint
        rows.append((joint, r.fid_ratio, base[i]["joint"], base[i]["fid_ratio"]))
        print(f"{i} {target}: joint {joint:.3f} (library {base[i]['joint']:.3f}), FID ratio {r.fid_ratio:.1f} (library"
              f" {base[i]['fid_ratio']:.1f}), HF ratio {r.hf_ratio:.2f}", flush=True)
    print(f"{variant}, {where} {late} steps, {len(rows)} composites: mean joint {statistics.mean(r[0] for r in rows):.3f}"
          f" (library {statistics.mean(r[2] for r in rows):.3f}), FID ratio median {statistics.median(r[1] for r in rows):.1f}"
          f" (library {statistics.median(r[3] for r in rows):.1f})")


if __name__ == "__main__":
    main()
