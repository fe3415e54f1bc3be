"""Equal-parameter families: sizes solved to a budget, counted from the built models."""

from itertools import pairwise

import pytest
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.experiments.text_config import parse_budgets
from depthprobe.probes.models import families as F
from depthprobe.probes.models import variant_net, variants
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import NativeConfig
from depthprobe.probes.training.fast_forward import fast_logits


def counted(member, vocab=64, context=16):
    return F.count_params(member.build(vocab, context, seed=0, device="cpu"))


def within_budget(member):
    nonembed, _ = counted(member)
    assert abs(nonembed - member.budget) <= 0.01 * member.budget, member
    assert nonembed == F.nonembed_params(member.depth, member.d_model, member.d_attn, member.d_ff)


@pytest.mark.parametrize(
    "cfg",
    [
        NativeConfig(layers=2, d_model=32, heads=2, d_head=8, d_mlp=40, attn_only=False, d_vocab=50, n_ctx=16),
        NativeConfig(layers=1, d_model=48, heads=3, d_mlp=100, attn_only=False, d_vocab=7, n_ctx=9),
        NativeConfig(layers=3, d_model=16, heads=2, attn_only=True, d_vocab=11, n_ctx=5),
    ],
)
def test_count_params_splits_n_params(cfg):
    nonembed, embed = F.count_params(load(cfg, device="cpu"))
    assert nonembed + embed == cfg.n_params()
    assert embed == 2 * cfg.d_vocab * cfg.d_model + cfg.n_ctx * cfg.d_model
    assert embed == F.embed_params(cfg.d_model, cfg.d_vocab, cfg.n_ctx)
    if not cfg.attn_only:
        assert nonembed == F.nonembed_params(cfg.layers, cfg.d_model, cfg.heads * cfg.head_dim, cfg.d_mlp)


def test_count_params_of_spa_models():
    for variant, extra in (("vanilla", 0), ("pre-ln", 2 * 32), ("value-skipinit", 2 * 4)):
        cfg = variants.SPAConfig(**variants.variant_config(variant, 3), width=32, heads=4, d_vocab=10, n_ctx=8)
        nonembed, embed = F.count_params(variant_net.VariantTransformer(cfg))
        assert embed == 2 * 10 * 32  # W_E and W_U
        assert nonembed == 3 * (4 * 32 * 32 + extra)
        assert nonembed + embed == cfg.n_params()


def test_nonembed_formula_by_hand():
    # per block: LN 2*64*2, QKV 3*(64*64+64), O 64*64+64, fc_in 64*256+256, fc_out 256*64+64; final LN 128
    block = 256 + 3 * (4096 + 64) + 4096 + 64 + 16384 + 256 + 16384 + 64
    assert F.nonembed_params(2, 64, 64, 256) == 2 * block + 128 == 100096


def test_levine_hits_the_exact_shape_of_a_known_budget():
    (shallow, deep) = F.levine([100096], pairs=((1, 2),))
    assert (deep.depth, deep.d_model, deep.n_heads, deep.d_head, deep.d_ff) == (2, 64, 4, 16, 256)
    assert counted(deep)[0] == 100096
    assert shallow.depth == 1 and shallow.pair == deep.pair == (1, 2)
    assert deep.name == "levine-b0100k096-L02" and deep.variant == "pre-ln" and deep.shrink is None


def test_levine_members_share_budgets_and_shared_depths():
    members = F.levine([25_000, 60_000], pairs=((2, 4), (4, 8)))
    assert [(m.budget, m.depth) for m in members] == [(b, L) for b in (25_000, 60_000) for L in (2, 4, 8)]
    for m in members:  # levine members stay on the line and report what they miss (at most 5%)
        assert counted(m)[0] == F.nonembed_params(m.depth, m.d_model, m.d_attn, m.d_ff)
        assert abs(F.budget_miss(m, 1024, 128)) <= F.LEVINE_TOLERANCE
        assert m.n_heads >= 2 and m.n_heads * m.d_head == m.d_model and 3 <= m.d_ff / m.d_model <= 5
    for budget in (25_000, 60_000):
        a = F.pair_members(members, budget, (2, 4))
        b = F.pair_members(members, budget, (4, 8))
        assert a[1] is b[0]  # depth 4 is one member in both pairs
        assert a[0].budget == a[1].budget == b[1].budget == budget
        assert a[1].pair == (2, 4) and b[1].pair == (4, 8)
    with pytest.raises(ProbeError, match="no members for pair"):
        F.pair_members(members, 25_000, (1, 2))


