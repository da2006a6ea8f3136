"""Screen (not kept in the library): the guided form with its unconditional part weighted, ``beta E_0 + sum_i
s_i w_i (E_i(x | c_i) - E_i(x | 0))``, on the 21 two-attribute composites without a size (as ``free_size.py``, 32
samples each, seed 0). Prints the mean share drawn large, how far each composite's share is from the data's
half on average, and the joint accuracy of what was asked.

    PYTHONPATH=. python benchmarks/screens/null_weight.py BETA
"""
import statistics
import sys

import torch

import composable_ebm as cebm
from benchmarks.screens.free_size import VALUES, read_free_size
from composable_ebm import Guided
from composable_ebm.persistence import load_model


def main() -> None:
    torch.set_num_threads(2)
    beta = float(sys.argv[1])

    def weighted(self, x, labels):  # Guided.energy with E_0 multiplied by beta (1: the library's form)
        null, guidance = self.parts(x)
        return beta * null + guidance

    Guided.energy = weighted
    rows = read_free_size(load_model("shapes-classifier").eval(), {a: cebm.load(f"shapes-{a}") for a in VALUES})
    large, right = [r[1] for r in rows], [r[2] for r in rows]
    print(f"beta {beta}: share drawn large mean {statistics.mean(large):.2f} (lowest {min(large):.2f}, highest"
          f" {max(large):.2f}), mean |share - 0.5| {statistics.mean(abs(v - 0.5) for v in large):.2f}; joint accuracy"
          f" mean {statistics.mean(right):.3f}, worst {min(right):.3f}")


if __name__ == "__main__":
    main()
