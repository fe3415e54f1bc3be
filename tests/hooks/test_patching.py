"""Patching and its neighbours (probes/hooks/patching.py, attribution.py, cache.py, loss.py,
lens.py): errors before any pass, patching at every grain against TransformerLens's own patching,
gradients on every hook, attribution patching, TransformerLens's cache verbs, the loss, and one
thread per model while a capture is open."""

import threading

import numpy as np
import pytest
import torch

from depthprobe.probes import (
    ProbeError,
    ablate_heads,
    attribute,
    capture,
    direct_logit_attribution,
    load,
    logit_lens,
    patch,
    run_with_cache,
)

CLEAN = torch.tensor([[1, 2, 3, 4, 5]])
CORRUPT = torch.tensor([[1, 2, 9, 4, 5]])


@pytest.fixture(scope="module")
def native():
    return load("native:layers=2,d_model=16,heads=2,d_vocab=20,n_ctx=16,seed=3")


def logit_diff(logits):
    return logits[0, -1, 5] - logits[0, -1, 7]


# 27.13: small API mistakes are one-line ProbeErrors, before any forward pass


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: run_with_cache(m, torch.tensor([[1, 2]]), names=123), "names must be"),
        (lambda m: run_with_cache(m, torch.tensor([[1, 20]])), "token id 20 is outside the vocabulary.*0 to 19"),
        (lambda m: run_with_cache(m, torch.tensor([[1, -1]])), "token id -1 is outside"),
        (lambda m: run_with_cache(m, torch.tensor([[1.0, 2.0]])), "token ids must be integers"),
        (lambda m: ablate_heads(m, (0, 1, 2), method="zero").__enter__(), r"a head is \(layer, head\)"),
        (lambda m: capture(m, "blocks.0.hook_resid_pre", {"a": 1}).__enter__(), "fn must be a function"),
        (lambda m: run_with_cache(m, CLEAN, names="blocks.0.attn.hook_result"), "set_use_attn_result"),
        (lambda m: patch(m, CLEAN, CORRUPT, hooks=5, metric=logit_diff), "hook names must be"),
        (
            lambda m: patch(m, CLEAN, CORRUPT, hooks="blocks.*.hook_resid_pre", per="head", metric=logit_diff),
            "no head axis",
        ),
        (lambda m: patch(m, CLEAN, CORRUPT, per="pos", metric=logit_diff), "unknown per"),
        (lambda m: patch(m, CLEAN, CORRUPT, positions=[7], metric=logit_diff), "positions must lie in 0..4"),
    ],
)
def test_small_mistakes_are_one_line_probe_errors_before_any_pass(native, call, match):
    calls = []
    handle = native.bridge.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ProbeError, match=match) as info:
            call(native)
    finally:
        handle.remove()
    assert "\n" not in str(info.value) and calls == []


# 27.4 + 26.3: patching at every grain, a list of hooks, a subset of positions


def test_patch_per_head_position_equals_transformer_lens_patching(native):
    from transformer_lens import patching

    df = patch(native, CLEAN, CORRUPT, hooks="blocks.*.attn.hook_z", per="head_position", metric=logit_diff)
    assert list(df.columns) == ["model", "task", "layer", "head", "position", "hook", "metric", "value"]
    _, clean_cache = native.bridge.run_with_cache(CLEAN)
    theirs = patching.get_act_patch_attn_head_out_by_pos(native.bridge, CORRUPT, clean_cache, logit_diff)
    ours = torch.zeros_like(theirs)  # [layer, pos, head]
    for r in df.itertuples():
        ours[r.layer, r.position, r.head] = r.value
    assert len(df) == 2 * 5 * 2
    assert torch.allclose(ours, theirs, atol=1e-5)
    every_pos = patching.get_act_patch_attn_head_out_all_pos(native.bridge, CORRUPT, clean_cache, logit_diff)
    by_head = patch(native, CLEAN, CORRUPT, hooks="blocks.*.attn.hook_z", metric=logit_diff)  # natural grain: head
    assert by_head.position.isna().all()
    assert np.allclose(by_head.sort_values(["layer", "head"]).value, every_pos.flatten().numpy(), atol=1e-5)


