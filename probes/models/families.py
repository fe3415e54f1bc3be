"""Equal-parameter model families for depth studies (Levine et al. 2020; Petty et al. 2023; He et al. 2023).

A family is a list of :class:`Member` shapes that differ in depth at a controlled non-embedding
parameter count. Sizes are solved with :func:`nonembed_params` (the count of the native pre-LN
block that :func:`probes.models.loading.load` builds), then every member is built once and counted
from its parameters with :func:`count_params`; a built count that differs from the formula is an
internal error. How far a member is from its budget is its ``budget_miss`` (reported in members.csv):
petty members are refused beyond 1% (:data:`TOLERANCE`, d_ff is solved freely), levine members
beyond 5% (:data:`LEVINE_TOLERANCE`: they stay on Levine's line, d_ff/d_model in [3, 5], so the
rest of the budget is reported, not absorbed into d_ff).

``match`` (levine, petty): ``"nonembed"`` matches the non-embedding count; ``"total"`` matches
non-embedding plus embedding (untied token embedding, learned positions and unembedding:
d_model * (2 vocab + context)), as Petty et al. matched total parameters.

- :func:`levine`: depth pairs (L, 2L) at a list of non-embedding budgets (Levine et al. 2020).
- :func:`petty`: one budget, many depths, shrinking d_ff, d_model or the attention width
  (Petty et al. 2023).
- :func:`spa`: fixed width, deep skipless variants against pre-LN (He et al. 2023).

Native members (levine, petty) are GPT-2-style decoders: learned positions, pre-LayerNorm, GELU
MLPs with biases, a final LayerNorm and an untied unembedding without bias. Non-embedding means
the blocks and the final LayerNorm; embedding means the token embedding, the positional
embedding and the unembedding.

Names are filesystem-safe and sort in study order: budgets in thousands padded to four digits
(``b0050k``; a budget that is not a whole number of thousands keeps its remainder, ``b0012k345``)
and depths padded to two digits (``L04``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.models.family_member import Member

FAMILIES = ("levine", "petty", "spa")
SHRINKS = ("d_ff", "d_model", "d_attn")
SPA_MLPS = ("none", "tat")  # spa members: attention-only, or with TAT MLPs
MATCHES = ("nonembed", "total")
TOLERANCE = 0.01  # petty members match their target within 1%
LEVINE_TOLERANCE = 0.05  # levine members, on the 12 L d^2 line, within 5% (their miss is reported)
LEVINE_RATIO = (3, 5)  # levine's d_ff / d_model range (Levine et al.: 4)
LEVINE_MIN_HEADS = 2

# top-level parameter names: the native model (TransformerLens NativeModel) and VariantTransformer
EMBEDDING = frozenset({"tok_embed", "pos", "head", "W_E", "W_P", "W_U"})
NON_EMBEDDING = frozenset({"layers", "ln_out", "blocks"})


# ----------------------------------------------------------------------------- counting


def count_params(model: Any) -> tuple[int, int]:
    """(non-embedding, embedding) parameter counts of a built model, each tensor once.

    ``model``: a :class:`Model`, a TransformerBridge over a native model, the native model itself
    or an :class:`~probes.models.variant_net.VariantTransformer`. Embedding: token embedding, positional
    embedding, unembedding and its bias (tok_embed, pos, head; W_E, W_P, W_U). Non-embedding: the
    blocks and the final norm (layers, ln_out; blocks)."""
    module = getattr(model, "bridge", model)
    module = getattr(module, "original_model", module)
    nonembed = embed = 0
    for name, p in module.named_parameters():  # named_parameters yields shared tensors once
        top = name.split(".", 1)[0]
        if top in EMBEDDING:
            embed += p.numel()
        elif top in NON_EMBEDDING:
            nonembed += p.numel()
        else:
            raise ProbeError(f"count_params: parameter {name!r} is neither embedding nor non-embedding")
    return nonembed, embed


def nonembed_params(depth: int, d_model: int, d_attn: int, d_ff: int) -> int:
    """Non-embedding count of a native member (blocks + final LayerNorm, biases included).

    Per block: ln1 and ln2 (2 d each), Q, K, V (d x d_attn + d_attn each), O (d_attn x d + d),
    fc_in (d x d_ff + d_ff), fc_out (d_ff x d + d): 4 d d_attn + 3 d_attn + (2 d + 1) d_ff + 6 d.
    With d_attn = d and d_ff = 4 d that is Levine's 12 d^2 plus lower-order terms."""
    d = d_model
    return depth * (4 * d * d_attn + 3 * d_attn + (2 * d + 1) * d_ff + 6 * d) + 2 * d


