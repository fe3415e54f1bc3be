"""One builder for a run's page: the report drawn from a Result in memory when it is saved equals the
report `probe report RUN_DIR` draws from the saved files, byte for byte."""

from __future__ import annotations

import pytest

from depthprobe.probes import run
from depthprobe.probes.render import report


@pytest.mark.parametrize("task", ["attention-stats", "syntax", "coref", "kernels"])
def test_the_page_saved_from_memory_equals_the_page_redrawn_from_disk(tiny_bert, tmp_path, task):
    out = run(tiny_bert, task, limit=3, max_len=64).save(tmp_path / "run")
    saved = (out / "report.html").read_bytes()
    (out / "report.html").unlink()
    assert report.write_report(out).read_bytes() == saved


def test_the_page_is_drawn_without_reading_the_saved_tables(tiny_bert, tmp_path, monkeypatch):
    """Saving draws from the Result: reading the run folder back (RunData.read) is never needed."""

    def no_reading(run_dir):
        raise AssertionError(f"the report read {run_dir} back from disk")

    monkeypatch.setattr(report.RunData, "read", no_reading)
    out = run(tiny_bert, "attention-stats", limit=2).save(tmp_path / "run")
    assert "attention-stats" in (out / "report.html").read_text(encoding="utf-8")
