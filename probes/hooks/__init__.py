"""Hooks: scoped capture of activations, the attention seam, caches, ablation and patching."""
