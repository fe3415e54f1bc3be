"""Depth studies: one :class:`~.protocol.Experiment` module per family, one runner for all (docs/architecture.md)."""
