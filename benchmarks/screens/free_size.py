"""Which size do guided composites draw when they leave size free? Every 2-attribute composite without a size
(shape + colour, shape + position, colour + position: 21), 32 samples each (seed 0), read by the bundled
classifier; the data draws each size half the time. An optional factor multiplies the colour term's weight
(the colour model's guidance scale is 1.5; 0.6667 gives an effective 1), an optional form picks the
guided (default) or the plain sum, and an optional EARLY runs the first EARLY of the 60 steps on the conditioned
terms' mean (the plain sum at the step size divided by the number of terms) and the guided form after them
(guidance in a limited interval).

    PYTHONPATH=. python benchmarks/screens/free_size.py [COLOUR_FACTOR [guided|plain [EARLY]]]
"""
import itertools
import statistics
import sys

import torch

import composable_ebm as cebm
from composable_ebm import Guided
from composable_ebm.energy import Energy
from composable_ebm.persistence import load_model

VALUES = {"shape": ("circle", "square", "triangle"), "color": ("red", "green", "blue"), "position": ("left", "right")}


def read_free_size(classifier, models: dict, factor: float = 1.0, form: str = "guided") -> list[tuple[str, float, float]]:
    """For each of the 21 composites: its name, the share of its 32 samples read large, and its joint accuracy."""
    rows = []
    for a, b in (("shape", "color"), ("shape", "position"), ("color", "position")):
        for va, vb in itertools.product(VALUES[a], VALUES[b]):
            terms = [(factor if name == "color" else 1.0) * models[name].condition(**{name: value})
                     for name, value in ((a, va), (b, vb))]
            read = classifier.predict((terms[0] + terms[1]).sample(32, seed=0, form=form))
            large = float((read["size"] == 1).float().mean())
            asked = float(((read[a] == VALUES[a].index(va)) & (read[b] == VALUES[b].index(vb))).float().mean())
            rows.append((f"{va} + {vb}", large, asked))
    return rows


def plain_first(early: int) -> None:
    """Make every guided energy evaluate as the conditioned terms' mean for its first ``early`` calls after each
    ``sample`` starts (the sampler calls the energy once at the start and once per step)."""
    library_energy, sample = Guided.energy, Energy.sample
    calls = [0]

    def energy(self, x, labels):
        calls[0] += 1
        if calls[0] > early:
            return library_energy(self, x, labels)
        return torch.stack([cond for cond, _ in self.term_energies(x)]).mean(0)

    def counted_sample(self, *args, **kwargs):
        calls[0] = 0
        return sample(self, *args, **kwargs)

    Guided.energy, Energy.sample = energy, counted_sample


def main() -> None:
    torch.set_num_threads(2)
    factor = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    form = sys.argv[2] if len(sys.argv) > 2 else "guided"
    if len(sys.argv) > 3:
        plain_first(int(sys.argv[3]))
    classifier = load_model("shapes-classifier").eval()
    models = {a: cebm.load(f"shapes-{a}") for a in VALUES}
    rows = read_free_size(classifier, models, factor, form)
    for name, large, asked in rows:
        print(f"{name}: large {large:.2f}, read right {asked:.2f}")
    large = [r[1] for r in rows]
    print(f"share drawn large: mean {statistics.mean(large):.2f}, lowest {min(large):.2f}, highest {max(large):.2f};"
          f" mean distance from 0.5 {statistics.mean(abs(v - 0.5) for v in large):.2f}; read right: mean"
          f" {statistics.mean(r[2] for r in rows):.3f}, lowest {min(r[2] for r in rows):.3f}")

if __name__ == "__main__":
    main()
