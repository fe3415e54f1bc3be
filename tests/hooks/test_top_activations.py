"""#46.5: top-activating contexts of an SAE latent. Known answers: the latent is a planted
direction, so its activation at every token is computed by hand from the residual stream, and the
top k equal the hand ranking; padding never ranks; the view marks the top token."""

from __future__ import annotations

import pytest
import torch

import depthprobe.probes as probes
from depthprobe.probes.models.sae import SAE, SAEConfig

HOOK = "blocks.1.hook_resid_pre"


def planted(d: int, seed: int = 0) -> SAE:
    """Latent 1 reads a random direction w: relu(x . w - 0.1); latent 0 its opposite."""
    w = torch.randn(d, generator=torch.Generator().manual_seed(seed))
    t = {"W_enc": torch.stack([-w, w], 1), "b_enc": torch.tensor([0.0, -0.1])}
    t |= {"W_dec": torch.stack([-w, w]) / d, "b_dec": torch.zeros(d)}
    return SAE(SAEConfig(d, 2, HOOK, apply_b_dec_to_input=False), t)


def by_hand(model, ids, mask, sae):
    _, cache = probes.run_with_cache(model, ids, names=HOOK, attention_mask=mask)
    acts = (cache[HOOK] @ sae.W_enc[:, 1] - 0.1).relu()
    return acts.masked_fill(mask == 0, float("-inf"))


def test_native_top_k_equal_the_hand_ranking():
    model = probes.load("native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,attn_only=false", device="cpu")
    ids = torch.randint(0, 20, (6, 9), generator=torch.Generator().manual_seed(2))
    sae = planted(16)
    top = probes.top_activations(model, sae, ids, latent=1, k=5, batch_size=4, window=3, after=1)
    hand = by_hand(model, ids, torch.ones_like(ids), sae)
    values, where = hand.flatten().topk(5)
    assert top.table["activation"].to_list() == pytest.approx(values.tolist(), abs=1e-5)
    assert list(zip(top.table["example"], top.table["position"], strict=True)) == [divmod(int(i), 9) for i in where]
    first = top.table.iloc[0]
    assert first["token"] == f" {int(ids[first['example'], first['position']])}"  # ids, spaced
    assert f"[[{first['token']}]]" in first["context"]
    assert top.table["rank"].to_list() == [0, 1, 2, 3, 4]
    html = top.view.page
    assert html.count("<mark") == 5 and "Latent 1 of the SAE" in html
    assert repr(top).startswith("TopActivations(latent 1: 5 contexts")


def test_texts_with_padding_on_a_tiny_gpt2(tiny_gpt2):
    texts = ["the dog saw a cat", "mary ran", "the old man read a big book in london"]
    sae = planted(32, seed=1)
    top = probes.top_activations(tiny_gpt2, sae, texts, latent=1, k=100)
    ids, mask = tiny_gpt2.encode(texts)
    hand = by_hand(tiny_gpt2, ids, mask, sae)
    n_real = int(mask.sum())
    assert len(top.table) == n_real  # k above the real tokens: every real token once, no padding
    assert sorted(top.table["activation"], reverse=True) == top.table["activation"].to_list()
    for _, row in top.table.iterrows():
        assert mask[row["example"], row["position"]] == 1
        assert row["activation"] == pytest.approx(float(hand[row["example"], row["position"]]), abs=1e-5)
        assert row["token"] == tiny_gpt2.tokenizer.decode([int(ids[row["example"], row["position"]])])
    assert "<iframe" in top._repr_html_()


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"latent": 2}, r"latent must be an integer from 0 to 1 \(the SAE's d_sae is 2\)"),
        ({"latent": True}, "latent must be an integer"),
        ({"k": 0}, "k must be an integer of at least 1"),
        ({"window": -1}, "window must be an integer of at least 0"),
        ({"sae": "sae"}, "top_activations needs an SAE from probes.load_sae, got str"),
    ],
)
def test_bad_arguments_are_one_line(kw, says):
    model = probes.load("native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,attn_only=false", device="cpu")
    args = {"sae": planted(16), "texts": torch.zeros(1, 3, dtype=torch.long), "latent": 1} | kw
    with pytest.raises(probes.ProbeError, match=says):
        probes.top_activations(model, **args)
