"""kernels (docs/kernels.md): signal propagation through depth, on any model, and the depth sweep.

``probe run --task kernels`` captures the residual stream at the embeddings (layer 0 =
``blocks.0.hook_resid_pre``, the input of the first block) and after every block (layer l =
``blocks.{l-1}.hook_resid_post``), and reports per layer, averaged over input sequences: the mean
off-diagonal cosine of the normalised kernel, Dong et al.'s residual ratios (Frobenius and
composite (1, inf)), the contraction exponent log(r_{l+1}) / log(r_l) of the Frobenius ratio, and
the effective rank of the centred and of the uncentred X (see ``probes.measures.kernels``). Padding never
counts; [CLS]/[SEP] of encoders are dropped unless ``exclude_special=false``, and the BOS of
decoders unless ``include_bos=true`` (the model still sees them; only the kernel leaves them out).
Models without a tokenizer get sequences of distinct random token ids. Models from
``probes.models.variant_net`` also get the infinite-width theory next to each measurement.

``probe sweep --task kernels`` builds one ``probes.models.variant_net`` model per variant and depth (optionally
trains it) and writes one table: variant, depth, layer, metric, value, theory.

The package, one concern per module: ``task`` (options, state and the task protocol),
``accumulator`` (metric names, running sums, theory rows and one measured pass of a SPA model:
what the sweep needs from the task), ``plots`` (figures and the npz file) and ``sweep``.
"""
