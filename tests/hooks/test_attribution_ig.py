"""Integrated-gradient attribution (``attribute(..., ig_steps=N)``) against answers known in closed
form: exact where the metric is linear in the activation, the left Riemann sum's deficit where it
is quadratic, and completeness (the slots' estimates add up to the whole hook patched) as N grows."""

import warnings

import pytest
import torch

import depthprobe.probes as probes
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.spot_check import AttributionWarning

SPEC = "native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,attn_only=false,seed=3"
LAST = "unembed.hook_in"  # the logits are linear in it, position by position


@pytest.fixture(scope="module")
def model():
    return probes.load(SPEC)


@pytest.fixture(scope="module")
def pair():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 20, (4, 6), generator=g), torch.randint(0, 20, (4, 6), generator=g)


def logit_diff(logits):
    return logits[:, -1, 3] - logits[:, -1, 5]


def test_linear_metric_ig_equals_attribution_equals_patching(model, pair):
    clean, corrupt = pair
    plain = probes.attribute(model, clean, corrupt, logit_diff, LAST)
    ig = probes.attribute(model, clean, corrupt, logit_diff, LAST, ig_steps=8)
    patched = probes.patch(model, clean, corrupt, LAST, logit_diff)
    assert torch.allclose(torch.tensor(ig["value"].to_numpy()), torch.tensor(plain["value"].to_numpy()), atol=1e-5)
    assert torch.allclose(torch.tensor(ig["value"].to_numpy()), torch.tensor(patched["value"].to_numpy()), atol=1e-5)


def test_ig_steps_one_is_plain_attribution(model, pair):
    hook = "blocks.1.hook_resid_pre"
    a = probes.attribute(model, *pair, logit_diff, hook)
    b = probes.attribute(model, *pair, logit_diff, hook, ig_steps=1)
    assert a.equals(b)


@pytest.mark.parametrize("steps", [1, 3, 10])
def test_quadratic_metric_gives_the_left_riemann_sum(model, pair, steps):
    """f = d^2 with d linear in the activation: the mean gradient over k/N, k < N, times the change
    is f(clean) - f(corrupt) - (d_clean - d_corrupt)^2 / N, per example."""
    clean, corrupt = pair
    df = probes.attribute(
        model, clean, corrupt, lambda x: logit_diff(x) ** 2, LAST, positions=[5], ig_steps=steps, per_example=True
    )
    with torch.no_grad():
        k, c = logit_diff(model.bridge(clean)).double(), logit_diff(model.bridge(corrupt)).double()
    want = c**2 + (k**2 - c**2) - (k - c) ** 2 / steps
    assert torch.allclose(torch.tensor(df.sort_values("example")["value"].to_numpy()), want, atol=1e-4)


def test_completeness_on_a_nonlinear_hook(model, pair):
    """blocks.1.hook_resid_pre is the whole residual stream: patching all of it gives the clean
    metric, so the positions' estimates add up to clean - corrupt as the steps grow (error ~ 1/N;
    measured: 0.92 at N=1, 0.065 at 16, 0.016 at 64, for a difference of -0.45)."""
    clean, corrupt = pair
    hook = "blocks.1.hook_resid_pre"

    def mean_diff(logits):
        return logit_diff(logits).mean()

    def error(steps):
        df = probes.attribute(model, clean, corrupt, mean_diff, hook, ig_steps=steps)
        whole = df.attrs["clean"] - df.attrs["corrupt"]
        return float((df["value"] - df.attrs["corrupt"]).sum() - whole), whole

    e16, whole = error(16)
    e64, _ = error(64)
    assert abs(e64) < abs(e16) / 3
    assert abs(e64) < 0.05 * abs(whole)


def test_ig_steps_is_checked_first(model, pair):
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ProbeError, match="ig_steps must be an integer of at least 1"):
            probes.attribute(model, *pair, logit_diff, "blocks.1.hook_resid_pre", ig_steps=bad)


def test_spot_check_warns_where_patching_disagrees_and_reports_the_patched_values(model, pair):
    """On the residual stream (nonlinear downstream) the top estimate is -1.17 where patching gives
    -0.20: one AttributionWarning; the checked values are patch's own."""
    hook = "blocks.1.hook_resid_pre"
    with pytest.warns(AttributionWarning, match=r"disagrees with patching at \d of the 3 slots it ranks first"):
        df = probes.attribute(model, *pair, logit_diff, hook)
    patched = probes.patch(model, *pair, hook, logit_diff)
    checked = df.attrs["checked"]
    assert checked[0]["slot"] == "position 5"
    for c in checked:
        position = int(c["slot"].split()[-1])
        want = patched.loc[patched["position"] == position, "value"].item() - patched.attrs["corrupt"]
        assert abs(c["patched"] - want) < 1e-5


def test_spot_check_is_quiet_where_attribution_is_exact_and_off_with_zero(model, pair):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = probes.attribute(model, *pair, logit_diff, LAST)
        assert len(df.attrs["checked"]) == 3
        quiet = probes.attribute(model, *pair, logit_diff, "blocks.1.hook_resid_pre", check=0)
    assert "checked" not in quiet.attrs
    with pytest.raises(ProbeError, match="check must be an integer of at least 0"):
        probes.attribute(model, *pair, logit_diff, LAST, check=-1)
