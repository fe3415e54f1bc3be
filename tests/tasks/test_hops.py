"""The hop-attention probe: the measure (probes/measures/hops.py) on hand-built attention patterns
with known answers, and the task (tasks/hop_attention.py) on hand-set attention through its
protocol, on a real native model whose attention is uniform by construction, and end to end."""

from __future__ import annotations

import math

import pytest
import torch

from depthprobe.probes.api.run import run
from depthprobe.probes.base.batching import Batch
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data import khop
from depthprobe.probes.engine.task import Context, RunConfig, get_task
from depthprobe.probes.hooks.capture import Captured, pattern_names
from depthprobe.probes.measures.hops import hop_attention, hop_attention_sums, neighbour_positions, target_means
from depthprobe.probes.models.loading import load
from depthprobe.probes.models.model import NativeConfig
from depthprobe.tasks.cards import HopAttentionOptions

# x = 0 1 0 1 0: p = -1 -1 1 2 3, p^2 = -1 -1 -1 1 2
HOPS = torch.tensor([[[-1, -1, 1, 2, 3]], [[-1, -1, -1, 1, 2]]])  # [J=2, n=1, N=5]


def uniform(n: int, T: int) -> torch.Tensor:
    """[n, T, T] causal uniform attention."""
    causal = torch.tril(torch.ones(T, T))
    return (causal / causal.sum(-1, keepdim=True)).expand(n, T, T).clone()


def pointing(hops: torch.Tensor, T: int, weight: float = 1.0, offset: int = 1) -> torch.Tensor:
    """[n, T, T]: query offset + i puts ``weight`` on key offset + hops[n, i] and the rest on itself;
    uniform where the hop is undefined."""
    n, N = hops.shape
    out = uniform(n, T)
    for b in range(n):
        for i in range(N):
            if hops[b, i] >= 0:
                q = offset + i
                out[b, q] = 0.0
                out[b, q, offset + hops[b, i]] += weight
                out[b, q, q] += 1 - weight
    return out


def test_known_answers_on_a_hand_built_pattern():
    T = 6  # the hop-count token, then 5 letters
    patterns = torch.stack(
        [
            torch.stack([pointing(HOPS[0], T), uniform(1, T)]),  # layer 0: head 0 finds p(i)
            torch.stack([uniform(1, T), pointing(HOPS[1], T)]),  # layer 1: head 1 finds p^2(i)
        ]
    )  # [layers 2, heads 2, n 1, T, T]
    res = hop_attention(patterns, HOPS)
    chance1 = (1 / 4 + 1 / 5 + 1 / 6) / 3  # queries at 1 + i, i = 2, 3, 4, see 2 + i keys
    chance2 = (1 / 5 + 1 / 6) / 2
    assert res["chance"].tolist() == pytest.approx([chance1, chance2])
    assert res["count"].tolist() == [3, 2]
    assert res["attention"][0, 0].tolist() == pytest.approx([1.0, 0.0])  # p(i) is never p^2(i)
    assert res["attention"][1, 1].tolist() == pytest.approx([(1 / 4) / 3, 1.0])  # uniform at i = 2 (no p^2)
    assert res["attention"][0, 1].tolist() == pytest.approx([chance1, chance2])  # uniform heads sit at chance
    assert res["resolved"].tolist() == [[[True, False], [False, False]], [[False, False], [False, True]]]
    assert res["largest_hop"].tolist() == [1, 2]


def test_resolving_needs_the_threshold_and_three_times_chance():
    T = 6
    half = pointing(HOPS[0], T, weight=0.5)[None, None]  # 0.5 on p(i): at the threshold, but < 3 x 0.206
    assert hop_attention(half, HOPS[:1])["resolved"].tolist() == [[[False]]]
    assert hop_attention(half, HOPS[:1], ratio=2.0)["resolved"].tolist() == [[[True]]]
    low = pointing(HOPS[0], T, weight=0.49)[None, None]
    assert hop_attention(low, HOPS[:1], ratio=1.0)["largest_hop"].tolist() == [0]


def test_a_hop_defined_nowhere_has_no_score():
    hops = torch.full((1, 1, 5), -1)
    res = hop_attention(uniform(1, 6)[None, None], hops)
    assert math.isnan(res["attention"].item()) and math.isnan(res["chance"].item())
    assert res["largest_hop"].tolist() == [0]


def test_sums_add_across_batches():
    x = khop.sample(6, 30, 3, torch.Generator().manual_seed(0))
    hops = torch.stack([khop.hop_positions(x, j) for j in (1, 2, 3)])
    patterns = torch.softmax(torch.randn(2, 3, 6, 31, 31, generator=torch.Generator().manual_seed(1)), -1)
    whole = hop_attention_sums(patterns, hops)
    a, b = hop_attention_sums(patterns[:, :, :2], hops[:, :2]), hop_attention_sums(patterns[:, :, 2:], hops[:, 2:])
    for key in whole:
        assert torch.allclose(whole[key], a[key] + b[key])
    with pytest.raises(ValueError, match="do not fit"):
        hop_attention_sums(patterns[:, :, :, :10, :10], hops)