def test_patch_patterns_are_labelled_by_head_and_match_transformer_lens(native):
    from transformer_lens import patching

    df = patch(native, CLEAN, CORRUPT, hooks="blocks.*.attn.hook_pattern", metric=logit_diff)
    assert df.position.isna().all() and sorted(set(df["head"])) == [0, 1]
    _, clean_cache = native.bridge.run_with_cache(CLEAN)
    theirs = patching.get_act_patch_attn_head_pattern_all_pos(native.bridge, CORRUPT, clean_cache, logit_diff)
    assert np.allclose(df.sort_values(["layer", "head"]).value, theirs.flatten().numpy(), atol=1e-5)


def test_patch_q_k_v_match_transformer_lens(native):
    from transformer_lens import patching

    _, clean_cache = native.bridge.run_with_cache(CLEAN)
    for letter in "qkv":
        df = patch(native, CLEAN, CORRUPT, hooks=f"blocks.*.attn.hook_{letter}", per="head_position", metric=logit_diff)
        fn = getattr(patching, f"get_act_patch_attn_head_{letter}_by_pos")
        theirs = fn(native.bridge, CORRUPT, clean_cache, logit_diff)
        ours = torch.zeros_like(theirs)
        for r in df.itertuples():
            ours[r.layer, r.position, r.head] = r.value
        assert torch.allclose(ours, theirs, atol=1e-5), letter


def test_patch_a_list_of_hooks_and_a_subset_of_positions(native):
    df = patch(
        native,
        CLEAN,
        CORRUPT,
        hooks=["blocks.0.hook_resid_pre", "blocks.1.attn.hook_z"],
        metric=logit_diff,
        positions=[2, 4],
        per=None,
    )
    resid = df[df.hook == "hook_resid_pre"]
    assert list(resid.position) == [2, 4] and set(resid.layer) == {0}
    # patching the one differing embedding restores the clean run; an unchanged one changes nothing
    assert resid.value.iloc[0] == pytest.approx(df.attrs["clean"], abs=1e-5)
    assert resid.value.iloc[1] == pytest.approx(df.attrs["corrupt"], abs=1e-5)
    z = df[df.hook == "attn.hook_z"]
    assert list(z["head"]) == [0, 1] and set(z.layer) == {1}
    per_pos = patch(
        native, CLEAN, CORRUPT, hooks="blocks.1.attn.hook_z", per="position", positions=[4], metric=logit_diff
    )
    assert len(per_pos) == 1 and per_pos["head"].isna().all() and per_pos.position.iloc[0] == 4


# 26.1: gradients on every hook, attribution patching

HOOKS = [
    "attn.hook_z",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.q.hook_out",
    "attn.o.hook_in",
    "attn.hook_pattern",
    "hook_resid_post",
]


@pytest.mark.parametrize("hook", HOOKS)
def test_capture_grad_gives_tensors_in_the_graph_on_every_hook(native, hook):
    name = f"blocks.0.{hook}"
    with capture(native, name, grad=True) as acts:
        logits = native.bridge(CLEAN)
    (g,) = torch.autograd.grad(logit_diff(logits), [acts[name]], allow_unused=True)
    assert g is not None and g.abs().sum() > 0


def test_run_with_cache_grad_caches_gradients_like_transformer_lens(native):
    loss, cache = run_with_cache(native, CLEAN, names="blocks.*.hook_resid_post", return_type="loss", grad=True)
    _, theirs = native.bridge.run_with_cache(
        CLEAN, return_type="loss", incl_bwd=True, names_filter=lambda n: "resid_post" in n
    )
    native.bridge.zero_grad()
    for i in range(2):
        name = f"blocks.{i}.hook_resid_post"
        assert cache[f"{name}_grad"].abs().sum() > 0
        assert torch.allclose(cache[f"{name}_grad"], theirs[f"{name}_grad"], atol=1e-6)
    assert not loss.requires_grad and not cache["blocks.0.hook_resid_post"].requires_grad


