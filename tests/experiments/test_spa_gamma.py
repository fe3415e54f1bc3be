"""E-SPA's kernel endpoint gamma_last as a study option (issue 34): the current token's share of the
last layer's variance it implies at init, computed here independently (numpy Cholesky of the
target kernel, and the kernel of the built network on orthonormal inputs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.measures import kernels
from depthprobe.probes.models import variant_net
from tests.helpers import cli_error, plan, resolve


def _last_pivot_squared(kernel: np.ndarray) -> float:
    """The variance of the last position that the earlier positions cannot explain (unit diagonal)."""
    return float(np.linalg.cholesky(kernel)[-1, -1] ** 2)


def _espa_target(t: int, gamma: float) -> np.ndarray:
    pos = np.arange(t)
    return np.exp(-gamma * np.abs(pos[:, None] - pos[None, :]))


@pytest.mark.parametrize(("gamma", "share"), [(0.005, 0.0099502), (0.1116, 0.2000452)])
def test_espa_current_share_is_the_last_cholesky_pivot(gamma, share):
    """1 - exp(-2 gamma): 0.00995 at He et al.'s 0.005 (1%), 0.2000 at the cpu preset's 0.1116."""
    assert _last_pivot_squared(_espa_target(128, gamma)) == pytest.approx(share, rel=1e-5)
    assert kernels.current_share("e-spa", 128, gamma_last=gamma) == pytest.approx(share, rel=1e-5)


def test_uspa_current_share_falls_to_one_minus_rho():
    uniform = lambda t: 0.2 * np.eye(t) + 0.8 * np.ones((t, t))  # noqa: E731
    for t, share in ((2, 0.36), (128, 0.2015717)):  # 1 - rho^2 with one earlier token; -> 1 - rho = 0.2
        assert _last_pivot_squared(uniform(t)) == pytest.approx(share, rel=1e-5)
        assert kernels.current_share("u-spa", t, rho_last=0.8) == pytest.approx(share, rel=1e-5)
    assert kernels.current_share("u-spa", 100_000, rho_last=0.8) == pytest.approx(0.2, abs=1e-5)


@pytest.mark.study
def test_cpu_preset_gamma_gives_uspa_long_context_share():
    """The stated rule: E-SPA's share equals U-SPA's at long context, 1 - rho_L = 0.2."""
    cfg = resolve("spa", "cpu")
    assert cfg.gamma_last == pytest.approx(-math.log(0.8) / 2, abs=1e-4)
    assert kernels.current_share("e-spa", cfg.context, gamma_last=cfg.gamma_last) == pytest.approx(0.2, abs=1e-4)
    assert resolve("spa", "smoke").gamma_last == 0.005  # the model's default elsewhere


@pytest.mark.study
@pytest.mark.parametrize(("gamma", "share"), [(0.005, 0.0099502), (0.1116, 0.2000452)])
def test_study_member_builds_espa_with_its_gamma(gamma, share):
    """The member the study trains holds the kernel: on inputs with kernel I (orthonormal rows),
    the last layer's kernel at init has the share above (attention-only E-SPA is exact at any width)."""
    cfg = resolve("spa", "smoke", d_model=64, depths=(4,), variants=("e-spa",), gamma_last=gamma)
    (job,) = plan(cfg)
    spa = job.net_config(512)
    assert spa.gamma_last == gamma and spa.attention == "e-spa"
    net = variant_net.build(spa, device="cpu").bridge
    q, _ = torch.linalg.qr(torch.randn(64, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    with torch.no_grad():
        x = net((q * 8.0).to(torch.float32)[None], return_type="residual")[0].double()
    kernel = (x @ x.T / 64).numpy()
    d = np.sqrt(np.diag(kernel))
    assert _last_pivot_squared(kernel / d[:, None] / d[None, :]) == pytest.approx(share, rel=0.02)


def test_bad_gamma_last_is_one_line():
    for bad in (0.0, -1.0, 50.0, float("nan")):
        with pytest.raises(ProbeError, match=r"--gamma-last must be in \(0, 50\)"):
            resolve("spa", "smoke", gamma_last=bad)
    cli_error(
        ["study", "--family", "spa", "--gamma-last", "0", "--dry-run", "--out", "x"], "--gamma-last must be in (0, 50)"
    )
