"""The API layer: one module per verb (run, sweep, study, compare, viz)."""
