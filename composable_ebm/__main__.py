"""``python -m composable_ebm ...`` runs the ``cebm`` command line."""

from composable_ebm.cli import app

app(prog_name="cebm")
