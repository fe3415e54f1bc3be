"""Sharded runs and the job map: every task's merge step, and the same runs on a real local Ray instance."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from depthprobe import probes
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.runtime import seed_everything, torch_threads
from depthprobe.probes.engine import distributed
from depthprobe.probes.engine.distributed import JobResult, map_jobs, pack_state, plan_shards, unpack_state
from depthprobe.probes.engine.execute import accumulate, execute
from depthprobe.probes.engine.task import Context, Examples, NoOptions, Output, RunConfig, Task, get_task
from depthprobe.probes.models import variant_net, variants
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import NativeConfig
from tests.helpers import ReadsNothing, run_python

REPO = Path(__file__).resolve().parents[2]
# Sharded and local runs do the same float32 work per batch (workers run the driver's torch thread
# count: test_workers_run_the_drivers_thread_count), but the merge adds float64 shard sums in another
# grouping than one running sum: last-bit differences (3e-17 measured), far inside TOL (docs/distributed.md).
TOL = 1e-9
# ----------------------------------------------------------------------------- comparing outputs


def assert_close(a: Any, b: Any, where: str = "") -> None:
    """Equal structures; numbers (floats, arrays, tensors, frames) equal to TOL."""
    if isinstance(a, pd.DataFrame):
        assert list(a.columns) == list(b.columns) and a.shape == b.shape, where
        for col in a.columns:
            assert_close(a[col].tolist(), b[col].tolist(), f"{where}.{col}")
    elif isinstance(a, torch.Tensor):
        assert_close(a.double().numpy(), b.double().numpy(), where)
    elif isinstance(a, np.ndarray):
        assert a.shape == b.shape, where
        if a.dtype.kind in "fc":
            assert np.allclose(a, b, rtol=0, atol=TOL, equal_nan=True), f"{where}: max diff {np.nanmax(abs(a - b))}"
        else:
            assert np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= TOL, f"{where}: {a} != {b}"
    elif a is pd.NA or a is None or (isinstance(a, float) and math.isnan(a)):
        assert b is a or (isinstance(b, float) and math.isnan(b)), f"{where}: {a!r} != {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_output(a: Output, b: Output) -> None:
    assert_close(a.scores, b.scores, "scores")
    assert_close(a.summary, b.summary, "summary")
    assert_close(a.headline, b.headline, "headline")
    assert a.notes == b.notes
    assert_close(a.views, b.views, "views")
    assert a.heatmaps == b.heatmaps
    assert a.files.keys() == b.files.keys()
    for name, data in a.files.items():
        if name.endswith(".csv"):
            assert_close(
                pd.read_csv(pd.io.common.BytesIO(data)), pd.read_csv(pd.io.common.BytesIO(b.files[name])), name
            )
        elif name.endswith(".npz"):
            x, y = np.load(pd.io.common.BytesIO(data)), np.load(pd.io.common.BytesIO(b.files[name]))
            assert_close(dict(x), dict(y), name)


# ----------------------------------------------------------------------------- merge, without Ray


def whole_and_merged(model, task_name: str, data: Path | None = None, **options: Any) -> tuple[Output, Output, int]:
    """The task's output over every batch, and over its batches split in two halves (each started
    fresh and run alone, the states passed through the worker's pickling) then merged."""
    batch_size, max_len, limit = options.pop("batch_size", 2), options.pop("max_len", 128), options.pop("limit", None)
    task: Task = get_task(task_name)
    config = RunConfig(
        model=model.info.name,
        task=task_name,
        data=None if data is None else str(data),
        batch_size=batch_size,
        max_len=max_len,
        limit=limit,
        options=tuple(sorted(options.items())),
    )
    ctx = Context(config=config, options=task.parse_options(options))
    seed_everything(0)
    examples = task.load(model, ctx).head(limit)
    seed_everything(0)
    whole, n = execute(task, model, ctx, examples)
    half = n // 2
    seed_everything(0)
    a, na = accumulate(task, model, ctx, examples, batches=range(0, half))
    b, nb = accumulate(task, model, ctx, examples, batches=range(half, n))
    assert na + nb == n
    a, b = (unpack_state(pack_state(s, model), model) for s in (a, b))
    seed_everything(0)
    return whole, task.finalize(task.merge(a, b), ctx), n


