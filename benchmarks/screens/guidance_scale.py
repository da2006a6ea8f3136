"""Quick screen of one model's guidance scale: joint accuracy of every guided conjunction of ARITY attributes that
holds a term of ATTRIBUTE (only those asking for VALUE, when given), with that term's weight multiplied by each
scale, read by the bundled classifier.

    PYTHONPATH=. python benchmarks/screens/guidance_scale.py MODELS_FOLDER 1,2,3 [N] [ARITY] [ATTRIBUTE] [VALUE]

MODELS_FOLDER holds shapes-shape, shapes-color, shapes-size and shapes-position model folders (or links to them).
ATTRIBUTE defaults to size (the screen in docs/benchmarks.md, "Screening the colour head and the guidance scale").
"""
import sys

import torch

from benchmarks.composition import conjunctions
from composable_ebm import compositional_accuracy, guided
from composable_ebm.persistence import load_model

torch.set_num_threads(1)
folder = sys.argv[1]
scales = [float(w) for w in sys.argv[2].split(",")]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 16
arity = int(sys.argv[4]) if len(sys.argv) > 4 else 2
attribute = sys.argv[5] if len(sys.argv) > 5 else "size"
value = sys.argv[6] if len(sys.argv) > 6 else None
models = {a: load_model(f"{folder}/shapes-{a}").eval() for a in ("shape", "color", "size", "position")}
classifier = load_model("shapes-classifier").eval()
targets = [t for t in conjunctions(arity) if attribute in t and value in (None, t[attribute])]
for scale in scales:
    rows = []
    for target in targets:
        terms = [(scale if a == attribute else 1.0) * models[a].condition(**{a: v}) for a, v in target.items()]
        x = guided(sum(terms[1:], terms[0])).sample(n, seed=1)
        rows.append((target, compositional_accuracy(x, classifier, target).joint))
    by_value = {}
    for t, j in rows:
        by_value.setdefault(t[attribute], []).append(j)
    print(f"{attribute} x {scale:g}: {len(rows)} composites, mean joint {sum(j for _, j in rows) / len(rows):.3f},"
          f" worst {min(j for _, j in rows):.3f}; "
          + ", ".join(f"{v} {sum(js) / len(js):.3f}" for v, js in by_value.items()), flush=True)
