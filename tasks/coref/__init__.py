"""coref (Clark et al. 2019, Table 2; GAP): which heads attend from a mention to its antecedent.

The task: its options, loading either protocol (format detection, windows or GAP items),
batches, state and the dispatch to the protocol's scoring and output.

Chains (CoNLL-U ``Entity=`` / CoNLL-2012, docs/coref.md; :mod:`.chains`, :mod:`.chain_scores`):
documents are cut into windows of consecutive whole sentences (greedy, at most ``--max-len``
pieces with specials; a longer sentence is skipped and ends the window), one forward pass per
window. A mention M of a window (whole span inside) is evaluated when an earlier mention of its
chain (strictly earlier start) starts in the window. Candidates are the window's mentions ending
before M starts (start before M, no overlap), ordered nearest first: start descending, then end
descending. Per head the prediction is the candidate whose head word gets the most word-level
attention from M's head word (ties: the nearer); correct when the candidate's span belongs to M's chain.

GAP (``--data file.tsv``, detected by extension or header; :mod:`.gap`): one pass over the whole
text, attention from the pronoun to A and to B (pieces by character overlap), the larger wins.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.runtime import torch_threads
from depthprobe.probes.data import coref_formats
from depthprobe.probes.data import gap as gap_data
from depthprobe.probes.engine.task import Batch, Context, Examples, Output, Task
from depthprobe.probes.hooks.capture import Captured, pattern_names
from depthprobe.probes.models.model import Model
from depthprobe.tasks.cards import CARDS, CorefOptions
from depthprobe.tasks.coref.chain_scores import ChainState, chain_accumulate, chain_output
from depthprobe.tasks.coref.chains import Window, chain_windows
from depthprobe.tasks.coref.common import budget_batches
from depthprobe.tasks.coref.gap import GapState, gap_accumulate, gap_items, gap_output

SAMPLE = Path(__file__).parent.parent / "data" / "sample_coref.conllu"


Options = CorefOptions  # tasks/cards.py: the options, readable without importing this module


class CorefExamples(Examples):
    """Examples that remember their format ('chains' or 'gap') and counts through ``head``."""

    def __init__(self, items, skipped: int, why: str, kind: str, counts: dict) -> None:
        super().__init__(items, skipped, why)
        self.kind, self.counts = kind, counts

    def head(self, n: int | None) -> CorefExamples:
        return self if n is None else CorefExamples(self[:n], self.skipped, self.why, self.kind, self.counts)


class Coref(Task[Options, ChainState | GapState]):
    name = "coref"
    description = CARDS["coref"].description

    def _format(self, ctx: Context[Options]) -> str:
        fmt = ctx.options.format
        if fmt != "auto":
            return fmt
        if ctx.data is None:
            return "conllu"
        if ctx.data.is_dir():
            kinds = {
                coref_formats.sniff(f)
                for f in ctx.data.iterdir()
                if f.is_file() and (f.suffix in (".conllu", ".tsv") or coref_formats.is_conll2012(f))
            }
            if kinds == {"gap"}:
                return "gap"
            return "chains"
        return coref_formats.sniff(ctx.data)

    def load(self, model: Model, ctx: Context[Options]) -> Examples:
        if ctx.options.views < 0:
            raise ProbeError(f"coref: views={ctx.options.views} must be 0 or more")
        fmt = self._format(ctx)
        if fmt == "gap":
            return self._load_gap(model, ctx)
        docs = coref_formats.read_chain_docs(ctx.data or SAMPLE, kind=fmt if fmt in ("conllu", "conll2012") else None)
        limit = model.input_limit(ctx.config.max_len)
        windows, counts = chain_windows(model, docs, limit)
        if not windows:
            raise ProbeError(
                f"{ctx.data or SAMPLE}: no mention has an earlier mention of its chain within "
                f"one window of {limit} pieces; give documents with coreference chains"
            )
        return CorefExamples(
            windows,
            counts["sentences_skipped"],
            f"sentences longer than {limit} pieces",
            "chains",
            {**counts, "documents": len(docs)},
        )

    def _load_gap(self, model: Model, ctx: Context[Options]) -> Examples:
        path = ctx.data
        if path is None:
            raise ValueError("_load_gap needs a data path")
        files = sorted(f for f in path.iterdir() if f.suffix == ".tsv") if path.is_dir() else [path]
        rows = [ex for f in files for ex in gap_data.read_gap(f)]
        limit = model.input_limit(ctx.options.gap_max_len)
        items, counts = gap_items(model, rows, limit, path)
        if not items:
            raise ProbeError(f"{path}: no GAP example with exactly one true candidate fits in {limit} pieces")
        return CorefExamples(items, counts["too_long"], f"GAP texts longer than {limit} pieces", "gap", counts)

    def batches(self, model: Model, examples: list[Any], ctx: Context[Options]) -> Iterator[Batch]:
        seqs = [w.encoded.ids if isinstance(w, Window) else w.ids for w in examples]
        per_pair = 4 * model.info.n_layers * model.info.n_heads
        return budget_batches(examples, seqs, ctx.config.batch_size, model.pad_id, per_pair)

    def hook_names(self, model: Model, ctx: Context[Options]) -> list[str]:
        return pattern_names(model.info.n_layers)

    def start(self, model: Model, ctx: Context[Options], examples: Examples) -> ChainState | GapState:
        kind = getattr(examples, "kind", "chains")
        cls = GapState if kind == "gap" else ChainState
        return cls(model.info.n_layers, model.info.n_heads, ctx.options.views, getattr(examples, "counts", {}))

    def accumulate(self, state: ChainState | GapState, batch: Batch, acts: Captured) -> None:
        names = pattern_names(state.n_layers)
        with torch_threads(1):  # scoring: small gathered tensors, no gain from threads
            if isinstance(state, GapState):
                gap_accumulate(state, batch, acts, names)
            else:
                chain_accumulate(state, batch, acts, names)

    def merge(self, a: ChainState | GapState, b: ChainState | GapState) -> ChainState | GapState:
        if type(a) is not type(b):
            raise ValueError("coref: merge needs two states of the same format")
        a.correct += b.correct
        a.n = [x + y for x, y in zip(a.n, b.n, strict=True)]
        a.base = [[x + y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a.base, b.base, strict=True)]
        a.views = (a.views + b.views)[: a.views_wanted]  # the first ones, as one run picks them
        if isinstance(a, ChainState) and isinstance(b, ChainState):
            a.n_windows += b.n_windows
        return a

    def finalize(self, state: ChainState | GapState, ctx: Context[Options]) -> Output:
        return gap_output(state, ctx) if isinstance(state, GapState) else chain_output(state, ctx)
