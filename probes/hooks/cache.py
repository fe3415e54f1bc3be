"""``run_with_cache``: one forward pass, its logits (or loss) and every asked-for activation, as
TransformerLens users expect.

The cache is a dict of hook name -> tensor (copies) with depthprobe's ``stack`` and
``accumulated_resid``; every other verb of TransformerLens's ``ActivationCache``
(``cache["pattern", 1]``, ``decompose_resid``, ``stack_head_results``, ``apply_ln_to_stack``,
``logit_attrs``, ``get_full_resid_decomposition``, ...) is the library's own, run on the same
tensors (``cache.tl`` is that ``ActivationCache``).

Encoders without a trained head over the vocabulary (``model.has_lm_head`` is False, e.g. the
sentence encoder minilm) return the final hidden states [batch, pos, d_model] in place of logits:
the last block's ``hook_resid_post``, which is what Hugging Face calls ``last_hidden_state``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.capture import HookFn, Names, capture, resolve_names
from depthprobe.probes.hooks.inputs import inputs
from depthprobe.probes.hooks.loss import ReturnType, check_return_type, token_loss
from depthprobe.probes.hooks.stats import bar, chunks
from depthprobe.probes.models.model import Model


def _layer_key(name: str) -> tuple[int, str]:
    m = re.match(r"blocks\.(\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


class Cache(dict):
    """hook name -> tensor (the pass's own tensor, as TransformerLens caches it; a copy when the pass
    ran edits, which may act in place); with ``grad=True``, ``name + "_grad"`` -> its gradient too."""

    def __init__(self, tensors: dict[str, torch.Tensor], n_layers: int, bridge: Any = None) -> None:
        super().__init__(tensors)
        self.n_layers = n_layers
        self.bridge = bridge
        self.has_batch_dim = True

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, tuple):  # TransformerLens's short names: cache["pattern", 1]
            return self.tl[key]
        return super().__getitem__(key)

    @property
    def tl(self) -> Any:
        """TransformerLens's ``ActivationCache`` over the same tensors."""
        from transformer_lens import ActivationCache

        if self.bridge is None:
            raise ProbeError("this cache has no model (loaded or unpickled?); attach one: cache.attach(model)")
        return ActivationCache(dict(self.items()), self.bridge, has_batch_dim=self.has_batch_dim)

    def __getattr__(self, name: str) -> Any:
        """TransformerLens's cache verbs (``decompose_resid``, ``stack_head_results``, ``logit_attrs``...)."""
        if name.startswith("_") or name in ("n_layers", "bridge", "has_batch_dim"):
            raise AttributeError(name)
        from transformer_lens import ActivationCache

        if not hasattr(ActivationCache, name):
            raise AttributeError(f"'Cache' object has no attribute {name!r}")
        return getattr(self.tl, name)

    def stack(self, pattern: str) -> torch.Tensor:
        """Tensors whose names match ``pattern`` (``blocks.*.hook_resid_post``), stacked on a new
        leading layer axis in layer order: [n_layers, ...]."""
        names = sorted((n for n in self if fnmatch.fnmatchcase(n, pattern)), key=_layer_key)
        if not names:
            raise ProbeError(
                f"no cached activation matches {pattern!r}; run_with_cache(..., names=[{pattern!r}]) caches it"
            )
        return torch.stack([self[n] for n in names])

    def __dir__(self) -> list[str]:  # tab completion sees TransformerLens's verbs too
        from transformer_lens import ActivationCache

        return sorted({*super().__dir__(), *(n for n in dir(ActivationCache) if not n.startswith("_"))})

    def accumulated_resid(self, layer: int | None = None, *args: Any, **kwargs: Any) -> Any:
        """The residual stream before every block and after the last: [n_layers + 1, batch, pos, d_model].
        With any of TransformerLens's options (``layer``, ``incl_mid``, ``apply_ln``, ``pos_slice``,
        ``mlp_input``, ``return_labels``), TransformerLens's own ``accumulated_resid`` on this cache."""
        if layer is not None or args or kwargs:
            return self.tl.accumulated_resid(layer, *args, **kwargs)
        names = [f"blocks.{i}.hook_resid_pre" for i in range(self.n_layers)]
        names.append(f"blocks.{self.n_layers - 1}.hook_resid_post")
        missing = [n for n in names if n not in self]
        if missing:
            raise ProbeError(
                f"accumulated_resid needs {missing[0]}, which is not cached; "
                "cache blocks.*.hook_resid_pre and blocks.*.hook_resid_post (or names=None)"
            )
        return torch.stack([self[n] for n in names])

    def remove_batch_dim(self) -> None:
        """Drop the batch axis of a batch of one, in place (as TransformerLens does)."""
        sizes = {v.shape[0] for v in self.values()}
        if sizes != {1}:
            raise ProbeError(f"remove_batch_dim needs a batch of one, the cache holds {sorted(sizes)}")
        for k in list(self):
            dict.__setitem__(self, k, dict.__getitem__(self, k)[0])
        self.has_batch_dim = False

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles (``torch.save(cache)``) without its model: load it back with ``model=`` or
        :meth:`attach` to use TransformerLens's verbs."""
        return (_rebuild, (dict(self), self.n_layers, self.has_batch_dim))

    def attach(self, model: Any) -> Cache:
        """This cache with ``model``'s bridge (for ``cache.tl`` and the verbs); returns itself."""
        self.bridge = getattr(model, "bridge", model)
        return self

    def save(self, path: str | Path) -> Path:
        """Write the tensors to one safetensors file, with their names in order, the layer count and
        whether it has a batch axis (the model is not saved); :meth:`load` reads it back exactly.
        A tensor equal to one already written (an aliased hook: ``hook_resid_pre`` and
        ``blocks.0.hook_in`` are one hook point) is written once, with its name and shape."""
        from safetensors.torch import save_file

        tensors, aliases = _once(self)
        meta = {"format": _FORMAT, "names": json.dumps(list(self)), "n_layers": str(self.n_layers)}
        meta["has_batch_dim"] = str(self.has_batch_dim)
        meta["aliases"] = json.dumps(aliases)
        path = Path(path)
        save_file(tensors, str(path), metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | Path, model: Any = None, device: str | torch.device = "cpu") -> Cache:
        """A cache written by :meth:`save`, on ``device``; with ``model``, attached to it."""
        from safetensors import SafetensorError, safe_open

        path = Path(path)
        if not path.is_file():
            raise ProbeError(f"no cache file at {path}; write one with cache.save(path)")
        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                written = set(f.keys())
                names, aliases, n_layers, has_batch = _read_meta(path, f.metadata() or {}, written)
                stored = {k: f.get_tensor(k) for k in written}
                tensors = {k: _stored(stored, aliases, k) for k in names}
        except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as e:  # not safetensors, cut short
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise ProbeError(f"{path} is not a readable cache file ({first}); write it again with cache.save") from None
        cache = _rebuild(tensors, n_layers, has_batch)
        return cache if model is None else cache.attach(model)

    def __repr__(self) -> str:
        """One line: size, layers, a few names (the tensors are in the dict)."""
        shown = ", ".join(list(self)[:3]) + (", ..." if len(self) > 3 else "")
        mb = sum(v.numel() * v.element_size() for v in self.values()) / 1e6
        model = "" if self.bridge is None else ", with model"
        return f"Cache({len(self)} tensors, {mb:.1f} MB, {self.n_layers} layers{model}: {shown})"

    def to(self, device: str | torch.device) -> Cache:
        out = Cache({k: v.to(device) for k, v in self.items()}, self.n_layers, self.bridge)
        out.has_batch_dim = self.has_batch_dim
        return out


