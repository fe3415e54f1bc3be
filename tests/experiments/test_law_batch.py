"""Law studies with batched members (--batch-members; probes/experiments/law_batch.py) equal the
same studies with every member alone.

Known answer: the tables of the two runs. Tolerances: accuracies, learning curves, the law table
and the groups' curriculum moves identical (argmax predictions; measured identical on this CPU);
window losses (each member's loss.csv) and the hop-attention table within 1e-4 (batched matrix
products sum in another order: tests/training/test_batched.py; measured at most 1e-8 on hops.csv). Also:
``--jobs 2`` with batches, a diverging member failing its batch (each member's row says so),
a damaged member of a batched study trained again alone. crasp's depth-usage table within 1e-4
too (measured 1.3e-7)."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes.experiments.runner import study as law_study

LOSS_TOL = 1e-4
EXACT = ("accuracy.csv", "curves.csv", "law.csv")


def _run(tmp_path, name, family="khop", **options):
    return law_study(family, "smoke", out=tmp_path / name, echo=lambda _line: None, **options)


def _same(batched, alone, exact=EXACT, close=()):
    for name in exact:
        pd.testing.assert_frame_equal(batched[name], alone[name], check_exact=True, obj=name)
    for name in close:
        pd.testing.assert_frame_equal(batched[name], alone[name], check_exact=False, atol=LOSS_TOL, rtol=0, obj=name)
    for member in alone["members.csv"].member:
        a = pd.read_csv(batched.folder / "members" / member / "loss.csv")
        b = pd.read_csv(alone.folder / "members" / member / "loss.csv")
        assert (a.step == b.step).all() and (a.lr - b.lr).abs().max() < 1e-12
        assert (a.loss - b.loss).abs().max() < LOSS_TOL, member


@pytest.fixture(scope="module")
def khop_alone(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("alone"), "khop", seeds=2, batch_members="off")


def test_khop_batched_equals_alone(tmp_path, khop_alone):
    batched = _run(tmp_path, "khop", seeds=2, batch_members="auto")  # auto on a CPU: width 16 batches
    assert list(batched["members.csv"].batch) == [2, 2, 2, 2]
    assert list(khop_alone["members.csv"].batch) == [1, 1, 1, 1]
    _same(batched, khop_alone, close=("hops.csv",))


def test_khop_batched_with_two_processes(tmp_path, khop_alone):
    batched = _run(tmp_path, "jobs", seeds=2, batch_members=2, jobs=2)  # two batches, one per process
    assert (batched["members.csv"].status == "ok").all() and list(batched["members.csv"].batch) == [2, 2, 2, 2]
    _same(batched, khop_alone, close=("hops.csv",))


def test_groups_curriculum_batched_equals_alone(tmp_path):
    """Each member's curriculum moves on by itself (its batches padded to the longest in the batch)."""
    options = {"seeds": 2, "depths": (2,), "groups": ("s3",), "steps": 60, "check_every": 5}
    batched = _run(tmp_path, "on", "groups", batch_members=2, **options)
    alone = _run(tmp_path, "off", "groups", batch_members="off", **options)
    assert list(batched["members.csv"].batch) == [2, 2]
    _same(batched, alone, exact=(*EXACT, "curriculum.csv"), close=("positions.csv",))


def test_crasp_strings_of_random_length_batched_equal_alone(tmp_path):
    """crasp batches hold strings of random length: each member's padded to the longest in the batch."""
    options = {"seeds": 2, "depths": (1,), "control": False}
    batched = _run(tmp_path, "on", "crasp", batch_members=2, **options)
    alone = _run(tmp_path, "off", "crasp", batch_members="off", **options)
    assert list(batched["members.csv"].batch) == [2, 2]
    _same(batched, alone, exact=(*EXACT, "ranges.csv", "skipped_accuracy.csv"), close=("depth_usage.csv",))