def test_merge_attention_stats_both_protocols(tiny_bert, tiny_gpt2):
    for model in (tiny_bert, tiny_gpt2):
        for protocol in ("pooled", "clark"):
            whole, merged, n = whole_and_merged(model, "attention-stats", protocol=protocol)
            assert n >= 4
            assert_same_output(whole, merged)


def test_merge_syntax(tiny_bert):
    whole, merged, n = whole_and_merged(tiny_bert, "syntax")
    assert n >= 2 and merged.headline["n_words"] == whole.headline["n_words"] > 0
    assert_same_output(whole, merged)


def test_merge_coref_chains_and_gap(tiny_bert, tmp_path):
    whole, merged, n = whole_and_merged(tiny_bert, "coref", max_len=64, views=3)
    assert n >= 2 and len(merged.views) == len(whole.views) > 0
    assert_same_output(whole, merged)
    from tests.tasks.test_coref import GAP_HEADER, GAP_ROWS

    gap = tmp_path / "gap.tsv"
    gap.write_text(GAP_HEADER + "\n" + "\n".join(GAP_ROWS) + "\n", encoding="utf-8")
    whole, merged, n = whole_and_merged(tiny_bert, "coref", gap, batch_size=1, views=3)
    assert n == 5
    assert_same_output(whole, merged)


def test_merge_induction_with_icl_and_k_composition(tiny_gpt2):
    whole, merged, n = whole_and_merged(tiny_gpt2, "induction", repeat_len=8, n_seqs=6, icl_windows=2)
    assert n == 3 and "icl_score" in merged.headline
    assert_same_output(whole, merged)
    native = load(NativeConfig(layers=2, d_model=32, heads=2, d_vocab=16, n_ctx=32), device="cpu")
    whole, merged, n = whole_and_merged(native, "induction", repeat_len=8, n_seqs=5)
    assert "k_composition.csv" in merged.files and merged.headline["n_sequences"] == 5
    assert_same_output(whole, merged)


def test_merge_kernels_text_and_theory(tiny_bert):
    whole, merged, n = whole_and_merged(tiny_bert, "kernels", batch_size=3)
    assert n >= 2
    assert_same_output(whole, merged)
    m = variant_net.build(variants.SPAConfig(**{"width": 64, "heads": 4, "n_ctx": 16, "d_vocab": 64,
                                   **variants.variant_config("vanilla", 3)}), device="cpu")  # fmt: skip
    whole, merged, n = whole_and_merged(m, "kernels", n_random=6, seq_len=16, batch_size=2)
    assert n == 3 and "max_theory_gap" in merged.headline
    assert_same_output(whole, merged)


def test_merge_ablation_keeps_the_one_plan():
    native = load("native:layers=2,d_model=16,heads=4,d_vocab=40,n_ctx=64,seed=3", device="cpu")
    whole, merged, n = whole_and_merged(native, "ablation", source="induction", k=2, limit=8)
    assert n == 0  # every forward pass runs in finalize
    assert_same_output(whole, merged)


def test_a_task_without_merge_refuses_to_shard():
    class Plain(ReadsNothing, Task[None, int]):
        name = "plain"
        description = "no merge"

        def finalize(self, state, ctx):
            return Output(pd.DataFrame(), pd.DataFrame())

    assert not Plain.can_merge() and get_task("syntax").can_merge()
    with pytest.raises(ProbeError, match=r"defines no merge step.*--backend local"):
        Plain().merge(0, 0)
    with pytest.raises(ProbeError, match="defines no merge step"):
        distributed.run_sharded(Plain(), None, None, probes.Examples([]), spec="x", dtype=torch.float32)  # type: ignore[arg-type]


def test_plan_shards_cover_every_batch_in_order():
    assert plan_shards([4, 4, 4, 4], 2) == [range(0, 2), range(2, 4)]
    assert plan_shards([10, 1, 1, 1, 1], 2) == [range(0, 1), range(1, 5)]
    assert plan_shards([3, 3], 5) == [range(0, 1), range(1, 2)]
    assert plan_shards([], 3) == []
    shards = plan_shards([5, 3, 8, 1, 1, 2, 9], 3)
    assert [i for r in shards for i in r] == list(range(7)) and len(shards) == 3