_FORMAT = "depthprobe-cache-2"  # 2: equal tensors written once ("aliases"); 1 (read too): every name
_FORMATS = ("depthprobe-cache-1", _FORMAT)


def _once(cache: Cache) -> tuple[dict[str, torch.Tensor], dict[str, list[Any]]]:
    """The tensors to write, each content once, and name -> [written name, shape] for the others."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, list[Any]] = {}
    candidates: dict[tuple[Any, ...], list[str]] = {}
    seen: set[int] = set()
    for k, v in cache.items():
        v = v.detach().cpu().contiguous()
        key = (v.dtype, v.numel(), float(v.double().sum()) if v.numel() else 0.0)  # equal tensors share it
        same = next((o for o in candidates.get(key, []) if torch.equal(tensors[o].reshape(-1), v.reshape(-1))), None)
        if same is not None:
            aliases[k] = [same, list(v.shape)]
            continue
        storage = v.untyped_storage().data_ptr()  # views of one tensor (the cache holds no copies) share it
        tensors[k] = v.clone() if storage in seen and v.numel() else v  # safetensors writes no shared storage
        seen.add(tensors[k].untyped_storage().data_ptr())
        candidates.setdefault(key, []).append(k)
    return tensors, aliases


def _stored(stored: dict[str, torch.Tensor], aliases: dict[str, list[Any]], name: str) -> torch.Tensor:
    """``name``'s tensor: as written, or (an alias) a copy of the tensor it equals, in its own shape."""
    if name not in aliases:
        return stored[name]
    target, shape = aliases[name]
    return stored[target].reshape(shape).clone()


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _read_meta(path: Path, meta: dict[str, str], keys: set[str]) -> tuple[list[str], dict[str, list[Any]], int, bool]:
    """The names (in order), aliases, layer count and batch flag of a saved cache; one line for any
    other metadata."""
    bad = f"{path} is not a cache written by Cache.save"
    if meta.get("format") not in _FORMATS:
        raise ProbeError(f"{bad}; load it with safetensors")
    names, aliases = _json(meta.get("names", "")), _json(meta.get("aliases", "{}"))
    n_layers, has_batch = meta.get("n_layers", ""), meta.get("has_batch_dim")
    if not (
        isinstance(aliases, dict)
        and all(
            isinstance(a, list) and len(a) == 2 and a[0] in keys and isinstance(a[1], list) for a in aliases.values()
        )
        and all(isinstance(d, int) and d >= 0 for a in aliases.values() for d in a[1])
    ):
        raise ProbeError(f"{bad} (its 'aliases' metadata is damaged); write it again with cache.save")
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names) and set(names) == keys | set(aliases)):
        raise ProbeError(f"{bad} (its 'names' metadata is not the list of its tensors); write it again with cache.save")
    if not (n_layers.isdigit() and len(n_layers) < 6 and has_batch in ("True", "False")):
        raise ProbeError(f"{bad} (its n_layers or has_batch_dim metadata is damaged); write it again with cache.save")
    return names, aliases, int(n_layers), has_batch == "True"


