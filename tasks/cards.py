"""Every task's card: its one-line description and its options, readable without importing the task.

`probe list tasks` and the options parser need only these, so listing the tasks loads neither
torch nor pandas. Each task module takes its ``Options`` and ``description`` from its card (a test
holds every registered task to its card). Enumerated options are ``Literal[...]``: the options
parser reads the choices from the annotation and refuses anything else with the choices named.
A new task adds a card here, a line in the task table (``tasks/__init__.py``) and its module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from depthprobe.probes.base.options import ranged

if TYPE_CHECKING:  # an annotation only: cards import probes/base alone
    from depthprobe.probes.data.memory import Text


@dataclass(frozen=True)
class AblationOptions:
    source: Literal["induction", "syntax", "coref", "attention-stats"] = "induction"
    heads: str = "auto"  # auto (the source's top k) or L-H,... (0-indexed)
    k: int = ranged(3, min=1)  # heads taken with heads=auto
    method: Literal["mean", "zero"] = "mean"


@dataclass(frozen=True)
class AttentionStatsOptions:
    top: int = ranged(5, min=1)  # heads listed per metric in the summary
    protocol: Literal["pooled", "clark"] = "pooled"  # see tasks/attention_stats.py's docstring


@dataclass(frozen=True)
class CorefOptions:
    format: Literal["auto", "conllu", "conll2012", "gap"] = "auto"
    views: int = ranged(4, min=0)  # evaluated mentions (or GAP examples) shown with the best head's attention
    gap_max_len: int = ranged(512, min=3)  # GAP texts longer than this many pieces (incl. specials) are skipped


@dataclass(frozen=True)
class DepthUsageOptions:
    skips: bool = True  # skip each block in turn (one extra pass per block); false: contributions (and lens) only
    lens: bool = True  # logit lens per layer (models with an unembedding)


@dataclass(frozen=True)
class HopAttentionOptions:
    letters: int = ranged(4, min=2)  # A, the letters of the khop family the model was trained on
    length: int = ranged(48, min=2)  # N, the letters per sequence (the input is 1 + N tokens)
    max_hop: int = ranged(4, min=1)  # J: hops j = 1..J probed
    hop: int = ranged(4, min=1)  # k, the hop count whose token leads every input (token A + k)
    sequences: int = ranged(256, min=1)  # sequences of the evaluation stream scored
    seed: int = ranged(0, min=0)  # the khop run seed whose evaluation stream is read
    threshold: float = ranged(0.5, above=0, max=1)  # mean attention a head needs to resolve a hop (and 3x chance)


@dataclass(frozen=True)
class InductionOptions:
    repeat_len: int = ranged(25, min=2)  # S, the length of r
    n_seqs: int = ranged(64, min=1)  # repeated sequences scored
    top: int = ranged(5, min=1)  # heads listed per metric in the summary
    icl_text: str | Text | None = None  # UTF-8 file or probes.Text for the ICL score (default: Tiny Shakespeare)
    icl_windows: int = ranged(64, min=0)  # at most this many text windows, evenly spread; 0 skips the ICL score


@dataclass(frozen=True)
class KernelsOptions:
    exclude_special: bool | None = None  # encoders: drop [CLS]/[SEP] (None: yes)
    include_bos: bool | None = None  # decoders: keep BOS in the kernel (None: no)
    layers: tuple[int, ...] = ranged((), min=0)  # layers whose kernels are saved and drawn; (): four spread over 0..L
    kernel_len: int = ranged(64, min=2)  # leading positions kept in the averaged kernel matrices
    n_random: int = ranged(16, min=1)  # random sequences for models without a tokenizer
    seq_len: int | None = ranged(None, min=2)  # their length (None: --max-len, capped at the model's context)


@dataclass(frozen=True)
class SyntaxOptions:
    parser: str | None = None  # spaCy pipeline (installed name or directory) to parse raw-text --data
    baseline_root: bool = True  # offsets may land on ROOT (position 0), as in Clark et al.'s code


@dataclass(frozen=True)
class Card:
    """What a task is, in one line, and the frozen dataclass of its options."""

    description: str
    options: type


CARDS: dict[str, Card] = {
    "ablation": Card(
        "Ablate the heads a source task finds (its top k, or -O heads=L-H,...) and k random control "
        "heads from the same layers; loss (causal) or embedding cosine (encoders) and the source "
        "task's scores, with and without",
        AblationOptions,
    ),
    "attention-stats": Card(
        "Per-head attention to [CLS]/BOS, [SEP], punctuation, previous/next token, self; entropy",
        AttentionStatsOptions,
    ),
    "coref": Card(
        "Antecedent selection by attention (Clark Table 2): CoNLL-U Entity chains, "
        "CoNLL-2012 *_conll, or GAP TSV; best head vs nearest / head-match / rule-based",
        CorefOptions,
    ),
    "depth-usage": Card(
        "What each block adds (Csordas et al. 2025): per layer ||c_l||/||h_l|| and cos(c_l, h_l), per skipped "
        "block the change of later contributions and of the output (KL, top-1 or 1 - cos), logit lens",
        DepthUsageOptions,
    ),
    "hop-attention": Card(
        "k-hop induction (Sanford et al. 2024), models trained on the khop family: per head and hop j, "
        "attention from i to p^j(i), to the previous token (i - 1) and to the previous occurrence of X_i "
        "(p(i) - 1), each with chance; per layer the largest hop a head resolves; accuracy",
        HopAttentionOptions,
    ),
    "induction": Card(
        "Per-head induction, previous-token and duplicate-token scores on repeated random "
        "tokens with chance levels; repeat copying and ICL scores (causal); copying and "
        "K-composition, trained and at init (native)",
        InductionOptions,
    ),
    "kernels": Card(
        "Signal propagation per layer: mean cosine, residual ratios, contraction exponent, effective ranks, "
        "kernel maps",
        KernelsOptions,
    ),
    "syntax": Card(
        "Clark et al. Table 1: per dependency relation, the head whose attention best finds "
        "the governor, vs a fixed-offset baseline (CoNLL-U, or raw text with --parser)",
        SyntaxOptions,
    ),
}
