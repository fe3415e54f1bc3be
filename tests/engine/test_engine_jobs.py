"""The one member-job path: typed errors across the job boundary, one retry loop, local processes
(`--jobs N`) giving exactly what one process gives, members writing their own folders."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.engine.distributed import JobResult, map_jobs
from depthprobe.probes.experiments.runner import study

TINY = {"vocab": 300, "min_tokens": 40960, "tokens_per_param": 1.0, "context": 32, "batch_size": 8,
        "probe_lines": 10, "icl_windows": 2}  # fmt: skip
TIMED = {"wall_s", "tokens_per_s"}  # the only columns of study.csv that may differ between runs


class Refused(ProbeError):
    """A user error two levels below ProbeError (its name is not ProbeError's nor a direct subclass's)."""


class Deeper(Refused):
    pass


def judge(x: int) -> int:
    if x == -1:
        raise Deeper("--width -1 must be positive; pass --width 8\nsecond line")
    if x == -2:
        raise ValueError("ProbeError: looks like a user error but is not")
    return x * x


def flaky(path: str) -> str:
    """Fails on its first call (a file marks it), succeeds on the second: a retried job."""
    mark = Path(path)
    if not mark.exists():
        mark.write_text("1")
        raise RuntimeError("first attempt fails")
    return f"ok in {os.getpid() != 0}"


@pytest.mark.parametrize("processes", [1, 2])
def test_errors_keep_their_type_across_the_job_boundary(processes):
    results = map_jobs(judge, [3, -1, -2], processes=processes)
    assert results[0] == JobResult(0, True, 9, None, 1, False)
    assert results[1] == JobResult(1, False, None, "--width -1 must be positive; pass --width 8", 1, True)
    assert results[2] == JobResult(2, False, None, "ValueError: ProbeError: looks like a user error but is not", 1)
    assert results[1].failure() == "--width -1 must be positive; pass --width 8"
    assert results[2].failure() == "internal error: ValueError: ProbeError: looks like a user error but is not"
    assert results[0].failure() is None


@pytest.mark.parametrize("processes", [1, 2])
def test_one_retry_loop_for_in_process_and_process_jobs(tmp_path, processes):
    done: list[int] = []
    jobs = [str(tmp_path / f"{processes}-{i}") for i in range(3)]
    results = map_jobs(flaky, jobs, retries=1, processes=processes, on_done=lambda i, r: done.append(i))
    assert [r.ok for r in results] == [True] * 3 and [r.attempts for r in results] == [2, 2, 2]
    assert sorted(done) == [0, 1, 2]
    again = map_jobs(flaky, [str(tmp_path / "x")], retries=0, processes=processes)
    assert again == [JobResult(0, False, None, "RuntimeError: first attempt fails", 1)]


def test_jobs_must_be_positive_and_local():
    with pytest.raises(ProbeError, match="--jobs must be at least 1, got 0"):
        map_jobs(judge, [1], processes=0)
    with pytest.raises(ProbeError, match="--jobs applies to --backend local"):
        study("levine", "smoke", backend="ray", jobs=2)


@pytest.fixture(scope="module")
def two_studies(tmp_path_factory, tiny_corpus):
    root = tmp_path_factory.mktemp("jobs")
    corpus = tiny_corpus
    os.environ["DEPTHPROBE_CACHE"] = str(root / "cache")
    one = study("levine", "smoke", out=root / "one", corpus=str(corpus), jobs=1, echo=lambda _: None, **TINY)
    two = study("levine", "smoke", out=root / "two", corpus=str(corpus), jobs=2, echo=lambda _: None, **TINY)
    return one.folder, two.folder


CKPT = re.compile(r"ckpt-[0-9a-f]{8}")  # a checkpoint's folder has a random name
RANDOM = re.compile(rb"depthprobe-inputs-\w+|(?<=[#\"])(?:m|p|image)[0-9a-f]{10}\b")
# where a probe note names its temporary input, and matplotlib's random SVG element ids


def _files(folder: Path) -> dict[str, Path]:
    return {CKPT.sub("ckpt-*", str(p.relative_to(folder))): p for p in sorted(folder.rglob("*")) if p.is_file()}


def _untimed(path: Path) -> object:
    """A file's content without what records time (wall times, speeds, timings)."""
    if path.name == "loss.csv":
        return pd.read_csv(path).drop(columns=["elapsed_s"]).to_csv(index=False)
    if path.name == "manifest.json":
        data = json.loads(RANDOM.sub(b"*", path.read_bytes()))
        return {k: v for k, v in data.items() if k not in ("timings_s", "created", "host", "git_commit")}
    if path.name == "member.json":
        data = json.loads(path.read_text())
        row = {k: v for k, v in data["row"].items() if k not in TIMED}
        files = {CKPT.sub("ckpt-*", k): v for k, v in data["files"].items()
                 if not k.endswith(("loss.csv", ".json", ".svg"))}  # fmt: skip
        return {**data, "row": row, "files": files}
    if path.name == "depthprobe.json":
        return CKPT.sub("ckpt-*", path.read_text())
    return RANDOM.sub(b"*", path.read_bytes())


@pytest.mark.study
def test_study_with_two_jobs_equals_one_job_exactly(two_studies):
    one, two = two_studies
    a, b = pd.read_csv(one / "members.csv"), pd.read_csv(two / "members.csv")
    assert (a.status == "ok").all(), a.error.tolist()
    pd.testing.assert_frame_equal(a.drop(columns=sorted(TIMED)), b.drop(columns=sorted(TIMED)), check_exact=True)
    fa, fb = _files(one / "members"), _files(two / "members")
    assert sorted(fa) == sorted(fb)
    for rel in fa:
        assert _untimed(fa[rel]) == _untimed(fb[rel]), rel


@pytest.mark.study
def test_members_keep_tables_without_a_report_each_and_the_study_draws_them(two_studies):
    one, _ = two_studies
    members = one / "members"
    assert not list(members.rglob("report.html")), "a member probe run rendered its own HTML report"
    for run in ("induction", "kernels", "kernels-init", "attention-stats"):
        for name in ("scores.csv", "summary.csv", "summary.json", "manifest.json"):
            assert len(list(members.glob(f"*/runs/{run}/{name}"))) == 2, (run, name)
    assert not [p for p in members.iterdir() if p.name.startswith(".")]  # no partial folder left
    page = (one / "report.html").read_text(encoding="utf-8")
    assert "levine-b0007k-L01-s0" in page and "levine-b0007k-L02-s0" in page


@pytest.mark.study
def test_member_processes_reuse_a_pipe_corpus_the_driver_read(tmp_path, tiny_corpus):
    """A pipe can be read once: the member processes get the driver's corpus, not the pipe."""
    import threading

    fifo = tmp_path / "corpus.fifo"
    os.mkfifo(fifo)
    text = tiny_corpus.read_text(encoding="utf-8")
    writer = threading.Thread(target=lambda: fifo.write_text(text, encoding="utf-8"), daemon=True)
    writer.start()
    os.environ["DEPTHPROBE_CACHE"] = str(tmp_path / "cache")
    s = study("levine", "smoke", out=tmp_path / "s", corpus=str(fifo), jobs=2, echo=lambda _: None, **TINY)
    assert (s.table.status == "ok").all(), s.table.error.tolist()
