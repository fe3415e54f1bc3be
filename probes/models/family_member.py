"""One model shape of an equal-parameter family (:mod:`probes.models.families`): its depth and
widths, its target budget, and how it is built: a native pre-LN decoder (levine, petty) or a
depth-study network (spa)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from depthprobe.probes.base.errors import ProbeError

if TYPE_CHECKING:  # models import torch (and the network TransformerLens): loaded only where a member is built,
    # so the family tables stay light enough for `probe study --help`
    from depthprobe.probes.models.model import Model, NativeConfig
    from depthprobe.probes.models.variants import SPAConfig

NATIVE_VARIANT = "pre-ln"


@dataclass(frozen=True)
class Member:
    """One model shape of a family. ``d_ff`` is 0 for attention-only spa members;
    ``budget`` is the target non-embedding count (None for spa); ``variant`` is the spa variant
    name, or "pre-ln" for native members; ``shrink`` the petty mode; ``pair`` the levine pair
    (see :func:`levine` for depths shared by two pairs); ``match`` what the budget counts."""

    family: str
    name: str
    depth: int
    d_model: int
    n_heads: int
    d_head: int
    d_ff: int
    budget: int | None = None
    variant: str = NATIVE_VARIANT
    shrink: str | None = None
    pair: tuple[int, int] | None = None
    mlp: str = "none"  # spa: "none" (attention-only blocks) or "tat" (TAT leaky-ReLU MLPs, d_ff = 4 d_model)
    match: str = "nonembed"  # what ``budget`` counts: "nonembed" or "total" (with the embeddings)
    network: Literal["native", "spa"] = "native"  # built as the native decoder, or the hookable spa network

    @property
    def d_ff_ratio(self) -> float:
        """d_ff / d_model (0 for spa members, which have no MLP)."""
        return self.d_ff / self.d_model

    @property
    def d_attn(self) -> int:
        """Attention width n_heads * d_head (d_model except in petty's d_attn mode)."""
        return self.n_heads * self.d_head

    def native(self, vocab: int, context: int, seed: int) -> NativeConfig:
        """The native decoder of a levine or petty member."""
        from depthprobe.probes.models.model import NativeConfig

        if self.network == "spa":
            raise ProbeError(f"member {self.name} is an spa model; build it with Member.spa(...)")
        return NativeConfig(
            layers=self.depth,
            d_model=self.d_model,
            heads=self.n_heads,
            d_head=self.d_head,
            d_mlp=self.d_ff,
            d_vocab=vocab,
            n_ctx=context,
            attn_only=False,
            norm="ln",
            positional="learned",
            act_fn="gelu",
            seed=seed,
        )

    def spa(self, vocab: int, context: int, seed: int) -> SPAConfig:
        """The SPA model of an spa member: softmax attention for the baselines, attention-only or
        with TAT MLPs."""
        if self.network != "spa":
            raise ProbeError(f"member {self.name} is a native model; build it with Member.native(...)")
        from depthprobe.probes.models.variants import SPAConfig, variant_config

        return SPAConfig(
            **variant_config(self.variant, self.depth, attention="softmax"),
            width=self.d_model,
            heads=self.n_heads,
            n_ctx=context,
            d_vocab=vocab,
            seed=seed,
            mlp=self.mlp == "tat",
            mlp_kind="tat" if self.mlp == "tat" else "relu",
        )

    def build(self, vocab: int, context: int, seed: int, device: str | None = None) -> Model:
        """The member as a loaded :class:`Model` (random init with ``seed``)."""
        if self.network == "spa":
            from depthprobe.probes.models import variant_net

            return variant_net.build(self.spa(vocab, context, seed), device=device, name=self.name)
        from depthprobe.probes.models.loading import load

        return load(self.native(vocab, context, seed), device=device)
