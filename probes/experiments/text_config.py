"""What the text-study families (levine, petty, spa) share: their Config's common fields and presets.

A family's Config (``LevineConfig``, ``PettyConfig``, ``SpaConfig``) adds its own fields to
:class:`TextConfig`; the presets below set the common ones, each family module its own. Costs are
measured on this project's reference machine (2 CPU cores) and estimated for one large GPU. Importing
this module imports no torch (``probe list families`` reads it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import ranged
from depthprobe.probes.experiments import protocol
from depthprobe.probes.experiments.protocol import at_least, check_field_ranges, check_members, distinct, positive

BYTE_VOCAB = 257  # --vocab bytes: the 256 bytes and <|bos|>, no merges (data.corpus.MIN_VOCAB; not imported
# here, so that `probe study --help` loads no torch: tests/experiments/test_text_families.py checks they agree)
MAX_BUDGET = 10**12  # parameters: the width searches of probes.models.families stay short below it
MAX_VOCAB = 1_000_000  # BPE vocabulary (its training is refused, not run for hours, above this)
MAX_PROBE_ITEMS = 100_000  # validation lines or windows a member's probes read
MAX_PASSES = 4.0  # passes over the training split (Muennighoff et al. 2023: ~4 epochs of repeats cost little)


@dataclass(frozen=True)
class TextConfig(protocol.StudyConfig):
    """A text study's common settings. ``depths``: the depths (levine: the shallow L of each pair
    (L, 2L)); ``max_passes``: the most passes over the training split a member may make (a study
    over it is refused); ``lrs``: one rate, or a grid each tried on ``lr_fraction`` of the budget."""

    corpus: str | None = None  # None: the built-in Tiny Shakespeare
    vocab: int = ranged(1024, min=1, max=MAX_VOCAB)  # BYTE_VOCAB (257): byte-level, no merges
    d_head: int = ranged(16, min=1, max=4096)
    tokens_per_param: float = 20.0  # training tokens per non-embedding parameter of the budget
    min_tokens: int = 200_000  # the floor under tokens_per_param * budget
    max_passes: float = MAX_PASSES
    lrs: tuple[float, ...] = (3e-3,)
    lr_fraction: float = 0.2
    batch_size: int = 32
    context: int = 128
    probe_lines: int = ranged(200, min=1, max=MAX_PROBE_ITEMS)  # validation lines for attention-stats
    icl_windows: int = ranged(32, min=1, max=MAX_PROBE_ITEMS)  # validation windows for the ICL score
    max_params: int | None = None  # refuse members with more parameters than this (they fail, the rest go on)

    def __post_init__(self) -> None:
        check_field_ranges(self)  # the ranged() fields, a family's own included
        check_members(self)
        positive(self, "max_passes", "tokens_per_param")
        if not self.lrs or any(not (lr > 0 and math.isfinite(lr)) for lr in self.lrs):
            raise ProbeError(f"--lr must be positive numbers, e.g. --lr 1e-3,3e-3, got {list(self.lrs)}")
        distinct(self, "lrs", flag="--lr")
        if not 0 < self.lr_fraction <= 1:
            raise ProbeError(f"--lr-fraction must be in (0, 1], got {self.lr_fraction}")
        at_least(self, 1, "vocab", "d_head", "min_tokens", "batch_size", "probe_lines", "icl_windows")
        at_least(self, 8, "context")

    def tokens_for(self, budget: int | None) -> int:
        """The training tokens of a member whose non-embedding budget is ``budget`` (spa: its
        counted non-embedding parameters), rounded up to whole steps."""
        per_step = self.batch_size * self.context
        want = max(self.min_tokens, math.ceil(self.tokens_per_param * (budget or 0)))
        return math.ceil(want / per_step) * per_step


def check_budgets(budgets: tuple[int, ...]) -> None:
    if not budgets or any(b < 1 for b in budgets):
        raise ProbeError(f"--budgets must be positive, got {list(budgets)}")
    if max(budgets) > MAX_BUDGET:
        raise ProbeError(
            f"--budgets must be at most {MAX_BUDGET:.0e} parameters, got {max(budgets):.3g}; give smaller budgets"
        )


# the presets' common fields; each family module adds its own
COMMON: dict[str, dict[str, Any]] = {
    "smoke": {
        "vocab": 512,
        "context": 64,
        "batch_size": 8,
        "tokens_per_param": 5.0,
        "min_tokens": 65536,
        "d_head": 8,
        "probe_lines": 20,
        "icl_windows": 4,
    },
    "cpu": {"vocab": 1024, "context": 128, "batch_size": 32, "tokens_per_param": 20.0, "min_tokens": 1_000_000},
    "gpu": {
        "vocab": 1024,
        "context": 256,
        "batch_size": 64,
        "tokens_per_param": 20.0,
        "min_tokens": 4_000_000,
        "seeds": 3,
        "icl_windows": 256,  # the ICL score of one window has a standard error of about 3 nats
    },
}
GPU_COST = (
    "needs a --corpus of at least 8M training tokens (about 20 MB of English text; the built-in one is refused): "
    "about an hour on one large GPU (estimated; not run on a GPU yet), 10-20 hours on 2 CPU cores"
)


def parse_budgets(text: str) -> tuple[int, ...]:
    """``"50k,200k,1.6M,1e6,12345"`` -> (50000, 200000, 1600000, 1000000, 12345).

    Suffixes k (1e3) and M (1e6), either case; each budget must be a positive whole number after
    scaling, and none may repeat."""
    pieces = [p.strip() for p in str(text).split(",")]
    if not any(pieces):
        raise ProbeError("--budgets is empty: give non-embedding parameter counts such as 50k,200k,1.6M")
    out: list[int] = []
    for piece in pieces:
        if not piece:
            raise ProbeError(f"--budgets {text!r} has an empty entry; separate budgets with single commas")
        scale, digits = 1, piece
        if piece[-1] in "kKmM":
            scale, digits = (1000 if piece[-1] in "kK" else 1_000_000), piece[:-1]
        try:
            value = Decimal(digits) * scale
        except InvalidOperation:
            raise ProbeError(
                f"--budgets: {piece!r} is not a number; write counts like 50k, 1.6M, 1e6 or 12345"
            ) from None
        if not value.is_finite() or value != value.to_integral_value() or value < 1:
            raise ProbeError(f"--budgets: {piece!r} is not a positive whole number of parameters; e.g. 50k or 1.6M")
        if int(value) in out:
            raise ProbeError(f"--budgets: {piece!r} repeats budget {int(value)}; give each budget once")
        out.append(int(value))
    return tuple(out)


def parse_vocab(text: str) -> int:
    """``--vocab``: a BPE vocabulary size (at least 257), or ``bytes`` (the 256 bytes and <|bos|>)."""
    if text.strip().lower() == "bytes":
        return BYTE_VOCAB
    try:
        return int(text)
    except ValueError:
        raise ProbeError(f"--vocab expects a whole number such as 1024, or bytes, got {text!r}") from None
