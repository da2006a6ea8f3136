"""How much of an image an autoencoder keeps: PSNR and, per attribute, how often the faces64 classifier reads a
reconstruction as it reads the render itself (the ceiling of any latent model's accuracy), on fresh renders.

    python -m benchmarks.autoencoder runs/ae/c4 runs/ae/c8 --n 500
    python -m benchmarks.autoencoder faces64-autoencoder --jacobian 16

``--jacobian N`` measures instead what a plain sum of latent energies adds to the energy of the image densities:
``-(K - 1) log |det J(z)|`` for K models (docs/latent.md), with ``log |det J| = 1/2 log det(J^T J)`` of the decoder at
the latents of N fresh renders (and, beside them, at N standard normal latents), in nats.

A run in progress is measured from its latest checkpoint; a model folder (``runs/ae/c4/model``, a bundled name) as
saved. The renders are lorelei faces at 64 px from seed 1, which no training folder of the recipes draws.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from composable_ebm.data.faces import STYLES, faces
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
    agree = {a: read_again[a] == read[a] for a in read}
    return {"psnr": round(psnr(again, x), 2),
            "agreement": {a: round(float(agree[a].float().mean()), 3) for a in read},
            "worst_cell": worst_cells(agree, read)}


def worst_cells(agree: dict[str, torch.Tensor], read: dict[str, torch.Tensor]) -> dict[str, list]:
    """Per attribute, the value of it and the value of another attribute (as the classifier reads the renders) under
    which its agreement is lowest, with that agreement: where a thin attribute is erased (a smile's line inside a
    beard, say). Cells of fewer than 20 renders are left out."""
    names = STYLES["lorelei"].attributes
    out = {}
    for a, hits in agree.items():
        cells = []
        for u in read[a].unique():
            for b in (b for b in read if b != a):
                for v in read[b].unique():
                    cell = (read[a] == u) & (read[b] == v)
                    if int(cell.sum()) >= 20:
                        cells.append((float(hits[cell].float().mean()), names[a][int(u)], b, names[b][int(v)]))
        low, u, b, v = min(cells)
        out[a] = [u, b, v, round(low, 3)]
    return out


def measure(source: str, n: int = 500, seed: int = 1) -> dict:
    """`measure_model` of one run (its latest checkpoint) or model folder, with its step."""
    path = Path(source)
    model, step = (checkpoint_autoencoder(path) if (path / "checkpoint.pt").is_file() and not (path / "config.json").is_file()
                   else (load_model(source), None))
    row = measure_model(model, n, seed)
    return {"source": source, "step": step, "psnr": row["psnr"], **row["agreement"], "worst_cell": row["worst_cell"]}


def log_volume(model, z: torch.Tensor, chunk: int = 64) -> float:
    """``1/2 log det(J^T J)`` of the decoder at one latent ``z`` (its shape): the log of the volume a small cube of
    latents is spread over in image space."""
    from torch.func import jvp, vmap

    def decode(flat: torch.Tensor) -> torch.Tensor:
        return model.decode(flat.view(1, *z.shape)).flatten()

    flat = z.flatten()
    basis = torch.eye(flat.numel())
    columns = []
    for i in range(0, flat.numel(), chunk):  # J's columns, a chunk of forward-mode products at a time
        along = vmap(lambda v: jvp(decode, (flat,), (v,))[1])
        columns.append(along(basis[i:i + chunk]))
    jac = torch.cat(columns).T  # (pixels, latent elements)
    return 0.5 * float(torch.linalg.slogdet((jac.T @ jac).double())[1])


def jacobian_report(source: str, n: int, seed: int = 1) -> dict:
    """Mean and spread of ``log |det J|`` over the latents of ``n`` fresh renders and of ``n`` normal latents."""
    model = load_model(source).requires_grad_(False)
    x = faces(n, seed=seed, size=64, style="lorelei").images.float() / 255
    with torch.no_grad():
        data = model.encode(x)
    noise = torch.randn(data.shape, generator=torch.Generator().manual_seed(seed))
    out = {}
    for name, latents in (("renders", data), ("normal", noise)):
        values = torch.tensor([log_volume(model, z) for z in latents])
        out[name] = {"mean": round(float(values.mean()), 1), "std": round(float(values.std()), 1),
                     "min": round(float(values.min()), 1), "max": round(float(values.max()), 1)}
    return {"source": source, "n": n, "log_det_J": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="run folders (their latest checkpoint) or model folders")
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--jacobian", type=int, default=None, metavar="N",
                        help="instead: log |det J| of the decoder at N renders' latents and N normal ones")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for source in args.sources:
        row = jacobian_report(source, args.jacobian) if args.jacobian else measure(source, args.n)
        print(row, flush=True)
        if args.jacobian and source == "faces64-autoencoder":  # the bundled one: for the docs' section
            from benchmarks.faces64 import RESULTS

            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / "jacobian.json").write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
