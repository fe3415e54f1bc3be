"""Every registered study family, and a law family of a shape no built-in one has (running sums mod
p: two groups, its own level, a prediction per level; tests/experiments/modular_family.py), meets
the protocol: its smoke preset plans, its page renders on planted tables and with no member
finished, its study folder round-trips, and (law families) its scores evaluate with the predict
they are given, so a skipped-block evaluation differs from the intact one."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

from depthprobe.probes.experiments import folder as folders
from depthprobe.probes.experiments.laws import LawExperiment
from depthprobe.probes.experiments.protocol import BUILT_IN, StudyConfig, get_experiment
from depthprobe.probes.experiments.report import render, render_folder, saved_config
from tests.experiments import modular_family

modular_family.register()
FAMILIES = [*BUILT_IN, "modular-test"]
LAW_FAMILIES = [f for f in FAMILIES if isinstance(get_experiment(f), LawExperiment)]


def smoke(family: str):
    exp = get_experiment(family)
    return exp, exp.config("smoke", device="cpu")


def failed_members(exp, jobs) -> pd.DataFrame:
    rows = [{**exp.base_row(j), "status": "failed", "error": "planted failure"} for j in jobs]
    return pd.DataFrame(rows, columns=exp.columns)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_smoke_preset_plans_members_of_distinct_names_and_full_rows(family):
    exp, cfg = smoke(family)
    assert isinstance(cfg, StudyConfig) and cfg.preset == "smoke"
    jobs = exp.plan(cfg)
    assert jobs and len({j.name for j in jobs}) == len(jobs)
    assert all(list(exp.base_row(j)) == exp.columns for j in jobs)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_page_renders_with_no_member_finished_and_the_folder_round_trips(family, tmp_path):
    exp, cfg = smoke(family)
    jobs = exp.plan(cfg)
    members = failed_members(exp, jobs)
    page = render(exp, cfg, {folders.MEMBERS_CSV: members}, tmp_path)
    assert exp.name in page and "planted failure" in page
    folders.write_study_json(tmp_path, {"family": family, "preset": "smoke", "config": dataclasses.asdict(cfg)})
    folders.write_table(tmp_path, folders.MEMBERS_CSV, members)
    saved = json.loads((tmp_path / folders.STUDY_JSON).read_text())
    assert saved_config(exp, saved) == cfg
    assert "planted failure" in render_folder(tmp_path)


def plant(exp: LawExperiment, cfg, folder) -> pd.DataFrame:
    """members.csv and each member's accuracy.csv and curves.csv: accuracy 1 from depth 2 on, 0.5
    below, and 0.5 at every depth in the last of two or more groups (a blank measured depth)."""
    jobs = exp.plan(cfg)
    keys = list(exp.eval_sets(jobs[0], 1))
    groups = list(dict.fromkeys(j.group for j in jobs))
    rows = []
    for job in jobs:
        acc = 1.0 if job.depth >= 2 and (len(groups) < 2 or job.group != groups[-1]) else 0.5
        out = folder / folders.MEMBERS / job.name
        out.mkdir(parents=True)
        accuracy = [{**job.ids(), exp.key: k, "accuracy": acc, exp.second: acc, "step_reached": None} for k in keys]
        pd.DataFrame(accuracy).to_csv(out / "accuracy.csv", index=False)
        curve = [
            {"member": job.name, "step": cfg.steps, exp.key: k, "accuracy": acc, "accuracy_all": acc} for k in keys
        ]
        pd.DataFrame(curve).to_csv(out / "curves.csv", index=False)
        rows.append({**exp.base_row(job), "params": 1000, "status": "ok", "error": ""})
    return pd.DataFrame(rows, columns=exp.columns)


@pytest.mark.parametrize("family", LAW_FAMILIES)
def test_the_law_page_renders_on_planted_tables(family, tmp_path):
    exp, cfg = smoke(family)
    members = plant(exp, cfg, tmp_path)
    tables = {folders.MEMBERS_CSV: members, **exp.tables(cfg, members, tmp_path)}
    assert not tables["law.csv"].empty and set(exp.law_columns) <= set(tables["law.csv"])
    page = render(exp, cfg, tables, tmp_path)
    assert "<h2>The law</h2>" in page and "<h2>Accuracy</h2>" in page


@pytest.mark.parametrize("family", LAW_FAMILIES)
def test_scores_evaluate_with_the_predict_they_are_given(family):
    """A planted member whose blocks matter: intact it predicts every target, with a block skipped
    every target is wrong. The family's scores must see the difference (a family that evaluated
    its own way would write a skipped_accuracy.csv equal to the intact accuracy)."""
    from depthprobe.probes.experiments.law_member import predictor
    from depthprobe.probes.models.loading import load

    exp, cfg = smoke(family)
    job = next(j for j in exp.plan(cfg) if not j.control)
    sets = exp.eval_sets(job, 8)
    answers = {id(x): y for x, y in sets.values()}

    def intact(inputs, decide=None):
        return answers[id(inputs)]

    def skipped(inputs, decide=None):
        return answers[id(inputs)] + 1

    good, bad = exp.scores(job, intact, sets), exp.scores(job, skipped, sets)
    assert set(good) == set(sets) and all(acc == 1.0 for acc, _ in good.values())
    assert all(bad[k][0] < good[k][0] for k in sets)
    model = load(job.native(), device="cpu")  # and a real member: skipping its block 0 changes its predictions
    x = next(iter(sets.values()))[0]
    logits = [predictor(model, skip)(x, lambda z: z) for skip in ((), (0,))]
    assert not torch.allclose(logits[0], logits[1])