def test_attribution_has_patchs_table_and_is_exact_for_a_linear_metric(native):
    p = patch(native, CLEAN, CORRUPT, hooks="blocks.*.attn.hook_z", metric=logit_diff)
    a = attribute(native, CLEAN, CORRUPT, logit_diff, hooks="blocks.*.attn.hook_z")
    assert list(a.columns) == list(p.columns) and len(a) == len(p)
    assert {k: a.attrs[k] for k in ("clean", "corrupt")} == pytest.approx(p.attrs)
    assert len(a.attrs["checked"]) == 3  # the spot check's patched slots (tests/hooks/test_attribution_ig.py)
    # the logits are linear in the final layer norm's output: there the approximation is exact
    lin = attribute(native, CLEAN, CORRUPT, logit_diff, hooks="ln_final.hook_out", positions=[4])
    exact = patch(native, CLEAN, CORRUPT, hooks="ln_final.hook_out", positions=[4], metric=logit_diff)
    assert lin.value.iloc[0] == pytest.approx(exact.value.iloc[0], abs=1e-5)
    assert abs(exact.value.iloc[0] - p.attrs["corrupt"]) > 1e-3
    with pytest.raises(ProbeError, match="one-element tensor"):
        attribute(native, CLEAN, CORRUPT, lambda lg: logit_diff(lg).item(), hooks="blocks.0.attn.hook_z")


@pytest.mark.slow
def test_minilm_hook_z_gradients_and_attribution_agree_with_patch_on_the_readme_example(minilm):
    ids, mask = minilm.encode("The keys to the cabinet are on the table.")
    names = [f"blocks.{i}.attn.hook_z" for i in range(6)]
    with capture(minilm, [*names, "blocks.5.hook_resid_post"], grad=True) as acts:
        minilm.bridge(ids, attention_mask=mask, return_type=None)
    for n in names:
        acts[n].retain_grad()
    acts["blocks.5.hook_resid_post"][0, 0].norm().backward()
    minilm.bridge.zero_grad()
    assert all(acts[n].grad is not None and acts[n].grad.abs().sum() > 0 for n in names)

    clean_ids, _ = minilm.encode("The keys to the cabinet are on the table.")
    corrupt_ids, _ = minilm.encode("The key to the cabinets are on the table.")

    def metric(out):
        return out[0, 0].norm()

    table = patch(minilm, clean_ids, corrupt_ids, hooks="blocks.*.attn.hook_z", metric=metric)
    approx = attribute(minilm, clean_ids, corrupt_ids, metric, hooks="blocks.*.attn.hook_z")
    assert len(table) == 6 * 12
    assert np.corrcoef(table.value, approx.value)[0, 1] >= 0.95  # measured 0.952


# 26.2: TransformerLens's cache verbs on probes.run_with_cache's cache


def test_cache_verbs_match_the_bridges_own_cache(native):
    _, ours = run_with_cache(native, CLEAN)
    _, theirs = native.bridge.run_with_cache(CLEAN)
    assert torch.equal(ours["pattern", 1], theirs["pattern", 1])
    for verb, kwargs in [("decompose_resid", {}), ("stack_head_results", {}), ("accumulated_resid", {})]:
        a, b = getattr(ours.tl, verb)(**kwargs), getattr(theirs, verb)(**kwargs)
        assert torch.allclose(a, b, atol=1e-5), verb
    a = ours.stack_head_results(return_labels=True)
    b = theirs.stack_head_results(return_labels=True)
    assert a[1] == b[1] and torch.allclose(a[0], b[0], atol=1e-5)
    resid = ours.decompose_resid()
    attrs = ours.logit_attrs(resid, tokens=torch.tensor([5]))
    assert torch.allclose(attrs, theirs.logit_attrs(theirs.decompose_resid(), tokens=torch.tensor([5])), atol=1e-5)
    assert torch.allclose(
        ours.apply_ln_to_stack(resid, layer=-1), theirs.apply_ln_to_stack(theirs.decompose_resid(), layer=-1), atol=1e-5
    )
    assert ours.stack("blocks.*.hook_resid_post").shape == (2, 1, 5, 16)  # depthprobe's own verbs stay
    ours.remove_batch_dim()
    assert ours["blocks.0.hook_resid_pre"].shape == (5, 16) and ours["pattern", 0].shape == (2, 5, 5)


