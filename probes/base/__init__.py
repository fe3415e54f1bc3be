"""The bottom floor: errors, options, registry, runtime, artifacts, batching, scores.

Imports nothing else of the project."""
