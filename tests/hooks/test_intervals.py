"""#46.3: bootstrap intervals and permutation p-values on patch and attribute tables. Known answers
on planted data: a seeded interval covers the planted mean and 95% intervals cover it in about 95% of
planted data sets; a planted effect gets the smallest p the permutations allow, a null gets uniform
p-values, three equal differences get 2/8; a patched slot equal in clean and corrupt gets p = 1."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import depthprobe.probes as probes
from depthprobe.probes.hooks.stats import Stats

SPEC = "native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,attn_only=false"


def planted(mean: float, n: int, seed: int) -> torch.Tensor:
    return mean + torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_a_seeded_interval_covers_the_planted_mean_with_the_normal_width():
    low, high = Stats(ci=0.95, n_boot=2000).interval(planted(2.0, 400, 0))
    assert low < 2.0 < high
    assert high - low == pytest.approx(2 * 1.96 / 400**0.5, rel=0.15)  # sd 1: the normal interval's width
    assert Stats(ci=0.95, n_boot=2000).interval(planted(2.0, 400, 0)) == (low, high)  # seeded


def test_95_percent_intervals_cover_the_planted_mean_about_95_percent_of_the_time():
    stats = Stats(ci=0.95, n_boot=400)
    covered = [lo < 1.0 < hi for lo, hi in (stats.interval(planted(1.0, 40, s)) for s in range(200))]
    assert 0.88 <= np.mean(covered) <= 0.99  # the percentile bootstrap runs a little narrow at n = 40


def test_a_planted_effect_gets_the_smallest_p_and_a_null_uniform_p_values():
    assert Stats(permutation=999).p_value(planted(0.5, 100, 1)) == 1 / 1000  # z = 5: no flip reaches it
    p = np.array([Stats(permutation=199, seed=s).p_value(planted(0.0, 20, 1000 + s)) for s in range(300)])
    assert 0.45 <= p.mean() <= 0.55 and 0.02 <= (p <= 0.05).mean() <= 0.09
    counts = np.histogram(p, bins=5, range=(0, 1))[0]
    assert counts.min() >= 40 and counts.max() <= 80  # 60 per fifth if uniform
    exact = Stats(permutation=20000).p_value(torch.ones(3, dtype=torch.float64))
    assert exact == pytest.approx(0.25, abs=0.01)  # only 2 of the 8 sign patterns reach |mean| = 1


def diff(logits):  # one value per example
    return logits[:, -1, 3] - logits[:, -1, 5]


@pytest.fixture(scope="module")
def pair():
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 20, (12, 6), generator=g)
    corrupt = clean.clone()
    corrupt[:, 4:] = torch.randint(1, 20, (12, 2), generator=g)
    return probes.load(SPEC, device="cpu"), clean, corrupt


@pytest.mark.parametrize("verb", ["patch", "attribute"])
def test_table_columns_equal_the_statistics_of_the_per_example_rows(pair, verb):
    model, clean, corrupt = pair
    run = getattr(probes, verb)
    kw = {} if verb == "patch" else {"check": 0}
    hooks = "blocks.0.hook_resid_pre"
    rows = run(model, clean, corrupt, metric=diff, hooks=hooks, per_example=True, **kw)
    table = run(model, clean, corrupt, metric=diff, hooks=hooks, ci=0.9, n_boot=500, permutation=499, seed=3, **kw)
    assert list(table.columns[-3:]) == ["ci_low", "ci_high", "p"]
    base = probes.patch(model, clean, corrupt, hooks=hooks, metric=diff, per_example=True)
    corrupt_values = torch.tensor(base.attrs["corrupt"])  # the mean; per example below
    stats = Stats(ci=0.9, n_boot=500, permutation=499, seed=3)
    x = diff(model.bridge(corrupt)).detach().double()
    assert float(x.mean()) == pytest.approx(float(corrupt_values), abs=1e-6)
    for position, got in table.groupby("position"):
        v = torch.tensor(rows[rows["position"] == position]["value"].to_numpy())
        want = stats.columns(v, x)
        assert got["ci_low"].item() == pytest.approx(want["ci_low"], abs=1e-6)
        assert got["ci_high"].item() == pytest.approx(want["ci_high"], abs=1e-6)
        assert got["p"].item() == pytest.approx(want["p"], abs=1e-3)
        if position < 4:  # clean and corrupt agree there: patching changes nothing, no effect at all
            assert got["p"].item() == 1.0
    assert table[table["position"] == 4]["p"].item() < 0.05  # the corrupted token, an effect


def test_batches_give_the_same_intervals(pair):
    model, clean, corrupt = pair
    kw = dict(metric=diff, hooks="blocks.1.attn.hook_z", ci=0.95, permutation=99)
    whole = probes.patch(model, clean, corrupt, **kw)
    parts = probes.patch(model, clean, corrupt, batch_size=5, **kw)
    assert np.allclose(whole[["ci_low", "ci_high", "p"]], parts[["ci_low", "ci_high", "p"]], atol=1e-6)


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"ci": 1.5}, "ci must be a coverage between 0 and 1"),
        ({"ci": True}, "ci must be a coverage"),
        ({"ci": 0.95, "n_boot": 5}, "n_boot must be an integer of at least 10"),
        ({"permutation": -1}, "permutation must be an integer of at least 0"),
        ({"permutation": 9, "seed": 1.5}, "seed must be an integer"),
        ({"ci": 0.95, "per_example": True}, "drop per_example=True"),
    ],
)
def test_bad_statistics_are_one_line_before_any_pass(pair, kw, says):
    model, clean, corrupt = pair
    with pytest.raises(probes.ProbeError, match=says) as err:
        probes.patch(model, clean, corrupt[:, :3], hooks="nope.*", metric=diff, **kw)  # worse inputs, checked later
    assert "\n" not in str(err.value)


def test_a_metric_of_one_number_cannot_have_intervals(pair):
    model, clean, corrupt = pair
    with pytest.raises(probes.ProbeError, match="one value per example"):
        probes.patch(model, clean, corrupt, hooks="blocks.0.hook_resid_pre", metric=lambda x: x[:, -1].mean(), ci=0.9)
