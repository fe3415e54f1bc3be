"""Models: loading (aliases, Hugging Face, native, checkpoints), read-only HF attentions, SPA depth models, training."""
