"""Metrics of a patching or attribution sweep: several at once, per example, with standard errors,
over a dataset in batches.

A metric is ``fn(logits) -> number`` (one value for the batch: the table holds it, as before) or
``fn(logits) -> tensor [batch]`` (one value per example, a batch of one included: the table holds
their mean, its standard error ``se = std / sqrt(n)`` and ``n``; with ``per_example=True`` one row
per example instead, numbered in ``example``). ``metric`` may be a dict of name -> function: every
metric of every patched run, in one sweep (the ``metric`` column names it). With ``batch_size``
the examples run in batches (a metric must then give one value per example, so that batches join
exactly); a metric with two arguments, ``fn(logits, index)``, gets the batch's slice of the
dataset, to read its own targets (``targets[index]``).

:class:`Stats` adds what a reviewer asks of a per-example metric's rows: ``ci=0.95`` a percentile
bootstrap interval of the row's mean over examples (``ci_low``, ``ci_high``: ``n_boot`` resamples of
the examples, the same resamples for every row), and ``permutation=N`` the p-value of the row's
effect, ``value - corrupt`` per example, against no effect (``p``: a paired permutation test, each
example's difference flipped in sign at random N times; ``(1 + #{|null mean| >= |mean|}) / (1 + N)``),
both seeded by ``seed``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from depthprobe.probes.base.errors import ProbeError

Metric = Callable[..., Any]  # fn(logits) or fn(logits, index)
Metrics = Metric | Mapping[str, Metric]


def metric_fns(metric: Metrics | None) -> dict[str, Metric]:
    """name -> function, checked before any pass."""
    if callable(metric):
        return {getattr(metric, "__name__", "metric"): metric}
    if isinstance(metric, Mapping) and metric and all(isinstance(k, str) and callable(f) for k, f in metric.items()):
        return dict(metric)
    raise ProbeError(
        "give metric=, a function of the logits [batch, pos, vocab] giving a number (or one per example), "
        "or a dict of name -> such function"
    )


def takes_examples(fn: Metric) -> bool:
    """Whether ``fn`` takes the examples' index too: ``fn(logits, index)`` (two required arguments)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds and p.default is p.empty for p in params) >= 2


def call(fn: Metric, logits: torch.Tensor, index: slice | None) -> Any:
    """``fn(logits)``, or ``fn(logits, index)`` (the examples' slice of the dataset, so that a
    metric reads its own targets as ``targets[index]`` in batches)."""
    if takes_examples(fn):
        return fn(logits, slice(0, logits.shape[0]) if index is None else index)
    return fn(logits)


def measure(name: str, fn: Metric, logits: torch.Tensor, index: slice | None = None) -> torch.Tensor:
    """The metric's value(s) as float64: 0-d (one for the batch) or [batch] (one per example)."""
    out = call(fn, logits, index)
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        return torch.tensor(float(out), dtype=torch.float64)
    if isinstance(out, torch.Tensor) and (out.is_floating_point() or out.dtype in (torch.int32, torch.int64)):
        if out.shape == (logits.shape[0],):  # a [batch] tensor, even of one example
            return out.detach().to(torch.float64).cpu()
        if out.numel() == 1:
            return torch.tensor(float(out.detach().reshape(()).item()), dtype=torch.float64)
    got = f"a tensor of shape {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
    raise ProbeError(
        f"metric {name!r} must return a number, a one-element tensor or one value per example "
        f"[batch={logits.shape[0]}], got {got}"
    )


@dataclass(frozen=True)
class Stats:
    """Bootstrap intervals (``ci``, ``n_boot``) and permutation p-values (``permutation``) of
    per-example rows, seeded by ``seed``; checked on construction, before any pass."""

    ci: float | None = None
    n_boot: int = 1000
    permutation: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        ci = self.ci
        if ci is not None and (isinstance(ci, bool) or not isinstance(ci, int | float) or not 0 < ci < 1):
            raise ProbeError(f"ci must be a coverage between 0 and 1 (e.g. ci=0.95) or None, got {ci!r}")
        for arg, value, low in (("n_boot", self.n_boot, 10), ("permutation", self.permutation, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ProbeError(f"{arg} must be an integer of at least {low}, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ProbeError(f"seed must be an integer, got {self.seed!r}")

    @property
    def wanted(self) -> bool:
        return self.ci is not None or self.permutation > 0

    def check(self, per_example: bool) -> Stats | None:
        """Itself when asked for (refused beside ``per_example``, whose rows are the examples), else None."""
        if self.wanted and per_example:
            raise ProbeError("ci and permutation summarise the examples' rows; drop per_example=True to get them")
        return self if self.wanted else None

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed)

    def interval(self, v: torch.Tensor) -> tuple[float, float]:
        """The percentile bootstrap interval of the mean of ``v`` [n]."""
        assert self.ci is not None
        idx = torch.randint(0, len(v), (self.n_boot, len(v)), generator=self.generator())
        means = v[idx].mean(1)
        tail = (1 - self.ci) / 2
        low, high = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=means.dtype))
        return float(low), float(high)

    def p_value(self, diff: torch.Tensor) -> float:
        """The paired permutation (sign-flip) p-value of mean(``diff``) [n] against zero."""
        signs = torch.randint(0, 2, (self.permutation, len(diff)), generator=self.generator()) * 2 - 1
        null = (signs.to(diff.dtype) * diff).mean(1).abs()
        observed = float(diff.mean().abs())
        hits = int((null >= observed * (1 - 1e-12)).sum())
        return (1 + hits) / (1 + self.permutation)

    def columns(self, v: torch.Tensor, base: torch.Tensor | None) -> dict[str, float]:
        """``ci_low``/``ci_high`` and ``p`` for one row's per-example values ``v`` (``base``: the
        corrupted run's, the permutation's no-effect reference)."""
        out: dict[str, float] = {}
        if self.ci is not None:
            out["ci_low"], out["ci_high"] = self.interval(v)
        if self.permutation:
            if base is None or base.shape != v.shape:
                raise ProbeError("permutation needs the corrupted run's metric per example; return a [batch] tensor")
            out["p"] = self.p_value(v - base)
        return out


