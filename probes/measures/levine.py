"""Levine et al. 2020's depth threshold (docs/kernels.md): the one formula every summary uses.

L_th = log3(d_model). Their theory (for linearised attention) gives depth below L_th a
double-exponential advantage over width; at or above it, depth and width contribute comparably
and width limits what added layers can give. The threshold is a floor for depth, not advice to
widen, and it concerns trained networks: random-init families get the number, never a label.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

BELOW = (
    "below the threshold, where their theory (for linearised attention) gives a double-exponential "
    "advantage of depth over width"
)
AT_OR_ABOVE = (
    "at or above the threshold, where in their theory (for linearised attention) depth and width "
    "contribute comparably and width limits what added layers can give; the threshold is a floor "
    "for depth, not advice to widen"
)

RANDOM_INIT = "random-init weights, so no regime label: the theory (for linearised attention) concerns trained networks"


def threshold(d_model: int) -> float:
    """L_th = log3(d_model)."""
    if d_model < 1:
        raise ValueError(f"d_model must be at least 1 for Levine et al.'s threshold, got {d_model}")
    return math.log(d_model) / math.log(3)


@dataclass(frozen=True)
class DepthNote:
    """A model's depth L and width d_model against L_th."""

    depth: int
    d_model: int
    random_init: bool = False  # untrained weights: the number, no side of the threshold

    @property
    def l_th(self) -> float:
        return threshold(self.d_model)

    @property
    def ratio(self) -> float:
        return self.depth / self.l_th if self.l_th > 0 else math.inf

    @property
    def below(self) -> bool:
        return self.depth < self.l_th

    def sentence(self) -> str:
        if self.random_init:
            return RANDOM_INIT
        return BELOW if self.below else AT_OR_ABOVE

    def line(self) -> str:
        return (
            f"depth L={self.depth}, d_model={self.d_model}, Levine et al. L_th = log3({self.d_model}) = "
            f"{self.l_th:.2f}, L/L_th = {self.ratio:.2f}: {self.sentence()}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "depth": self.depth,
            "d_model": self.d_model,
            "L_th": round(self.l_th, 3),
            "L_over_L_th": round(self.ratio, 3),
            "side": None if self.random_init else "below" if self.below else "at_or_above",
        }
