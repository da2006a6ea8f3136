"""Quick screen of one guidance weight on every term of a guided composite: 14 random conjunctions (5 / 5 / 4 of
2 / 3 / 4 attributes), 16 samples each, bundled models; read by the bundled classifier.

    python benchmarks/screens/uniform_weight.py '[1, 2, 3]' SEED
"""
import json, random, sys, torch
sys.path.insert(0, ".")
torch.set_num_threads(1)
import composable_ebm as cebm
from benchmarks.composition import conjunctions
from composable_ebm import compositional_accuracy
classifier = cebm.load("shapes-classifier").eval()
models = {a: cebm.load(f"shapes-{a}") for a in ("shape", "color", "size", "position")}
rng = random.Random(int(sys.argv[2]))
targets = rng.sample(conjunctions(2), 5) + rng.sample(conjunctions(3), 5) + rng.sample(conjunctions(4), 4)
for w in json.loads(sys.argv[1]):
    joint = {2: [], 3: [], 4: []}
    for t in targets:
        e = sum(w * models[a].condition(**{a: v}) for a, v in t.items())
        joint[len(t)].append(compositional_accuracy(e.sample(16, seed=1), classifier, t).joint)
    print(w, {k: round(sum(v)/len(v), 3) for k, v in joint.items()}, "all", round(sum(sum(v) for v in joint.values())/len(targets), 3), flush=True)
