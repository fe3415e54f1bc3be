"""The depth-usage task: examples, running sums over the residual stream, one skip pass per block.

Each text is one sequence (tokenized alone, special tokens added; longer than ``--max-len``
skipped and counted); batches are padded and the padding is masked out of every sum. h_0 =
``blocks.0.hook_resid_pre`` (the embeddings, after BERT's embedding LayerNorm), h_{l+1} =
``blocks.l.hook_resid_post``, c_l = h_{l+1} - h_l. Every value is a mean over all real tokens
(special tokens included) of a per-token value (``probes.measures.depth``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from depthprobe.probes.base.batching import Batch
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.engine.inputs import text_sequences
from depthprobe.probes.engine.task import Context, Examples, Output, Task, add_sums
from depthprobe.probes.hooks.capture import Captured, HookFn, capture, forward
from depthprobe.probes.hooks.depth import (
    BlockCalls,
    Readout,
    check_editable,
    check_readout,
    readout,
    recording_blocks,
    resid_names,
    skip_edits,
    sublayer_hooks,
)
from depthprobe.probes.measures import depth
from depthprobe.probes.models.model import Model
from depthprobe.tasks.cards import CARDS, DepthUsageOptions
from depthprobe.tasks.depth_usage.tables import finish

SAMPLE = Path(__file__).parent.parent / "data" / "sample.txt"  # the same sample text as attention-stats

Options = DepthUsageOptions  # tasks/cards.py: the options, readable without importing this module


@dataclass
class State:
    model: Model
    options: Options
    sums: dict[str, torch.Tensor] = field(default_factory=dict)  # metric -> float64 sums over tokens
    tokens: int = 0
    texts: int = 0
    checked: bool = False  # the readout was checked against the model's logits


class DepthUsage(Task[Options, State]):
    name = "depth-usage"
    description = CARDS["depth-usage"].description
    needs_text = False  # token ids in memory serve models without a tokenizer
    memory_kinds = frozenset({"lines", "tokens"})

    def wants_logits(self, model: Model) -> bool:
        return readout(model) is not None

    def load(self, model: Model, ctx: Context[Options]) -> Examples:
        if model.tokenizer is None and (ctx.memory is None or ctx.memory.tokens is None):
            raise ProbeError(
                f"depth-usage on {model.name} (no tokenizer) needs token ids: probes.run(model, 'depth-usage', "
                "data=ids) with ids [example, pos], or a model with a tokenizer"
            )
        if ctx.options.skips:
            check_editable(model, "depth-usage's skips")
        seqs = text_sequences(model, ctx, SAMPLE)
        limit = model.input_limit(ctx.config.max_len)
        kept = [s for s in seqs if len(s) <= limit]
        if not kept:
            raise ProbeError(
                f"every text is longer than --max-len {limit} pieces; raise --max-len "
                f"(model limit {model.info.max_len}) or split the lines"
            )
        return Examples(kept, skipped=len(seqs) - len(kept), why=f"longer than {limit} pieces")

    def hook_names(self, model: Model, ctx: Context[Options]) -> list[str]:
        names = resid_names(model.info.n_layers)
        for layer in range(model.info.n_layers):
            for _, out, base in sublayer_hooks(model, layer):
                names += [n for n in (out, base) if n not in names]
        return names

    def start(self, model: Model, ctx: Context[Options], examples: Examples) -> State:
        return State(model=model, options=ctx.options)

    def accumulate(self, state: State, batch: Batch, acts: Captured) -> None:
        model, L = state.model, state.model.info.n_layers
        mask = batch.attention_mask.to(model.device)
        h = [acts[n] for n in resid_names(L)]
        sums: dict[str, torch.Tensor] = {}
        sums["relative_contribution"], sums["cosine"] = _pairs(
            [depth.contribution_sums(h[i + 1] - h[i], h[i], mask) for i in range(L)]
        )
        for kind in ("attn", "mlp"):
            parts = [[p for p in sublayer_hooks(model, i) if p[0] == kind] for i in range(L)]
            if all(parts):
                pairs = [depth.contribution_sums(acts[p[0][1]], acts[p[0][2]], mask) for p in parts]
                sums[f"{kind}_relative_contribution"], sums[f"{kind}_cosine"] = _pairs(pairs)
        logits = acts.get("logits")
        head = readout(model) if logits is not None and state.options.lens else None
        if head is not None and logits is not None:
            sums.update(_lens_sums(state, head, h, logits, mask))
        if state.options.skips:
            sums.update(_skip_sums(state, batch, h, logits, mask))
        state.sums = add_sums(state.sums, sums)
        state.tokens += int(batch.attention_mask.sum())
        state.texts += int(batch.attention_mask.shape[0])

    def merge(self, a: State, b: State) -> State:
        a.sums = add_sums(a.sums, b.sums)
        a.tokens += b.tokens
        a.texts += b.texts
        return a

    def finalize(self, state: State, ctx: Context[Options]) -> Output:
        means = {k: v / max(state.tokens, 1) for k, v in state.sums.items()}
        return finish(means, state.model, ctx, state.tokens, state.texts)


def _pairs(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[(a_0, b_0), (a_1, b_1), ...] of scalar tensors -> (a, b) as float64 CPU vectors (one copy)."""
    t = torch.stack([torch.stack(p) for p in pairs]).double().cpu()  # [n, 2]
    return t[:, 0], t[:, 1]