def test_previous_token_and_previous_occurrence_known_answers():
    """x = 0 1 0 1 0: the previous token i - 1 = -1 0 1 2 3; the previous occurrence p(i) - 1 = -1 -1 0 1 2."""
    pointer = HOPS[0]  # p(i) = -1 -1 1 2 3
    near = neighbour_positions(pointer)
    assert near[0].tolist() == [[-1, 0, 1, 2, 3]] and near[1].tolist() == [[-1, -1, 0, 1, 2]]
    T = 6
    patterns = torch.stack([pointing(near[0], T), pointing(near[1], T)])[None]  # head 0 on i - 1, head 1 on p(i) - 1
    res = target_means(hop_attention_sums(patterns, near))
    assert res["count"].tolist() == [4, 3]
    assert res["chance"].tolist() == pytest.approx([(1 / 3 + 1 / 4 + 1 / 5 + 1 / 6) / 4, (1 / 4 + 1 / 5 + 1 / 6) / 3])
    assert res["attention"][0, 0].tolist() == pytest.approx([1.0, 0.0])  # i - 1 is never p(i) - 1 here
    assert res["attention"][0, 1].tolist() == pytest.approx([(1 / 3) / 4, 1.0])  # uniform at i = 1 (no p(i) - 1)


def test_the_task_reads_previous_token_and_previous_occurrence_heads():
    task = get_task("hop-attention")
    model = load(NativeConfig(layers=2, d_model=16, heads=2, d_vocab=9, n_ctx=64), device="cpu")
    options = HopAttentionOptions(letters=4, length=40, max_hop=2, hop=2, sequences=6)
    ctx = Context(RunConfig(model="hand-set", task="hop-attention"), options)
    ids = torch.tensor(task.load(model, ctx))
    x = ids[:, 1:]
    near = neighbour_positions(khop.pointer(x))
    acts = perfect_captured(x, 4, 2)
    T = ids.shape[1]
    acts[pattern_names(2)[0]] = torch.stack([pointing(near[0], T), uniform(len(x), T)], dim=1)  # 0-0 on i - 1
    acts[pattern_names(2)[1]] = torch.stack([uniform(len(x), T), pointing(near[1], T)], dim=1)  # 1-1 on p(i) - 1
    state = task.start(model, ctx, [tuple(r) for r in ids.tolist()])
    task.accumulate(state, Batch(ids, torch.ones_like(ids), []), acts)
    out = task.finalize(state, ctx)
    s = out.scores.set_index(["layer", "head", "metric"])
    assert s.loc[(0, 0, "previous_token_attention"), "value"] == pytest.approx(1.0)
    assert s.loc[(1, 1, "previous_occurrence_attention"), "value"] == pytest.approx(1.0)
    chance = s.loc[(0, 1, "previous_token_attention")]  # a uniform head sits at its chance
    assert chance["value"] == pytest.approx(chance["chance"])
    assert out.headline["previous_token_by_layer"][0] == 1.0 and out.headline["previous_occurrence_by_layer"][1] == 1.0
    assert out.summary["previous_token"].tolist()[0] == 1.0 and out.summary["previous_occurrence"].tolist()[1] == 1.0
    assert out.summary["previous_token_chance"].tolist()[0] == pytest.approx(float(chance["chance"]), abs=1e-4)


def perfect_captured(x: torch.Tensor, letters: int, hop: int) -> Captured:
    """Layer l's head 0 points at p^(l+1)(i); the logits are one-hot on the right answers."""
    T = 1 + x.shape[1]
    acts = Captured()
    for layer, name in enumerate(pattern_names(2)):
        acts[name] = torch.stack([pointing(khop.hop_positions(x, layer + 1), T), uniform(len(x), T)], dim=1)
    targets = torch.cat([torch.zeros(len(x), 1, dtype=torch.long), khop.hop_targets(x, hop, letters)], dim=1)
    acts["logits"] = torch.nn.functional.one_hot(targets, khop.vocab_size(letters, hop)).float()
    return acts


