"""Sweep statistics (probes/hooks/stats.py): several metrics in one sweep, per-example values with
standard errors, batches and a progress bar for patch, attribute and run_with_cache. Known
answers: a batched sweep equals the unbatched one, each metric of a joint sweep equals its own
sweep, the mean and se are numpy's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import depthprobe.probes as probes

SPEC = "native:layers=2,d_model=32,heads=4,d_vocab=20,n_ctx=16,attn_only=false"


@pytest.fixture(scope="module")
def pair():
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, 20, (5, 7), generator=g)
    corrupt = clean.clone()
    corrupt[:, 2] = torch.randint(1, 20, (5,), generator=g)
    return probes.load(SPEC, device="cpu"), clean, corrupt


def diff(logits):  # one value per example
    return logits[:, -1, 3] - logits[:, -1, 4]


def mean_diff(logits):  # one value for the batch
    return (logits[:, -1, 3] - logits[:, -1, 4]).mean()


HOOKS = "blocks.*.attn.hook_z"


@pytest.mark.parametrize("verb", ["patch", "attribute"])
def test_per_example_values_batches_and_standard_errors(pair, verb):
    model, clean, corrupt = pair
    run = getattr(probes, verb)
    rows = run(model, clean, corrupt, hooks=HOOKS, metric=diff, per_example=True)
    batched = run(model, clean, corrupt, hooks=HOOKS, metric=diff, per_example=True, batch_size=2, progress=True)
    assert len(rows) == 8 * 5 and list(rows["example"].unique()) == [0, 1, 2, 3, 4]
    assert np.allclose(rows["value"], batched["value"], atol=1e-5)
    summary = run(model, clean, corrupt, hooks=HOOKS, metric=diff)
    by_slot = rows.groupby(["layer", "head"], sort=False)["value"]
    assert np.allclose(summary["value"], by_slot.mean().to_numpy(), atol=1e-9)
    assert np.allclose(summary["se"], by_slot.std(ddof=1).to_numpy() / np.sqrt(5), atol=1e-9)
    assert (summary["n"] == 5).all()
    scalar = run(model, clean, corrupt, hooks=HOOKS, metric=mean_diff)  # the old table: no se, n
    assert list(scalar.columns) == ["model", "task", "layer", "head", "position", "hook", "metric", "value"]
    assert np.allclose(scalar["value"], summary["value"], atol=1e-5)
    for i in (0, 3):  # each example's row is that example's own sweep
        alone = run(model, clean[i : i + 1], corrupt[i : i + 1], hooks=HOOKS, metric=diff)
        assert np.allclose(alone["value"], rows[rows["example"] == i]["value"], atol=1e-5)


def test_several_metrics_in_one_sweep_equal_their_own_sweeps(pair):
    model, clean, corrupt = pair
    both = probes.patch(model, clean, corrupt, hooks=HOOKS, metric={"diff": diff, "mean": mean_diff})
    assert set(both["metric"]) == {"diff", "mean"} and set(both.attrs["clean"]) == {"diff", "mean"}
    alone = probes.patch(model, clean, corrupt, hooks=HOOKS, metric=mean_diff)
    assert both[both["metric"] == "mean"]["value"].tolist() == alone["value"].tolist()  # exactly
    assert both.attrs["corrupt"]["mean"] == alone.attrs["corrupt"]


def test_bad_metrics_and_batches_are_refused_in_one_line(pair):
    model, clean, corrupt = pair
    with pytest.raises(probes.ProbeError, match="with batch_size, metric 'mean_diff' must give one value per example"):
        probes.patch(model, clean, corrupt, hooks="blocks.0.hook_resid_pre", metric=mean_diff, batch_size=2)
    with pytest.raises(probes.ProbeError, match=r"must return a number.*got str"):
        probes.patch(model, clean, corrupt, hooks="blocks.0.hook_resid_pre", metric=lambda x: "high")
    with pytest.raises(probes.ProbeError, match="batch_size must be a positive integer"):
        probes.patch(model, clean, corrupt, hooks="blocks.0.hook_resid_pre", metric=diff, batch_size=0)


def test_run_with_cache_in_batches_equals_one_batch(pair):
    model, clean, _ = pair
    mask = torch.ones_like(clean)
    mask[1, 5:] = 0  # padding: the mean loss weighs batches by their real tokens
    names = ["blocks.*.hook_resid_post", "blocks.0.attn.hook_pattern"]
    for kw in ({}, {"return_type": "loss", "grad": True}, {"return_type": "loss", "loss_per_token": True}):
        one, cache = probes.run_with_cache(model, clean, names, attention_mask=mask, **kw)
        many, batched = probes.run_with_cache(
            model, clean, names, attention_mask=mask, batch_size=2, progress=True, **kw
        )
        assert torch.allclose(one, many, atol=1e-5) and list(cache) == list(batched)
        assert all(torch.allclose(cache[k], batched[k], atol=1e-6) for k in cache), kw


def test_destination_by_source_grain_for_attention_maps(pair):
    """The destination-by-source grain: per='head_query_key' patches one (head, query, key) entry
    of a map; attribution's estimates over a query's keys add up to its per='head_position' estimate (linearity)."""
    model, clean, corrupt = pair
    clean, corrupt = clean[:1], corrupt[:1]
    hook = "blocks.1.attn.hook_pattern"
    rows = probes.patch(model, clean, corrupt, hooks=hook, metric=mean_diff, per="head_query_key", positions=[3, 6])
    assert len(rows) == 4 * (4 + 7) and (rows["key"] <= rows["position"]).all()
    _, cache = probes.run_with_cache(model, clean, hook)

    def one(t, h):  # head 2, query 6, key 1 from the clean run
        t = t.clone()
        t[:, 2, 6, 1] = cache[hook][:, 2, 6, 1]
        return t

    with torch.no_grad(), probes.capture(model, hook, one):
        by_hand = float(mean_diff(model.bridge(corrupt)))
    got = rows.query("head == 2 and position == 6 and key == 1")["value"].item()
    assert got == pytest.approx(by_hand, abs=1e-6)
    est = probes.attribute(model, clean, corrupt, mean_diff, hook, per="head_query_key", positions=[6])
    whole = probes.attribute(model, clean, corrupt, mean_diff, hook, per="head_position", positions=[6])
    base = est.attrs["corrupt"]
    summed = (est["value"] - base).groupby(est["head"]).sum().to_numpy() + base
    assert np.allclose(summed, whole["value"].to_numpy(), atol=1e-6)
    with pytest.raises(probes.ProbeError, match="cuts attention maps"):
        probes.patch(model, clean, corrupt, hooks="blocks.1.attn.hook_z", metric=mean_diff, per="head_query_key")


def test_a_metric_reads_its_own_targets_in_batches(pair):
    """fn(logits, index) gets each batch's slice of the dataset: batched equals unbatched."""
    model, clean, corrupt = pair
    targets = clean[:, -1]

    def own(logits, index):  # [batch]: the logit of each example's own last token
        return logits[:, -2].gather(-1, targets[index, None])[:, 0]

    for verb in (probes.patch, probes.attribute):
        one = verb(model, clean, corrupt, hooks=HOOKS, metric=own, per_example=True)
        batched = verb(model, clean, corrupt, hooks=HOOKS, metric=own, per_example=True, batch_size=2)
        assert np.allclose(one["value"], batched["value"], atol=1e-5)


def test_a_metric_reading_targets_from_a_closure_under_batch_size_is_one_line(pair):
    """D6: a metric indexing targets of the whole dataset failed on the first batch with a raw
    RuntimeError; the line names fn(logits, index), and that form equals the unbatched sweep."""
    model, clean, corrupt = pair
    targets = torch.tensor([3, 4, 5, 6, 7])

    def closure(logits):  # every example's target: only right for the whole dataset at once
        return logits[torch.arange(5), -1, targets]

    def indexed(logits, index):
        return logits[torch.arange(logits.shape[0]), -1, targets[index]]

    hook = "blocks.0.hook_resid_pre"
    with pytest.raises(
        probes.ProbeError, match=r"metric 'closure' failed on a batch of 2 examples .*targets\[index\]"
    ) as err:
        probes.patch(model, clean, corrupt, hooks=hook, metric=closure, batch_size=2)
    assert "\n" not in str(err.value)
    whole = probes.patch(model, clean, corrupt, hooks=hook, metric=closure)
    batched = probes.patch(model, clean, corrupt, hooks=hook, metric=indexed, batch_size=2)
    np.testing.assert_allclose(batched["value"].to_numpy(), whole["value"].to_numpy(), atol=1e-5)
