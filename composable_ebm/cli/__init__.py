"""The ``cebm`` command line: train, sample, compose, eval, plot, info (`app`).

Every failure the library expects ends in one line on stderr that names the file or option,
the problem and the valid choices (``--debug`` shows the traceback instead). Exit status: 0 on
success, 1 on a failure at run time (a diverged run, a failed download), 2 on bad usage or bad input.

One module per group of commands (`training`, `sampling`, `models`, `evaluate`), each registering its commands on
the one `app` (`common`). Importing this package imports no torch, so ``cebm --help`` starts at once.
"""

# each module registers its commands on `app`; `cebm --help` lists them in this order
from composable_ebm.cli import training  # noqa: F401
from composable_ebm.cli import sampling  # noqa: F401
from composable_ebm.cli import models  # noqa: F401
from composable_ebm.cli import evaluate  # noqa: F401
from composable_ebm.cli.common import MAX_SAMPLES, MAX_THREADS, app, default_threads, eval_app
from composable_ebm.cli.sampling import compose, sample

__all__ = ["MAX_SAMPLES", "MAX_THREADS", "app", "compose", "default_threads", "eval_app", "sample"]
