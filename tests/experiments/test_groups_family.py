"""The reworked ``groups`` family: Merrill and Sabharwal's length curriculum, Z_60 beside A_5, the
accuracy per position and the longest prefix solved."""

from __future__ import annotations

import pandas as pd
import pytest

from depthprobe.probes.experiments.groups import prefix_table
from depthprobe.probes.experiments.runner import study as run_study
from tests.helpers import cli_error, plan, resolve


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return run_study("groups", "smoke", out=tmp_path_factory.mktemp("groups") / "smoke", echo=lambda _: None)


@pytest.mark.study
def test_smoke_curriculum_positions_and_prefix(smoke):
    out = smoke.folder
    members = pd.read_csv(out / "members.csv")
    assert (members.status == "ok").all() and len(members) == 4  # the controls would equal depth 2: left out
    curriculum = pd.read_csv(out / "curriculum.csv")
    for _, moves in curriculum.groupby("member"):
        assert moves.length.iloc[0] == 2 and moves.step.iloc[0] == 0  # every member starts on pairs
        assert set(moves.length) <= {2, 4, 8} and moves.length.is_monotonic_increasing
        assert (moves.step % 10 == 0).all()  # moves only at the checks (check_every 10)
    positions = pd.read_csv(out / "positions.csv")
    assert (positions.groupby("member").position.max() == 7).all()  # every position of T = 8
    assert positions[positions.group == "z2"].sign_accuracy.isna().all()
    assert positions[positions.group == "s3"].sign_accuracy.between(0, 1).all()
    prefix = pd.read_csv(out / "prefix.csv")
    assert set(prefix.group) == {"z2", "s3"} and prefix.longest_prefix_max.between(0, 8).all()
    assert "Longest prefix solved" in (out / "report.html").read_text()


@pytest.mark.study
def test_prefix_table_on_planted_accuracies():
    cfg = resolve("groups", "smoke", threshold=0.9, seeds=2)
    rows = []
    for seed, accs in ((0, [1.0, 0.95, 0.5, 0.2]), (1, [1.0, 0.99, 0.92, 0.3])):
        for t, a in enumerate(accs):
            rows.append(
                dict(
                    member=f"s3-L2-s{seed}",
                    group="s3",
                    depth=2,
                    d_model=16,
                    seed=seed,
                    control=False,
                    position=t,
                    accuracy=a,
                    sign_accuracy=1.0 - 0.5 * seed,
                )
            )
    curriculum = pd.DataFrame({"member": ["s3-L2-s0", "s3-L2-s0", "s3-L2-s1"], "step": [0, 20, 0], "length": [2, 4, 2]})
    got = prefix_table(cfg, pd.DataFrame(rows), curriculum).iloc[0]
    assert (got.longest_prefix_min, got.longest_prefix_max) == (2, 3)  # seed 0 fails at t = 2, seed 1 at t = 3
    assert got.trained_to == 2 and got.order == 6 and bool(got.solvable)
    assert got.accuracy_last == pytest.approx(0.25) and got.sign_accuracy_last == pytest.approx(0.75)


def test_cpu_plan_puts_z60_and_a4xz5_beside_a5():
    cfg = resolve("groups", "cpu")
    assert cfg.groups == ("s3", "z60", "A4xZ5", "a5") and cfg.curriculum
    assert cfg.lengths == (2, 4, 8, 16)  # T = 2 (pairs: learning the table) reported apart from longer T
    jobs = plan(cfg)
    assert len(jobs) == 4 * 2 * (4 + 1)
    assert {j.group: j.vocab for j in jobs} == {"s3": 6, "z60": 60, "A4xZ5": 60, "a5": 60}


def test_bad_curriculum_options(tmp_path):
    cli_error(["study", "--family", "groups", "--check-every", "0", "--out", tmp_path / "a"], "--check-every")
    cli_error(["study", "--family", "groups", "--lengths", "1", "--out", tmp_path / "b"], "--curriculum")
    assert not any(tmp_path.iterdir())


@pytest.mark.study
def test_curriculum_check_moves_on_only_at_checks_and_when_solved(tmp_path):
    from depthprobe.probes.experiments.groups import Groups
    from depthprobe.probes.experiments.law_member import predictor
    from depthprobe.probes.models.loading import load
    from depthprobe.probes.training.sources import CurriculumSource

    exp = Groups()
    job = plan(resolve("groups", "smoke", groups=("s3",), threshold=1e-9))[0]  # any accuracy counts as solved
    model = load(job.native(), device="cpu")
    source = exp.source(job)
    assert isinstance(source, CurriculumSource) and source.lengths == (2, 4, 8)
    predict = predictor(model)
    assert not source.check(predict, 5) and source.length == 2  # not a check step
    assert source.check(predict, 10) and source.length == 4
    strict = exp.source(plan(resolve("groups", "smoke", groups=("s3",), threshold=1.0))[0])
    assert isinstance(strict, CurriculumSource) and strict.threshold == 1.0
    source.threshold = strict.threshold
    assert source.check(predict, 20) and source.length == 4  # an untrained model: not solved
    exp.probe(job, model, tmp_path, source)
    assert pd.read_csv(tmp_path / "curriculum.csv")[["step", "length"]].values.tolist() == [[0, 2], [10, 4]]
