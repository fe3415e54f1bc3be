"""Sparse autoencoders (SAEs) read from disk: a sae-lens folder or one safetensors file.

:func:`load_sae` reads a sae-lens folder (``cfg.json`` + ``sae_weights.safetensors``, sae-lens 6's
layout with ``metadata.hook_name``, or the older one with a top-level ``hook_name``/``hook_point``
and ``activation_fn_str``) or a plain safetensors file holding ``W_enc`` [d_in, d_sae], ``b_enc``
[d_sae], ``W_dec`` [d_sae, d_in], ``b_dec`` [d_in] (and ``threshold`` [d_sae] for JumpReLU),
with the hook name given. The maths is sae-lens's inference SAEs', written here so that only
safetensors is needed:

- input ``x`` [..., d_in] (a ``hook_z`` SAE flattens [..., head, d_head]), normalised as
  ``normalize_activations`` says ("none"; "constant_norm_rescale": x * sqrt(d_in) / |x|;
  "layer_norm": (x - mean) / (std + 1e-5)), minus ``b_dec`` when ``apply_b_dec_to_input``;
- latents from ``pre = x' @ W_enc + b_enc``: "standard" relu(pre); "jumprelu" relu(pre) where
  pre > threshold, else 0; "topk" relu of the k largest entries of pre, 0 elsewhere (with
  ``rescale_acts_by_decoder_norm``, pre times each latent's ``|W_dec row|`` before the top k, and the
  latents divided by it again before decoding); "batchtopk" as sae-lens runs it at inference, a
  JumpReLU whose threshold is the trained ``topk_threshold`` (one number for every latent, or the
  ``threshold`` [d_sae] of a file saved for inference; ``rescale_acts_by_decoder_norm`` as for topk);
  "gated" (``b_gate``, ``r_mag``, ``b_mag`` instead of ``b_enc``) relu(x' @ (W_enc * exp(r_mag)) +
  b_mag) where x' @ W_enc + b_gate > 0, else 0 (the magnitude path is ``hook_sae_acts_pre``).
  Transcoders (``hook_name_out``: they write another hook than they read) are refused;
- reconstruction ``latents @ W_dec + b_dec``, the normalisation undone, the shape restored.

Weights are read as float32 whatever the file holds (bf16, fp16), and attached in the model's
precision (at least float32), so the SAE with its error term leaves the model's logits unchanged;
integer or non-finite (NaN, inf) weights and malformed ``cfg.json`` fields are refused at load, in
one line naming the field.

Its hook points are sae-lens's: ``hook_sae_input``, ``hook_sae_acts_pre``, ``hook_sae_acts_post``
(the latents), ``hook_sae_recons``, ``hook_sae_error``, ``hook_sae_output``. In the model
(:func:`~depthprobe.probes.hooks.sae.attach_sae`) the output is the reconstruction plus the error
``x - reconstruction(x)`` (computed without the hooks' edits, with its gradient), so the model
computes the same function, and the same gradients, with the SAE attached as without.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import torch
from torch import nn

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import check_choices

WEIGHTS = "sae_weights.safetensors"
CONFIG = "cfg.json"
HOOKS = (
    "hook_sae_input",
    "hook_sae_acts_pre",
    "hook_sae_acts_post",
    "hook_sae_recons",
    "hook_sae_error",
    "hook_sae_output",
)


@dataclass(frozen=True)
class SAEConfig:
    """What the maths needs (sae-lens's names), and the hook the SAE reads."""

    d_in: int
    d_sae: int
    hook_name: str | None = None
    architecture: Literal["standard", "jumprelu", "topk", "batchtopk", "gated"] = "standard"
    k: int | None = None  # topk only
    apply_b_dec_to_input: bool = True
    normalize_activations: Literal["none", "constant_norm_rescale", "layer_norm"] = "none"
    reshape_activations: Literal["none", "hook_z"] = "none"
    rescale_acts_by_decoder_norm: bool = False  # topk only: latents measured in units of |W_dec row|

    def __post_init__(self) -> None:
        if self.normalize_activations == "expected_average_only_in":
            raise ProbeError(f"SAE normalize_activations='expected_average_only_in' is not supported; {_NORM_FIX}")
        check_choices(self, "SAE config")
        if self.architecture == "topk" and not (isinstance(self.k, int) and 0 < self.k <= self.d_sae):
            raise ProbeError(f"a topk SAE needs k between 1 and d_sae={self.d_sae}, got k={self.k!r} (cfg.json 'k')")
        if self.rescale_acts_by_decoder_norm and self.architecture not in ("topk", "batchtopk"):
            raise ProbeError(
                f"rescale_acts_by_decoder_norm is read for topk and batchtopk SAEs only, not {self.architecture}; "
                "fold the decoder norms into the weights and set it to false"
            )


_NORM_FIX = (
    "its scaling factor is not in cfg.json: fold it into the weights (W_enc * s, W_dec / s, b_dec / s, "
    "threshold * s) and set normalize_activations='none'"
)


class SAE(nn.Module):
    """An inference SAE with sae-lens's hook points (see the module notes)."""

    W_enc: torch.Tensor  # [d_in, d_sae]; buffers, read from the file
    b_enc: torch.Tensor  # [d_sae]
    W_dec: torch.Tensor  # [d_sae, d_in]
    b_dec: torch.Tensor  # [d_in]
    threshold: torch.Tensor  # [d_sae], jumprelu and batchtopk only
    b_gate: torch.Tensor  # [d_sae], gated only (and r_mag, b_mag; no b_enc)
    r_mag: torch.Tensor
    b_mag: torch.Tensor
    scaling_factor: torch.Tensor  # [d_sae], sae-lens before 6 (finetuning_scaling_factor), when not all ones
    hook_sae_input: Any  # TransformerLens HookPoints
    hook_sae_acts_pre: Any
    hook_sae_acts_post: Any
    hook_sae_recons: Any
    hook_sae_error: Any
    hook_sae_output: Any

    def __init__(self, cfg: SAEConfig, tensors: dict[str, torch.Tensor]) -> None:
        from transformer_lens.hook_points import HookPoint

        super().__init__()
        self.cfg = cfg
        _check_tensors(cfg, tensors)
        for name in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold", "scaling_factor", "b_gate", "r_mag", "b_mag"):
            if name in tensors:  # float32 whatever the file held; attach_sae moves it to the model's precision
                self.register_buffer(name, tensors[name].detach().to(torch.float32, copy=True))
        for name in HOOKS:
            setattr(self, name, HookPoint())

    def __repr__(self) -> str:
        c = self.cfg
        return f"SAE({c.architecture}, d_in {c.d_in}, d_sae {c.d_sae}, hook {c.hook_name!r})"

    # --- the maths; ``hooked`` fires the hook points (the reference pass of the error term does not) ---

    def _in(self, x: torch.Tensor, hooked: bool) -> tuple[torch.Tensor, Any]:
        """The normalised, centred input [..., d_in] and what undoing the normalisation needs."""
        x = x.to(self.W_enc.dtype)
        if self.cfg.reshape_activations == "hook_z":
            x = x.flatten(-2)  # [..., head, d_head] -> [..., head * d_head]
        x = self.hook_sae_input(x) if hooked else x
        undo: Any = None
        if self.cfg.normalize_activations == "constant_norm_rescale":
            undo = (self.cfg.d_in**0.5) / x.norm(dim=-1, keepdim=True)
            x = x * undo
        elif self.cfg.normalize_activations == "layer_norm":
            mu = x.mean(-1, keepdim=True)
            std = (x - mu).std(-1, keepdim=True)
            x, undo = (x - mu) / (std + 1e-5), (mu, std)
        return x - self.b_dec * self.cfg.apply_b_dec_to_input, undo

    def _activate(self, pre: torch.Tensor) -> torch.Tensor:
        if self.cfg.architecture == "topk":
            top = pre.topk(int(self.cfg.k or 0), dim=-1)
            return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
        acts = pre.relu()
        jump = self.cfg.architecture in ("jumprelu", "batchtopk")
        return acts * (pre > self.threshold).to(acts.dtype) if jump else acts

    def encode(self, x: torch.Tensor, hooked: bool = True) -> tuple[torch.Tensor, Any]:
        """Latents [..., d_sae] of ``x`` (the hook's activation), and the normalisation to undo."""
        sae_in, undo = self._in(x, hooked)
        if self.cfg.architecture == "gated":  # sae-lens's GatedSAE: a gate and a magnitude path
            gate = (sae_in @ self.W_enc + self.b_gate > 0).to(sae_in.dtype)
            magnitude = sae_in @ (self.W_enc * self.r_mag.exp()) + self.b_mag
            magnitude = self.hook_sae_acts_pre(magnitude) if hooked else magnitude
            acts = gate * magnitude.relu()
            return (self.hook_sae_acts_post(acts) if hooked else acts), undo
        pre = sae_in @ self.W_enc + self.b_enc
        pre = self.hook_sae_acts_pre(pre) if hooked else pre
        if self.cfg.rescale_acts_by_decoder_norm:  # sae-lens's TopKSAE: after the pre hook, before top-k
            pre = pre * self.W_dec.norm(dim=-1)
        acts = self._activate(pre)
        return (self.hook_sae_acts_post(acts) if hooked else acts), undo

    def decode(self, acts: torch.Tensor, undo: Any, shape: torch.Size, hooked: bool = True) -> torch.Tensor:
        """The reconstruction of the hook's activation (its shape ``shape``) from latents."""
        if hasattr(self, "scaling_factor"):  # sae-lens before 6: finetuning_scaling_factor
            acts = acts * self.scaling_factor
        if self.cfg.rescale_acts_by_decoder_norm:
            acts = acts / self.W_dec.norm(dim=-1)
        out = acts @ self.W_dec + self.b_dec
        out = self.hook_sae_recons(out) if hooked else out
        if self.cfg.normalize_activations == "constant_norm_rescale":
            out = out / undo
        elif self.cfg.normalize_activations == "layer_norm":
            out = out * undo[1] + undo[0]
        return out.reshape(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction plus the error term: ``x`` itself unless a hook edits the SAE."""
        acts, undo = self.encode(x)
        recons = self.decode(acts, undo, x.shape)
        plain_acts, plain_undo = self.encode(x, hooked=False)
        error = x.to(recons.dtype) - self.decode(plain_acts, plain_undo, x.shape, hooked=False)
        error = self.hook_sae_error(error.flatten(-2) if self.cfg.reshape_activations == "hook_z" else error)
        return self.hook_sae_output(recons + error.reshape(x.shape)).to(x.dtype)


def _check_tensors(cfg: SAEConfig, tensors: dict[str, torch.Tensor]) -> None:
    want = {"W_enc": (cfg.d_in, cfg.d_sae), "b_enc": (cfg.d_sae,), "W_dec": (cfg.d_sae, cfg.d_in), "b_dec": (cfg.d_in,)}
    if cfg.architecture == "batchtopk" and "threshold" not in tensors:
        if "topk_threshold" not in tensors:
            raise ProbeError(
                "a batchtopk SAE runs as a JumpReLU with its trained 'topk_threshold' (or a 'threshold' [d_sae]); "
                "neither is in the weights: save the SAE with its threshold"
            )
        tensors["threshold"] = torch.ones(cfg.d_sae) * tensors.pop("topk_threshold").reshape(-1)[0].float()
    if cfg.architecture in ("jumprelu", "batchtopk"):
        want["threshold"] = (cfg.d_sae,)
    if cfg.architecture == "gated":
        del want["b_enc"]
        want |= {"b_gate": (cfg.d_sae,), "r_mag": (cfg.d_sae,), "b_mag": (cfg.d_sae,)}
    if "scaling_factor" in tensors:
        want["scaling_factor"] = (cfg.d_sae,)
    for name, shape in want.items():
        if name not in tensors:
            raise ProbeError(f"the SAE has no {name!r} tensor (a {cfg.architecture} SAE needs {', '.join(want)})")
        if tuple(tensors[name].shape) != shape:
            raise ProbeError(
                f"the SAE's {name} has shape {list(tensors[name].shape)}, expected {list(shape)} "
                f"(d_in={cfg.d_in}, d_sae={cfg.d_sae})"
            )
    for name in want:
        _check_values(name, tensors[name])


def _check_values(name: str, t: torch.Tensor) -> None:
    """Floating point and finite: integer weights would compute in integers, NaN would reach every logit."""
    if not t.is_floating_point():
        kind = str(t.dtype).removeprefix("torch.")
        raise ProbeError(
            f"the SAE's {name} holds {kind} values; an SAE's weights are floating point (save them as float32)"
        )
    if not bool(torch.isfinite(t).all()):
        raise ProbeError(f"the SAE's {name} holds NaN or inf; load an SAE whose weights are all finite")


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise ProbeError(f"no SAE weights at {path}; give a sae-lens folder (cfg.json + {WEIGHTS}) or a .safetensors")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ProbeError(f"cannot read {path} as safetensors: {str(exc).splitlines()[0]}") from None
    scale = tensors.pop("finetuning_scaling_factor", tensors.pop("scaling_factor", None))
    if scale is not None and not torch.all(scale == 1):
        tensors["scaling_factor"] = scale
    return tensors


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _typed(where: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str, default: Any = None) -> Any:
    """``where[key]``, or ``default`` when it is missing or null; one line when it is not ``what``
    (a JSON string "false" is not a boolean, and true is not a number)."""
    value = where.get(key)
    if value is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise ProbeError(f"the SAE config's {key!r} is {_show(value)}, not {what}; fix it in cfg.json")
    return value


def _dict(raw: Any, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProbeError(f"the SAE's {what} is {type(raw).__name__} {_show(raw)}, not a JSON object; fix cfg.json")
    return raw


def _hook(raw: dict[str, Any]) -> str | None:
    meta = _dict(raw.get("metadata") or raw.get("meta") or {}, "metadata")
    hook = _typed(meta, "hook_name", str, "a hook name") or _typed(raw, "hook_name", str, "a hook name")
    hook = hook or _typed(raw, "hook_point", str, "a hook name")
    head = meta.get("hook_head_index", raw.get("hook_head_index", raw.get("hook_point_head_index")))
    if head is not None:
        raise ProbeError(
            f"SAEs on one head of a hook (hook_head_index={_show(head)}) are not supported; use a whole-hook SAE"
        )
    return hook


def _refuse_transcoder(raw: dict[str, Any]) -> None:
    """A transcoder reads one hook and writes another (``hook_name_out``, ``d_out``): one line."""
    arch = raw.get("architecture")
    for key in ("hook_name_out", "d_out"):
        if raw.get(key) is not None or (isinstance(arch, str) and arch.endswith("transcoder")):
            raise ProbeError(
                f"the SAE config's {key!r} (architecture {_show(arch)}) makes it a transcoder, which writes another "
                "hook than it reads; attach_sae splices an SAE into one hook: load a plain SAE"
            )


def config_from_dict(raw: dict[str, Any]) -> SAEConfig:
    """sae-lens's cfg.json (6.x, or older: ``hook_point``, ``activation_fn_str``) -> SAEConfig.
    Every field is type-checked: a malformed config is one line naming the key."""
    raw = _dict(raw, "config")
    hook = _hook(raw)
    text = "a string"
    _refuse_transcoder(raw)
    activation = _typed(raw, "activation_fn_str", str, text) or _typed(raw, "activation_fn", str, text) or "relu"
    arch = "topk" if activation == "topk" else _typed(raw, "architecture", str, text, "standard")
    kwargs = _dict(raw.get("activation_fn_kwargs") or {}, "activation_fn_kwargs")
    k = None if arch == "batchtopk" else _typed(raw, "k", int, "an integer") or _typed(kwargs, "k", int, "an integer")
    norm = _typed(raw, "normalize_activations", (str, bool), text)
    norm = "none" if norm in (None, False) else "expected_average_only_in" if norm is True else norm
    for key in ("d_in", "d_sae"):
        if _typed(raw, key, int, "a positive integer", 0) <= 0:
            raise ProbeError(
                f"the SAE config has no positive integer {key!r}; sae-lens's cfg.json holds d_in and d_sae"
            )
    reshape = _typed(raw, "reshape_activations", str, text) or (
        "hook_z" if hook and hook.endswith("hook_z") else "none"
    )
    return SAEConfig(  # the Literal fields are checked in __post_init__
        d_in=raw["d_in"],
        d_sae=raw["d_sae"],
        hook_name=hook,
        architecture=cast(Any, arch),
        k=k,
        apply_b_dec_to_input=_typed(raw, "apply_b_dec_to_input", bool, "true or false", True),
        normalize_activations=cast(Any, norm),
        reshape_activations=cast(Any, reshape),
        rescale_acts_by_decoder_norm=_typed(raw, "rescale_acts_by_decoder_norm", bool, "true or false", False),
    )


def load_sae(path: str | Path, hook_name: str | None = None, architecture: str | None = None) -> SAE:
    """An SAE from a sae-lens folder (``cfg.json`` + ``sae_weights.safetensors``) or from one
    safetensors file (``W_enc``, ``b_enc``, ``W_dec``, ``b_dec``, and ``threshold`` for a JumpReLU
    SAE); ``hook_name`` says (or overrides) the hook it reads, ``architecture`` what a plain file
    holds (default: "jumprelu" when it has a threshold, else "standard"; "topk" needs a folder)."""
    if hook_name is not None and not isinstance(hook_name, str):
        raise ProbeError(f"hook_name must be a hook name, e.g. 'blocks.0.hook_resid_post', got {_show(hook_name)}")
    path = Path(path)
    if path.is_dir():
        cfg_file = path / CONFIG
        if not cfg_file.is_file():
            raise ProbeError(f"{path} has no {CONFIG}; a sae-lens folder holds {CONFIG} and {WEIGHTS}")
        try:
            raw = _dict(json.loads(cfg_file.read_text(encoding="utf-8")), "config")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProbeError(f"cannot read {cfg_file} as JSON: {exc}") from None
        except RecursionError:
            raise ProbeError(f"cannot read {cfg_file}: it nests too deeply for an SAE config") from None
        tensors = _read_tensors(path / WEIGHTS)
    else:
        tensors = _read_tensors(path)
        w = tensors.get("W_enc")
        if w is None or w.dim() != 2:
            raise ProbeError(f"{path} has no 2-D 'W_enc' [d_in, d_sae]; an SAE file holds W_enc, b_enc, W_dec, b_dec")
        raw = {"d_in": w.shape[0], "d_sae": w.shape[1]}
        raw["architecture"] = architecture or ("jumprelu" if "threshold" in tensors else "standard")
    if hook_name is not None:
        raw = {**raw, "hook_name": hook_name, "metadata": {}}
    elif architecture is not None:
        raw = {**raw, "architecture": architecture}
    return SAE(config_from_dict(raw), tensors)


def save_sae(sae: SAE, folder: str | Path) -> Path:
    """Write ``sae`` as a sae-lens 6 folder (``cfg.json`` + ``sae_weights.safetensors``)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = sae.cfg
    cfg = {
        "d_in": c.d_in,
        "d_sae": c.d_sae,
        "dtype": str(sae.W_enc.dtype).removeprefix("torch."),
        "device": "cpu",
        "apply_b_dec_to_input": c.apply_b_dec_to_input,
        "normalize_activations": c.normalize_activations,
        "reshape_activations": c.reshape_activations,
        "metadata": {"hook_name": c.hook_name, "sae_lens_version": "6.0.0"},
        "architecture": c.architecture,
        **(
            {"k": c.k, "rescale_acts_by_decoder_norm": c.rescale_acts_by_decoder_norm}
            if c.architecture in ("topk", "batchtopk")
            else {}
        ),
    }
    (folder / CONFIG).write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    save_file({k: v.detach().cpu().contiguous() for k, v in sae.state_dict().items()}, str(folder / WEIGHTS))
    return folder
