"""#46.2: circuits in batches. ``batch_size`` chunks the examples of ``circuit``, ``faithfulness``
and ``prune``: every score, standard error, bootstrap interval and permutation p-value equals the
one-batch call (to 1e-6), for each method, grain and ablation (the mean ablation's mean is over all
the examples, not each batch's); an edge into the logits still scores ``(clean - corrupted
output) . W_U[:, t]`` by hand; a metric ``fn(logits, index)`` reads its targets by the batch's slice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import depthprobe.probes as probes

MLP = "native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,attn_only=false"
ATTN = "native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,attn_only=true"


def ids_pair(n: int = 7, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(1, 20, (n, 6), generator=g)
    corrupt = clean.clone()
    corrupt[:, 3:] = torch.randint(1, 20, (n, 3), generator=g)
    return clean, corrupt


CLEAN, CORRUPT = ids_pair()
TARGETS = torch.randint(1, 20, (7,), generator=torch.Generator().manual_seed(5))  # one target per example


def diff(logits):  # one value per example
    return logits[:, -1, 3] - logits[:, -1, 5]


def target_logprob(logits, index):  # reads its targets by the batch's slice
    return logits[:, -1].log_softmax(-1).gather(-1, TARGETS[index, None])[:, 0]


def same_table(a, b):
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    key = ["sender", "receiver"]
    a, b = (df.assign(receiver=df["receiver"].fillna("")).set_index(key).sort_index() for df in (a, b))
    for col in ("score", "se", "ci_low", "ci_high", "p"):
        if col in a:
            assert np.allclose(a[col], b[col], rtol=0, atol=1e-6), col
    assert (a["n"] == 7).all() and (b["n"] == 7).all()


@pytest.mark.parametrize("method", ["patch", "eap", "eap-ig"])
@pytest.mark.parametrize("grain", ["edge", "node"])
@pytest.mark.parametrize("ablation", ["corrupt", "mean"])
def test_batches_give_the_one_batch_table(method, grain, ablation):
    model = probes.load(MLP if method == "eap-ig" else ATTN, device="cpu")  # the MLP graph once: 46 edges
    kw = {"method": method, "grain": grain, "ablation": ablation, "ig_steps": 4, "ci": 0.9, "permutation": 99}
    whole = probes.circuit(model, CLEAN, CORRUPT, diff, **kw)
    for batch_size in (3, 1, 7) if method == "eap-ig" else (3,):  # uneven batches; one example a batch; one batch
        same_table(probes.circuit(model, CLEAN, CORRUPT, diff, batch_size=batch_size, **kw), whole)


def test_a_metric_reads_its_targets_by_the_batch_slice_and_pruning_matches():
    model = probes.load(MLP, device="cpu")
    whole = probes.circuit(model, CLEAN, CORRUPT, target_logprob, "patch")
    batched = probes.circuit(model, CLEAN, CORRUPT, target_logprob, "patch", batch_size=2)
    same_table(batched, whole)
    keep = [0, 3, 10, len(whole)]
    curves = [
        probes.faithfulness(model, CLEAN, CORRUPT, target_logprob, whole, keep=keep, batch_size=b) for b in (None, 2)
    ]
    assert np.allclose(curves[0]["recovered"], curves[1]["recovered"], rtol=0, atol=1e-6)
    assert curves[1]["recovered"].iloc[[0, -1]].tolist() == pytest.approx([0.0, 1.0], abs=1e-6)
    kept = [probes.prune(model, CLEAN, CORRUPT, target_logprob, whole, target=0.8, batch_size=b) for b in (None, 3)]
    assert kept[0].attrs["edges"] == kept[1].attrs["edges"]
    assert kept[0].attrs["recovered"] == pytest.approx(kept[1].attrs["recovered"], abs=1e-6)


def test_an_edge_into_the_logits_scores_as_by_hand_in_batches():
    model = probes.load("native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,attn_only=true,norm=none")

    def logit(x):
        return x[:, -1, 3]

    patched = probes.circuit(model, CLEAN, CORRUPT, logit, "patch", batch_size=3).set_index(["sender", "receiver"])
    name = "blocks.1.attn.hook_z"
    (_, c), (_, x) = (probes.run_with_cache(model, ids, names=name) for ids in (CLEAN, CORRUPT))
    z = c[name][:, -1, 1] - x[name][:, -1, 1]
    by_hand = (z @ model.bridge.W_O[1, 1] @ model.bridge.W_U[:, 3]).detach()
    assert patched.loc[("1-1", "logits"), "score"] == pytest.approx(float(by_hand.mean()), abs=1e-5)
    assert patched.loc[("1-1", "logits"), "se"] == pytest.approx(float(by_hand.std() / 7**0.5), abs=1e-5)


def test_progress_shows_a_bar_of_the_passes(capsys):
    model = probes.load(MLP, device="cpu")
    probes.circuit(model, CLEAN, CORRUPT, diff, "eap-ig", ig_steps=2, batch_size=4, progress=True)
    assert "circuit passes" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda m: probes.circuit(m, CLEAN, CORRUPT, diff, batch_size=0), "batch_size must be a positive integer"),
        (lambda m: probes.prune(m, CLEAN, CORRUPT, diff, None, batch_size=1.5), "batch_size must be a positive"),
        (
            lambda m: probes.circuit(m, CLEAN, CORRUPT, lambda y: y[:, -1, 3].mean(), "patch", batch_size=2),
            "with batch_size, metric .* must give one value per example",
        ),
        (
            lambda m: probes.circuit(m, CLEAN, CORRUPT, lambda y: y[:, -1, 3].mean(), "eap", batch_size=2),
            "with batch_size, metric .* must give one value per example",
        ),
        (
            lambda m: probes.circuit(m, CLEAN, CORRUPT, lambda y: y[:, -1, 3] - TARGETS, "eap-ig", batch_size=2),
            "take the batch's slice too, def metric\\(logits, index\\)",
        ),
    ],
)
def test_bad_batches_are_one_line(call, says):
    model = probes.load(MLP, device="cpu")
    with pytest.raises(probes.ProbeError, match=says) as err:
        call(model)
    assert "\n" not in str(err.value)
