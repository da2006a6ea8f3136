"""How much of an image an autoencoder keeps: PSNR and, per attribute, how often the faces64 classifier reads a
reconstruction as it reads the render itself (the ceiling of any latent model's accuracy), on fresh renders.

    python -m benchmarks.autoencoder runs/ae/c4 runs/ae/c8 --n 500

A run in progress is measured from its latest checkpoint; a model folder (``runs/ae/c4/model``, a bundled name) as
saved. The renders are lorelei faces at 64 px from seed 1, which no training folder of the recipes draws.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from composable_ebm.data.faces import faces
from composable_ebm.models import load_model
from composable_ebm.training.autoencoder import checkpoint_autoencoder, psnr


def measure_model(model, n: int = 500, seed: int = 1) -> dict:
    """PSNR of ``model``'s reconstructions of ``n`` fresh renders and, per attribute, how often faces64-classifier
    reads a reconstruction as it reads the render."""
    x = faces(n, seed=seed, size=64, style="lorelei").images.float() / 255
    classifier = load_model("faces64-classifier")
    with torch.no_grad():
        again = torch.cat([model.reconstruct(x[i:i + 100]) for i in range(0, n, 100)])
        read, read_again = classifier.predict(x), classifier.predict(again)
    return {"psnr": round(psnr(again, x), 2),
            "agreement": {a: round(float((read_again[a] == read[a]).float().mean()), 3) for a in read}}


def measure(source: str, n: int = 500, seed: int = 1) -> dict:
    """`measure_model` of one run (its latest checkpoint) or model folder, with its step."""
    path = Path(source)
    model, step = (checkpoint_autoencoder(path) if (path / "checkpoint.pt").is_file() and not (path / "config.json").is_file()
                   else (load_model(source), None))
    row = measure_model(model, n, seed)
    return {"source": source, "step": step, "psnr": row["psnr"], **row["agreement"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="run folders (their latest checkpoint) or model folders")
    parser.add_argument("--n", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for source in args.sources:
        print(measure(source, args.n), flush=True)


if __name__ == "__main__":
    main()
