"""induction (docs/induction.md; Olsson et al. 2022; Elhage et al. 2021): copying heads on repeated
random tokens.

Input: ``n_seqs`` sequences ``[BOS] r r`` (encoders: ``[CLS] r r [SEP]``), ``r`` of length
``S = repeat_len`` drawn uniformly WITHOUT replacement (no token twice in r) from the model's
ordinary vocabulary (special tokens excluded; native models: token 0 is BOS, tokens
1..d_vocab-1 are ordinary). With ``p`` prefix tokens, the first copy sits at positions
p..p+S-1 and the second at p+S..p+2S-1.

Per head, averaged over sequences (all sequences have the same length, so this is also the
mean over every scored position):

- induction: mean over second-copy positions i of A[i, i-S+1] (the token after i's earlier
  occurrence);
- duplicate_token: mean over second-copy positions i of A[i, i-S] (the earlier occurrence);
- previous_token: mean over every copy position i (first and second copy) of A[i, i-1],
  positions whose target is BOS/[CLS] excluded (so i = p+1..p+2S-1);
- copying (native models): for W_E W_V W_O W_U, sum of eigenvalues / sum of their absolute
  values (LayerNorm ignored, as in Elhage et al.);
- k_composition_max (native models, layers >= 1): the largest K-composition score of the
  head with any head of an earlier layer (TransformerLens ``all_composition_scores('K')``);
  the full pairwise table is written to ``k_composition.csv``; ``k_composition_max_init`` is
  the same for the model's own initialisation (same config and seed, untrained).

Each attention score has a chance level (:func:`chance_levels`): the mean over its scored query
positions of 1 / (number of positions the query can attend to): i + 1 for a causal model at
position i, every real position for an encoder.

Causal models also get the repeat copying score (``repeat_copying_score``): mean next-token loss
over the second copy (predicting r_1..r_{S-1}) minus the same over the first copy. Causal
models with a tokenizer get Olsson et al.'s in-context-learning score on natural text
(``icl_score``, :func:`icl_positions`): loss at token 500 minus loss at token 50 of 512-token
windows (shorter contexts scale both positions).

The package, one concern per module: ``task`` (options, state and the task protocol),
``metrics`` (pure scores), ``inputs`` (the ICL text windows), ``report`` (summary, notes, files),
``evaluation`` (the scores a training loop checks) and ``sweep`` (the depth sweep, which needs
from the task only ``evaluation.evaluate`` and ``metrics.chance_levels``).
"""