def embed_params(d_model: int, vocab: int, context: int) -> int:
    """Embedding count of a native member: token embedding, learned positions, unembedding."""
    return d_model * (2 * vocab + context)


def flops_per_token(nonembed: int, unembed: int, depth: int, d_attn: int, context: int) -> float:
    """Training FLOPs per token (forward + backward), after Kaplan et al. 2020 (Table 1):
    C = 6 N + 6 L n_ctx d_attn, with N = ``nonembed`` + ``unembed`` (the unembedding matmul,
    d_model x vocab; the embedding lookups cost nothing) and the attention term counting the
    full context per token (causal masking is ignored, as Kaplan et al. do). Multiply by the
    tokens trained on."""
    return 6.0 * (nonembed + unembed) + 6.0 * depth * context * d_attn


# ----------------------------------------------------------------------------- solving


def _solve_d_ff(budget: int, depth: int, d_model: int, d_attn: int, per_width: int = 0) -> int:
    """The integer d_ff whose count (non-embedding + ``per_width`` * d_model) is nearest ``budget``
    (may be < 1)."""
    fixed = nonembed_params(depth, d_model, d_attn, 0) + per_width * d_model
    return round((budget - fixed) / (depth * (2 * d_model + 1)))


def _count(depth: int, width: int, d_ff: int, extra: int) -> int:  # d_attn = d_model, embeddings by ``extra``
    return nonembed_params(depth, width, width, d_ff) + extra * width


def _miss(budget: int, count: int) -> float:
    return abs(count - budget) / budget


def _fits(budget: int, depth: int, d_model: int, d_attn: int, d_ff: int, per_width: int = 0) -> bool:
    count = nonembed_params(depth, d_model, d_attn, d_ff) + per_width * d_model
    return d_ff >= 1 and _miss(budget, count) <= TOLERANCE


def _needed(budget: int, depth: int, d_model: int, d_attn: int, d_ff_min: int, per_width: int = 0) -> int:
    """The smallest exact count at this shape that is at least ``budget`` with d_ff >= d_ff_min."""
    fixed = nonembed_params(depth, d_model, d_attn, 0) + per_width * d_model
    d_ff = max(d_ff_min, math.ceil((budget - fixed) / (depth * (2 * d_model + 1))))
    return nonembed_params(depth, d_model, d_attn, d_ff) + per_width * d_model


def per_width(match: str, vocab: int, context: int) -> int:
    """Embedding parameters per unit of d_model that ``match`` counts: 0 for ``"nonembed"``,
    2 vocab + context for ``"total"`` (see :func:`embed_params`)."""
    if match not in MATCHES:
        raise ProbeError(f"unknown --match {match!r}{suggest(match, MATCHES)}; choose from {', '.join(MATCHES)}")
    return 0 if match == "nonembed" else 2 * vocab + context


def budget_miss(member: Member, vocab: int, context: int) -> float:
    """(counted - budget) / budget of a levine or petty member under its ``match`` (signed)."""
    assert member.budget is not None
    count = nonembed_params(member.depth, member.d_model, member.d_attn, member.d_ff)
    count += per_width(member.match, vocab, context) * member.d_model
    return (count - member.budget) / member.budget


def _thousands(budget: int) -> str:
    k, rest = divmod(budget, 1000)
    return f"b{k:04d}k" + (f"{rest:03d}" if rest else "")


