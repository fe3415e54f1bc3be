"""Hooks: scoped capture of activations, eager attention for edits, caches, ablation and patching."""
