"""depth-usage (docs/protocols.md §3.10, docs/depth-usage.md): what each block adds to the residual stream,
and what changes when it is skipped (Csordás, Manning and Potts 2025; Gromov et al. 2024; Lad et
al. 2024).

The package, one concern per module: ``task`` (the task protocol: examples, running sums, skip
passes) and ``tables`` (the tidy rows, the summary, the notes and the plots). The maths is in
``probes.measures.depth``; the skip edit and the logit readout in ``probes.hooks.depth``.
"""