def test_the_task_on_hand_set_attention():
    task = get_task("hop-attention")
    model = load(NativeConfig(layers=2, d_model=16, heads=2, d_vocab=9, n_ctx=64), device="cpu")
    options = HopAttentionOptions(letters=4, length=40, max_hop=3, hop=2, sequences=8)
    ctx = Context(RunConfig(model="hand-set", task="hop-attention"), options)
    examples = task.load(model, ctx)
    ids = torch.tensor(examples)
    assert (ids[:, 0] == 4 + 2).all() and ids.shape == (8, 41)
    states = []
    for rows in (ids[:5], ids[5:]):  # two batches, merged as a sharded run would
        state = task.start(model, ctx, examples)
        task.accumulate(state, Batch(rows, torch.ones_like(rows), []), perfect_captured(rows[:, 1:], 4, 2))
        states.append(state)
    out = task.finalize(task.merge(*states), ctx)
    assert out.headline["accuracy"] == 1.0 and out.headline["accuracy_all"] == 1.0
    assert out.headline["largest_hop_by_layer"] == [1, 2]
    assert out.summary["largest_hop"].tolist() == [1, 2]
    assert out.summary["heads"].tolist() == ["0-0", "1-0"]
    s = out.scores.set_index(["layer", "head", "metric"])["value"]
    assert s[(0, 0, "hop_1_attention")] == pytest.approx(1.0) and s[(1, 0, "hop_2_attention")] == pytest.approx(1.0)
    x = ids[:, 1:]
    only_p1 = (khop.hop_positions(x, 1) >= 0) & (khop.hop_positions(x, 2) < 0)  # 1-0 is uniform there, else on p^2
    visible = 1 / (torch.arange(40) + 2.0)  # query 1 + i sees 2 + i keys
    expected = float((visible * only_p1).sum() / (khop.hop_positions(x, 1) >= 0).sum())
    assert s[(1, 0, "hop_1_attention")] == pytest.approx(expected)
    assert "hop_attention" in out.plots and out.plots["hop_attention"].startswith("<svg")


def test_uniform_attention_of_a_real_model_scores_chance():
    """A native model whose queries are zero attends uniformly: every hop score equals its chance."""
    from depthprobe.probes.training.fast_forward import inner

    model = load(NativeConfig(layers=2, d_model=16, heads=2, d_vocab=9, n_ctx=64, attn_only=True), device="cpu")
    with torch.no_grad():
        for block in model.bridge.original_model.layers:
            q = inner(inner(block).attn).q
            q.weight.zero_()
            if q.bias is not None:
                q.bias.zero_()
    result = run(model, "hop-attention", sequences=6, max_hop=3, hop=3, length=30)
    scores = result.scores[result.scores.metric.str.startswith("hop_")]
    assert len(scores) == 2 * 2 * 3
    assert scores["value"].to_numpy() == pytest.approx(scores["chance"].to_numpy(), rel=1e-5)
    assert result.headline["largest_hop_by_layer"] == [0, 0]
    printed = result.summary.to_string(index=False)  # what `probe run` prints: a layer that resolves nothing
    assert "None" not in printed and "nan" not in printed.lower(), printed  # shows blanks, not None


def test_end_to_end_on_a_tiny_native_model(tmp_path):
    spec = "native:layers=2,d_model=16,heads=4,d_vocab=9,n_ctx=64,seed=3"
    result = run(spec, "hop-attention", sequences=8, hop=4, max_hop=4, length=48)
    result.save(tmp_path / "run")
    assert (tmp_path / "run" / "scores.csv").exists() and (tmp_path / "run" / "plots" / "hop_attention.svg").exists()
    per_head = result.scores[result.scores.metric.str.startswith("hop_")]
    assert set(per_head.metric) == {f"hop_{j}_attention" for j in range(1, 5)} and len(per_head) == 2 * 4 * 4
    assert per_head["value"].between(0, 1).all() and per_head["chance"].between(0, 1).all()
    assert result.summary["layer"].tolist() == [0, 1]
    assert 0 <= result.headline["accuracy"] <= 1


@pytest.mark.parametrize(
    ("model", "options", "message"),
    [
        ("native:layers=1,d_model=16,heads=2,d_vocab=8,n_ctx=64", {"hop": 4}, "need a vocabulary of 9"),
        ("native:layers=1,d_model=16,heads=2,d_vocab=9,n_ctx=32", {"hop": 4}, "use -O length=31 or less"),
        ("tiny-gpt2", {}, "needs a causal token-level model trained on the khop family"),
    ],
)
def test_models_that_cannot_read_khop_inputs_are_refused(model, options, message, tiny_gpt2_dir):
    name = str(tiny_gpt2_dir) if model == "tiny-gpt2" else model
    with pytest.raises(ProbeError, match=message) as e:
        run(name, "hop-attention", **options)
    assert "\n" not in str(e.value)


def test_probe_list_tasks_names_the_previous_token_and_occurrence_targets():
    from typer.testing import CliRunner

    from depthprobe.cli.main import app

    out = CliRunner().invoke(app, ["list", "tasks"]).output
    line = next(x for x in out.splitlines() if x.startswith("hop-attention"))
    assert "previous token (i - 1)" in line and "previous occurrence of X_i (p(i) - 1)" in line
