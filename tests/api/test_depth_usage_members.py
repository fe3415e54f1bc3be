"""The depth-usage functions a study runner calls per member (probes/api/depth_usage.py), on a
tiny native model: the task's table with a member column, and the accuracy per task level with
each single block skipped (known answers: a zero block is never needed; a fast path that ignores
hooks is refused)."""

from __future__ import annotations

import pytest
import torch

from depthprobe import probes
from depthprobe.probes.api.depth_usage import depth_usage_tables, skipped_layer_accuracy
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.training.fast_forward import fast_logits

SPEC = "native:layers=3,d_model=32,heads=4,attn_only=false,d_vocab=20,n_ctx=32,seed=3"


@pytest.fixture(scope="module")
def native():
    """A native model whose block 1 has every weight zero (it adds exactly 0)."""
    model = probes.load(SPEC, device="cpu")
    with torch.no_grad():
        for p in model.bridge.blocks[1].parameters():
            p.zero_()
    return model


@pytest.fixture(scope="module")
def levels():
    """Two task levels, each a fixed batch of token ids."""
    g = torch.Generator().manual_seed(0)
    return {1: torch.randint(0, 20, (6, 10), generator=g), 2: torch.randint(0, 20, (6, 10), generator=g)}


def test_depth_usage_tables_on_token_ids(native, levels):
    table = depth_usage_tables(native, levels[1], member="d3-seed0")
    assert table.columns[0] == "member" and set(table.member) == {"d3-seed0"}
    rel = table[table.metric == "relative_contribution"].sort_values("layer")["value"].tolist()
    assert len(rel) == 3 and rel[1] == 0.0 and rel[0] > 0
    assert {"skip_later", "skip_kl", "lens_kl"} <= set(table.metric)
    short = depth_usage_tables(native, levels[1], skips=False, lens=False)
    assert not short.metric.str.startswith(("skip_", "lens_")).any()


def test_skipped_layer_accuracy_known_answers(native, levels):
    with torch.no_grad():
        intact = {k: native.bridge(x).argmax(-1) for k, x in levels.items()}

    def evaluate():  # agreement with the intact model's predictions: 1.0 when nothing changed
        with torch.no_grad():
            return {k: float((native.bridge(x).argmax(-1) == intact[k]).float().mean()) for k, x in levels.items()}

    table = skipped_layer_accuracy(native, evaluate, member="m")
    assert list(table.columns) == ["member", "skipped", "level", "accuracy", "drop"]
    assert len(table) == 2 * 4  # intact + 3 skips, 2 levels each
    base = table[table.skipped.isna()]
    assert base.accuracy.tolist() == [1.0, 1.0]
    zero = table[table.skipped == 1]
    assert zero.accuracy.tolist() == [1.0, 1.0] and zero["drop"].tolist() == [0.0, 0.0]
    assert (table[table.skipped == 0].accuracy < 1.0).any()  # a real block is needed
    assert evaluate() == {1: 1.0, 2: 1.0}  # the skips are gone afterwards


def test_skipped_layer_accuracy_refuses_an_evaluate_that_bypasses_hooks(native, levels):
    def fast():
        with torch.no_grad():
            return {1: float(fast_logits(native, levels[1]).argmax(-1).float().mean())}

    with pytest.raises(ProbeError, match="no pass through block 0"):
        skipped_layer_accuracy(native, fast, [0])
    with pytest.raises(ProbeError, match="mapping of task level"):
        skipped_layer_accuracy(native, lambda: 0.5, [0])  # type: ignore[arg-type, return-value]
    with pytest.raises(ProbeError, match="block 7 does not exist"):
        skipped_layer_accuracy(native, fast, [7])


@pytest.mark.parametrize("spec", [SPEC, SPEC.replace("attn_only=false", "attn_only=true")])
def test_the_fast_path_skips_a_block_as_the_hooks_do(spec, levels):
    """Law members evaluate skipped blocks on the fast path (probes.experiments.law_member.member_logits):
    it must equal the bridge under probes.skip_layers, block by block, with and without MLPs."""
    from depthprobe.probes.experiments.law_member import member_logits

    model = probes.load(spec, device="cpu")
    x = levels[1]
    with torch.no_grad():
        for block in (0, 1, 2):
            with probes.skip_layers(model, [block]):
                hooked = model.bridge(x)
            fast = member_logits(model, x, skip=(block,))
            torch.testing.assert_close(fast, hooked, atol=1e-5, rtol=1e-4)
            assert not torch.allclose(fast, model.bridge(x), atol=1e-3)  # the skip changed the logits
        torch.testing.assert_close(member_logits(model, x), model.bridge(x), atol=1e-5, rtol=1e-4)


def test_a_checkpoint_gives_the_same_tables(native, levels, tmp_path):
    probes.save_checkpoint(native, tmp_path / "ckpt")
    loaded = probes.load_checkpoint(tmp_path / "ckpt", device="cpu")
    a = depth_usage_tables(native, levels[2], member="m").drop(columns="model")
    b = depth_usage_tables(loaded, levels[2], member="m").drop(columns="model")
    assert a[["layer", "metric"]].equals(b[["layer", "metric"]])
    torch.testing.assert_close(torch.tensor(a.value.to_numpy()), torch.tensor(b.value.to_numpy()))


def test_depth_alignment_of_a_model_with_itself_is_the_diagonal():
    from depthprobe.probes.api.depth_usage import depth_alignment

    a = probes.load("native:layers=2,d_model=16,heads=4,attn_only=false,d_vocab=20,n_ctx=32,seed=1", device="cpu")
    b = probes.load("native:layers=4,d_model=16,heads=4,attn_only=false,d_vocab=20,n_ctx=32,seed=2", device="cpu")
    ids = torch.randint(0, 20, (20, 16), generator=torch.Generator().manual_seed(0))
    same = depth_alignment(a, a, ids)
    assert len(same) == 3 * 3
    diag = same[same.shallow_layer == same.deep_layer]
    assert diag.r2.min() > 1 - 1e-6 and diag.best.all()  # h_i maps onto itself exactly
    other = depth_alignment(a, b, ids)
    assert len(other) == 3 * 5 and (other.r2 < 1 - 1e-3).any() and other.groupby("shallow_layer").best.sum().eq(1).all()
    assert other.relative_deep.max() == 1.0
    with pytest.raises(ProbeError, match="token ids"):
        depth_alignment(a, b, ids[0])