# 26.4: loss from run_with_cache


def test_run_with_cache_gives_the_loss_as_transformer_lens_does(native):
    loss, _ = run_with_cache(native, CLEAN, names="blocks.0.hook_resid_pre", return_type="loss")
    assert loss.item() == pytest.approx(native.bridge(CLEAN, return_type="loss").item(), abs=1e-5)
    per_token, _ = run_with_cache(
        native, CLEAN, names="blocks.0.hook_resid_pre", return_type="loss", loss_per_token=True
    )
    theirs = native.bridge(CLEAN, return_type="loss", loss_per_token=True)
    assert torch.allclose(per_token, theirs, atol=1e-5)
    (logits, both_loss), _ = run_with_cache(native, CLEAN, names="hook_embed", return_type="both")
    assert logits.shape == (1, 5, 20) and both_loss.item() == pytest.approx(loss.item())
    with pytest.raises(ProbeError, match="unknown return_type"):
        run_with_cache(native, CLEAN, return_type="los")


def test_logit_lens_ends_at_the_logits_and_layer_dla_adds_up_to_the_logit(native):
    logits, cache = run_with_cache(native, CLEAN)
    lens = logit_lens(native, cache)
    assert lens.shape == (3, 1, 5, 20) and torch.allclose(lens[-1], logits, atol=1e-5)
    targets = torch.tensor([[2, 3, 4, 5, 6]])
    by_layer = direct_logit_attribution(native, cache, targets, by="layer")
    assert list(by_layer.component.unique()) == ["embed", "pos_embed", "0_attn_out", "1_attn_out"]
    bias = native.bridge.ln_final.original_component.bias
    for pos, total in by_layer.groupby("position").value.sum().items():
        t = int(targets[0, pos])
        expected = logits[0, pos, t] - native.bridge.b_U[t] - bias @ native.bridge.W_U[:, t]
        assert total == pytest.approx(float(expected.detach()), abs=1e-5)
    by_head = direct_logit_attribution(native, cache, targets)
    assert len(by_head) == 2 * 2 * 5 and list(by_head["head"].unique()) == [0, 1]
    with pytest.raises(ProbeError, match="tokens must be integer ids"):
        direct_logit_attribution(native, cache, torch.tensor([[1, 2]]))


def test_weights_and_circuits_are_transformer_lens_factored_matrices(native):
    from transformer_lens import FactoredMatrix

    bridge = native.bridge
    assert isinstance(bridge.OV, FactoredMatrix) and bridge.OV.shape == (2, 2, 16, 16)
    assert torch.allclose(bridge.OV[1, 0].AB, bridge.W_V[1, 0] @ bridge.W_O[1, 0], atol=1e-6)
    assert bridge.all_composition_scores("K").shape == (2, 2, 2, 2)


# 27.12: one thread per model while a capture is open


def test_a_capture_open_in_one_thread_refuses_another_threads_capture(native):
    opened, release = threading.Event(), threading.Event()

    def zero(t, hook):
        return torch.zeros_like(t)

    def hold_edit():
        with capture(native, "blocks.0.attn.hook_z", zero):
            opened.set()
            release.wait(30)

    worker = threading.Thread(target=hold_edit)
    worker.start()
    try:
        assert opened.wait(30)
        with pytest.raises(ProbeError, match="another thread"):
            run_with_cache(native, CLEAN, names="blocks.1.hook_resid_post")
    finally:
        release.set()
        worker.join()
    _, after = run_with_cache(native, CLEAN, names="blocks.1.hook_resid_post")  # free again once it ends
    assert after["blocks.1.hook_resid_post"].shape == (1, 5, 16)


def test_to_single_token_on_an_encoder_strips_its_special_tokens(minilm):
    """D4: to_single_token raised for every string on minilm (the bridge appends [SEP])."""
    ids = minilm.encode("the cat")[0][0]  # [CLS] the cat [SEP]
    assert minilm.to_single_token("the") == int(ids[1]) and minilm.to_single_token("cat") == int(ids[2])
    with pytest.raises(ProbeError, match=r"'the cat' is 2 tokens in minilm, not one: \['the', 'cat'\]"):
        minilm.to_single_token("the cat")
