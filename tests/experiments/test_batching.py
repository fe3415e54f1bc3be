"""The runner's units and auto --jobs (probes/experiments/batching.py): pure functions on given numbers."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.experiments import batching
from depthprobe.probes.experiments.batching import Batch, auto_jobs, batch_size, plan_units, read_batch_members
from tests.helpers import cli_error, plan, resolve

GiB = 2**30


@dataclass(frozen=True)
class J:
    name: str
    shape: str


def _names(units):
    return [[j.name for j in batching.members(u)] for u in units]


def test_members_of_one_shape_batch_in_plan_order_up_to_the_size():
    jobs = [J("a0", "A"), J("b0", "B"), J("a1", "A"), J("a2", "A"), J("b1", "B"), J("c0", "C")]
    units = plan_units(jobs, lambda j: j.shape, lambda j: 2, processes=1, auto=False)
    assert _names(units) == [["a0", "a1"], ["a2"], ["b0", "b1"], ["c0"]]
    assert isinstance(units[0], Batch) and units[0].name == "a0+1"
    assert units[1] is jobs[3]  # a batch of one is the job itself


def test_auto_cuts_a_shape_into_as_many_batches_as_processes():
    jobs = [J(f"a{i}", "A") for i in range(5)]
    size4 = plan_units(jobs, lambda j: j.shape, lambda j: 4, processes=2, auto=True)
    assert _names(size4) == [["a0", "a1", "a2"], ["a3", "a4"]]  # ceil(5 / 2) = 3 each
    given = plan_units(jobs, lambda j: j.shape, lambda j: 4, processes=2, auto=False)
    assert _names(given) == [["a0", "a1", "a2", "a3"], ["a4"]]  # an explicit N is kept
    off = plan_units(jobs, lambda j: j.shape, lambda j: 1, processes=1, auto=False)
    assert off == jobs


@pytest.mark.parametrize(
    ("mode", "device", "width", "size"),
    [
        ("off", "cuda", 16, 1),
        (3, "cpu", 256, 3),
        ("auto", "cuda", 256, batching.AUTO_CUDA),
        ("auto", "cpu", 16, batching.AUTO_CPU),
        ("auto", "cpu", 32, batching.AUTO_CPU),
        ("auto", "cpu", 64, 1),  # compute-bound on a CPU: measured no gain
        ("auto", "mps", 16, 1),
    ],
)
def test_batch_size_by_mode_device_and_width(mode, device, width, size):
    assert batch_size(mode, device, width) == size


def test_auto_jobs_from_memory_cores_and_units():
    unit = 2 * GiB  # + a 0.5 GiB context each: 2.5 GiB a process
    assert auto_jobs(10 * GiB, unit, cores=16, units=20) == 3  # 0.8 * 10 = 8 GiB holds 3
    assert auto_jobs(130 * GiB, unit, cores=16, units=20) == batching.MAX_AUTO_JOBS
    assert auto_jobs(130 * GiB, unit, cores=2, units=20) == 2
    assert auto_jobs(130 * GiB, unit, cores=16, units=1) == 1
    assert auto_jobs(1 * GiB, unit, cores=16, units=20) == 1  # never below one
    assert auto_jobs(None, unit, cores=16, units=20) == 1  # memory unknown
    assert auto_jobs(10 * GiB, None, cores=16, units=20) == 1  # a member's need unknown


def test_batch_members_text():
    assert read_batch_members("auto") == "auto" and read_batch_members("OFF") == "off"
    assert read_batch_members("4") == 4
    with pytest.raises(ProbeError, match="auto, off or a number"):
        read_batch_members("many")


def test_law_members_batch_by_shape_not_seed():
    cfg = resolve("khop", seeds=3, depths=(1, 2), batch_members=2)
    from depthprobe.probes.experiments.protocol import get_experiment

    units = get_experiment("khop").batches(cfg, plan(cfg), processes=1)
    assert _names(units) == [["L1-d16-s0", "L1-d16-s1"], ["L1-d16-s2"], ["L2-d16-s0", "L2-d16-s1"], ["L2-d16-s2"]]
    cfg = resolve("groups", seeds=2, depths=(1,), control=False, batch_members="auto", device="cpu")
    units = get_experiment("groups").batches(cfg, plan(cfg), processes=1)  # z2 and s3: two vocabularies
    assert _names(units) == [["z2-L1-d16-s0", "z2-L1-d16-s1"], ["s3-L1-d16-s0", "s3-L1-d16-s1"]]


@pytest.mark.parametrize("value", ["0", "-2", "lots"])
def test_bad_batch_members_refused_before_any_folder(tmp_path, value):
    cli_error(["study", "--family", "khop", "--batch-members", value, "--out", tmp_path / "never"], "--batch-members")
    assert not (tmp_path / "never").exists()


def test_longest_first_hands_out_the_largest_members_first_ties_in_plan_order():
    from depthprobe.probes.experiments.protocol import get_experiment

    cfg = resolve("khop", "cpu")
    jobs = plan(cfg)
    order = batching.longest_first(get_experiment("khop"), cfg, jobs, None)
    names = [jobs[i].name for i in order]
    # parameters (docs/depth-laws.md): control 269,464 > depth 5 254,336 > ... > depth 1 54,400
    assert names == [
        "control-L2-d104-s0", "control-L2-d104-s1", "L5-d64-s0", "L5-d64-s1", "L4-d64-s0", "L4-d64-s1",
        "L3-d64-s0", "L3-d64-s1", "L2-d64-s0", "L2-d64-s1", "L1-d64-s0", "L1-d64-s1",
    ]  # fmt: skip


def test_longest_first_is_plan_order_when_a_members_work_is_not_known():
    from depthprobe.probes.experiments.protocol import Experiment

    class Unknown:
        def plan_row(self, config, job, context):
            return Experiment.plan_row(self, config, job, context)  # flops None

        def base_row(self, job):
            return {"member": job.name}

    assert batching.longest_first(Unknown(), None, [J("a", "A"), J("b", "B")], None) is None
