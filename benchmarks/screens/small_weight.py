"""Quick screen of the weight on the size term in guided composites that ask for ``small`` (the value that composes
worst): joint accuracy of four such conjunctions, 32 samples each, in the default (guided) form of the bundled
models, for size weights 1, 2 and 3; read by the bundled classifier.

    python benchmarks/screens/small_weight.py
"""
import torch

import composable_ebm as cebm
from composable_ebm import compositional_accuracy
from composable_ebm.expression import parse_expression

torch.set_num_threads(2)
classifier = cebm.load("shapes-classifier").eval()
TARGETS = [{"shape": "circle", "color": "green", "size": "small"}, {"color": "red", "size": "small", "position": "left"},
           {"color": "red", "size": "small"}, {"shape": "square", "size": "small"}]
for weight in (1, 2, 3):
    joint = []
    for target in TARGETS:
        text = " + ".join((f"{weight} * " if a == "size" and weight != 1 else "") + f"shapes-{a}[{a}={v}]"
                          for a, v in target.items())
        samples = parse_expression(text, cebm.load).sample(32, seed=1)
        joint.append(compositional_accuracy(samples, classifier, target).joint)
    print(weight, [round(j, 2) for j in joint], flush=True)
