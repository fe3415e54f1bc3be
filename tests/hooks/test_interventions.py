"""Head ablation and activation patching, with known answers."""

import pytest
import torch

from depthprobe.probes import ProbeError, capture, load, run_with_cache
from depthprobe.probes.hooks.interventions import ablate_heads, parse_heads, patch


@pytest.fixture(scope="module")
def native():
    return load("native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,seed=3")


def test_head_labels_are_l_h_zero_indexed(tiny_gpt2):
    assert parse_heads(tiny_gpt2, "1-2, 0-3") == [(1, 2), (0, 3)]
    assert parse_heads(tiny_gpt2, [(1, 2), "1-2"]) == [(1, 2)]
    for bad in ("1.2", "L1H2"):
        with pytest.raises(ProbeError, match="L-H, 0-indexed"):
            parse_heads(tiny_gpt2, bad)
    with pytest.raises(ProbeError, match="heads 0-3"):
        parse_heads(tiny_gpt2, "1-4")


def test_zero_ablation_is_zeroing_the_heads_pattern(tiny_bert):
    """z = pattern @ v, so zeroing head 1-2's output equals zeroing its attention pattern."""
    ids, mask = tiny_bert.encode(["the dog saw the cat", "a man"])
    with torch.no_grad():
        clean = tiny_bert.bridge(ids, attention_mask=mask)
        with ablate_heads(tiny_bert, "1-2", method="zero"):
            ablated = tiny_bert.bridge(ids, attention_mask=mask)

        def zero(t, h):
            t = t.clone()
            t[:, 2] = 0
            return t

        with capture(tiny_bert, "blocks.1.attn.hook_pattern", zero):
            by_pattern = tiny_bert.bridge(ids, attention_mask=mask)
    keep = mask.bool()
    assert (ablated - clean)[keep].abs().max() > 1e-4
    assert (ablated - by_pattern)[keep].abs().max() < 1e-5


def test_mean_ablation_over_the_input_itself_changes_a_one_token_input_by_nothing(native):
    ids = torch.tensor([[7]])
    with torch.no_grad():
        clean = native.bridge(ids)
        with ablate_heads(native, "0-1,1-0", data=ids):
            same = native.bridge(ids)
        with ablate_heads(native, "0-1,1-0", data=torch.tensor([[3]])):
            other = native.bridge(ids)
    assert torch.allclose(clean, same, atol=1e-6)
    assert (clean - other).abs().max() > 1e-4
    with pytest.raises(ProbeError, match="data="), ablate_heads(native, "0-1"):
        pass


def test_patching_residuals_per_layer_and_position(native):
    clean = torch.tensor([[1, 2, 3, 4, 5]])
    corrupt = torch.tensor([[1, 2, 9, 4, 5]])  # only position 2 differs

    def last_logit(logits):
        return logits[0, -1, 5]

    df = patch(native, clean, corrupt, metric=last_logit)
    assert list(df.columns) == ["model", "task", "layer", "head", "position", "hook", "metric", "value"]
    assert len(df) == 2 * 5 and set(df.metric) == {"last_logit"}
    layer0 = df[df.layer == 0].set_index("position")["value"]
    # the embedding at an unchanged position is the same in both runs: patching it changes nothing
    for pos in (0, 1, 3, 4):
        assert layer0[pos] == pytest.approx(df.attrs["corrupt"], abs=1e-5)
    # patching the one differing embedding restores the whole clean run
    assert layer0[2] == pytest.approx(df.attrs["clean"], abs=1e-5)
    assert abs(df.attrs["clean"] - df.attrs["corrupt"]) > 1e-4


def test_patching_per_head_matches_a_hand_made_patch(native):
    clean, corrupt = torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[1, 2, 9, 4, 5]])
    df = patch(native, clean, corrupt, hooks="blocks.*.attn.hook_z", metric=lambda lg: lg[0, -1].logsumexp(-1))
    assert len(df) == 4 and df.position.isna().all()
    _, cache = run_with_cache(native, clean, names="blocks.1.attn.hook_z")

    def put(t, h):
        t = t.clone()
        t[:, :, 1] = cache["blocks.1.attn.hook_z"][:, :, 1]
        return t

    with torch.no_grad(), capture(native, "blocks.1.attn.hook_z", put):
        want = native.bridge(corrupt)[0, -1].logsumexp(-1).item()
    got = df[(df.layer == 1) & (df["head"] == 1)]["value"].item()
    assert got == pytest.approx(want, abs=1e-6)
    with pytest.raises(ProbeError, match="same shape"):
        patch(native, clean, torch.tensor([[1, 2]]), metric=lambda lg: lg.sum())


@pytest.mark.parametrize(
    ("metric", "says"),
    [
        (lambda logits: "high", "got str"),
        (lambda logits: logits[0, -1], "got a tensor of shape [20]"),
        (lambda logits: None, "got NoneType"),
    ],
)
def test_a_patch_metric_that_is_not_one_number_is_refused_in_one_line(native, metric, says):
    clean, corrupt = torch.tensor([[1, 2, 3]]), torch.tensor([[1, 9, 3]])
    refused = r"metric '<lambda>' must return a number, a one-element tensor or one value per example"
    with pytest.raises(ProbeError, match=refused) as got:
        patch(native, clean, corrupt, metric=metric)
    assert says in str(got.value) and "\n" not in str(got.value)