def _check_depths(depths: Sequence[int], family: str) -> tuple[int, ...]:
    out = tuple(int(d) for d in depths)
    if not out:
        raise ProbeError(f"{family}: --depths is empty; give depths such as 1,2,4,8")
    if any(d < 1 for d in out):
        raise ProbeError(f"{family}: every depth must be at least 1, got {', '.join(map(str, out))}")
    if len(set(out)) != len(out):
        raise ProbeError(f"{family}: --depths repeats a depth ({', '.join(map(str, out))}); give each depth once")
    return out


def _check_positive(family: str, **values: int) -> None:
    for key, value in values.items():
        if value < 1:
            raise ProbeError(f"{family}: {key} must be at least 1, got {value}")


@functools.lru_cache(maxsize=256)
def _built_nonembed(depth: int, d_model: int, n_heads: int, d_head: int, d_ff: int) -> int:
    shape = Member("levine", "check", depth, d_model, n_heads, d_head, d_ff)
    return count_params(shape.build(vocab=1, context=1, seed=0, device="cpu"))[0]


def _verified(member: Member) -> Member:
    """``member`` after building it once: its counted non-embedding size is the formula's."""
    counted = _built_nonembed(member.depth, member.d_model, member.n_heads, member.d_head, member.d_ff)
    expected = nonembed_params(member.depth, member.d_model, member.d_attn, member.d_ff)
    if counted != expected:
        raise ProbeError(
            f"internal error: member {member.name} counts {counted} non-embedding parameters, the formula "
            f"{expected}; report this with the family options"
        )
    return member


# ----------------------------------------------------------------------------- levine


def levine(
    budgets: Sequence[int],
    pairs: Sequence[tuple[int, int]] = ((2, 4), (4, 8)),
    d_head: int = 16,
    match: str = "nonembed",
    vocab: int = 1024,
    context: int = 128,
) -> list[Member]:
    """Depth pairs at equal budgets, each member on Levine et al.'s (2020) 12 L d^2 line.

    For each budget B and depth L the widths d_model = 16, 24, 32, ... (multiples of 8) are tried;
    each gets the widest head of ``d_head``, ``d_head / 2``, ... that leaves at least 2 heads (8
    when none does) and the d_ff that brings its count nearest B, clamped to [3, 5] d_model. Of the
    widths whose count is then within 5% of B (:data:`LEVINE_TOLERANCE`), the one whose d_ff is
    nearest 4 d_model wins (ties: the smaller miss), so the rest of the budget is a reported miss
    (:func:`budget_miss`), not absorbed into d_ff. A budget no width meets is refused, naming the
    budgets that work. ``match``, ``vocab``, ``context``: see the module docstring.

    A depth that appears in two pairs (4 in (2, 4) and (4, 8)) is one member per budget, shared by
    both pairs: it is listed once, at its first pair, with ``pair`` set to that first pair. Find a
    pair's two members with :func:`pair_members`. Members are ordered by budget, then depth."""
    _check_positive("levine", d_head=d_head, vocab=vocab, context=context)
    extra = per_width(match, vocab, context)
    budgets = tuple(int(b) for b in budgets)
    if not budgets:
        raise ProbeError("levine: --budgets is empty; give non-embedding budgets such as 50k,200k")
    if any(b < 1 for b in budgets):
        raise ProbeError(f"levine: budgets must be positive, got {', '.join(map(str, budgets))}")
    pair_list = _check_pairs(pairs)
    first_pair: dict[int, tuple[int, int]] = {}
    for pair in pair_list:
        for depth in pair:
            first_pair.setdefault(depth, pair)
    members = []
    for budget in sorted(set(budgets)):
        for depth in sorted(first_pair):
            d_model, head, d_ff = _levine_shape(budget, depth, d_head, extra)
            member = Member(
                family="levine",
                name=f"levine-{_thousands(budget)}-L{depth:02d}",
                depth=depth,
                d_model=d_model,
                n_heads=d_model // head,
                d_head=head,
                d_ff=d_ff,
                budget=budget,
                pair=first_pair[depth],
                match=match,
            )
            members.append(_verified(member))
    return members


