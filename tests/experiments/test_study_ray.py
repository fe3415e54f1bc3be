"""probe study on a real local Ray instance: one member made to fail, results equal the local backend's."""

from __future__ import annotations

import pandas as pd
import pytest

from depthprobe.probes.experiments.runner import study

TINY = {"vocab": 300, "min_tokens": 16384, "tokens_per_param": 1.0, "context": 32, "batch_size": 8,
        "probe_lines": 10, "icl_windows": 2}  # fmt: skip
NUMBERS = ["params_nonembed", "params_embed", "tokens", "flops", "val_loss", "val_bpb", "induction_best",
           "kernel_cos_last", "kernel_cos_last_init", "entropy_mean", "icl_score"]  # fmt: skip

pytestmark = pytest.mark.slow


@pytest.mark.study
def test_study_on_ray_equals_local_and_isolates_a_failure(tmp_path, monkeypatch, ray_instance, tiny_corpus):
    monkeypatch.setenv("DEPTHPROBE_CACHE", str(tmp_path / "cache"))
    common = {"corpus": str(tiny_corpus), "echo": lambda line: None, "max_params": 20_000, **TINY}
    local = study("levine", "smoke", out=tmp_path / "local", **common).table.set_index("member")
    remote = study("levine", "smoke", out=tmp_path / "ray", backend="ray", address="auto", retries=1,
                   **common).table.set_index("member")  # fmt: skip
    assert list(remote.index) == list(local.index)
    assert list(remote.status) == ["failed", "ok"] == list(local.status)
    failed = remote.index[0]
    assert "max-params" in remote.loc[failed, "error"] and "Traceback" not in remote.loc[failed, "error"]
    ok = remote.index[1]
    for col in NUMBERS:
        assert remote.loc[ok, col] == pytest.approx(local.loc[ok, col], rel=1e-9, abs=1e-12), col
    assert (tmp_path / "ray" / "members" / ok / "checkpoint" / "depthprobe.json").exists()
    assert (tmp_path / "ray" / "report.html").exists()
    on_disk = pd.read_csv(tmp_path / "ray" / "members.csv")
    assert list(on_disk.status) == ["failed", "ok"]
