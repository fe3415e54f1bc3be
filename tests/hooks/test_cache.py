"""run_with_cache, Model.encode and Model.to_str_tokens, checked against plain transformers."""

import json
from pathlib import Path

import pytest
import torch
import transformers

from depthprobe.probes import Cache, ProbeError, capture, load, run_with_cache

TEXTS = ["the dog saw the cat and ran", "a man read a book"]


def test_logits_and_cache_match_plain_transformers(tiny_gpt2, tiny_gpt2_dir):
    logits, cache = run_with_cache(tiny_gpt2, TEXTS)
    ids, mask = tiny_gpt2.encode(TEXTS)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    keep = mask.bool()
    assert (logits - ref.logits)[keep].abs().max() < 1e-5
    assert (cache["blocks.0.hook_resid_post"] - ref.hidden_states[1])[keep].abs().max() < 1e-5
    assert (cache["blocks.0.hook_resid_pre"] - ref.hidden_states[0])[keep].abs().max() < 1e-5
    patterns = cache.stack("blocks.*.attn.hook_pattern")  # [layer, batch, head, q, k]
    assert patterns.shape == (2, 2, 4, ids.shape[1], ids.shape[1])
    qk = keep[:, None, :, None] & keep[:, None, None, :]
    assert (patterns[1] - ref.attentions[1])[qk.expand_as(patterns[1])].abs().max() < 1e-6
    acc = cache.accumulated_resid()
    assert acc.shape == (3, *cache["blocks.0.hook_resid_pre"].shape)
    assert torch.equal(acc[0], cache["blocks.0.hook_resid_pre"]) and torch.equal(
        acc[2], cache["blocks.1.hook_resid_post"]
    )
    moved = cache.to("cpu")
    assert isinstance(moved, Cache) and torch.equal(
        moved["blocks.1.hook_resid_post"], cache["blocks.1.hook_resid_post"]
    )


def test_the_cache_holds_clones(tiny_gpt2):
    """A later in-place edit in the same pass (here: zeroing the next block's input, which is the
    same tensor as this block's output) does not reach the cached activation."""
    ids, _ = tiny_gpt2.encode(TEXTS[0])
    clean_logits, clean = run_with_cache(tiny_gpt2, ids, names="blocks.0.hook_resid_post")

    def zero_in_place(t, hook):
        t.mul_(0)

    logits, cache = run_with_cache(
        tiny_gpt2, ids, names={"blocks.0.hook_resid_post": lambda t, h: None, "blocks.1.hook_resid_pre": zero_in_place}
    )
    assert (logits - clean_logits).abs().max() > 1e-4  # the edit took effect
    assert torch.equal(cache["blocks.0.hook_resid_post"], clean["blocks.0.hook_resid_post"])
    assert torch.count_nonzero(cache["blocks.1.hook_resid_pre"]) == 0


def test_an_encoder_without_lm_head_returns_its_final_hidden_states(tiny_bert_dir, tmp_path):
    body = tmp_path / "body"
    transformers.BertModel.from_pretrained(tiny_bert_dir).save_pretrained(body, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(tiny_bert_dir).save_pretrained(body)
    model = load(str(body), device="cpu")
    assert not model.has_lm_head and load(str(tiny_bert_dir), device="cpu").has_lm_head
    hidden, cache = run_with_cache(model, TEXTS, names="blocks.0.attn.hook_pattern")
    ids, mask = model.encode(TEXTS)
    ref = transformers.BertModel.from_pretrained(body, attn_implementation="eager").eval()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    assert hidden.shape == want.shape == (2, ids.shape[1], 32)
    assert (hidden - want)[mask.bool()].abs().max() < 1e-5
    assert list(cache) == ["blocks.0.attn.hook_pattern"]


def test_encode_pads_and_masks_and_to_str_tokens_reads_back(tiny_bert):
    ids, mask = tiny_bert.encode(["the dog", "the old red car"])
    tok = tiny_bert.tokenizer
    assert ids[0].tolist() == tok("the dog")["input_ids"] + [tok.pad_token_id] * 2
    assert mask.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]
    assert tiny_bert.to_str_tokens("the dog") == ["[CLS]", "the", "dog", "[SEP]"]
    assert tiny_bert.to_str_tokens(ids)[1] == ["[CLS]", "the", "old", "red", "car", "[SEP]"]
    assert tiny_bert.to_str_tokens(ids[0, :3].tolist()) == ["[CLS]", "the", "dog"]
    with pytest.raises(ProbeError, match="above the limit of 3"):
        tiny_bert.encode("the old red car", max_len=3)
    with pytest.raises(ProbeError, match="string"):
        tiny_bert.encode([])