def test_levine_widths_follow_sqrt_budget():
    # 12 L d^2 = B with B = 12 * 2 * 64^2 lands on d_model 64 (nearest multiple of 16) at depth 2
    (m,) = [m for m in F.levine([12 * 2 * 64 * 64], pairs=((1, 2),)) if m.depth == 2]
    assert m.d_model == 64 and 200 < m.d_ff < 256


def test_levine_too_small_names_the_budget_that_works():
    need = F.nonembed_params(4, 16, 16, 48)  # narrowest on the line: d_model 16 (2 heads of 8), d_ff = 3 d_model
    with pytest.raises(ProbeError) as err:
        F.levine([1000], pairs=((2, 4),))
    msg = str(err.value)
    assert "\n" not in msg and f"at least {F.nonembed_params(2, 16, 16, 48)}" in msg and "shallower --depths" in msg
    with pytest.raises(ProbeError, match=f"depth 4 .* at least {need} "):
        F.levine([F.nonembed_params(2, 16, 16, 48)], pairs=((2, 4),))
    (deep,) = [m for m in F.levine([need], pairs=((1, 4),)) if m.depth == 4]
    assert (deep.d_model, deep.n_heads, deep.d_ff) == (16, 2, 48) and counted(deep)[0] == need


def test_levine_bad_pairs_and_budgets():
    with pytest.raises(ProbeError, match="shallow < deep"):
        F.levine([50_000], pairs=((4, 2),))
    with pytest.raises(ProbeError, match="positive"):
        F.levine([0])


def test_petty_d_ff_falls_with_depth():
    members = F.petty(60_000, depths=(1, 2, 3, 4), shrink="d_ff", d_model=32)
    assert [m.depth for m in members] == [1, 2, 3, 4]
    assert {(m.d_model, m.n_heads) for m in members} == {(32, 2)}
    d_ff = [m.d_ff for m in members]
    assert all(a > b for a, b in pairwise(d_ff)), d_ff
    for m in members:
        within_budget(m)
        assert m.name == f"petty-d_ff-b0060k-L{m.depth:02d}" and m.shrink == "d_ff"


def test_petty_d_model_falls_with_depth_and_keeps_d_ff_near_four_widths():
    members = F.petty(200_000, depths=(1, 2, 4, 8), shrink="d_model")
    assert [m.d_model for m in members] == [128, 96, 64, 48]  # sqrt(200k / 12 L) in steps of 16
    for m in members:
        within_budget(m)
        assert m.d_model % 16 == 0 and m.n_heads == m.d_model // 16 and m.d_head == 16
        assert 2.5 < m.d_ff / m.d_model < 5.5


def test_petty_d_attn_drops_heads_and_builds():
    members = F.petty(60_000, depths=(1, 2, 4, 6), shrink="d_attn", d_model=32, d_head=8)
    heads = [m.n_heads for m in members]
    assert all(a >= b for a, b in pairwise(heads)) and heads[0] > heads[-1], heads
    assert {m.d_model for m in members} == {32}
    for m in members:
        within_budget(m)
        # among the possible head counts, d_ff is the one nearest 4 * d_model
        options = [F._solve_d_ff(m.budget, m.depth, 32, h * 8) for h in range(1, 5)]
        assert abs(m.d_ff - 128) == min(abs(f - 128) for f in options)
    narrow = members[-1]
    assert narrow.d_attn < narrow.d_model
    model = narrow.build(vocab=20, context=8, seed=1, device="cpu")
    tokens = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(fast_logits(model, tokens), model.bridge(tokens), atol=1e-5, rtol=1e-4)


