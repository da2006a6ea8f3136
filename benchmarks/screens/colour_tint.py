"""The background's tint in guided composites with a colour term, for each scale of the colour term: the largest
difference between a channel's mean over the samples' border pixels and the data's flat background (renders: about
0.005), with the colour term's whole guidance scale set to each SCALE (the model's own, 1.5, set aside), over every
conjunction of 2 and of 4 attributes that has a colour term, 16 samples each (seed 2).

    PYTHONPATH=. python benchmarks/screens/colour_tint.py [SCALES]     # SCALES: comma-separated, default 1,1.5
"""
import dataclasses
import sys

import torch

from benchmarks._shapes import border_tint
from benchmarks.composition import conjunctions
from composable_ebm import guided, shapes
from composable_ebm.persistence import load_model

torch.set_num_threads(1)
scales = [float(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "1,1.5").split(",")]
models = {a: load_model(f"shapes-{a}").eval() for a in ("shape", "color", "size", "position")}
colour = models["color"]
colour.sampler_config = dataclasses.replace(colour.sampler_config, guidance_scale=1.0)  # SCALE is the whole scale
print(f"renders: tint {border_tint(shapes(256, 16, seed=5, split='all').images):.3f}")
for scale in scales:
    for arity in (2, 4):
        tints = []
        for target in (t for t in conjunctions(arity) if "color" in t):
            terms = [(scale if a == "color" else 1.0) * models[a].condition(**{a: v}) for a, v in target.items()]
            tints.append(border_tint(guided(sum(terms[1:], terms[0])).sample(16, seed=2)))
        print(f"colour x {scale:g}, {arity} attributes ({len(tints)} composites): tint mean {sum(tints) / len(tints):.3f},"
              f" worst {max(tints):.3f}", flush=True)
