"""The `probe` command-line interface (typer)."""
