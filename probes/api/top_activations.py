"""Top-activating examples of an SAE latent: the k (text, position) pairs of a data set where the
latent fires most, as a tidy table and a view with each context's tokens shaded by the latent and
the top token marked.

``top_activations(model, sae, texts, latent, k)`` attaches the SAE (as
:func:`~.sae.attach_sae`), runs the texts in batches, reads ``H.hook_sae_acts_post[..., latent]``
at every real (unpadded) token and keeps the k largest (ties: the earlier example and position
first). Each row: ``rank, example, position, token, activation, context`` (the ``window`` tokens
before the top token and up to ``after`` following, joined; the top token in ``[[ ]]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.api.viz import InlineView, VizPage
from depthprobe.probes.api.viz import _piece_labels as piece_labels
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.capture import forward
from depthprobe.probes.hooks.inputs import inputs
from depthprobe.probes.hooks.sae import attach_sae
from depthprobe.probes.models.model import Model
from depthprobe.probes.models.sae import SAE
from depthprobe.probes.render.html import esc, no_paths

COLUMNS = ["rank", "example", "position", "token", "activation", "context"]


@dataclass
class TopActivations:
    """The table (``.table``) and its view (``.view``, shown inline in a notebook)."""

    table: pd.DataFrame
    view: InlineView
    latent: int

    def __repr__(self) -> str:
        top = f"{self.table['activation'].iloc[0]:.4g}" if len(self.table) else "none"
        return f"TopActivations(latent {self.latent}: {len(self.table)} contexts, top activation {top})"

    def _repr_html_(self) -> str:
        return str(self.view._repr_html_())


def _check(sae: Any, latent: Any, k: Any, window: Any, after: Any, batch_size: Any) -> None:
    if not isinstance(sae, SAE):
        raise ProbeError(f"top_activations needs an SAE from probes.load_sae, got {type(sae).__name__}")
    d_sae = sae.cfg.d_sae
    if isinstance(latent, bool) or not isinstance(latent, int) or not 0 <= latent < d_sae:
        raise ProbeError(
            f"latent must be an integer from 0 to {d_sae - 1} (the SAE's d_sae is {d_sae}), got {latent!r}"
        )
    for arg, value, low in (("k", k, 1), ("window", window, 0), ("after", after, 0), ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ProbeError(f"{arg} must be an integer of at least {low}, got {value!r}")


def _latent_acts(
    model: Model, sae: SAE, ids: torch.Tensor, mask: torch.Tensor, latent: int, batch: int
) -> torch.Tensor:
    """The latent's activation at every token [example, pos]; -inf at padding."""
    parts = []
    with attach_sae(model, sae, sae.cfg.hook_name) as attached:
        name = f"{attached.hook_sae_acts_post.name}"
        for start in range(0, ids.shape[0], batch):
            m = mask[start : start + batch]
            acts = forward(model, ids[start : start + batch], m, name)[name][..., latent].float().cpu()
            parts.append(acts.masked_fill(m.cpu() == 0, float("-inf")))
    return torch.cat(parts)


def _labels(model: Model, ids: list[int]) -> list[str]:
    return [f" {i}" for i in ids] if model.tokenizer is None else piece_labels(model.tokenizer, ids)


def top_activations(
    model: Model,
    sae: SAE,
    texts: Any,
    latent: int,
    k: int = 10,
    *,
    window: int = 12,
    after: int = 3,
    batch_size: int = 32,
) -> TopActivations:
    """The ``k`` contexts of ``texts`` (strings, or token ids [example, pos]) where ``latent`` of
    ``sae`` fires most (see the module notes). Checked before any pass: the SAE, the latent (0 to
    d_sae - 1), k, window, after and batch_size; the SAE's hook on this model as attach_sae checks it."""
    _check(sae, latent, k, window, after, batch_size)
    ids, mask = inputs(model, texts, None)
    acts = _latent_acts(model, sae, ids, mask, latent, batch_size)
    n_real = int((mask != 0).sum())
    flat = acts.flatten()
    order = torch.sort(-flat, stable=True).indices[: min(k, n_real)].tolist()  # ties: the earlier first
    rows, contexts = [], []
    width = acts.shape[1]
    for rank, i in enumerate(order):
        ex, pos = divmod(i, width)
        real = int(mask[ex].sum())
        lo, hi = max(0, pos - window), min(real, pos + after + 1)
        labels = _labels(model, ids[ex, lo:hi].tolist())
        shades = acts[ex, lo:hi].clamp(min=0).tolist()
        top = pos - lo
        context = "".join(f"[[{t}]]" if j == top else t for j, t in enumerate(labels))
        rows.append([rank, ex, pos, labels[top], float(flat[i]), context])
        contexts.append((labels, shades, top, float(flat[i])))
    table = pd.DataFrame(rows, columns=COLUMNS)
    table.attrs.update(latent=latent, hook=sae.cfg.hook_name)
    return TopActivations(table, _view(model, sae, latent, contexts), latent)


def _view(model: Model, sae: SAE, latent: int, contexts: list[tuple[list[str], list[float], int, float]]) -> InlineView:
    """A page of the contexts: each token shaded by the latent's activation there (relative to the
    largest shown), the top token marked."""
    peak = max((a for _, _, _, a in contexts), default=0.0)
    lines = []
    for rank, (labels, shades, top, act) in enumerate(contexts):
        spans = []
        for j, (label, shade) in enumerate(zip(labels, shades, strict=True)):
            alpha = 0.0 if peak <= 0 else min(1.0, shade / peak)
            style = f"background: rgba(255, 140, 0, {alpha:.3f})"
            tag = "mark" if j == top else "span"
            spans.append(f"<{tag} style='{style}' title='{shade:.4g}'>{esc(label)}</{tag}>")
        lines.append(f"<tr><td>{rank}</td><td>{act:.4g}</td><td class='ctx'>{''.join(spans)}</td></tr>")
    note = "" if peak > 0 else "<p class='meta'>The latent never fires (activation above 0) on these texts.</p>"
    body = (
        f"<h1>Latent {latent} of the SAE at {esc(no_paths(str(sae.cfg.hook_name)))}: top activations</h1>"
        f"<p class='meta'>model <b>{esc(no_paths(model.name))}</b>; each token shaded by the latent's activation "
        "(the largest shown is full colour), the top token marked; hover a token for its value.</p>"
        f"{note}<div class='tablewrap'><table class='data'><thead><tr><th>rank</th><th>activation</th>"
        f"<th>context</th></tr></thead><tbody>{''.join(lines)}</tbody></table></div>"
    )
    parts = VizPage(f"depthprobe top activations: latent {latent}", body, [], 0, height=120 + 32 * len(contexts))
    return InlineView(parts, bundle=False)  # no attention views: the circuitsvis bundle is not needed
