"""The ``crasp`` depth family (`probe study --family crasp`): the smoke preset end to end, a trained
depth-1 NoPE member obeying the depth-1 theory, the law table's arithmetic on planted accuracies,
the cpu plan, and bad options refused in one line."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from depthprobe.probes.data import crasp, crasp_cap
from depthprobe.probes.experiments.crasp import Crasp, predicted_depth
from depthprobe.probes.experiments.laws import ROW_COLUMNS
from depthprobe.probes.experiments.runner import study as run_study
from depthprobe.probes.models.loading import load
from tests.helpers import cli_error, law_table, plan, resolve


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    return run_study("crasp", "smoke", out=tmp_path_factory.mktemp("crasp") / "smoke", echo=lambda _: None)


@pytest.mark.study
def test_smoke_writes_every_table(smoke):
    out = smoke.folder
    for name in ("members.csv", "accuracy.csv", "law.csv", "depths.csv", "ranges.csv", "curves.csv", "report.html"):
        assert (out / name).is_file(), name
    members = pd.read_csv(out / "members.csv")
    assert list(members.columns) == [*ROW_COLUMNS, "k"]
    assert list(members.member) == ["k4-L1-d16-s0", "k4-L2-d16-s0", "k4-control-L1-d32-s0"]
    assert (members.status == "ok").all()
    acc = pd.read_csv(out / "accuracy.csv")
    assert sorted(set(acc.max_length)) == [16, 32] and acc.accuracy.between(0, 1).all()
    assert (acc.accuracy <= acc.token_accuracy).all()  # every string right implies its tokens right
    law = pd.read_csv(out / "law.csv")
    assert list(law.k) == [4] and list(law.predicted_depth) == [2] and list(law.solve_range) == ["17-32"]
    assert law.depth1_token_cap.iloc[0] == pytest.approx(crasp_cap.token_cap(4, 8, 16), abs=1e-4)
    ranges = pd.read_csv(out / "ranges.csv")
    assert ranges.majority.between(0.5, 1).all()
    assert "Exact-match accuracy by model and length" in (out / "report.html").read_text()


@pytest.mark.study
def test_a_trained_depth_one_member_answers_by_cell(smoke):
    """Without positions, depth 1's answer at t is a function of (x_t, #a, #b): equal cells, equal
    answers, in the trained member as loaded from its checkpoint."""
    model = load(str(smoke.folder / "members" / "k4-L1-d16-s0" / "checkpoint"), device="cpu")
    inputs, targets = crasp.eval_batch(4, 64, 8, 32, seed=5)
    with torch.no_grad():
        pred = crasp.predictions(model.bridge(inputs))
    x = inputs[:, 1:]
    counts_a, counts_b = (x == crasp.A).cumsum(1), (x == crasp.B).cumsum(1)
    answers: dict[tuple[int, int, int], set[int]] = {}
    scored = targets[:, 1:] != crasp.IGNORE
    for cell, p in zip(
        zip(x[scored].tolist(), counts_a[scored].tolist(), counts_b[scored].tolist(), strict=True),
        pred[:, 1:][scored].tolist(),
        strict=True,
    ):
        answers.setdefault(cell, set()).add(p)
    assert len(answers) > 50 and all(len(a) == 1 for a in answers.values())


def test_law_arithmetic_on_planted_accuracies():
    rows = []
    for seed in (0, 1):
        for depth, at16, at32 in ((1, 0.97, 0.4), (2, 0.99, 0.96 - 0.02 * seed), (3, 1.0, 0.99)):
            for hi, acc in ((16, at16), (32, at32)):
                rows.append(
                    dict(
                        member=f"L{depth}-s{seed}",
                        group="L4",
                        depth=depth,
                        d_model=16,
                        seed=seed,
                        control=False,
                        max_length=hi,
                        accuracy=acc,
                        token_accuracy=acc,
                        k=4,
                    )
                )
        rows.append(
            dict(
                member=f"c-s{seed}",
                group="L4",
                depth=1,
                d_model=32,
                seed=seed,
                control=True,
                max_length=32,
                accuracy=0.2 + 0.2 * seed,
                token_accuracy=0.9,
                k=4,
            )
        )
    law = law_table(pd.DataFrame(rows), "crasp", threshold=0.95, seeds=2).iloc[0]
    assert law.predicted_depth == 2 and law.measured_depth == 3 and law.difference == 1  # seed 1 at depth 2: 0.94
    assert law.in_distribution_depth == 1  # 0.97 in both seeds at the training lengths
    assert (law.control_depth, law.control_d_model, law.control_exact_match) == (1, 32, pytest.approx(0.3))
    assert law.depth1_exact_match == pytest.approx(0.97)
    assert law.depth1_string_cap == pytest.approx(crasp_cap.string_cap_l4(8, 16)[0], abs=1e-4)
    assert [predicted_depth(k) for k in (3, 4, 5, 6)] == [1, 2, 3, 4]


def test_cpu_plan():
    cfg = resolve("crasp", "cpu")
    assert (cfg.ks, cfg.depths, cfg.steps, cfg.seeds, cfg.threshold) == ((3, 4, 5, 6), (1, 2, 3, 4, 5), 2000, 2, 0.95)
    assert cfg.ranges == ((32, 64), (65, 128), (129, 256), (257, 512))
    jobs = plan(cfg)
    assert len(jobs) == 4 * 2 * 5 + 3 * 2 and len({j.name for j in jobs}) == len(jobs)
    controls = [(j.k, j.depth, j.d_model) for j in jobs if j.control and j.seed == 0]
    assert controls == [(4, 1, 128), (5, 2, 128), (6, 3, 128)]  # depth k - 3 at twice the width; none for L_3
    native = jobs[0].native()
    assert native.positional == "none" and native.d_vocab == 4 and native.n_ctx == 513
    assert Crasp().base_row(jobs[0])["k"] == 3


def test_bad_options_are_one_line_errors(tmp_path):
    cli_error(["study", "--family", "crasp", "--solve-at", "100", "--out", tmp_path / "a"], "--solve-at")
    cli_error(["study", "--family", "crasp", "--ks", "3,3", "--out", tmp_path / "b"], "--ks")
    cli_error(["study", "--family", "crasp", "--eval-lengths", "16,8", "--out", tmp_path / "c"], "--eval-lengths")
    assert not any(tmp_path.iterdir())