def test_local_map_jobs_retries_and_reports_each_job_once():
    seen: list[int] = []
    results = map_jobs(square_or_fail, [1, -1, 3], retries=2, on_done=lambda i, r: seen.append(i))
    assert [r.ok for r in results] == [True, False, True] and [r.value for r in results] == [1, None, 9]
    assert results[1] == JobResult(1, False, None, "ValueError: job -1 is negative", 3)
    assert results[0].attempts == 1 and seen == [0, 1, 2]


def test_backend_errors_without_ray():
    with pytest.raises(ProbeError, match=r"unknown backend 'rey'.*did you mean 'ray'"):
        probes.run("minilm", "attention-stats", backend="rey")
    with pytest.raises(ProbeError, match="--workers and --address apply to --backend ray"):
        probes.run("minilm", "attention-stats", workers=2)
    with pytest.raises(ProbeError, match="--retries must be 0 or more"):
        map_jobs(square_or_fail, [1], retries=-1)


def square_or_fail(x: int) -> int:
    if x < 0:
        raise ValueError(f"job {x} is negative\nsecond line")
    return x * x


# ----------------------------------------------------------------------------- the CLI without Ray


def run_cli_without_ray(*args: str) -> subprocess.CompletedProcess:
    """`probe run ...` in a fresh interpreter in which `import ray` fails as if it were not installed."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["ray"] = None  # import ray -> ImportError, as when it is not installed
        sys.argv = ["probe", "run", *{list(args)!r}]
        from depthprobe.cli.main import app
        app()
        """
    )
    return run_python(code)


def test_cli_backend_ray_without_ray_installed(tmp_path):
    r = run_cli_without_ray("--backend", "ray", "--out", str(tmp_path / "r"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "error: --backend ray needs Ray, which is not installed: pip install 'depthprobe[ray]'"
    assert not (tmp_path / "r").exists()
    r = run_cli_without_ray("--backend", "rai", "--out", str(tmp_path / "r"))
    assert r.returncode == 2 and "did you mean 'ray'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- on a real local Ray instance


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    import logging

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    # this module is not importable by name on the workers: ship its functions by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield ray
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "options"),
    [
        ("attention-stats", {"batch_size": 8}),
        ("attention-stats", {"batch_size": 8, "protocol": "clark"}),
        ("syntax", {"batch_size": 8}),
        ("coref", {"batch_size": 1}),  # the built-in sample is 3 windows
    ],
)
def test_sharded_run_equals_the_local_run(ray_local, task, options, tmp_path):
    with torch_threads(2):  # the instance's 2 CPUs: each worker runs as many threads as the driver (2)
        local = probes.run("minilm", task, **options)
        sharded = probes.run("minilm", task, backend="ray", workers=2, **options)
    assert sharded.config["backend"] == "ray" and sharded.config["workers"] == 2
    assert local.config["backend"] == "local" and local.config["workers"] == 1
    assert sharded.counts == local.counts and local.counts["batches"] >= 2
    assert_close(local.scores, sharded.scores, "scores")
    assert_close(local.summary, sharded.summary, "summary")
    assert_close(local.headline, sharded.headline, "headline")
    assert local.notes == sharded.notes
    assert_close(local.views, sharded.views, "views")
    a, b = local.save(tmp_path / "local"), sharded.save(tmp_path / "ray")
    assert sorted(p.relative_to(a).as_posix() for p in a.rglob("*")) == sorted(
        p.relative_to(b).as_posix() for p in b.rglob("*")
    )


class ThreadSums(Task[NoOptions, list]):
    """Per batch, a float32 sum of 2**21 numbers drawn from the batch's embeddings: torch splits such
    a sum across its threads, so its last bits depend on the thread count."""

    name = "thread-sums"
    description = "float32 sums whose rounding depends on torch's thread count"

    def load(self, model, ctx):
        return Examples([[1 + (i * 7 + j) % 40 for j in range(3 + i % 5)] for i in range(12)])

    def hook_names(self, model, ctx):
        return ["hook_embed"]

    def start(self, model, ctx, examples):
        return []

    def accumulate(self, state, batch, acts):
        seed = int((acts["hook_embed"].abs().sum() * 1e6).item())
        big = torch.randn(2**21, generator=torch.Generator().manual_seed(seed))
        state.append(big.sum().item())

    def merge(self, a, b):
        return a + b

    def finalize(self, state, ctx):
        return Output(pd.DataFrame({"value": state}), pd.DataFrame())


