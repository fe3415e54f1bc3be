"""The `probe` command-line interface (typer).

``main`` defines the app and its core commands; the modules listed in ``commands`` add theirs to
it when imported, which happens here, so that ``depthprobe.cli.main:app`` always has every command.
"""

from depthprobe.cli import commands  # noqa: F401
