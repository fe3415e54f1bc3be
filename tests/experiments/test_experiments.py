"""The experiment protocol: a toy family defined outside the package (tests/fixtures/toy_family.py)
runs through `probe study --plugin` and `probes.study` with resume, failure rows, --dry-run,
--jobs 2 and its report; families are looked up, suggested and refused through the registry."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from depthprobe import probes
from depthprobe.cli.main import app
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.engine.plugins import load_plugin
from depthprobe.probes.experiments.khop import predicted_depth
from depthprobe.probes.experiments.protocol import EXPERIMENTS
from tests.helpers import TOY_FAMILY, toy_study

runner = CliRunner()


def toy(out: Path, *more: str) -> object:
    return toy_study(out, "--preset", "smoke", *more)


def test_toy_family_runs_resumes_and_reports(tmp_path):
    res = toy(tmp_path / "a")
    assert res.exit_code == 0, res.output
    members = pd.read_csv(tmp_path / "a" / "members.csv")
    assert list(members["member"]) == ["L1-s0", "L2-s0", "L4-s0"]
    assert list(members["depth"]) == [1, 2, 4] and set(members["status"]) == {"ok"}
    by_depth = pd.read_csv(tmp_path / "a" / "by_depth.csv")
    assert by_depth["loss"].tolist() == [1.0, 0.5, 0.25]
    page = (tmp_path / "a" / "report.html").read_text()
    assert "Loss by depth" in page and "depth 4: 0.250" in page and "members 3 ok, 0 failed" in page
    again = toy(tmp_path / "a")
    assert again.exit_code == 0 and "3 finished member(s) kept" in again.output


def test_toy_failures_are_rows_and_exit_3(tmp_path):
    res = toy(tmp_path / "f", "--fail-depth", "2")
    assert res.exit_code == 3, res.output
    members = pd.read_csv(tmp_path / "f" / "members.csv")
    failed = members[members.status == "failed"]
    assert list(failed["member"]) == ["L2-s0"] and "fails on purpose" in failed["error"].iloc[0]
    assert pd.read_csv(tmp_path / "f" / "by_depth.csv")["depth"].tolist() == [1, 4]
    assert "Failed members" in (tmp_path / "f" / "report.html").read_text()
    other = toy(tmp_path / "f")  # other settings on the same folder: refused, nothing changed
    assert other.exit_code == 2 and "holds another study" in other.output


def test_toy_dry_run_and_jobs_2_equal_jobs_1(tmp_path):
    res = toy(tmp_path / "p", "--dry-run")
    assert res.exit_code == 0, res.output
    plan = pd.read_csv(tmp_path / "p" / "plan.csv")
    assert list(plan["member"]) == ["L1-s0", "L2-s0", "L4-s0"] and "cpu_minutes" in plan
    assert not (tmp_path / "p" / "members.csv").exists()
    one, two = toy(tmp_path / "j1", "--depths", "1,2"), toy(tmp_path / "j2", "--depths", "1,2", "--jobs", "2")
    assert one.exit_code == 0 and two.exit_code == 0, two.output
    for name in ("members.csv", "by_depth.csv"):
        a, b = pd.read_csv(tmp_path / "j1" / name), pd.read_csv(tmp_path / "j2" / name)
        pd.testing.assert_frame_equal(
            a.drop(columns="wall_s", errors="ignore"), b.drop(columns="wall_s", errors="ignore")
        )


def test_toy_through_the_python_api(tmp_path):
    load_plugin(TOY_FAMILY)
    study = probes.study("toy", "smoke", out=tmp_path / "api", depths=(2, 4), shape="flat", echo=lambda line: None)
    assert study["by_depth.csv"]["loss"].tolist() == [1.0, 1.0]
    with pytest.raises(ProbeError, match=r"unknown shape 'flatt' \(did you mean 'flat'\?\)"):
        probes.study("toy", out=tmp_path / "bad", shape="flatt")
    assert not (tmp_path / "bad").exists()


@pytest.mark.study
def test_families_come_from_the_registry_with_suggestions():
    assert {"levine", "petty", "spa", "khop", "groups"} <= set(EXPERIMENTS.names())
    res = runner.invoke(app, ["study", "--family", "khopp", "--out", "/nonexistent/x"])
    assert res.exit_code == 2 and "did you mean 'khop'" in res.output
    res = runner.invoke(app, ["study", "--family", "levine", "--ks", "1,2", "--out", "/nonexistent/x"])
    assert res.exit_code == 2 and "--ks applies to the crasp, khop families, not levine" in res.output
    res = runner.invoke(app, ["study", "--help"])
    assert res.exit_code == 0 and "khop" in res.output and "levine" in res.output


def test_khop_prediction_is_sanfords_construction():
    assert [predicted_depth(k) for k in (1, 2, 3, 4, 7, 8, 16)] == [2, 3, 3, 4, 4, 5, 6]


def test_no_family_switch_outside_the_registry():
    """The experiment layer dispatches on a family only through the registry: no ``family ==``."""
    root = Path(__file__).resolve().parents[2]
    layer = [
        *(root / "probes" / "experiments").glob("*.py"),
        *(root / "probes" / "render").glob("*.py"),
        *(root / "probes" / "api").glob("*.py"),
        *(root / "cli").glob("*.py"),
    ]
    switches = [
        p.name for p in layer for line in p.read_text().splitlines() if "family ==" in line or "family !=" in line
    ]
    assert switches == []


def test_dry_run_plans_every_family_with_costs(tmp_path):
    for family in ("khop", "groups"):
        res = runner.invoke(app, ["study", "--family", family, "--dry-run", "--out", str(tmp_path / family)])
        assert res.exit_code == 0, res.output
        plan = pd.read_csv(tmp_path / family / "plan.csv")
        assert len(plan) == 2 * (2 if family == "groups" else 1) and (plan["cpu_minutes"] > 0).all()
        assert (plan["flops"] == 6 * plan["params"] * plan["tokens"]).all()
        assert not (tmp_path / family / "members.csv").exists()