def _lens_sums(
    state: State, head: Readout, h: list[torch.Tensor], logits: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Logit lens on h_0 .. h_L: sums of KL(final || lens_l) and of top-1 agreement."""
    if not state.checked:
        check_readout(state.model, head, h[-1], logits)
        state.checked = True
    with torch.inference_mode():
        pairs = [depth.kl_top1_sums(logits, head(x), mask) for x in h]
    kl, top1 = _pairs(pairs)
    return {"lens_kl": kl, "lens_top1": top1}


def _skip_sums(
    state: State, batch: Batch, h: list[torch.Tensor], logits: torch.Tensor | None, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """One pass per skipped block s: sums of ||c_j' - c_j|| / ||c_j|| for j > s (``skip_later``
    [s, j], NaN-free zeros elsewhere), 1 - cos(h_L', h_L), and with logits KL(p || p') and top-1.

    Blocks before s compute what they computed in the intact pass, so the pass for s > 0 starts
    from the intact residual entering block s (its input is its output) and runs blocks s+1..L-1
    alone, with the arguments the blocks had in the pass for s = 0 (a whole pass, recorded);
    models whose blocks cannot be called one by one (or logits without a checked readout) get
    whole passes."""
    model, L = state.model, state.model.info.n_layers
    names = resid_names(L)
    later = torch.zeros(L, L, dtype=torch.float64, device=model.device)
    out = torch.zeros(L, 3, dtype=torch.float64, device=model.device)  # skip_output, skip_kl, skip_top1
    keep: dict[str, HookFn] = dict.fromkeys(names, _keep)
    head = readout(model) if logits is not None and state.checked else None
    calls = None
    for s in range(L):
        if s > 0 and calls is not None and calls.usable() and (logits is None or head is not None):
            acts = _rerun(model, calls, s, h[s], names[s + 2 :], head)
        else:
            with recording_blocks(model) as calls:
                edits = {**keep, **skip_edits(model, [s])}
                acts = forward(model, batch.input_ids, batch.attention_mask, edits, logits=logits is not None)
        h2 = [h[j] for j in range(s + 1)] + [acts[n].float() for n in names[s + 1 :]]
        for j in range(s + 1, L):
            later[s, j] = depth.relative_change_sum(h2[j + 1] - h2[j], h[j + 1] - h[j], mask)
        out[s, 0] = depth.cosine_distance_sum(h2[-1], h[-1], mask)
        if logits is not None:
            out[s, 1], out[s, 2] = depth.kl_top1_sums(logits, acts["logits"].float(), mask)
    later, out = later.cpu(), out.cpu()
    sums = {"skip_later": later, "skip_output": out[:, 0]}
    if logits is not None:
        sums.update(skip_kl=out[:, 1], skip_top1=out[:, 2])
    return sums


def _rerun(
    model: Model, calls: BlockCalls, s: int, h_s: torch.Tensor, names: list[str], head: Readout | None
) -> Captured:
    """The pass with block s skipped, from the intact residual h_s entering it: blocks s+1..L-1
    on h_s (the skipped block's output), capturing ``names``; the logits through ``head``."""
    acts, last = Captured(), h_s
    with torch.inference_mode():
        if names:  # s < L - 1
            with capture(model, dict.fromkeys(names, _keep)) as later:
                last = calls.run_from(s + 1, h_s)
            acts.update(later)
        acts[f"blocks.{s}.hook_resid_post"] = h_s
        if head is not None:
            acts["logits"] = head(last)
    return acts


def _keep(t: torch.Tensor, hook: object) -> None:
    """Capture only: the residuals beside the skip edits."""
    return None
