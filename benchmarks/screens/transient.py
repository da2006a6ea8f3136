"""Are the models' samples a chain's end point or a moment of it? The bundled shape and colour models (or EMA snapshots
in their place) alone at 50, 60 (their default), 80 and 100 steps, 64 samples per value (seed 1), read by the bundled
classifier: the value read right, the share drawn large and the share of circles. Then the mean object area (pixels
more than 0.3 from the data's background, summed over the channels) every 10 steps along chains of 64 (seed 0):
each model alone, the colour model's unconditional energy, and composites in the guided and the plain form.

    PYTHONPATH=. python benchmarks/screens/transient.py [models=FOLDER] [shape=RUN:STEP] [color=RUN:STEP]

RUN:STEP: ``RUN/snapshots/ema-<STEP>.safetensors`` (``benchmarks/realism_curve.py --watch`` keeps them), in the
bundled model's network and sampling settings. FOLDER: a folder of model folders (``FOLDER/shapes-<attribute>``, as
``snapshot_model.py`` writes them), each read with its own settings in place of the bundled one; the chains along
which the area is measured then run as many steps as the first term's settings say.
"""
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from benchmarks._shapes import shapes_models, snapshot_path
from composable_ebm.persistence import load_model

VALUES = {"shape": ("circle", "square", "triangle"), "color": ("red", "green", "blue"), "size": ("small", "large"),
          "position": ("left", "right")}
BACKGROUND = 0.08  # the Shapes renders' flat background, every channel


def area(x: torch.Tensor) -> torch.Tensor:
    return ((x - BACKGROUND).abs().sum(1) > 0.3).float().sum((1, 2))


def main() -> None:
    torch.set_num_threads(1)
    classifier = load_model("shapes-classifier").eval()
    folder = next((Path(item.split("=", 1)[1]) for item in sys.argv[1:] if item.startswith("models=")), None)
    models = shapes_models(folder)
    for item in sys.argv[1:]:
        attr, where = item.split("=", 1)
        if attr == "models":
            continue
        run, step = where.rsplit(":", 1)
        models[attr].load_state_dict(load_file(snapshot_path(run, step)))
    for attr in ("shape", "color"):
        for steps in (50, 60, 80, 100):
            cells = []
            for i, value in enumerate(VALUES[attr]):
                read = classifier.predict(models[attr].condition(**{attr: value}).sample(64, seed=1, steps=steps))
                cells.append(f"{value}: right {(read[attr] == i).float().mean():.2f}, large"
                             f" {(read['size'] == 1).float().mean():.2f}, circles {(read['shape'] == 0).float().mean():.2f}")
            print(f"{attr} alone, {steps} steps: " + "; ".join(cells), flush=True)
    red, circle = models["color"].condition(color="red"), models["shape"].condition(shape="circle")
    right = models["position"].condition(position="right")
    for name, energy, form in [("circle", circle, "auto"), ("red", red, "auto"), ("color, unconditional", models["color"], "auto"),
                               ("guided(red + circle)", red + circle, "guided"), ("red + circle", red + circle, "plain"),
                               ("guided(circle + right)", circle + right, "guided")]:
        trace = []

        def every_tenth(d: dict, trace: list = trace) -> None:
            if d["step"] % 10 == 0:
                trace.append(f"{d['step']}: {area(d['x']).mean():.0f}")

        x = energy.sample_chain(64, seed=0, callback=every_tenth, form=form).samples
        large = (classifier.predict(x)["size"] == 1).float().mean()
        print(f"{name}: object area {', '.join(trace)}; drawn large {large:.2f}", flush=True)


if __name__ == "__main__":
    main()