def test_errors_name_the_fix(tiny_gpt2):
    _, cache = run_with_cache(tiny_gpt2, "the dog", names="blocks.*.attn.hook_pattern")
    with pytest.raises(ProbeError, match="cache blocks"):
        cache.accumulated_resid()
    with pytest.raises(ProbeError, match="names="):
        cache.stack("blocks.*.hook_resid_post")
    with pytest.raises(ProbeError, match="token ids"):
        run_with_cache(tiny_gpt2, [[[1]]])
    native = load("native:layers=1,d_model=16,heads=2,d_vocab=20,n_ctx=16")
    with pytest.raises(ProbeError, match="no tokenizer"):
        native.encode("hello")
    logits, cache = run_with_cache(native, torch.tensor([1, 2, 3]))
    assert logits.shape == (1, 3, 20) and "blocks.0.attn.hook_pattern" in cache


def test_loss_gradients_with_every_hook_equal_transformer_lens():
    """#38.8: grad=True with the default names raised on the token ids (no gradient); now the
    cache holds the gradients TransformerLens's incl_bwd holds, key for key."""
    model = load("native:layers=2,d_model=32,heads=4,d_vocab=20,n_ctx=16,attn_only=false", device="cpu")
    ids = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(0))
    loss, cache = run_with_cache(model, ids, return_type="loss", grad=True)
    ref_loss, ref = model.bridge.run_with_cache(ids, incl_bwd=True, return_type="loss")
    assert torch.allclose(loss, ref_loss, atol=1e-6)
    grads = {k for k in cache if k.endswith("_grad")}
    assert grads == {k for k in ref.cache_dict if k.endswith("_grad")} and "embed.hook_in_grad" not in grads
    for k in grads:
        assert torch.allclose(cache[k], ref[k], atol=1e-6), k


def test_grad_capture_under_no_grad_is_refused():
    model = load("native:layers=1,d_model=16,heads=2,d_vocab=10,n_ctx=8", device="cpu")
    ids = torch.tensor([[1, 2, 3]])
    with (
        pytest.raises(ProbeError, match=r"torch\.no_grad\(\).*enable_grad"),
        torch.no_grad(),
        capture(model, "blocks.0.hook_resid_post", grad=True),
    ):
        model.bridge(ids)
    with capture(model, "blocks.0.hook_resid_post", grad=True) as acts:
        model.bridge(ids)
    assert acts["blocks.0.hook_resid_post"].requires_grad