def _rebuild(tensors: dict[str, torch.Tensor], n_layers: int, has_batch_dim: bool) -> Cache:
    cache = Cache(tensors, n_layers)
    cache.has_batch_dim = has_batch_dim
    return cache


def _every_hook(model: Model) -> list[str]:
    """Every hook name the bridge lets a hook attach to (TransformerLens gates a few, e.g. hook_mlp_in)."""
    gated = getattr(model.bridge, "_gated_hook_reason", None)
    return [
        n for n, hp in model.bridge.hook_dict.items() if gated is None or gated(getattr(hp, "name", None) or n) is None
    ]


def outputs(
    model: Model, ids: torch.Tensor, mask: torch.Tensor | None = None, edits: Mapping[str, HookFn] | None = None
) -> torch.Tensor:
    """The logits of one pass (final hidden states for encoders without an LM head), no cache, with
    ``edits`` (hook name -> function) applied; in the autograd graph when gradients are on. An
    encoder's pass stops at its last block (nothing after it is computed, unless another capture
    is open)."""
    if model.has_lm_head:
        with capture(model, edits, store=False) if edits else contextlib.nullcontext():
            return model.bridge(ids, attention_mask=mask)
    last = f"blocks.{model.info.n_layers - 1}.hook_resid_post"
    with capture(model, _with(edits or [], last), grad=torch.is_grad_enabled(), stop_early=True) as acts:
        model.bridge(ids, attention_mask=mask, return_type=None)
    return acts[last]


def _check_names(model: Model, names: Names | None) -> list[str]:
    if names is not None and not isinstance(names, str | Mapping | list | tuple):
        raise ProbeError(
            f"names must be a hook name, a list of them (globs allowed) or a dict of name -> function, "
            f"got {type(names).__name__}; e.g. names='blocks.*.attn.hook_pattern'"
        )
    wanted: Any = _every_hook(model) if names is None else names
    return resolve_names(model, list(wanted) if isinstance(wanted, Mapping) else wanted)