@pytest.mark.study
def test_a_diverging_member_fails_its_batch_with_exit_3(tmp_path):
    out = tmp_path / "diverge"
    args = ["study", "--family", "khop", "--depths", "1", "--seeds", "2", "--lr", "1e12", "--steps", "20"]
    result = CliRunner().invoke(app, [*args, "--control", "false", "--batch-members", "2", "--out", str(out)])
    assert result.exit_code == 3, result.output
    members = pd.read_csv(out / "members.csv")
    assert list(members.member) == ["L1-d16-s0", "L1-d16-s1"] and (members.status == "failed").all()
    assert members.error.str.contains("diverged").all() and members.error.str.contains("batch-members off").all()


@pytest.mark.study
def test_a_damaged_member_of_a_batched_study_trains_again(tmp_path, khop_alone):
    first = _run(tmp_path, "resume", seeds=2, batch_members=2)
    (first.folder / "members" / "L2-d16-s1" / "accuracy.csv").write_text("damaged\n")
    lines: list[str] = []
    again = law_study("khop", "smoke", out=first.folder, seeds=2, batch_members="off", echo=lines.append)
    assert any("L2-d16-s1: damaged" in line for line in lines)
    assert [ln.split(":")[0] for ln in lines if ln.startswith("[")] == ["[4/4] L2-d16-s1"]
    _same(again, khop_alone, close=("hops.csv",))


@pytest.mark.study
def test_a_resumed_batched_study_keeps_the_batches_of_an_uninterrupted_run():
    """#47 N8: with --jobs 2 auto cuts the 4 seeds of one shape into 2 batches of 2; a run killed
    after the first batch regrouped the 2 left into batches of 1 (weights off by 1e-7). The
    remaining members now run in the batch the uninterrupted run gives them."""
    from depthprobe.probes.experiments import batching
    from depthprobe.probes.experiments.protocol import get_experiment
    from depthprobe.probes.experiments.runner import Backend, units_to_run

    exp = get_experiment("khop")
    cfg = exp.config("smoke", depths=(1,), seeds=4, control=False)
    jobs = exp.plan(cfg)
    where = Backend(jobs=2)
    full = units_to_run(exp, cfg, jobs, set(), where)
    names = [[j.name for j in batching.members(u)] for u in full]
    assert names == [["L1-d16-s0", "L1-d16-s1"], ["L1-d16-s2", "L1-d16-s3"]]
    resumed = units_to_run(exp, cfg, jobs, {"L1-d16-s0", "L1-d16-s1"}, where)
    assert resumed == full[1:]
    half = units_to_run(exp, cfg, jobs, {"L1-d16-s0", "L1-d16-s1", "L1-d16-s2"}, where)  # s3 failed in its batch
    assert [j.name for u in half for j in batching.members(u)] == ["L1-d16-s3"]


def test_a_resumed_batched_study_equals_the_uninterrupted_one_bit_for_bit(tmp_path):
    """The same on disk: the last batch's members removed (a run killed before it finished) and
    the study rerun give the files of the uninterrupted run, byte for byte."""
    import shutil

    options = {"depths": (1,), "seeds": 4, "control": False, "jobs": 2, "depth_usage": False}
    whole = _run(tmp_path, "whole", **options)
    shutil.copytree(whole.folder, tmp_path / "resumed")
    for seed in (2, 3):
        shutil.rmtree(tmp_path / "resumed" / "members" / f"L1-d16-s{seed}")
    _run(tmp_path, "resumed", **options)
    for seed in (2, 3):
        member = f"members/L1-d16-s{seed}"
        for pattern in ("[!l]*.csv", "checkpoint/ckpt-*/model.safetensors"):  # a checkpoint's folder name is random
            a = sorted((whole.folder / member).glob(pattern))
            b = sorted((tmp_path / "resumed" / member).glob(pattern))
            assert len(a) == len(b) >= 1 and [p.read_bytes() for p in a] == [p.read_bytes() for p in b], (
                member,
                pattern,
            )
        losses = [pd.read_csv(f / member / "loss.csv") for f in (whole.folder, tmp_path / "resumed")]
        assert losses[0].loss.tolist() == losses[1].loss.tolist()  # loss.csv's elapsed_s is the clock's
