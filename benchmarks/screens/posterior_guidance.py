"""Screen: guide each term by its model's own posterior over the attribute's values instead of its ratio to the
null condition. The guided form's term ``E_i(x | c_i) - E_i(x | 0)`` is replaced by
``-log p_i(c_i | x) = E_i(x | c_i) + log sum_v exp(-E_i(x | v))`` (the classifier that Bayes' rule makes of a
conditional EBM, uniform over the values), which stops pulling once ``x`` is read as ``c_i``; ``E_0`` stays the
mean of the terms' unconditional energies.

Runs composites of the whole table (``benchmarks/composition.py``'s targets, seeds and renders) with the
library's guided form (``ratio``) or this one (``posterior``) and prints joint accuracy, FID ratio and HF ratio.

    PYTHONPATH=. python benchmarks/screens/posterior_guidance.py FORM N EVERY [ARITIES] [SCALE]

FORM: ``ratio`` (the library's form), ``posterior``, or ``mixture`` (the posterior terms with ``E_0`` the mean of each
model's ``-log sum_v exp(-E_i(x | v))`` instead of its trained null); N samples per composite; every EVERY-th
composite; ARITIES like ``2,3`` (default ``2,3,4``); SCALE multiplies every posterior term's weight (default 1).
THREADS in the environment sets torch's threads (default 2).
"""
import json
import os
import statistics
import sys

import torch

from benchmarks.composition import ATTRIBUTES, expression, read_composite, table
from composable_ebm import Guided
from composable_ebm.energy import NULL
from composable_ebm.expression import parse_expression
from composable_ebm.persistence import BUNDLED_DIR, load_model


def posterior_parts(self, x, scale: float = 1.0, mixture: bool = False):
    """``(E_0, sum_i s_i w_i (-log p_i(c_i | x)))`` with every value's energy and the null in one call per term."""
    b = x.shape[0]
    nulls, guidance = [], []
    for w, term in zip((s * w for s, w in zip(self.scales, self.weights)), self.terms):
        (attr, value), = term.bound.items()
        k = len(term.base.attributes[attr])
        codes = {attr: torch.arange(-1, k, device=x.device).repeat_interleave(b)}
        codes[attr][:b] = NULL
        e = term.base(x.repeat(k + 1, *([1] * (x.ndim - 1))), codes).view(k + 1, b)
        nulls.append(-torch.logsumexp(-e[1:], dim=0) if mixture else e[0])
        log_post = -e[1 + int(value)] - torch.logsumexp(-e[1:], dim=0)
        guidance.append(scale * w * -log_post)
    return torch.stack(nulls).mean(dim=0), torch.stack(guidance).sum(dim=0)


def main() -> None:
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    form, n, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if form not in ("ratio", "posterior", "mixture"):
        raise SystemExit(f"unknown form {form!r}; valid: mixture, posterior, ratio")
    arities = [int(a) for a in (sys.argv[4] if len(sys.argv) > 4 else "2,3,4").split(",")]
    scale = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
    if form in ("posterior", "mixture"):
        Guided.parts = lambda self, x: posterior_parts(self, x, scale, form == "mixture")
    models = {a: load_model(BUNDLED_DIR / f"shapes-{a}") for a in ATTRIBUTES}
    classifier = load_model(BUNDLED_DIR / "shapes-classifier").eval()
    rows = []
    for i, target in table(every):
        if len(target) not in arities:
            continue
        text = expression(target, "guided")
        samples = parse_expression(text, lambda name: models[name]).sample(n, seed=i, form="plain")
        score, r = read_composite(samples, target, i, classifier)
        read = classifier.predict(samples)
        free = {a: round(float((read[a] == 1).float().mean()), 2) for a in ("size", "position") if a not in target}
        rows.append({"index": i, "arity": len(target), "joint": score.joint, "fid_ratio": r.fid_ratio,
                     "hf_ratio": r.hf_ratio, "free_second_value": free})
        print(f"{i} {text}: joint {score.joint:.3f} FID ratio {r.fid_ratio:.1f} HF {r.hf_ratio:.2f}"
              f" free (share large / right) {free}", flush=True)
    for arity in arities:
        sel = [r for r in rows if r["arity"] == arity]
        if sel:
            print(f"arity {arity} ({len(sel)}): joint mean {statistics.mean(r['joint'] for r in sel):.3f} worst"
                  f" {min(r['joint'] for r in sel):.3f}; FID ratio median {statistics.median(r['fid_ratio'] for r in sel):.1f}")
    print(f"all ({len(rows)}): FID ratio median {statistics.median(r['fid_ratio'] for r in rows):.1f}, HF median"
          f" {statistics.median(r['hf_ratio'] for r in rows):.2f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
