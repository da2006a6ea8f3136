"""Quick screen of the size model's guidance scale: joint accuracy of every guided conjunction of ARITY attributes
that holds a size term, with the size term's weight multiplied by each scale, read by the bundled classifier.

    PYTHONPATH=. python benchmarks/screens/size_guidance.py MODELS_FOLDER 1,2,3 [N] [ARITY]

MODELS_FOLDER holds shapes-shape, shapes-color, shapes-size and shapes-position model folders (or links to them).
"""
import sys

import torch

from benchmarks.composition import conjunctions
from composable_ebm import compositional_accuracy, guided
from composable_ebm.hub import load_model

torch.set_num_threads(1)
folder = sys.argv[1]
scales = [float(w) for w in sys.argv[2].split(",")]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 16
arity = int(sys.argv[4]) if len(sys.argv) > 4 else 2
models = {a: load_model(f"{folder}/shapes-{a}").eval() for a in ("shape", "color", "size", "position")}
classifier = load_model("shapes-classifier").eval()
targets = [t for t in conjunctions(arity) if "size" in t]
for scale in scales:
    rows = []
    for target in targets:
        terms = [(scale if a == "size" else 1.0) * models[a].condition(**{a: v}) for a, v in target.items()]
        x = guided(sum(terms[1:], terms[0])).sample(n, seed=1)
        rows.append((target, compositional_accuracy(x, classifier, target).joint))
    small = [j for t, j in rows if t["size"] == "small"]
    large = [j for t, j in rows if t["size"] == "large"]
    print(f"size x {scale:g}: {len(rows)} composites, mean joint {sum(j for _, j in rows) / len(rows):.3f},"
          f" worst {min(j for _, j in rows):.3f}; small {sum(small) / len(small):.3f}, large"
          f" {sum(large) / len(large):.3f}", flush=True)
