"""Quick screen of the chain length of guided composites: 14 conjunctions drawn at random (5 of 2 attributes,
5 of 3, 4 of 4), 16 samples each, in the default (guided) form of the bundled models, with the part's steps
times each multiplier (``"k"``: times the number of terms); read by the bundled classifier.

    python benchmarks/screens/chain_length.py '[1, 1.5, "k"]' SEED
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
for multiplier in json.loads(sys.argv[1]):
    joint: dict[int, list[float]] = {2: [], 3: [], 4: []}
    for target in targets:
        energy = sum(models[a].condition(**{a: v}) for a, v in target.items())
        k = len(target)
        steps = int(60 * (k if multiplier == "k" else float(multiplier)))
        samples = energy.sample(16, seed=1, steps=steps)
        joint[k].append(compositional_accuracy(samples, classifier, target).joint)
    means = {k: round(sum(v) / len(v), 3) for k, v in joint.items()}
    print(multiplier, means, "all", round(sum(sum(v) for v in joint.values()) / len(targets), 3), flush=True)
