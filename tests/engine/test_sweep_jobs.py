"""probe sweep --jobs N: members in N local processes (real spawned processes, no Ray) give the
same table as --jobs 1; the manifest records the workers; --jobs with --backend ray is refused."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from depthprobe.probes.api.sweep import sweep
from depthprobe.probes.base.errors import ProbeError
from tests.helpers import cli_error

# tiny settings: a few seconds each on one CPU core
KERNELS = {"variants": ("vanilla", "e-spa"), "width": 16, "seq_len": 8, "samples": 2, "steps": 3}
INDUCTION = {"steps": 6, "eval_every": 3, "n_seqs": 2, "width": 16, "heads": 2, "seq_len": 24, "vocab": 12}
TIMINGS = ["train_seconds", "steps_per_s"]  # induction summary columns that measure wall time
TIMINGS_LOG = ["steps_per_s", "elapsed_s"]  # and those of its train_loss.csv


def test_induction_sweep_jobs_2_equals_jobs_1(tmp_path):
    one = sweep("induction", (1, 2), seed=2, jobs=1, **INDUCTION)
    two = sweep("induction", (1, 2), seed=2, jobs=2, **INDUCTION)
    pd.testing.assert_frame_equal(two.scores, one.scores)
    pd.testing.assert_frame_equal(two.summary.drop(columns=TIMINGS), one.summary.drop(columns=TIMINGS))
    assert two.headline == one.headline
    losses = [pd.read_csv(io.BytesIO(r.files["train_loss.csv"])).drop(columns=TIMINGS_LOG) for r in (one, two)]
    pd.testing.assert_frame_equal(losses[1], losses[0])
    assert len(two.scores) == 6 and two.scores.best_induction.notna().all()
    manifest = json.loads((two.save(tmp_path / "two") / "manifest.json").read_text())
    assert manifest["config"]["workers"] == 2 and manifest["config"]["backend"] == "local"
    assert one.config["workers"] == 1


def test_kernels_sweep_jobs_2_equals_jobs_1():
    one = sweep("kernels", (1, 2), seed=5, **KERNELS)
    two = sweep("kernels", (1, 2), seed=5, jobs=2, **KERNELS)
    pd.testing.assert_frame_equal(two.scores, one.scores)
    pd.testing.assert_frame_equal(two.summary, one.summary)
    assert two.headline == one.headline and two.notes == one.notes
    assert two.files["kernels.npz"] == one.files["kernels.npz"]
    assert two.config["workers"] == 2


def test_jobs_capped_by_members():
    res = sweep("kernels", (1,), variants=("vanilla",), width=16, seq_len=8, samples=2, steps=0, jobs=4)
    assert res.config["workers"] == 1  # one member: run here, no process started


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"jobs": 0}, "--jobs must be at least 1"),
        ({"jobs": 2, "backend": "ray"}, "--jobs applies to --backend local"),
    ],
)
def test_bad_jobs_refused(kwargs, fragment):
    with pytest.raises(ProbeError, match=fragment):
        sweep("kernels", (1,), **KERNELS, **kwargs)


def test_cli_jobs_with_ray_is_one_line(tmp_path):
    err = cli_error(["sweep", "--task", "kernels", "--depths", "1", "--backend", "ray", "--jobs", "2",
                     "--out", str(tmp_path / "x")])  # fmt: skip
    assert "--jobs applies to --backend local" in err


def test_a_member_failing_in_this_process_goes_through_the_one_retry_loop(tmp_path):
    # the in-process path is map_jobs's too: retried there, then one line naming the member and attempts
    blocker = tmp_path / "models"
    blocker.write_text("a file where the sweep wants a folder")
    with pytest.raises(ProbeError) as info:
        sweep("induction", (1,), retries=1, save_models=str(blocker), **INDUCTION)
    message = str(info.value)
    assert message.startswith("sweep induction: member depth 1 failed after 2 attempts: ")
    assert "internal error: NotADirectoryError" in message  # not a ProbeError: marked internal, typed, not parsed
    assert "\n" not in message and "Traceback" not in message


def test_a_failed_member_exits_3_like_a_study(tmp_path):
    """#47: a member that fails after the input was accepted (here it cannot write its model; a
    killed member process is the same path: tests/engine/test_job_processes.py) is exit 3, not 2."""
    blocker = tmp_path / "models"
    blocker.write_text("a file where the sweep wants a folder")
    options = [a for k, v in INDUCTION.items() for a in ("-O", f"{k}={v}")]
    err = cli_error(["sweep", "-t", "induction", "--depths", "1", "-O", f"save_models={blocker}", *options,
                     "--out", tmp_path / "x"], "member depth 1 failed", code=3)  # fmt: skip
    assert "internal error: NotADirectoryError" in err
    assert not (tmp_path / "x").exists()
