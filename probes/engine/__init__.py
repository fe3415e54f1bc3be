"""The engine: the task protocol and registry, the streaming loop, batches, options, errors and run folders."""
