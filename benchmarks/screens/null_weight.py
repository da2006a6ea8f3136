"""Screen (not kept in the library): the guided form with its unconditional part weighted, ``beta E_0 + sum_i
s_i w_i (E_i(x | c_i) - E_i(x | 0))``, on the 21 two-attribute composites without a size (as ``free_size.py``, 32
samples each, seed 0). Prints the mean share drawn large, how far each composite's share is from the data's
half on average, and the joint accuracy of what was asked.

    PYTHONPATH=. python benchmarks/screens/null_weight.py BETA
"""
import itertools
import statistics
import sys

import torch

import composable_ebm as cebm
from composable_ebm import energy as energy_module
from composable_ebm.persistence import load_model

VALUES = {"shape": ("circle", "square", "triangle"), "color": ("red", "green", "blue"), "position": ("left", "right")}


def weighted_null_energy(beta: float):
    """`Guided.energy` with the mean unconditional energy multiplied by ``beta`` (1: the library's form)."""
    def energy(self, x, labels):
        b = x.shape[0]
        nulls, guidance = [], []
        for w, term in zip((s * w for s, w in zip(self.scales, self.weights)), self.terms):
            codes = {a: torch.as_tensor(v, device=x.device).long().expand(b) for a, v in term.bound.items()}
            cond, uncond = term.base.conditioned_and_null(x, codes)
            nulls.append(uncond)
            guidance.append(w * (cond - uncond))
        return beta * torch.stack(nulls).mean(dim=0) + torch.stack(guidance).sum(dim=0)
    return energy


def main() -> None:
    torch.set_num_threads(2)
    beta = float(sys.argv[1])
    energy_module.Guided.energy = weighted_null_energy(beta)
    classifier = load_model("shapes-classifier").eval()
    models = {a: cebm.load(f"shapes-{a}") for a in VALUES}
    large, right = [], []
    for a, b in (("shape", "color"), ("shape", "position"), ("color", "position")):
        for va, vb in itertools.product(VALUES[a], VALUES[b]):
            composite = cebm.guided(models[a].condition(**{a: va}) + models[b].condition(**{b: vb}))
            read = classifier.predict(composite.sample(32, seed=0))
            large.append(float((read["size"] == 1).float().mean()))
            right.append(float(((read[a] == VALUES[a].index(va)) & (read[b] == VALUES[b].index(vb))).float().mean()))
    print(f"beta {beta}: share drawn large mean {statistics.mean(large):.2f} (lowest {min(large):.2f}, highest"
          f" {max(large):.2f}), mean |share - 0.5| {statistics.mean(abs(v - 0.5) for v in large):.2f}; joint accuracy"
          f" mean {statistics.mean(right):.3f}, worst {min(right):.3f}")


if __name__ == "__main__":
    main()
