"""Screen: is the composites' FID ratio their speckle? After the library's guided sample, K noise-free gradient
steps of the guided energy at step size STEP (clamped to [0, 1]), on every EVERY-th composite of the whole table
(``benchmarks/composition.py``'s targets and seeds, its renders with 256 real samples), 64 samples each, against the
rows of a composition run (``runs/composition/composition.json``: the same composites, K = 0).

    PYTHONPATH=. python benchmarks/screens/final_descent.py K STEP EVERY
"""
import json
import statistics
import sys
from pathlib import Path

import torch

import composable_ebm as cebm
from benchmarks.composition import read_composite, table
from composable_ebm import guided
from composable_ebm.persistence import load_model


def main() -> None:
    k, step, every = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    classifier = load_model("shapes-classifier").eval()
    models = {a: cebm.load(f"shapes-{a}") for a in ("shape", "color", "size", "position")}
    base = {r["index"]: r for r in json.loads(Path("runs/composition/composition.json").read_text())["rows"]["guided"]}
    rows = []
    for i, target in table(every):
        terms = [models[a].condition(**{a: v}) for a, v in target.items()]
        composite = sum(terms[1:], terms[0])
        x = composite.sample(64, seed=i)  # the library's default: the guided form
        energy = guided(composite)
        for _ in range(k):
            x = (x - step * energy.energy_and_grad(x)[1]).clamp(0, 1)
        score, r = read_composite(x, target, i, classifier)
        joint = score.joint
        rows.append((joint, r.fid_ratio, r.hf_ratio, base[i]["joint"], base[i]["fid_ratio"], base[i]["hf_ratio"]))
        print(f"{i} {target}: joint {joint:.3f} (library {base[i]['joint']:.3f}), FID ratio {r.fid_ratio:.1f} (library"
              f" {base[i]['fid_ratio']:.1f}), HF ratio {r.hf_ratio:.2f} (library {base[i]['hf_ratio']:.2f})", flush=True)
    median = lambda j: statistics.median(r[j] for r in rows)  # noqa: E731
    print(f"{k} steps of {step:g}, {len(rows)} composites: mean joint {statistics.mean(r[0] for r in rows):.3f} (library"
          f" {statistics.mean(r[3] for r in rows):.3f}), FID ratio median {median(1):.1f} (library {median(4):.1f}),"
          f" HF ratio median {median(2):.2f} (library {median(5):.2f})")


if __name__ == "__main__":
    main()
