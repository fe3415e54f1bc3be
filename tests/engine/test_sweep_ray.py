"""probe sweep as independent member jobs: jobs + run_job + combine equals run, and a real local
Ray instance gives the same numbers as the local backend."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pandas as pd
import pytest

from depthprobe.probes.api.sweep import SweepConfig, get_sweep, sweep
from depthprobe.probes.base.errors import ProbeError
from tests.helpers import cli_error

# tiny settings: a few seconds each on one CPU core
KERNELS = {"variants": ("vanilla", "e-spa"), "width": 16, "seq_len": 8, "samples": 2, "steps": 3}
INDUCTION = {"steps": 6, "eval_every": 3, "n_seqs": 2, "width": 16, "heads": 2, "seq_len": 24, "vocab": 12}
TIMINGS = ["train_seconds", "steps_per_s"]  # induction summary columns that measure wall time


def _config(task: str, depths: tuple[int, ...], seed: int, options: dict) -> SweepConfig:
    return SweepConfig(task=task, depths=depths, seed=seed, options=tuple(sorted(options.items())))


def _split_equals_run(task: str, options: dict, depths: tuple[int, ...] = (1, 2), seed: int = 3):
    sw = get_sweep(task)
    config = _config(task, depths, seed, options)
    parsed = sw.parse_options(options)
    whole = sw.run(config, parsed, False)
    jobs = sw.jobs(config, parsed)
    results = [pickle.loads(pickle.dumps(sw.run_job(pickle.loads(pickle.dumps(job))))) for job in jobs]
    split = sw.combine(config, parsed, results)
    return jobs, whole, split


def test_kernels_split_into_jobs_equals_run():
    jobs, whole, split = _split_equals_run("kernels", KERNELS)
    assert [job.name for job in jobs] == ["vanilla depth 1", "vanilla depth 2", "e-spa depth 1", "e-spa depth 2"]
    assert [job.heatmap_layers for job in jobs] == [(), (1, 2), (), (1, 2)]  # layers 1 and 2 of the deepest models
    pd.testing.assert_frame_equal(split.scores, whole.scores)
    pd.testing.assert_frame_equal(split.summary, whole.summary)
    assert split.headline == whole.headline and split.notes == whole.notes
    assert split.files["kernels.npz"] == whole.files["kernels.npz"]
    with np.load(io.BytesIO(split.files["kernels.npz"])) as npz:
        assert sorted(npz.files) == sorted(
            [f"{v}/depth{d}" for v in ("vanilla", "e-spa") for d in (1, 2)]
            + [f"{v}/depth2/layer{k}" for v in ("vanilla", "e-spa") for k in (1, 2)]
        )


def test_induction_split_into_jobs_equals_run():
    jobs, whole, split = _split_equals_run("induction", INDUCTION)
    assert [job.name for job in jobs] == ["depth 1", "depth 2"]
    assert jobs[0].lengths == jobs[1].lengths == (5, 10)  # held-out lengths that fit in 24 tokens
    pd.testing.assert_frame_equal(split.scores, whole.scores)
    pd.testing.assert_frame_equal(split.summary.drop(columns=TIMINGS), whole.summary.drop(columns=TIMINGS))
    assert split.headline == whole.headline
    assert list(split.scores.step) == [0, 3, 6, 0, 3, 6]
    loss = pd.read_csv(io.BytesIO(split.files["train_loss.csv"]))
    assert list(loss.depth) == [1, 2] and list(loss.step) == [6, 6]


def test_bad_input_fails_in_jobs_before_any_member():
    sw = get_sweep("induction")
    opts = {**INDUCTION, "vocab": 8}  # held-out length 10 needs 10 distinct tokens
    with pytest.raises(ProbeError, match="vocab=8"):
        sw.jobs(_config("induction", (1,), 0, opts), sw.parse_options(opts))
    kern = get_sweep("kernels")
    opts = {**KERNELS, "heatmap_depths": (9,)}
    with pytest.raises(ProbeError, match="heatmap_depths"):
        kern.jobs(_config("kernels", (1, 2), 0, opts), kern.parse_options(opts))


def test_backend_options_are_checked():
    with pytest.raises(ProbeError, match="did you mean 'ray'"):
        sweep("kernels", (1,), backend="rey", **KERNELS)
    with pytest.raises(ProbeError, match="--address applies to --backend ray"):
        sweep("kernels", (1,), address="auto", **KERNELS)
    with pytest.raises(ProbeError, match="--retries must be 0 or more"):
        sweep("kernels", (1,), retries=-1, **KERNELS)


def test_local_manifest_records_the_backend(tmp_path):
    res = sweep("kernels", (1,), **KERNELS)
    manifest = json.loads((res.save(tmp_path / "s") / "manifest.json").read_text())
    assert manifest["config"]["backend"] == "local" and manifest["config"]["kind"] == "sweep"


def test_cli_sweep_unknown_backend_suggests():
    cli_error(["sweep", "--task", "kernels", "--depths", "1,2", "--backend", "rey"], "'rey'", "did you mean 'ray'")


def test_cli_sweep_unreachable_address(tmp_path):
    cli_error(
        ["sweep", "--task", "kernels", "--depths", "1,2", "--backend", "ray", "--address", "127.0.0.1:1",
         "--width", "16", "--seq-len", "8", "--out", tmp_path / "s"],
        "cannot reach a Ray cluster at 127.0.0.1:1",
    )  # fmt: skip
    assert not (tmp_path / "s").exists()


# ----------------------------------------------------------------------------- on a real local Ray instance


@pytest.mark.slow
def test_kernels_sweep_on_ray_equals_local(tmp_path, ray_instance):
    local = sweep("kernels", (1, 2), seed=5, **KERNELS)
    remote = sweep("kernels", (1, 2), seed=5, backend="ray", address="auto", retries=1, **KERNELS)
    assert ray_instance.is_initialized()  # the session opened here was reused and left open
    pd.testing.assert_frame_equal(remote.scores, local.scores)
    pd.testing.assert_frame_equal(remote.summary, local.summary)
    assert remote.headline == local.headline and remote.notes == local.notes
    assert remote.files["kernels.npz"] == local.files["kernels.npz"]
    manifest = json.loads((remote.save(tmp_path / "ray") / "manifest.json").read_text())
    assert manifest["config"]["backend"] == "ray"


@pytest.mark.slow
def test_induction_sweep_on_ray_equals_local(ray_instance):
    local = sweep("induction", (1, 2), seed=2, **INDUCTION)
    remote = sweep("induction", (1, 2), seed=2, backend="ray", address="auto", **INDUCTION)
    pd.testing.assert_frame_equal(remote.scores, local.scores)
    pd.testing.assert_frame_equal(remote.summary.drop(columns=TIMINGS), local.summary.drop(columns=TIMINGS))
    assert remote.headline == local.headline
    assert remote.scores.best_induction.notna().all() and len(remote.scores) == 6


@pytest.mark.slow
def test_a_failed_member_fails_the_sweep_with_one_line(tmp_path, ray_instance):
    blocker = tmp_path / "models"
    blocker.write_text("a file where the sweep wants a folder")
    with pytest.raises(ProbeError) as info:
        sweep("induction", (1,), backend="ray", address="auto", retries=1, save_models=str(blocker), **INDUCTION)
    message = str(info.value)
    assert message.startswith("sweep induction: member depth 1 failed after 2 attempts: ")
    assert "\n" not in message and "Traceback" not in message
