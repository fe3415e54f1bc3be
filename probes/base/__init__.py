"""The bottom floor: errors, options, registry, runtime, artifacts, batching. Imports nothing else of the project."""
