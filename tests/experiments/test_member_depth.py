"""Depth usage in every study member (probes/experiments/member_depth.py): the member and study
tables of a law family (khop, crasp) and a text family (levine), switched off by --depth-usage
false, the skipped-block accuracy equal to evaluating with probes.skip_layers by hand, and resume."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from depthprobe import probes
from depthprobe.cli.main import app
from depthprobe.probes.data import khop
from depthprobe.probes.experiments import member_depth
from depthprobe.probes.experiments.protocol import (
    EXPERIMENTS,
    Experiment,
    StudyConfig,
    get_experiment,
    register_experiment,
)
from depthprobe.probes.experiments.runner import study
from tests.helpers import plan, resolve

TINY = {"vocab": 300, "min_tokens": 4096, "tokens_per_param": 0.1, "context": 32, "batch_size": 8,
        "probe_lines": 10, "icl_windows": 2}  # fmt: skip
TASK_COLUMNS = ["member", "model", "task", "layer", "head", "metric", "value", "skipped", "later"]
LAYER_METRICS = ["relative_contribution", "cosine", "skip_output", "skip_kl", "skip_top1"]


@pytest.fixture(scope="module")
def khop_study(tmp_path_factory):
    return study("khop", "smoke", out=tmp_path_factory.mktemp("depth") / "khop", echo=lambda line: None)


def test_law_members_write_depth_tables(khop_study):
    folder = khop_study.folder
    members = khop_study.table
    for m, depth in zip(members["member"], members["depth"], strict=True):
        usage = pd.read_csv(folder / "members" / m / "depth_usage.csv")
        assert list(usage.columns) == TASK_COLUMNS and set(usage["member"]) == {m}
        assert sorted(usage.loc[usage.metric == "relative_contribution", "layer"]) == list(range(depth))
        skipped = pd.read_csv(folder / "members" / m / "skipped_accuracy.csv")
        assert list(skipped.columns) == ["member", "skipped", "k", "accuracy", "drop"]
        assert len(skipped) == 2 * (depth + 1)  # k 1, 2: intact and each block skipped
    table = pd.read_csv(folder / "depth_usage.csv")
    assert list(table.columns) == ["member", "depth", "d_model", "heads", "seed", "control", "layer", *LAYER_METRICS]
    assert len(table) == int(members["depth"].sum())
    study_skipped = pd.read_csv(folder / "skipped_accuracy.csv")
    assert list(study_skipped.columns)[:6] == ["member", "depth", "d_model", "heads", "seed", "control"]
    report = (folder / "report.html").read_text()
    assert "<h2>Depth usage</h2>" in report and "<h2>Accuracy with each block skipped</h2>" in report


def test_intact_accuracy_is_the_final_accuracy(khop_study):
    """The same evaluation sets through the hooks give accuracy.csv's numbers."""
    skipped = pd.read_csv(khop_study.folder / "skipped_accuracy.csv")
    intact = skipped[skipped.skipped.isna()].set_index(["member", "k"])["accuracy"]
    final = pd.read_csv(khop_study.folder / "accuracy.csv").set_index(["member", "k"])["accuracy"]
    assert intact.sort_index().tolist() == pytest.approx(final.sort_index().tolist(), abs=1e-12)


def test_skipped_accuracy_equals_skip_layers_by_hand(khop_study):
    cfg = khop_study.config
    job = next(j for j in plan(cfg) if j.depth == 2 and not j.control)
    exp = get_experiment("khop")
    model = probes.load_checkpoint(khop_study.folder / "members" / job.name / "checkpoint", device="cpu")
    table = pd.read_csv(khop_study.folder / "members" / job.name / "skipped_accuracy.csv")
    for s in (0, 1):
        for k, (x, y) in exp.eval_sets(job, cfg.eval_sequences).items():
            with probes.skip_layers(model, [s]), torch.no_grad():
                by_hand = khop.accuracy(model.bridge(x).argmax(-1), y, cfg.letters)[0]
            got = table.loc[(table.skipped == s) & (table.k == k), "accuracy"].item()
            assert got == pytest.approx(by_hand, abs=1e-12), (s, k)


@pytest.mark.study
def test_switched_off_writes_none(tmp_path):
    out = tmp_path / "crasp"
    result = CliRunner().invoke(
        app, ["study", "--family", "crasp", "--preset", "smoke", "--out", str(out), "--depth-usage", "false"]
    )
    assert result.exit_code == 0, result.output
    assert not list(out.rglob("depth_usage.csv")) and not list(out.rglob("skipped_accuracy.csv"))
    assert "Depth usage" not in (out / "report.html").read_text()
    assert resolve("crasp", "smoke", depth_usage="no").depth_usage is False
    assert resolve("levine", "smoke").depth_usage is True


