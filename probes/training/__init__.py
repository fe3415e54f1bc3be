"""Training: the loops that train native models (synthetic data and text corpora)."""
