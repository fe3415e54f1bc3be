"""Levine et al.'s depth threshold: one formula, the sentence for each side, never advice to widen."""

import math

import pytest

from depthprobe.probes.api.run import run
from depthprobe.probes.measures import levine


def test_threshold_is_log3_of_width():
    assert levine.threshold(3**5) == pytest.approx(5.0, abs=1e-12)
    assert levine.threshold(384) == pytest.approx(5.4165, abs=1e-4)
    assert levine.threshold(1024) == pytest.approx(6.3093, abs=1e-4)
    with pytest.raises(ValueError, match="d_model"):
        levine.threshold(0)


def test_d384_six_layers_is_at_or_above_and_four_layers_below():
    above = levine.DepthNote(6, 384)
    assert not above.below and above.ratio == pytest.approx(6 / math.log(384, 3))
    assert above.line() == (
        "depth L=6, d_model=384, Levine et al. L_th = log3(384) = 5.42, L/L_th = 1.11: at or above the threshold, "
        "where in their theory (for linearised attention) depth and width contribute comparably and width limits "
        "what added layers can give; the threshold is a floor for depth, not advice to widen"
    )
    assert above.as_dict() == {"depth": 6, "d_model": 384, "L_th": 5.417, "L_over_L_th": 1.108, "side": "at_or_above"}
    below = levine.DepthNote(4, 384)
    assert below.below and below.line() == (
        "depth L=4, d_model=384, Levine et al. L_th = log3(384) = 5.42, L/L_th = 0.74: below the threshold, "
        "where their theory (for linearised attention) gives a double-exponential advantage of depth over width"
    )
    assert below.as_dict()["side"] == "below"
    for note in (above, below):
        assert "widening" not in note.line() and "efficient" not in note.line()


def test_every_run_summary_carries_the_line(tiny_bert):
    res = run(tiny_bert, "attention-stats", limit=2)
    want = levine.DepthNote(tiny_bert.info.n_layers, tiny_bert.info.d_model)
    assert res.notes[-1] == want.line()
    assert res.headline["depth_efficiency"] == want.as_dict()


def test_random_init_models_get_the_number_without_a_side():
    from depthprobe.probes.models import variant_net

    note = levine.DepthNote(8, 256, random_init=True)
    assert note.line().startswith(
        "depth L=8, d_model=256, Levine et al. L_th = log3(256) = 5.05, L/L_th = 1.58: "
        "random-init weights, so no regime label"
    )
    assert note.as_dict()["side"] is None
    res = run(variant_net.build("spa:variant=vanilla,depth=2,width=16,heads=2,n_ctx=8"), "kernels", n_random=2)
    assert "no regime label" in res.notes[-1] and res.headline["depth_efficiency"]["side"] is None
