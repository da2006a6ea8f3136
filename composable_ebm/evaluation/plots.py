"""Training-health curves from the trainer's JSONL log (the paper's Figures 3 and 4 in spirit).

Top: the energy difference ``E(x+) - E(x-)`` (stable training keeps it near zero). Bottom:
the gradient norms of ``L_CD`` and ``L_KL`` (the paper's comparison of their magnitudes).
Faults and rollbacks are marked with vertical lines. A noise-conditioned model's run (denoising score
matching) has no negatives: its top panel is the denoising loss, its bottom one the gradient norm.
"""

from __future__ import annotations

from pathlib import Path

from composable_ebm.images import save_figure
from composable_ebm.training.log import read_log


def plot_training_health(log: str | Path, out: str | Path, title: str | None = None) -> Path:
    """Draw the health curves of a run's log to a PNG; returns the written path."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    import math
    from numbers import Real

    from composable_ebm.errors import ModelFileError, utf8_text

    records = read_log(log)
    key = "e_diff" if any("e_diff" in r for r in records) else "loss_dsm"
    steps = [r for r in records if key in r]
    if not steps:
        raise ValueError(f"{log} holds no training records yet")
    for i, r in enumerate(steps):  # a record plotted is numbers: a string or a missing step is named, not drawn
        bad = [k for k in ("step", key, "grad_norm", "grad_norm_cd", "grad_norm_kl") if k in r and (
            isinstance(r[k], bool) or not isinstance(r[k], Real) or not math.isfinite(r[k]))]
        if "step" not in r or bad:
            what = f"{bad[0]} is {r[bad[0]]!r}" if bad else "it has no step"
            raise ModelFileError(f"{log}: a training record cannot be plotted ({what}); records hold numbers")
    faults = [r for r in records if r.get("event") == "fault"]
    x = [r["step"] for r in steps]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.set_title(utf8_text(title) if title else "training health")
    if key == "loss_dsm":
        top.semilogy(x, [r["loss_dsm"] for r in steps], color="tab:blue", lw=1.2)
        top.set_ylabel("denoising loss")
        bottom.semilogy(x, [r.get("grad_norm", float("nan")) for r in steps], lw=1.2, label="|grad loss|")
        bottom.legend(loc="best")
    else:
        top.plot(x, [r["e_diff"] for r in steps], color="tab:blue", lw=1.2)
        top.axhline(0.0, color="gray", lw=0.8, ls="--")
        top.set_ylabel("E(x+) - E(x-)")
    if any("grad_norm_cd" in r for r in steps):
        bottom.semilogy(x, [max(r.get("grad_norm_cd", 0.0), 1e-12) for r in steps], label="|grad L_CD|", lw=1.2)
        bottom.semilogy(x, [max(r.get("grad_norm_kl", 0.0), 1e-12) for r in steps], label="|grad L_KL|", lw=1.2)
        bottom.legend(loc="best")
    bottom.set_ylabel("gradient norm")
    bottom.set_xlabel("step")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no tick at step 4.25 on a short run
    for f in faults:
        for ax in (top, bottom):
            ax.axvline(f["step"], color="tab:red", lw=0.8, alpha=0.7)
    return save_figure(fig, out)
