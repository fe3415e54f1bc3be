"""Steering (probes/hooks/steering.py): a steering vector from contrast pairs, an edit adding it,
generation with scoped edits."""

from __future__ import annotations

import pytest
import torch

import depthprobe.probes as probes

SPEC = "native:layers=2,d_model=32,heads=4,d_vocab=20,n_ctx=32"


@pytest.fixture(scope="module")
def model():
    return probes.load(SPEC, device="cpu")


def test_steering_vector_is_the_difference_of_means_at_the_last_real_token(model):
    pos, neg = [[1, 2, 3], [4, 5]], [[6, 7, 8], [9, 10, 11]]
    hook = "blocks.0.hook_resid_post"
    v = probes.steering_vector(model, pos, neg, hook)

    def last(rows):
        acts = [probes.run_with_cache(model, torch.tensor([r]), hook)[1][hook][0, -1] for r in rows]
        return torch.stack(acts).mean(0)

    assert v.shape == (32,) and torch.allclose(v, last(pos) - last(neg), atol=1e-6)
    with pytest.raises(probes.ProbeError, match="reads one hook"):
        probes.steering_vector(model, pos, neg, "blocks.*.hook_resid_post")


def test_generate_with_scoped_edits(model):
    prompt = torch.tensor([[1, 2, 3, 4]])
    plain = probes.generate(model, prompt, max_new_tokens=6)
    assert torch.equal(
        plain, model.bridge.generate(prompt, max_new_tokens=6, do_sample=False, verbose=False, stop_at_eos=False)
    )
    v = probes.steering_vector(model, [[5, 5, 5]], [[1, 2, 3]], "blocks.1.hook_resid_post")
    steered = probes.generate(
        model, prompt, {"blocks.1.hook_resid_post": probes.steer(v, scale=50.0)}, max_new_tokens=6
    )
    assert steered.shape == plain.shape and not torch.equal(steered, plain)
    assert torch.equal(probes.generate(model, prompt, max_new_tokens=6), plain)  # the edit was removed
    with pytest.raises(probes.ProbeError, match="a dict of hook name"):
        probes.generate(model, prompt, [probes.steer(v)])


def test_steering_vector_positions_are_checked_not_wrapped(model):
    """position=999 read position 999 modulo the length; now it is refused. Negative positions count
    from each input's last real token (-1 equals the default)."""
    pos, neg = [[1, 2, 3], [4, 5, 6, 7]], [[6, 7, 8], [9, 10, 11]]
    hook = "blocks.0.hook_resid_post"
    with pytest.raises(
        probes.ProbeError, match=r"position 999 is outside the shortest input \(3 tokens\); give -3\.\.2"
    ):
        probes.steering_vector(model, pos, neg, hook, position=999)
    with pytest.raises(probes.ProbeError, match="position -4 is outside"):
        probes.steering_vector(model, pos, neg, hook, position=-4)
    assert torch.equal(
        probes.steering_vector(model, pos, neg, hook, position=-1), probes.steering_vector(model, pos, neg, hook)
    )
    at = probes.run_with_cache(model, torch.tensor([[4, 5, 6, 7]]), hook)[1][hook][0, 2]  # -2 of the longer input
    by_hand = (probes.run_with_cache(model, torch.tensor([[1, 2, 3]]), hook)[1][hook][0, 1] + at) / 2
    neg_hand = probes.run_with_cache(model, torch.tensor(neg), hook)[1][hook][:, 1].mean(0)
    assert torch.allclose(probes.steering_vector(model, pos, neg, hook, position=-2), by_hand - neg_hand, atol=1e-6)
    for bad, match in (("a", "must be an integer or None"), (True, "must be an integer or None")):
        with pytest.raises(probes.ProbeError, match=match):
            probes.steering_vector(model, pos, neg, hook, position=bad)
    with pytest.raises(probes.ProbeError, match="at least one positive and one negative"):
        probes.steering_vector(model, [], neg, hook)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m, v, p: probes.steer(v, scale="big"), "scale must be a finite number"),
        (lambda m, v, p: probes.steer(v, scale=float("nan")), "scale must be a finite number"),
        (lambda m, v, p: probes.steer(v * float("inf")), "holds NaN or inf"),
        (lambda m, v, p: probes.steer(v.long()), "float vector"),
        (lambda m, v, p: probes.steer(v, positions="ab"), "positions must be a list of integers"),
        (lambda m, v, p: probes.steer(v, positions=[]), "non-empty list"),
        (
            lambda m, v, p: probes.generate(m, p, {"blocks.1.hook_resid_post": probes.steer(v, positions=[99])}),
            r"positions \[99\] reach beyond the 4 positions",
        ),
        (lambda m, v, p: probes.generate(m, p, max_new_tokens="3"), "max_new_tokens must be an integer"),
        (lambda m, v, p: probes.generate(m, p, max_new_tokens=2.5), "max_new_tokens must be an integer"),
        (lambda m, v, p: probes.generate(m, p, max_new_tokens=29), "plus max_new_tokens=29 exceeds the 32 positions"),
        (lambda m, v, p: probes.generate(m, "a text"), "has no tokenizer: give generate token ids"),
        (
            lambda m, v, p: probes.generate(m, p, temprature=0.5),
            r"unknown keyword 'temprature' \(did you mean 'temperature'",
        ),
        (lambda m, v, p: probes.generate(m, p, do_sample=True, temperature=-1.0), "temperature must be a positive"),
        (lambda m, v, p: probes.generate(m, p, do_sample=True, top_p=2), r"top_p must be a number in \(0, 1\]"),
        (lambda m, v, p: probes.generate(m, p, do_sample=True, top_k=0), "top_k must be an integer of at least 1"),
    ],
)
def test_bad_steer_and_generate_values_are_one_line(model, call, match):
    v = probes.steering_vector(model, [[5, 5, 5]], [[1, 2, 3]], "blocks.1.hook_resid_post")
    with pytest.raises(probes.ProbeError, match=match) as err:
        call(model, v, torch.tensor([[1, 2, 3, 4]]))
    assert "\n" not in str(err.value)


def test_generate_refuses_an_encoder(minilm):
    """D12: generate on minilm raised TransformerLens's NotImplementedError."""
    with pytest.raises(probes.ProbeError, match="generate needs a causal language model; minilm is an encoder"):
        probes.generate(minilm, "the cat")