def per_example_only(name: str) -> ProbeError:
    return ProbeError(
        f"ci and permutation need metric {name!r} to give one value per example (a [batch] tensor), "
        "e.g. return logits[:, -1, a] - logits[:, -1, b]"
    )


@contextmanager
def batch_errors(name: str, fn: Metric, batched: bool, n: int) -> Iterator[None]:
    """With ``batch_size``, a one-argument metric's failure on a batch (a target read from outside
    with the whole dataset's shape) becomes one line naming the fix: take the batch's slice too."""
    try:
        yield
    except (RuntimeError, IndexError, ValueError) as exc:
        if not batched or takes_examples(fn):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise ProbeError(
            f"metric {name!r} failed on a batch of {n} examples ({type(exc).__name__}: {first}); "
            "with batch_size a metric sees one batch at a time: to read targets from outside, take the "
            "batch's slice too, def metric(logits, index): ... targets[index]"
        ) from None


class Values:
    """Metric values per key (a run: "clean", "corrupt", or a hook and slot) and metric name,
    gathered over batches."""

    def __init__(self, fns: dict[str, Metric], batched: bool, stats: Stats | None = None) -> None:
        self.fns, self.batched, self.stats = fns, batched, stats
        self.got: dict[tuple[Hashable, str], list[torch.Tensor]] = {}

    def add(self, key: Hashable, logits: torch.Tensor, index: slice | None = None) -> None:
        for name, fn in self.fns.items():
            with batch_errors(name, fn, self.batched, logits.shape[0]):
                value = measure(name, fn, logits, index)
            self.put(key, name, value)

    def put(self, key: Hashable, name: str, v: torch.Tensor) -> None:
        if self.batched and v.dim() == 0:
            raise ProbeError(
                f"with batch_size, metric {name!r} must give one value per example (a [batch] tensor), "
                "so that the batches join exactly; e.g. return logits[:, -1, a] - logits[:, -1, b]"
            )
        self.got.setdefault((key, name), []).append(v)

    def of(self, key: Hashable, name: str) -> torch.Tensor:
        parts = self.got[(key, name)]
        return parts[0] if parts[0].dim() == 0 else torch.cat(parts)

    def mean(self, key: Hashable, name: str) -> float:
        v = self.of(key, name)
        return float(v if v.dim() == 0 else v.mean())

    def rows(self, key: Hashable, base: dict[str, Any], per_example: bool) -> list[dict[str, Any]]:
        """One row per metric (value, and for per-example metrics se and n), or per example."""
        out = []
        for name in self.fns:
            v = self.of(key, name)
            row = {**base, "metric": name}
            if v.dim() == 0:
                if self.stats is not None:
                    raise per_example_only(name)
                out.append({**row, "value": float(v)})
            elif per_example:
                out.extend({**row, "example": i, "value": float(x)} for i, x in enumerate(v))
            else:
                se = float(v.std() / math.sqrt(len(v))) if len(v) > 1 else math.nan
                extra = {} if self.stats is None else self.stats.columns(v, self._base(name))
                out.append({**row, "value": float(v.mean()), "se": se, "n": len(v), **extra})
        return out

    def _base(self, name: str) -> torch.Tensor | None:
        return self.of("corrupt", name) if ("corrupt", name) in self.got else None

    def attrs(self, key: Hashable) -> float | dict[str, float]:
        """The mean value of a run (clean, corrupt): a number for one metric, else by name."""
        means = {name: self.mean(key, name) for name in self.fns}
        return next(iter(means.values())) if len(means) == 1 else means


def chunks(n: int, batch_size: int | None) -> list[slice]:
    """Slices of ``n`` examples, ``batch_size`` at a time (all at once when None)."""
    if batch_size is None:
        return [slice(0, n)]
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ProbeError(f"batch_size must be a positive integer, got {batch_size!r}")
    return [slice(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


def bar(enabled: bool, total: int, what: str) -> Any:
    """A tqdm progress bar (None when off)."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=what, leave=False)
