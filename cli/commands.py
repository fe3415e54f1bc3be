"""Import every module that adds commands to the `probe` app."""

from depthprobe.cli import compare, study, sweep, train, viz  # noqa: F401