@pytest.mark.study
def test_crasp_skipped_accuracy_per_length_range(tmp_path):
    s = study("crasp", "smoke", out=tmp_path / "crasp", echo=lambda line: None)
    table = pd.read_csv(s.folder / "skipped_accuracy.csv")
    assert {"k", "max_length", "skipped", "accuracy", "drop"} <= set(table.columns)
    assert sorted(set(table["max_length"])) == [16, 32]
    usage = pd.read_csv(s.folder / "depth_usage.csv")
    assert set(usage["member"]) == set(s.table["member"])


@pytest.mark.study
def test_text_members_and_resume(tmp_path, tiny_corpus):
    lines: list[str] = []
    first = study("levine", "smoke", out=tmp_path / "l", corpus=str(tiny_corpus), echo=lines.append, **TINY)
    folder = first.folder
    members = first.table
    for m in members["member"]:
        usage = pd.read_csv(folder / "members" / m / "depth_usage.csv")
        assert list(usage.columns) == TASK_COLUMNS
        assert not (folder / "members" / m / "skipped_accuracy.csv").exists()  # text members: no task levels
    table = pd.read_csv(folder / "depth_usage.csv")
    assert list(table.columns)[:4] == ["member", "variant", "depth", "d_model"]
    assert len(table) == int(members["depth"].sum())
    one = pd.read_csv(folder / "members" / members["member"][0] / "depth_usage.csv")
    rel = one[one.metric == "relative_contribution"].set_index("layer")["value"]
    mine = table[table.member == members["member"][0]].set_index("layer")["relative_contribution"]
    assert mine.tolist() == pytest.approx(rel.tolist(), abs=0)
    lines.clear()
    again = study("levine", "smoke", out=folder, corpus=str(tiny_corpus), echo=lines.append, **TINY)
    assert any("2 finished member(s) kept" in line for line in lines)
    pd.testing.assert_frame_equal(pd.read_csv(again.folder / "depth_usage.csv"), table)


@dataclass(frozen=True)
class PluginConfig(StudyConfig):
    preset: str = "smoke"
    depths: tuple[int, ...] = (1, 2)
    depth_usage: bool = True  # the one declaration: --depth-usage reads it


@dataclass(frozen=True)
class PluginJob:
    config: PluginConfig
    depth: int
    dest: str | None = None

    @property
    def name(self) -> str:
        return f"L{self.depth}"


class PluginFamily(Experiment):
    """A plugin's family: untrained native members, the probe called once in the member."""

    name = "depthplugin"
    Config = PluginConfig
    presets: ClassVar[dict[str, dict[str, Any]]] = {"smoke": {}}
    costs: ClassVar[dict[str, str]] = {"smoke": "two untrained members, seconds"}
    columns: ClassVar[list[str]] = ["family", "member", "depth", "wall_s", "device", "status", "error"]

    def plan(self, config: PluginConfig) -> list[PluginJob]:
        return [PluginJob(config, d) for d in config.depths]

    def base_row(self, job: PluginJob) -> dict[str, Any]:
        return {**super().base_row(job), "depth": job.depth}

    def measure(self, job: PluginJob, folder: Path, row: dict[str, Any]) -> dict[str, Any]:
        model = probes.load(f"native:layers={job.depth},d_model=16,heads=2,d_vocab=12,n_ctx=8,seed=0", device="cpu")
        if job.config.depth_usage:
            ids = torch.randint(0, 12, (4, 8), generator=torch.Generator().manual_seed(0))
            member_depth.write_depth_usage(model, ids, folder, job.name)
        row["device"] = "cpu"
        return {}


@pytest.mark.study
def test_a_plugin_family_gets_the_study_table(tmp_path, monkeypatch):
    monkeypatch.setattr(EXPERIMENTS, "_items", dict(EXPERIMENTS._items))  # registered for this test only
    register_experiment(PluginFamily)
    s = study("depthplugin", "smoke", out=tmp_path / "p", echo=lambda line: None)
    table = pd.read_csv(s.folder / "depth_usage.csv")
    assert list(table.columns)[:3] == ["member", "depth", "layer"] and len(table) == 1 + 2
    assert "<h2>Depth usage</h2>" in (s.folder / "report.html").read_text()
    off = study("depthplugin", "smoke", out=tmp_path / "off", echo=lambda line: None, depth_usage="false")
    assert not list(off.folder.rglob("depth_usage.csv"))