def test_cache_saves_loads_and_pickles_exactly_without_its_model(tmp_path):
    import io
    import pickle

    model = load("native:layers=2,d_model=32,heads=4,d_vocab=20,n_ctx=16", device="cpu")
    ids = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(0))
    _, cache = run_with_cache(model, ids)
    _, grads = run_with_cache(model, ids, names="blocks.*.hook_resid_post", return_type="loss", grad=True)

    def same(a, b):
        assert list(a) == list(b) and a.n_layers == b.n_layers and a.has_batch_dim == b.has_batch_dim
        assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)

    for c in (cache, grads):
        same(Cache.load(c.save(tmp_path / "c.safetensors")), c)
        same(pickle.loads(pickle.dumps(c)), c)
        buf = io.BytesIO()
        torch.save(c, buf)  # raised before: it pickled the bridge
        buf.seek(0)
        same(torch.load(buf, weights_only=False), c)
    loaded = Cache.load(tmp_path / "c.safetensors")
    with pytest.raises(ProbeError, match=r"attach"):
        loaded.decompose_resid()
    one = Cache.load(cache.save(tmp_path / "d.safetensors"), model=model)
    assert torch.equal(one.decompose_resid(), cache.decompose_resid())
    (tmp_path / "bad").write_bytes(b"not a cache")
    for bad in (tmp_path / "bad", tmp_path / "missing"):
        with pytest.raises(ProbeError, match="cache"):
            Cache.load(bad)


def test_transformer_lens_verbs_and_their_options():
    """#35.6: accumulated_resid takes TransformerLens's options (it shadowed them), and equals it."""
    model = load("native:layers=2,d_model=32,heads=4,d_vocab=20,n_ctx=16,attn_only=false", device="cpu")
    ids = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(0))
    _, cache = run_with_cache(model, ids)
    _, ref = model.bridge.run_with_cache(ids)
    assert torch.equal(cache.accumulated_resid(), ref.accumulated_resid())
    ours, labels = cache.accumulated_resid(apply_ln=True, incl_mid=True, return_labels=True)
    theirs, ref_labels = ref.accumulated_resid(apply_ln=True, incl_mid=True, return_labels=True)
    assert labels == ref_labels and len(labels) == 2 * 2 + 1 and torch.allclose(ours, theirs, atol=1e-6)
    assert torch.allclose(cache.accumulated_resid(1, mlp_input=True), ref.accumulated_resid(1, mlp_input=True))
    listed = dir(cache)
    assert {"decompose_resid", "stack_head_results", "logit_attrs", "save", "stack"} <= set(listed)


def test_tokenizer_verbs_are_transformer_lens(tiny_gpt2):
    ids = tiny_gpt2.to_tokens("the dog saw the cat", prepend_bos=False)
    assert ids.shape[0] == 1 and tiny_gpt2.to_string(ids[0]) == "the dog saw the cat"
    first = tiny_gpt2.to_string(ids[0, :1])
    assert tiny_gpt2.to_single_token(first) == int(ids[0, 0])
    assert torch.equal(tiny_gpt2.to_tokens(["a b", "c"]), tiny_gpt2.bridge.to_tokens(["a b", "c"]))
    native = load("native:layers=1,d_model=16,heads=2,d_vocab=10,n_ctx=8", device="cpu")
    with pytest.raises(ProbeError, match=r"needs a tokenizer.*pass ids"):
        native.to_tokens("text")


def test_loss_gradients_under_no_grad_equal_those_outside():
    """grad=True under torch.no_grad() raised a raw RuntimeError; it now computes the same cache."""
    model = load("native:layers=1,d_model=16,heads=2,d_vocab=10,n_ctx=8", device="cpu")
    ids = torch.tensor([[1, 2, 3, 4], [4, 3, 2, 1]])
    loss, cache = run_with_cache(model, ids, names="blocks.0.hook_resid_post", return_type="loss", grad=True)
    with torch.no_grad():
        loss2, cache2 = run_with_cache(model, ids, names="blocks.0.hook_resid_post", return_type="loss", grad=True)
    assert torch.equal(loss, loss2) and list(cache) == list(cache2)
    assert all(torch.equal(cache[k], cache2[k]) for k in cache)


def _hostile(tmp_path, name, meta, tensors=None):
    from safetensors.torch import save_file

    path = tmp_path / f"{name}.safetensors"
    save_file(tensors or {"a": torch.zeros(2)}, str(path), metadata=meta)
    return path