def run_with_cache(
    model: Model,
    texts_or_ids: Any,
    names: Names | None = None,
    *,
    attention_mask: torch.Tensor | None = None,
    return_type: ReturnType = "logits",
    loss_per_token: bool = False,
    grad: bool = False,
    batch_size: int | None = None,
    progress: bool = False,
) -> tuple[Any, Cache]:
    """``(logits, cache)`` for texts (encoded with ``model.encode``: padded, masked) or token ids.

    ``names`` (one name, a list with globs, or a dict of name -> edit function) limits the cache;
    None caches every hook. Logits are [batch, pos, vocab]; for encoders without a trained head,
    the final hidden states [batch, pos, d_model] (see the module notes). ``return_type="loss"``
    gives the next-token loss of a causal model instead (mean over real tokens, or [batch, pos - 1]
    with ``loss_per_token``; padding is 0 there), ``"both"`` gives ``(logits, loss)``. ``grad=True``
    (TransformerLens's ``incl_bwd``) backpropagates the mean loss and caches ``name + "_grad"`` for
    every cached tensor that has one (zeros where the loss does not depend on it; none for token ids).
    ``batch_size`` runs the examples that many at a time (the same logits, loss, cache and gradients,
    joined on the batch axis; less memory for the passes), ``progress`` shows a bar over the batches.
    """
    check_return_type(model, return_type, loss_per_token, grad)
    ids, mask = inputs(model, texts_or_ids, attention_mask)
    keys = _check_names(model, names)
    wanted: Names = names if isinstance(names, Mapping) else keys
    parts = chunks(ids.shape[0], batch_size)
    total = _real_tokens(mask)
    shown = bar(progress, len(parts), "run_with_cache batches")
    runs = []
    for part in parts:
        share = None if len(parts) == 1 else _real_tokens(mask[part]) / total  # of the mean loss
        with torch.set_grad_enabled(grad):  # the loss and its gradients too, even under torch.no_grad()
            runs.append(_one_pass(model, ids[part], mask[part], wanted, keys, return_type, loss_per_token, grad, share))
        if shown is not None:
            shown.update(1)
    if shown is not None:
        shown.close()
    logits, loss, tensors = runs[0] if len(runs) == 1 else _join(runs, loss_per_token)
    cache = Cache(tensors, model.info.n_layers, model.bridge)
    if return_type == "both":
        return (logits, loss), cache
    return (loss if return_type == "loss" else logits), cache


def _with(wanted: Names, name: str) -> Names:
    """``wanted`` and ``name`` too (captured; not edited, unless ``wanted`` edits it)."""
    if isinstance(wanted, Mapping):
        return {name: _keep, **wanted}
    return [*([wanted] if isinstance(wanted, str) else wanted), name]


def _keep(tensor: torch.Tensor, hook: Any) -> None:
    """An edit that leaves the activation as it is (captures it beside the user's edits)."""
    return None


def _real_tokens(mask: torch.Tensor) -> float:
    """Next-token targets with a real token on both sides (what the mean loss averages over)."""
    return float((mask[:, 1:] * mask[:, :-1]).sum().clamp(min=1))


def _join(runs: list[Any], per_token: bool) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    """Batches' (logits, loss, tensors) joined: on the batch axis, the mean loss as the sum of shares."""
    logits = torch.cat([r[0] for r in runs])
    losses = [r[1] for r in runs]
    loss = None if losses[0] is None else torch.cat(losses) if per_token else torch.stack(losses).sum()
    tensors = {k: torch.cat([r[2][k] for r in runs]) for k in runs[0][2]}
    return logits, loss, tensors


def _one_pass(
    model: Model,
    ids: torch.Tensor,
    mask: torch.Tensor,
    wanted: Names,
    keys: list[str],
    return_type: str,
    loss_per_token: bool,
    grad: bool,
    share: float | None,
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """One batch's logits, loss (times ``share`` of the whole mean, when batched) and cached tensors."""
    last = f"blocks.{model.info.n_layers - 1}.hook_resid_post"
    lm = model.has_lm_head
    edits = isinstance(wanted, Mapping)  # a user's edit may act in place: keep copies then
    added = not lm and last not in keys
    hooks = _with(wanted, last) if added else wanted
    # an encoder's logits are its last hook_resid_post: the pass stops once every asked-for hook has fired
    with capture(model, hooks, clone=edits and not grad, grad=grad, stop_early=not lm) as acts:
        out = model.bridge(ids, attention_mask=mask, return_type="logits" if lm else None)
    logits = out if lm else acts[last]
    if not grad and not lm:
        logits = logits.clone()
    loss = token_loss(logits, ids, mask, per_token=loss_per_token) if return_type != "logits" else None
    if loss is not None and share is not None and not loss_per_token:
        loss = loss * share
    tensors = {k: v.detach().clone() if grad else v for k, v in acts.items() if not (added and k == last)}
    if grad and loss is not None:
        # token ids (embed.hook_in...) have no gradient: skipped, as TransformerLens's incl_bwd skips them
        wrt = [k for k, v in acts.items() if v.requires_grad]
        grads = torch.autograd.grad(loss, [acts[k] for k in wrt], allow_unused=True)
        for k, g in zip(wrt, grads, strict=True):
            tensors[f"{k}_grad"] = torch.zeros_like(tensors[k]) if g is None else g
        logits, loss = logits.detach(), loss.detach()
    return logits, loss, tensors
