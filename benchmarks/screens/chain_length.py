"""Quick screens of guided composites on 14 conjunctions drawn at random (5 of 2 attributes, 5 of 3, 4 of 4), 16
samples each, bundled models, default (guided) form; read by the bundled classifier.

    python benchmarks/screens/chain_length.py '[1, 1.5, "k"]' SEED            # the part's steps times each multiplier
    python benchmarks/screens/chain_length.py '[1, 2, 3]' SEED weight         # one weight on every term

(``"k"``: the part's steps times the number of terms.)
"""
import json
import random
import sys

import torch

import composable_ebm as cebm
from benchmarks.composition import conjunctions
from composable_ebm import compositional_accuracy

torch.set_num_threads(1)
classifier = cebm.load("shapes-classifier").eval()
models = {a: cebm.load(f"shapes-{a}") for a in ("shape", "color", "size", "position")}
rng = random.Random(int(sys.argv[2]))
targets = rng.sample(conjunctions(2), 5) + rng.sample(conjunctions(3), 5) + rng.sample(conjunctions(4), 4)
by_weight = len(sys.argv) > 3 and sys.argv[3] == "weight"
for value in json.loads(sys.argv[1]):
    joint: dict[int, list[float]] = {2: [], 3: [], 4: []}
    for target in targets:
        k = len(target)
        weight = float(value) if by_weight else 1.0
        energy = sum(weight * models[a].condition(**{a: v}) for a, v in target.items())
        steps = 60 if by_weight else int(60 * (k if value == "k" else float(value)))
        samples = energy.sample(16, seed=1, steps=steps)
        joint[k].append(compositional_accuracy(samples, classifier, target).joint)
    means = {k: round(sum(v) / len(v), 3) for k, v in joint.items()}
    print(value, means, "all", round(sum(sum(v) for v in joint.values()) / len(targets), 3), flush=True)
