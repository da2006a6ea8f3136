"""Screen: staged composition with the bundled models. Stage 1 draws a sample of one energy with its own settings
(60 steps from noise); stage 2 runs the composite's guided form from those samples for STEPS more. Every EVERY-th
composite of the whole table (``benchmarks/composition.py``'s targets, seeds and renders), 64 samples each, read as
the table reads them (joint accuracy, FID ratio in the classifier's features, share drawn large where the composite
leaves size free). The authors' ``blender_combine.py`` adds terms stage by stage; this is its two-stage form.

    PYTHONPATH=. python benchmarks/screens/staged_composition.py FIRST STEPS EVERY [SHARD/SHARDS]

FIRST, what stage 1 samples: ``none`` (no stage 1: the library's guided form from noise, STEPS ignored),
``term`` (the composite's first term alone), ``plain`` (the plain sum of its terms), ``null`` (the first term's
model unconditioned).
"""
import statistics
import sys

import torch

from benchmarks._shapes import shapes_models
from benchmarks.composition import expression, read_composite, table, table_renders
from composable_ebm import guided
from composable_ebm.data.datasets import SHAPES_ATTRIBUTES
from composable_ebm.energy import value_index
from composable_ebm.expression import parse_expression
from composable_ebm.persistence import load_model

FIRSTS = ("none", "term", "plain", "null")


def main() -> None:
    first, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if first not in FIRSTS:
        raise SystemExit(f"unknown stage 1 {first!r}; valid: {', '.join(FIRSTS)}")
    shard, shards = (int(v) for v in (sys.argv[4] if len(sys.argv) > 4 else "0/1").split("/"))
    torch.set_num_threads(1)
    models = shapes_models()
    classifier = load_model("shapes-classifier").eval()
    n = 64
    rows = []
    for j, (i, target) in enumerate(table(every)):
        if j % shards != shard:
            continue
        composite = parse_expression(expression(target, "plain"), lambda name: models[name])
        (a0, v0), *_ = target.items()
        if first == "none":
            x = guided(composite).sample(n, seed=i, form="plain")
        else:
            stage1 = {"term": models[a0].condition(**{a0: v0}), "plain": composite, "null": models[a0]}[first]
            x0 = stage1.sample(n, seed=i, form="plain")
            x = guided(composite).sample(n, x0=x0, seed=i + 10_000, steps=steps, form="plain")
        score, r = read_composite(x, target, i, classifier, table_renders(target, i, n))
        large = ""
        if "size" not in target:
            read = classifier.predict(x)["size"]
            large = f" | large {float((read == value_index(SHAPES_ATTRIBUTES, 'size', 'large')).float().mean()):.2f}"
        rows.append((len(target), score.joint, r.fid_ratio))
        print(f"{i} | {expression(target, 'guided')} | joint {score.joint:.3f} | FID ratio {r.fid_ratio:.1f} |"
              f" HF {r.hf_ratio:.2f}{large}", flush=True)
    joints = [j for _, j, _ in rows]
    print(f"{first} {steps}: mean joint {statistics.mean(joints):.3f}, worst {min(joints):.3f},"
          f" FID ratio median {statistics.median(f for *_, f in rows):.1f}", flush=True)


if __name__ == "__main__":
    main()
