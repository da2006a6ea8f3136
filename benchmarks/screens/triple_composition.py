"""Quick screen of the chain length for three-term guided composites (shape + colour + size): joint accuracy of
four conjunctions, one of them held out, for each number of steps given; read by the bundled classifier.

    python benchmarks/screens/triple_composition.py SHAPE COLOR SIZE '[120, 180]' [N]

A model is a model folder, a bundled name, or ``RUN_FOLDER:RECIPE`` (the EMA weights of a run's latest checkpoint).
"""
import json
import sys

import torch

from composable_ebm import compositional_accuracy
from composable_ebm.persistence import load_model
from benchmarks._shapes import load_spec

torch.set_num_threads(1)
shape, color, size = (load_spec(s) for s in sys.argv[1:4])
classifier = load_model("shapes-classifier").eval()
n = int(sys.argv[5]) if len(sys.argv) > 5 else 24
TARGETS = [("circle", "red", "large"), ("triangle", "green", "small"), ("square", "blue", "small"),
           ("circle", "blue", "small")]
for steps in json.loads(sys.argv[4]):
    joint = []
    for s, c, z in TARGETS:
        energy = shape.condition(shape=s) + color.condition(color=c) + size.condition(size=z)
        score = compositional_accuracy(energy.sample(n, seed=3, steps=steps), classifier,
                                       {"shape": s, "color": c, "size": z})
        joint.append(score.joint)
        print(steps, s, c, z, f"joint {score.joint:.3f}", {k: round(v, 2) for k, v in score.per_attribute.items()},
              flush=True)
    print(steps, "MEAN", round(sum(joint) / len(joint), 3), flush=True)