def test_petty_impossible_depth_names_the_largest_that_fits():
    # d_model 64: a block without MLP takes 4*64*64 + 3*64 + 6*64 + 129 (d_ff = 1) = 17089
    with pytest.raises(ProbeError) as err:
        F.petty(200_000, depths=(1, 2, 16), shrink="d_ff")
    msg = str(err.value)
    need = F.nonembed_params(16, 64, 64, 1)
    assert "\n" not in msg and "depth 16" in msg
    assert f"use --depths up to 11 or raise --budgets to at least {need}" in msg
    F.petty(need, depths=(16,), shrink="d_ff")  # the named budget works
    with pytest.raises(ProbeError, match=r"raise --budgets to at least \d+$"):
        F.petty(1000, depths=(1,), shrink="d_attn")


def test_petty_bad_options():
    with pytest.raises(ProbeError, match="did you mean 'd_ff'"):
        F.petty(50_000, shrink="d-ff")
    with pytest.raises(ProbeError, match="repeats a depth"):
        F.petty(50_000, depths=(2, 2))
    with pytest.raises(ProbeError, match="multiple of d_head"):
        F.petty(50_000, d_model=40)


def test_spa_members_build_attention_only():
    members = F.spa(width=32, depths=(2, 3), heads=4)
    assert [m.name for m in members][:2] == ["spa-pre-ln-w032-L02", "spa-pre-ln-w032-L03"]
    assert len(members) == 10 and all(m.d_ff == 0 and m.budget is None for m in members)
    for m in members:
        cfg = m.spa(vocab=10, context=8, seed=3)
        assert cfg.mlp is False and cfg.depth == m.depth and cfg.width == 32 and cfg.causal
        model = m.build(vocab=10, context=8, seed=3, device="cpu")
        assert not any("mlp" in name for name, _ in model.bridge.named_parameters())
        nonembed, embed = F.count_params(model)
        assert embed == 2 * 10 * 32 and nonembed >= m.depth * 4 * 32 * 32
    assert members[0].spa(10, 8, 0).norm == "pre" and members[0].spa(10, 8, 0).attention == "softmax"
    with pytest.raises(ProbeError, match=r"Member\.spa"):
        members[0].native(10, 8, 0)
    with pytest.raises(ProbeError, match=r"Member\.native"):
        F.levine([50_000], pairs=((1, 2),))[0].spa(10, 8, 0)


def test_spa_unknown_variants():
    with pytest.raises(ProbeError, match="did you mean 'e-spa'"):
        F.spa(variants=("espa",))
    with pytest.raises(ProbeError, match="non-causal"):
        F.spa(variants=("dong",))
    with pytest.raises(ProbeError, match="divisible"):
        F.spa(width=30, heads=4)


def test_parse_budgets():
    assert parse_budgets("50k,200k,1.6M,1e6,12345") == (50_000, 200_000, 1_600_000, 1_000_000, 12_345)
    assert parse_budgets(" 2K , 0.5m ") == (2000, 500_000)
    for bad, what in (
        ("", "empty"),
        ("50k,,1M", "empty entry"),
        ("abc", "not a number"),
        ("1.5", "whole number"),
        ("0", "whole number"),
        ("-5k", "whole number"),
        ("50k,50000", "repeats"),
    ):
        with pytest.raises(ProbeError, match=what) as err:
            parse_budgets(bad)
        assert "\n" not in str(err.value)


def test_flops_per_token():
    # 6 N + 6 L n_ctx d_attn with N = non-embedding + unembedding
    assert F.flops_per_token(100096, 64 * 1024, 2, 64, 128) == 6 * (100096 + 65536) + 6 * 2 * 128 * 64


def test_names_sort_in_study_order():
    members = F.levine([50_000, 200_000, 1_600_000], pairs=((2, 4),))
    names = [m.name for m in members]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert names[-1] == "levine-b1600k-L04"
    assert F._thousands(12_345) == "b0012k345" and sorted(["b0012k345", "b0012k", "b0013k"]) == [
        "b0012k",
        "b0012k345",
        "b0013k",
    ]
