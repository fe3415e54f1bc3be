"""Models: the model types, device and size limits, the hub cache, the architecture table, the load
routes, checkpoints, read-only HF attentions, the depth-study network and equal-parameter families."""
