"""``map_jobs(order=...)``: member processes take jobs in the order given (the runner's longest
first), the results stay in job order, and an order that is not a permutation is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.engine.distributed import map_jobs


def record_start(job: tuple[str, int]) -> int:
    """Appends its index to the log as it starts (one write: whole lines from any process)."""
    log, index = job
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{index}\n".encode())
    finally:
        os.close(fd)
    return index * 10


def started(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()]


@pytest.mark.parametrize(("order", "first"), [(None, {0, 1}), ([3, 2, 1, 0], {3, 2})])
def test_processes_take_jobs_in_the_order_given_and_results_stay_in_job_order(tmp_path, order, first):
    log = tmp_path / "started.log"
    jobs = [(str(log), i) for i in range(4)]
    results = map_jobs(record_start, jobs, processes=2, order=order)
    assert [r.value for r in results] == [0, 10, 20, 30] and all(r.ok for r in results)
    seen = started(log)
    assert sorted(seen) == [0, 1, 2, 3]
    # two processes: the first two in the order start first; the last one is handed out only after
    # two jobs have finished, so at least two starts precede it
    assert seen[0] in first
    last = 3 if order is None else order[-1]
    assert seen.index(last) >= 2


def test_in_this_process_jobs_run_in_job_order_whatever_the_order(tmp_path):
    log = tmp_path / "started.log"
    results = map_jobs(record_start, [(str(log), i) for i in range(3)], processes=1, order=[2, 0, 1])
    assert started(log) == [0, 1, 2] and [r.value for r in results] == [0, 10, 20]


@pytest.mark.parametrize("order", [[0, 1], [0, 1, 1], [1, 2, 3]])
def test_an_order_that_is_not_a_permutation_is_refused(tmp_path, order):
    with pytest.raises(ProbeError, match="order must be a permutation of the 3 job indices"):
        map_jobs(record_start, [(str(tmp_path / "x"), i) for i in range(3)], processes=2, order=order)