@pytest.mark.slow
def test_workers_run_the_drivers_thread_count(ray_local):
    """A sharded run of work whose float32 results depend on the thread count equals the local run
    bit for bit: each worker runs torch on the driver's threads (here 2, the instance's CPUs)."""
    spec = "native:layers=1,d_model=16,heads=2,d_vocab=48,n_ctx=16,seed=0"
    model, task = load(spec, device="cpu"), ThreadSums()
    ctx = Context(config=RunConfig(model=spec, task=task.name, batch_size=3), options=NoOptions())
    examples = task.load(model, ctx)
    by_threads = {}
    for n in (1, 2):
        with torch_threads(n), torch.no_grad():
            by_threads[n] = execute(task, model, ctx, examples)[0].scores["value"].tolist()
    if by_threads[1] == by_threads[2]:
        pytest.skip("this torch build sums 2**21 floats the same on 1 and 2 threads: nothing to tell apart")
    with torch_threads(2):
        assert distributed.shard_threads(ray_local, 0) == 2
        out, n_batches, n_workers = distributed.run_sharded(
            task, model, ctx, examples, spec=spec, dtype=torch.float32, workers=2
        )
    assert n_batches == 4 and n_workers == 2
    assert out.scores["value"].tolist() == by_threads[2]


@pytest.mark.slow
def test_sharded_run_refuses_a_loaded_model(ray_local, tiny_bert):
    with pytest.raises(ProbeError, match="pass its name"):
        probes.run(tiny_bert, "attention-stats", backend="ray", workers=2)


def fail_until_third_attempt(job: tuple[int, str]) -> int:
    """Job -1 always fails; the others return their square."""
    x, _ = job
    return square_or_fail(x)


@pytest.mark.slow
def test_ray_map_jobs_retries_a_failing_job_and_keeps_the_others(ray_local):
    jobs = [(1, "a"), (2, "b"), (-1, "bad"), (4, "d")]
    done: list[tuple[int, JobResult]] = []
    results = map_jobs(
        fail_until_third_attempt, jobs, backend="ray", retries=2, on_done=lambda i, r: done.append((i, r))
    )
    local = map_jobs(fail_until_third_attempt, jobs, backend="local", retries=2)
    assert results == local
    assert [r.value for r in results] == [1, 4, None, 16] and [r.index for r in results] == [0, 1, 2, 3]
    assert results[2] == JobResult(2, False, None, "ValueError: job -1 is negative", 3)
    assert all(r.attempts == 1 for r in results if r.ok)
    assert sorted(i for i, _ in done) == [0, 1, 2, 3] and dict(done) == dict(enumerate(results))


def test_unreachable_address_exits_2_naming_it(tmp_path):
    pytest.importorskip("ray")
    from tests.helpers import cli_error

    cli_error(
        ["run", "--backend", "ray", "--address", "127.0.0.1:1", "--out", tmp_path / "r"],
        "cannot reach a Ray cluster at 127.0.0.1:1",
    )
    cli_error(["run", "--backend", "ray", "--address", "nowhere", "--out", tmp_path / "r"], "not HOST:PORT or auto")
    assert not (tmp_path / "r").exists()


def crash_first_time(marker: str) -> str:
    """Kills its worker process the first time (as a node dying would), succeeds when rerun."""
    import os

    path = Path(marker)
    if not path.exists():
        path.write_text("crashed once")
        os._exit(1)
    return "recovered"


@pytest.mark.slow
def test_ray_map_jobs_resubmits_a_job_whose_worker_died(ray_local, tmp_path):
    [r] = map_jobs(crash_first_time, [str(tmp_path / "a")], backend="ray", retries=1)
    assert r.ok and r.value == "recovered" and r.attempts == 1
    [r] = map_jobs(crash_first_time, [str(tmp_path / "b")], backend="ray", retries=0)
    assert not r.ok and r.value is None and r.error is not None
    assert r.error.startswith(
        ("its Ray worker or node died (WorkerCrashedError", "its Ray worker or node died (NodeDied")
    )
    assert "\n" not in r.error and r.crashed and r.failure() == r.error  # a death, not an internal error
