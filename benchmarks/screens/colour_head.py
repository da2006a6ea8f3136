"""Quick screen of a colour model in guided composites: does the colour term leave the other terms alone?

For every colour with ``size=small`` and ``size=large`` (6 composites, plus shape and position pairs that hold no
colour term, as the baseline), 32 samples each in the default (guided) form with the bundled shape, size and
position models, read by the bundled classifier: joint accuracy, and the background's tint, the largest
difference between a channel's mean over the border pixels of the samples and the data's flat dark-grey background.

    PYTHONPATH=. python benchmarks/screens/colour_head.py COLOR_MODEL [N] [COLOR_WEIGHT]

COLOR_MODEL is a model folder, a bundled name, or ``RUN_FOLDER:RECIPE`` (``benchmarks/_shapes.load_spec``).
"""
import sys

import torch

from benchmarks._shapes import border_tint, load_spec
from composable_ebm import compositional_accuracy, guided
from composable_ebm.persistence import load_model

torch.set_num_threads(1)
color = load_spec(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 32
weight = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0  # on the colour term of a composite
models = {"color": color, **{a: load_model(f"shapes-{a}").eval() for a in ("shape", "size", "position")}}
classifier = load_model("shapes-classifier").eval()


TARGETS = [{"shape": "circle", "size": "small"}, {"position": "left", "size": "small"}]
TARGETS += [{"color": c, "size": s} for s in ("small", "large") for c in ("red", "green", "blue")]
TARGETS += [{"shape": "square", "color": "blue", "size": "small"}, {"color": "green"}]
joint_colour, tints = [], []
for target in TARGETS:
    terms = [(weight if a == "color" and len(target) > 1 else 1.0) * models[a].condition(**{a: v})
             for a, v in target.items()]
    energy = terms[0] if len(terms) == 1 else guided(sum(terms[1:], terms[0]))
    x = energy.sample(n, seed=1)
    score = compositional_accuracy(x, classifier, target)
    tint = border_tint(x)
    if "color" in target:
        joint_colour.append(score.joint)
        tints.append(tint)
    print(f"{energy.expression():70s} joint {score.joint:.2f}", {k: round(v, 2) for k, v in score.per_attribute.items()},
          f"tint {tint:.3f}", flush=True)
print(f"with a colour term: mean joint {sum(joint_colour) / len(joint_colour):.3f}, worst {min(joint_colour):.3f};"
      f" tint mean {sum(tints) / len(tints):.3f}, worst {max(tints):.3f}")