@pytest.mark.parametrize(
    "meta",
    [
        {"format": "depthprobe-cache-1"},
        {"format": "depthprobe-cache-1", "names": "not json", "n_layers": "1", "has_batch_dim": "True"},
        {"format": "depthprobe-cache-1", "names": "5", "n_layers": "1", "has_batch_dim": "True"},
        {"format": "depthprobe-cache-1", "names": '{"a": 1}', "n_layers": "1", "has_batch_dim": "True"},
        {"format": "depthprobe-cache-1", "names": '["a", "b"]', "n_layers": "1", "has_batch_dim": "True"},
        {"format": "depthprobe-cache-1", "names": "[" * 50_000 + "]" * 50_000, "n_layers": "1", "has_batch_dim": "1"},
        {"format": "depthprobe-cache-1", "names": '["a"]', "n_layers": "one", "has_batch_dim": "True"},
        {"format": "depthprobe-cache-1", "names": '["a"]', "n_layers": "-1", "has_batch_dim": "True"},
        {"format": "depthprobe-cache-1", "names": '["a"]', "n_layers": "9" * 400, "has_batch_dim": "True"},
        {"format": "depthprobe-cache-1", "names": '["a"]', "n_layers": "1", "has_batch_dim": "maybe"},
        {"format": "depthprobe-cache-1", "names": '["a"]', "n_layers": "1"},
    ],
)
def test_cache_files_with_hostile_metadata_are_one_line(tmp_path, meta):
    with pytest.raises(ProbeError, match=r"is not a cache written by Cache\.save") as err:
        Cache.load(_hostile(tmp_path, "h", meta))
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_a_saved_cache_writes_each_aliased_hook_once(tmp_path):
    """D11: aliased hooks (one hook point under two names, e.g. blocks.0.hook_resid_pre and
    blocks.0.hook_in) were written twice; each content is written once and loads back exactly."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    model = load("native:layers=2,d_model=32,heads=4,d_vocab=20,n_ctx=16,attn_only=false", device="cpu")
    ids = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(0))
    _, cache = run_with_cache(model, ids)
    path = cache.save(tmp_path / "c.safetensors")
    with safe_open(str(path), framework="pt") as f:
        written = set(f.keys())
    points: dict[int, list[str]] = {}
    for name in cache:
        points.setdefault(id(model.bridge.hook_dict[name]), []).append(name)
    assert all(len(set(names) & written) <= 1 for names in points.values())  # never two names of one hook point
    assert len(written) < len(cache) and path.stat().st_size < 0.75 * sum(v.numel() * 4 for v in cache.values())
    back = Cache.load(path)
    assert list(back) == list(cache) and all(
        torch.equal(back[k], cache[k]) and back[k].dtype == cache[k].dtype for k in cache
    )
    old = {k: v.contiguous().clone() for k, v in cache.items()}  # the first format: every name written
    meta = {"format": "depthprobe-cache-1", "names": json.dumps(list(cache)), "n_layers": "2", "has_batch_dim": "True"}
    save_file(old, str(tmp_path / "old.safetensors"), metadata=meta)
    assert all(torch.equal(Cache.load(tmp_path / "old.safetensors")[k], cache[k]) for k in cache)


def test_a_pickled_cache_needs_weights_only_false_as_documented(tmp_path):
    """D7: torch.load's default (weights_only=True) refuses a pickled Cache; docs/api.md says to pass
    weights_only=False (and to trust the file) or to use cache.save."""
    import pickle

    model = load("native:layers=1,d_model=16,heads=2,d_vocab=10,n_ctx=8", device="cpu")
    _, cache = run_with_cache(model, torch.tensor([[1, 2, 3]]), names="blocks.0.hook_resid_post")
    torch.save(cache, tmp_path / "c.pt")
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        torch.load(tmp_path / "c.pt")
    back = torch.load(tmp_path / "c.pt", weights_only=False)
    assert torch.equal(back["blocks.0.hook_resid_post"], cache["blocks.0.hook_resid_post"])
    doc = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    assert "torch.load(path, weights_only=False)" in doc
