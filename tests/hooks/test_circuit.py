"""#46.2: circuits as a verb. Known answers: the graph's edge count by hand; with no edge removed
the run is the clean one and with every edge removed the corrupted one (native, attention-only and
a Hugging Face GPT-2); on a model without a final norm an edge into the logits scores
(clean - corrupt) . W_U[:, t] by hand, for EAP and patching alike; EAP-IG's input node tends to
clean - corrupted (completeness); statistics as for patch tables."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import depthprobe.probes as probes

ATTN = "native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,attn_only=true"
MLP = "native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,attn_only=false"


def ids_pair(vocab: int = 20, n: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(1, vocab, (n, 6), generator=g)
    corrupt = clean.clone()
    corrupt[:, 3:] = torch.randint(1, vocab, (n, 3), generator=g)
    return clean, corrupt


def diff(logits):  # one value per example
    return logits[:, -1, 3] - logits[:, -1, 5]


@pytest.mark.parametrize(("spec", "edges"), [(ATTN, 13 + 2 * 7 + 2), (MLP, 46)])
def test_the_graph_has_the_edges_counted_by_hand(spec, edges):
    """attention-only, 2 x 2 heads: embed reaches 12 q/k/v inputs and the logits (13); each layer-0
    head the 6 inputs of layer 1 and the logits (7); each layer-1 head the logits. With MLPs: 46."""
    model = probes.load(spec, device="cpu")
    clean, corrupt = ids_pair()
    df = probes.circuit(model, clean, corrupt, diff)
    assert len(df) == edges == df.attrs["of"]
    assert list(df.columns[:6]) == ["model", "task", "sender", "receiver", "metric", "score"]
    assert (df["score"].abs().diff().dropna() <= 0).all()  # ordered by |score|
    assert not ((df["sender"] == "1-0") & (df["receiver"] == "0-1.q")).any()  # no edge runs backwards


@pytest.mark.parametrize("spec", [ATTN, MLP])
@pytest.mark.parametrize("ablation", ["corrupt", "mean"])
def test_no_edge_removed_is_clean_and_every_edge_removed_is_the_reference(spec, ablation):
    model = probes.load(spec, device="cpu")
    clean, corrupt = ids_pair()
    table = probes.circuit(model, clean, corrupt, diff, ablation=ablation)
    f = probes.faithfulness(model, clean, corrupt, diff, table, keep=[0, len(table)], ablation=ablation)
    with torch.no_grad():
        assert f.attrs["clean"] == pytest.approx(float(diff(model.bridge(clean)).mean()), abs=1e-5)
        if ablation == "corrupt":
            assert f.attrs["empty"] == pytest.approx(float(diff(model.bridge(corrupt)).mean()), abs=1e-5)
    assert f["recovered"].tolist() == pytest.approx([0.0, 1.0], abs=1e-6)


def test_on_a_gpt2_bridge(tiny_gpt2):
    ids, corrupt = ids_pair(vocab=100, n=2)
    table = probes.circuit(tiny_gpt2, ids, corrupt, diff, "eap")
    # embed reaches all 27 receivers, each layer-0 head 15, mlp0 14, each layer-1 head 2 (mlp1, logits), mlp1 1
    assert len(table) == 27 + 4 * 15 + 14 + 4 * 2 + 1
    f = probes.faithfulness(tiny_gpt2, ids, corrupt, diff, table, keep=[0, len(table)])
    with torch.no_grad():
        assert f.attrs["clean"] == pytest.approx(float(diff(tiny_gpt2.bridge(ids)).mean()), abs=1e-4)
        assert f.attrs["empty"] == pytest.approx(float(diff(tiny_gpt2.bridge(corrupt)).mean()), abs=1e-4)
    whole = f.attrs["clean"] - f.attrs["empty"]  # EAP-IG's held embeddings reach the split inputs here too
    nodes = probes.circuit(tiny_gpt2, ids, corrupt, diff, "eap-ig", "node", ig_steps=32).set_index("sender")
    assert nodes.loc["embed", "score"] == pytest.approx(whole, rel=0.1)  # measured 6.7% off at 32 steps


def test_edges_into_the_logits_score_as_computed_by_hand_without_a_final_norm():
    model = probes.load("native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,attn_only=true,norm=none")
    clean, corrupt = ids_pair(seed=1)

    def logit(x):
        return x[:, -1, 3]

    eap = probes.circuit(model, clean, corrupt, logit, "eap").set_index(["sender", "receiver"])["score"]
    patched = probes.circuit(model, clean, corrupt, logit, "patch").set_index(["sender", "receiver"])["score"]
    names = ["blocks.0.hook_resid_pre", "blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    (_, c), (_, x) = (probes.run_with_cache(model, ids, names=names) for ids in (clean, corrupt))
    w_u, w_o = model.bridge.W_U[:, 3], model.bridge.W_O
    by_hand = {"embed": (c[names[0]] - x[names[0]])[:, -1] @ w_u}
    for layer in (0, 1):
        for head in (0, 1):
            z = c[names[1 + layer]][:, -1, head] - x[names[1 + layer]][:, -1, head]
            by_hand[f"{layer}-{head}"] = z @ w_o[layer, head] @ w_u
    for sender, want in by_hand.items():
        assert eap[(sender, "logits")] == pytest.approx(float(want.detach().mean()), abs=1e-4)
        assert patched[(sender, "logits")] == pytest.approx(float(want.detach().mean()), abs=1e-4)


def test_eap_ig_input_node_tends_to_clean_minus_corrupt():
    model = probes.load(MLP, device="cpu")
    clean, corrupt = ids_pair(seed=2)
    with torch.no_grad():
        whole = float((diff(model.bridge(clean)) - diff(model.bridge(corrupt))).mean())
    nodes = {s: probes.circuit(model, clean, corrupt, diff, "eap-ig", "node", ig_steps=s) for s in (1, 32)}
    got = {s: float(df.set_index("sender").loc["embed", "score"]) for s, df in nodes.items()}
    assert abs(got[32] - whole) < 0.05 * abs(whole) + 1e-3  # completeness, error of order 1/N
    assert abs(got[32] - whole) < abs(got[1] - whole)
    eap = probes.circuit(model, clean, corrupt, diff, "eap", "node").set_index("sender")["score"]
    assert eap["embed"] == pytest.approx(got[1], abs=1e-6)  # ig_steps=1 is plain EAP


def test_statistics_on_circuit_tables():
    model = probes.load(ATTN, device="cpu")
    clean, corrupt = ids_pair(n=10)
    df = probes.circuit(model, clean, corrupt, diff, ci=0.9, permutation=199)
    assert ((df["ci_low"] <= df["score"]) & (df["score"] <= df["ci_high"])).all()
    assert (df["n"] == 10).all() and df["p"].between(1 / 200, 1).all()
    same = probes.circuit(model, clean, clean, diff, permutation=199)  # nothing differs: no edge does anything
    assert np.allclose(same["score"], 0) and (same["p"] == 1).all()


def test_pruning_meets_its_target_with_the_fewest_top_edges():
    model = probes.load(MLP, device="cpu")
    clean, corrupt = ids_pair(seed=3)
    table = probes.circuit(model, clean, corrupt, diff, "patch")
    kept = probes.prune(model, clean, corrupt, diff, table, target=0.8)
    n = kept.attrs["edges"]
    assert len(kept) == n and kept.attrs["recovered"] >= 0.8 and kept.attrs["of"] == len(table)
    curve = probes.faithfulness(model, clean, corrupt, diff, table, keep=[n - 1, n])
    assert curve["recovered"].iloc[1] == pytest.approx(kept.attrs["recovered"], abs=1e-9)
    assert curve["recovered"].iloc[0] < 0.8  # one edge fewer falls short


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda m, c, x: probes.circuit(m, c, x, diff, "acdc"), "circuit: unknown method 'acdc'"),
        (lambda m, c, x: probes.circuit(m, c, x, diff, grain="heads"), "unknown grain 'heads'"),
        (lambda m, c, x: probes.circuit(m, c, x, diff, ablation="zero"), "unknown ablation 'zero'"),
        (lambda m, c, x: probes.circuit(m, c, x, diff, "eap-ig", ig_steps=0), "ig_steps must be an integer"),
        (lambda m, c, x: probes.circuit(m, c, x, "diff"), "give metric=, one function of the logits"),
        (lambda m, c, x: probes.circuit(m, c, x[:, :4], diff), "must have the same shape in tokens"),
        (lambda m, c, x: probes.circuit(m, c, x, diff, ci=2), "ci must be a coverage"),
        (lambda m, c, x: probes.circuit(m, c, x, lambda y: y[:, -1, 3].mean(), ci=0.9), "one value per example"),
        (lambda m, c, x: probes.circuit(m, c, x, lambda y: float(y[0, -1, 3])), "computed from the logits"),
        (lambda m, c, x: probes.prune(m, c, x, diff, "t"), "give edges=, the table probes.circuit returns"),
        (lambda m, c, x: probes.prune(m, c, x, diff, None, target=1.5), r"target must be a fraction .* \(0, 1\]"),
        (lambda m, c, x: probes.faithfulness(m, c, x, diff, table("edge"), keep=[99]), "edge counts from 0 to 29"),
        (
            lambda m, c, x: probes.faithfulness(m, c, x, diff, table("node")),
            r"a node row \(grain='node'\) is not an edge",
        ),
    ],
)
def test_bad_inputs_are_one_line(call, says):
    model = probes.load(ATTN, device="cpu")
    clean, corrupt = ids_pair()
    with pytest.raises(probes.ProbeError, match=says) as err:
        call(model, clean, corrupt)
    assert "\n" not in str(err.value)


@functools.cache
def table(grain: str):
    return probes.circuit(probes.load(ATTN, device="cpu"), *ids_pair(), diff, grain=grain)
