"""Bundle the 64-px faces autoencoder (``composable_ebm/bundled/faces64-autoencoder``) with a card that carries what
it was measured to keep.

    python -m benchmarks.bundle_faces64 autoencoder --run runs/ae/c4 --command "cebm train-autoencoder ..." \
        --device "2-core x86-64 CPU, one thread"

Measures the run's ``model/`` on 500 fresh lorelei renders (`benchmarks.autoencoder.measure`: PSNR and how often
faces64-classifier reads each attribute of a reconstruction as it reads the render, the ceiling of every latent
model's accuracy), in float32 and with its weights rounded to float16. The bundled weights are float16 when the
rounding changes no attribute's agreement and the PSNR by less than 0.05 dB, float32 otherwise; the card says which.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from pathlib import Path

import torch

from benchmarks.autoencoder import measure_model
from benchmarks.bundle import CARDS_DIR
from composable_ebm.model_cards import model_card
from composable_ebm.models import BUNDLED_DIR, load_model, save_model

NAME = "faces64-autoencoder"


def rounded(model: torch.nn.Module) -> torch.nn.Module:
    """A copy whose weights went through float16 and back (what loading float16 weights gives)."""
    again = copy.deepcopy(model)
    with torch.no_grad():
        for p in again.parameters():
            p.copy_(p.half().float())
    return again


def bundle_autoencoder(run: Path, command: str, device: str, n: int = 500) -> None:
    model = load_model(run / "model")
    full, half = measure_model(model, n), measure_model(rounded(model), n)
    use_half = half["agreement"] == full["agreement"] and abs(half["psnr"] - full["psnr"]) < 0.05
    model.config = dataclasses.replace(model.config, name=NAME)
    trained = next(line for line in (run / "model" / "README.md").read_text().splitlines()
                   if line.startswith("Trained for"))  # the run's own account: steps, images, minutes, PSNR
    agreement = ", ".join(f"{a} {v:.3f}" for a, v in full["agreement"].items())
    notes = "\n".join([
        trained.strip(),
        "",
        f"Trained on {device} with `{command}`.",
        "",
        f"**What it keeps** (`python -m benchmarks.autoencoder`, {n} fresh lorelei renders from seed 1, which it never"
        f" saw): PSNR {full['psnr']:.2f} dB; faces64-classifier reads each attribute of a reconstruction as it reads"
        f" the render: {agreement}. That agreement is the ceiling of a latent model's accuracy on the attribute.",
        "",
        "Weights stored in " + ("float16: rounding them changes no agreement above and the PSNR by"
                                f" {half['psnr'] - full['psnr']:+.3f} dB" if use_half else
                                f"float32: float16 weights read {half['agreement']} at {half['psnr']:.2f} dB")
        + "; it loads, encodes and decodes in float32.",
    ])
    card = model_card(model, location=NAME, notes=notes)
    stored = model.half() if use_half else model
    save_model(stored, BUNDLED_DIR / NAME, card=card)
    CARDS_DIR.mkdir(exist_ok=True)
    (CARDS_DIR / f"{NAME}.md").write_text(card)
    print(f"bundled {NAME} ({'float16' if use_half else 'float32'}): PSNR {full['psnr']:.2f} dB; {agreement}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    ae = sub.add_parser("autoencoder", help="bundle a cebm train-autoencoder run as faces64-autoencoder")
    ae.add_argument("--run", type=Path, required=True)
    ae.add_argument("--command", required=True, help="the command that trained it, for the card")
    ae.add_argument("--device", default="a 2-core x86-64 CPU, one thread")
    ae.add_argument("--n", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bundle_autoencoder(args.run, args.command, args.device, args.n)


if __name__ == "__main__":
    main()
