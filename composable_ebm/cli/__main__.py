"""``python -m composable_ebm.cli`` runs the ``cebm`` command line (e.g. under torchrun)."""

from composable_ebm.cli import app

app()