def pair_members(members: Sequence[Member], budget: int, pair: tuple[int, int]) -> tuple[Member, Member]:
    """The (shallow, deep) members of a levine ``pair`` at ``budget`` (shared depths included)."""
    found = {m.depth: m for m in members if m.pair is not None and m.budget == budget}
    try:
        return found[pair[0]], found[pair[1]]
    except KeyError:
        raise ProbeError(f"levine: no members for pair {pair} at budget {budget}; build them with levine()") from None


def _check_pairs(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for pair in pairs:
        if len(pair) != 2 or not 1 <= int(pair[0]) < int(pair[1]):
            raise ProbeError(f"levine: a depth pair is (shallow, deep) with 1 <= shallow < deep, got {tuple(pair)}")
        out.append((int(pair[0]), int(pair[1])))
    if not out:
        raise ProbeError("levine: no depth pairs; give pairs such as (2, 4), (4, 8)")
    return out


def _levine_head(width: int, d_head: int) -> int:
    """The widest of d_head, d_head / 2, ... dividing ``width`` into at least 2 heads (else 8)."""
    head = d_head
    while head >= 1:
        if width % head == 0 and width // head >= LEVINE_MIN_HEADS:
            return head
        head //= 2
    return 8


def _levine_shape(budget: int, depth: int, d_head: int, extra: int) -> tuple[int, int, int]:
    """(d_model, d_head, d_ff) of the levine member at ``budget`` and ``depth`` (see :func:`levine`)."""
    low, high = LEVINE_RATIO
    best: tuple[float, float, int, int] | None = None
    width = 16
    while _count(depth, width, low * width, extra) <= budget * (1 + LEVINE_TOLERANCE):
        d_ff = min(high * width, max(low * width, _solve_d_ff(budget, depth, width, width, extra)))
        miss = _miss(budget, _count(depth, width, d_ff, extra))
        key = (abs(d_ff / width - 4), miss, width, d_ff)
        if miss <= LEVINE_TOLERANCE and (best is None or key < best):
            best = key
        width += 8
    if best is not None:
        return best[2], _levine_head(best[2], d_head), best[3]
    line = f"at least {LEVINE_MIN_HEADS} heads and d_ff/d_model in [{low}, {high}], within {LEVINE_TOLERANCE:.0%}"
    smallest = _count(depth, 16, low * 16, extra)
    if budget < smallest:
        raise ProbeError(
            f"levine: budget {budget} is too small for depth {depth} on the 12 L d^2 line ({line}); the smallest "
            f"budget that works is {smallest} (d_model 16, d_ff 48): raise --budgets to at least {smallest} or use "
            "shallower --depths"
        )
    below = _count(depth, width - 8, high * (width - 8), extra)
    above = _count(depth, width, low * width, extra)
    raise ProbeError(
        f"levine: budget {budget} falls between the widths of depth {depth} on the 12 L d^2 line ({line}); "
        f"budgets that work nearby: up to {below} (d_model {width - 8}) or from {above} (d_model {width}); "
        "pick one of those for --budgets"
    )


# ----------------------------------------------------------------------------- petty


def petty(
    budget: int,
    depths: Sequence[int] = (1, 2, 3, 4, 6, 8),
    shrink: str = "d_ff",
    d_model: int = 64,
    d_head: int = 16,
    match: str = "nonembed",
    vocab: int = 1024,
    context: int = 128,
) -> list[Member]:
    """One budget across depths (Petty et al. 2023); ``shrink`` picks what pays for depth.

    Petty et al.'s headline is compositional generalisation after fine-tuning; the language-model
    loss at equal parameters is their secondary result, and the only one a study measures.

    - ``d_ff``: d_model and heads (d_model / d_head) fixed; d_ff is solved per depth to hit the
      budget. Impossible once attention and norms alone leave no room for d_ff >= 1.
    - ``d_model``: d_model moves in steps of d_head (d_head fixed, heads = d_model / d_head); the
      step whose count with d_ff = 4 d_model is nearest the budget is taken, then d_ff is solved to
      hit the budget, so d_ff / d_model is near 4 but not exactly 4 (at small budgets, where a
      step of d_head is a large part of d_model, it can stray far from 4). With ``match="total"``
      the count includes the embeddings, which shrink with d_model (Petty et al. matched totals).
    - ``d_attn``: d_model fixed; the attention width d_attn = heads * d_head shrinks (d_head
      fixed, 1 to d_model / d_head heads) and d_ff takes up the rest of the budget; the heads count
      whose solved d_ff is nearest 4 d_model wins (ties: more heads).

    ``d_model`` is the fixed width of the d_ff and d_attn modes (unused by the d_model mode).
    ``match``, ``vocab``, ``context``: see the module docstring. Members are ordered by depth."""
    if shrink not in SHRINKS:
        raise ProbeError(
            f"petty: unknown --shrink {shrink!r}{suggest(shrink, SHRINKS)}; choose from {', '.join(SHRINKS)}"
        )
    budget = int(budget)
    _check_positive("petty", budget=budget, d_model=d_model, d_head=d_head, vocab=vocab, context=context)
    extra = per_width(match, vocab, context)
    if shrink != "d_model" and d_model % d_head:
        raise ProbeError(f"petty: d_model={d_model} is not a multiple of d_head={d_head}; pick a multiple")
    depths = _check_depths(depths, "petty")
    solve = functools.partial(PETTY_SOLVERS[shrink], extra=extra)
    members = []
    for depth in sorted(depths):
        shape = solve(budget, depth, d_model, d_head)
        if shape is None:
            raise _petty_error(budget, depth, depths, shrink, d_model, d_head, solve, extra)
        width, heads, d_ff = shape
        member = Member(
            family="petty",
            name=f"petty-{shrink}-{_thousands(budget)}-L{depth:02d}",
            depth=depth,
            d_model=width,
            n_heads=heads,
            d_head=d_head,
            d_ff=d_ff,
            budget=budget,
            shrink=shrink,
            match=match,
        )
        members.append(_verified(member))
    return members


Shape = tuple[int, int, int] | None  # (d_model, heads, d_ff) or None when nothing fits


def _petty_d_ff(budget: int, depth: int, d_model: int, d_head: int, extra: int = 0) -> Shape:
    d_ff = _solve_d_ff(budget, depth, d_model, d_model, extra)
    return (d_model, d_model // d_head, d_ff) if _fits(budget, depth, d_model, d_model, d_ff, extra) else None


def _petty_d_model(budget: int, depth: int, d_model: int, d_head: int, extra: int = 0) -> Shape:
    # the count with d_ff = 4 d grows with d: walk up until it passes the budget
    width = d_head
    while _count(depth, width + d_head, 4 * (width + d_head), extra) <= budget:
        width += d_head
    above = width + d_head
    low, high = _count(depth, width, 4 * width, extra), _count(depth, above, 4 * above, extra)
    if budget > low and high - budget < budget - low:
        width = above
    d_ff = _solve_d_ff(budget, depth, width, width, extra)
    return (width, width // d_head, d_ff) if _fits(budget, depth, width, width, d_ff, extra) else None


def _petty_d_attn(budget: int, depth: int, d_model: int, d_head: int, extra: int = 0) -> Shape:
    best: Shape = None
    for heads in range(d_model // d_head, 0, -1):
        d_ff = _solve_d_ff(budget, depth, d_model, heads * d_head, extra)
        if _fits(budget, depth, d_model, heads * d_head, d_ff, extra) and (
            best is None or abs(d_ff - 4 * d_model) < abs(best[2] - 4 * d_model)
        ):
            best = (d_model, heads, d_ff)
    return best


PETTY_SOLVERS = {"d_ff": _petty_d_ff, "d_model": _petty_d_model, "d_attn": _petty_d_attn}


def _petty_error(
    budget: int,
    depth: int,
    depths: Sequence[int],
    shrink: str,
    d_model: int,
    d_head: int,
    solve: Callable[[int, int, int, int], Shape],
    extra: int = 0,
) -> ProbeError:
    # the narrowest shape the mode can build at this depth, with d_ff >= 1
    width = d_head if shrink == "d_model" else d_model
    d_attn = d_head if shrink in ("d_model", "d_attn") else d_model
    need = _needed(budget, depth, width, d_attn, 1, extra)
    fitting = [L for L in range(1, max(depths) + 1) if solve(budget, L, d_model, d_head) is not None]
    what = {"d_ff": f"d_model={d_model}", "d_model": f"d_model={d_head}", "d_attn": f"d_model={d_model} and one head"}
    fix = f"use --depths up to {max(fitting)} or raise" if fitting else "raise"
    counted = "parameters in all" if extra else "non-embedding parameters"
    return ProbeError(
        f"petty: budget {budget} is too small for depth {depth} with --shrink {shrink} (attention and norms "
        f"at {what[shrink]} leave no room for d_ff >= 1; that depth needs {need} {counted}); "
        f"{fix} --budgets to at least {need}"
    )


# ----------------------------------------------------------------------------- spa


def spa(
    width: int = 64,
    depths: Sequence[int] = (8, 16, 32),
    variants: Sequence[str] = ("pre-ln", "vanilla", "e-spa", "u-spa", "value-skipinit"),
    heads: int = 4,
    mlp: str = "none",
) -> list[Member]:
    """Deep skipless variants at one width (He et al. 2023): every variant at every depth.

    ``mlp`` "none": every member is attention-only (``d_ff`` = 0): E-SPA, U-SPA and Value-SkipInit
    hold a target kernel that plain ReLU MLPs would undo (docs/protocols.md §3.6). "tat": every member has
    MLP blocks (``d_ff`` = 4 width) with TAT leaky ReLUs whose slopes share the kernel budget with
    the attention (:mod:`probes.measures.tat`), He et al.'s setting; names end in ``-tat``. Either
    way the baselines (pre-LN, vanilla) get the same blocks, for an equal comparison. Baselines use
    softmax attention. Members have token embeddings W_E and an unembedding W_U and no positional
    embedding unless the study's ``positional`` is learned (W_P, set by its job); ``budget`` is None
    (the variants differ only by LayerNorm gains or Value-SkipInit's per-head alpha, beta).
    Non-causal variants (``dong``) are refused: a language model must not see the next token.
    Members are ordered by variant, then depth."""
    _check_positive("spa", width=width, heads=heads)
    if width % heads:
        raise ProbeError(f"spa: width={width} is not divisible by heads={heads}; pick a multiple")
    depths = _check_depths(depths, "spa")
    if mlp not in SPA_MLPS:
        raise ProbeError(f"spa: unknown --mlp {mlp!r}{suggest(mlp, SPA_MLPS)}; choose from {', '.join(SPA_MLPS)}")
    from depthprobe.probes.models.variants import VARIANTS, variant_config

    causal = [v for v in VARIANTS if variant_config(v, 1).get("causal", True)]
    if not variants:
        raise ProbeError(f"spa: no variants; choose from {', '.join(causal)}")
    if len(set(variants)) != len(variants):
        raise ProbeError(f"spa: variants repeat ({', '.join(variants)}); give each once")
    for v in variants:
        if v not in causal:
            reason = " (it is non-causal, so it cannot train a language model)" if v in VARIANTS else ""
            raise ProbeError(f"spa: unknown variant {v!r}{reason}{suggest(v, causal)}; choose from {', '.join(causal)}")
    members = []
    for variant in variants:
        for depth in sorted(depths):
            member = Member(
                family="spa",
                name=f"spa-{variant}-w{width:03d}-L{depth:02d}" + ("-tat" if mlp == "tat" else ""),
                depth=depth,
                d_model=width,
                n_heads=heads,
                d_head=width // heads,
                d_ff=4 * width if mlp == "tat" else 0,
                variant=variant,
                mlp=mlp,
                network="spa",
            )
            member.spa(vocab=1, context=1, seed=0)  # SPAConfig validates the combination
            members.append(member)
    return members
