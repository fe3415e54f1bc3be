"""The study corpus: reading, splitting, the cached byte-level BPE tokenizer, batches and validation loss."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data import corpus as C

UNICODE = "Thé cat sat on the mat. 😀 naïve café — 日本語のテキスト.\nThe dog ran; the cat sat.\n" * 40


def one_line_error(excinfo: pytest.ExceptionInfo[ProbeError]) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory) -> C.Corpus:
    return C.load_corpus(None, cache_dir=tmp_path_factory.mktemp("tok"))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DEPTHPROBE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokenizers"


# ---------------------------------------------------------------- reading


def test_builtin_text_is_the_shipped_file():
    assert C.BUILTIN.is_file()
    text, label = C.read_corpus(None)
    assert label == "tinyshakespeare"
    assert text == C.BUILTIN.read_text(encoding="utf-8")
    assert text.startswith("First Citizen:")


def test_file_is_read_as_utf8_with_bom_dropped(tmp_path):
    f = tmp_path / "plays.txt"
    f.write_bytes(b"\xef\xbb\xbfcaf\xc3\xa9\n")
    assert C.read_corpus(f) == ("café\n", "plays.txt")
    assert C.read_corpus(str(f)) == ("café\n", "plays.txt")


def test_folder_reads_every_visible_file_in_path_order(tmp_path):
    d = tmp_path / "texts"
    (d / "a").mkdir(parents=True)
    (d / ".git").mkdir()
    (d / "sub" / ".hid").mkdir(parents=True)
    (d / "b.txt").write_text("B", encoding="utf-8")
    (d / "a.txt").write_text("A", encoding="utf-8")
    (d / "a" / "z.txt").write_text("Z", encoding="utf-8")
    (d / "sub" / "y.txt").write_text("Y", encoding="utf-8")
    (d / ".hidden.txt").write_text("H", encoding="utf-8")
    (d / ".git" / "x.txt").write_text("G", encoding="utf-8")
    (d / "sub" / ".hid" / "w.txt").write_text("W", encoding="utf-8")
    text, label = C.read_corpus(d)
    # relative paths component by component: ("a", "z.txt") < ("a.txt",) < ("b.txt",) < ("sub", "y.txt")
    assert text == "Z\nA\nB\nY"
    assert label == "texts"


def test_missing_corpus(tmp_path):
    with pytest.raises(ProbeError) as e:
        C.read_corpus(tmp_path / "nope.txt")
    msg = one_line_error(e)
    assert msg.startswith(f"--corpus {tmp_path / 'nope.txt'} does not exist")
    assert "omit --corpus" in msg


@pytest.mark.parametrize("content", [b"", b"  \n\t\n"])
def test_empty_corpus(tmp_path, content):
    f = tmp_path / "empty.txt"
    f.write_bytes(content)
    with pytest.raises(ProbeError, match="holds no text") as e:
        C.read_corpus(f)
    one_line_error(e)


def test_non_utf8_names_file_and_line(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes(b"fine\nalso fine\ncaf\xe9\n")
    with pytest.raises(ProbeError) as e:
        C.read_corpus(f)
    assert one_line_error(e).startswith(f"{f}:3: not valid UTF-8")


def test_non_utf8_in_a_folder_names_the_file(tmp_path):
    (tmp_path / "good.txt").write_text("good\n", encoding="utf-8")
    (tmp_path / "bad.txt").write_bytes(b"\xff\n")
    with pytest.raises(ProbeError, match=r"bad\.txt:1: not valid UTF-8"):
        C.read_corpus(tmp_path)


def test_empty_folder_and_folder_of_hidden_files(tmp_path):
    with pytest.raises(ProbeError, match="no \\(non-hidden\\) files") as e:
        C.read_corpus(tmp_path)
    one_line_error(e)
    (tmp_path / ".secret").write_text("x", encoding="utf-8")
    with pytest.raises(ProbeError, match="no \\(non-hidden\\) files"):
        C.read_corpus(tmp_path)


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="no /dev/null")
def test_device_is_refused():
    with pytest.raises(ProbeError, match="not a regular file"):
        C.read_corpus("/dev/null")


# ---------------------------------------------------------------- splitting


def test_split_boundaries():
    assert C.split_text("abcdefghij") == ("abcdefghi", "j")
    assert C.split_text("abcdefghij", 0.5) == ("abcde", "fghij")
    assert C.split_text("abcdefghij", 0.25) == ("abcdefg", "hij")  # floor(7.5)
    # characters, not bytes
    assert C.split_text("é😀日é😀日é😀日本", 0.1) == ("é😀日é😀日é😀日", "本")


@pytest.mark.parametrize("fraction", [0.0, -0.1, 0.51, 1.0])
def test_bad_val_fraction(fraction):
    with pytest.raises(ProbeError, match=r"outside \(0, 0.5\]") as e:
        C.split_text("abcdefghij", fraction)
    one_line_error(e)


def test_text_too_short_to_split():
    with pytest.raises(ProbeError, match="too short to split"):
        C.split_text("a")


# ---------------------------------------------------------------- tokenizer


def test_builtin_corpus(shakespeare):
    c = shakespeare
    text = C.BUILTIN.read_text(encoding="utf-8")
    cut = math.floor(len(text) * 0.9)
    assert c.label == "tinyshakespeare"
    assert c.vocab == 1024 == c.tokenizer.get_vocab_size()
    assert c.bos == 0 and c.tokenizer.id_to_token(0) == "<|bos|>"
    assert c.train_text_chars == cut
    assert c.val_text == text[cut:]
    assert c.train_bytes == len(text[:cut].encode("utf-8"))
    assert c.val_bytes == len(text[cut:].encode("utf-8"))
    for ids in (c.train_ids, c.val_ids):
        assert ids.dtype == torch.int64 and ids.ndim == 1
        assert not bool((ids == 0).any())
        assert int(ids.min()) >= 1 and int(ids.max()) < c.vocab
    assert int(c.token_bytes[c.train_ids].sum()) == c.train_bytes
    assert int(c.token_bytes[c.val_ids].sum()) == c.val_bytes
    assert c.tokenizer.decode(c.val_ids.tolist()) == c.val_text
    assert c.key == C.corpus_key(text[:cut], 1024)
    # BPE compresses: well under one token per byte
    assert len(c.train_ids) < c.train_bytes / 2


def test_roundtrip_and_byte_counts_on_unicode(cache):
    tok = C.train_tokenizer(UNICODE, 300)
    unseen = "Ünïcödé 🙂🚀 Ω≈ç√ — new text\tand\r\nlines <|bos|> end"
    tb = C.token_bytes(tok)
    assert tb.shape == (tok.get_vocab_size(),) and tb.dtype == torch.int64
    assert int(tb[0]) == 0
    assert int(tb[1:257].min()) >= 1
    for text in (UNICODE, unseen, "😀"):
        ids = C.encode(tok, text)
        assert tok.decode(ids.tolist()) == text
        assert int(tb[ids].sum()) == len(text.encode("utf-8"))
        assert not bool((ids == 0).any())  # a literal <|bos|> is encoded as its bytes


def test_training_is_deterministic():
    a = C._train(UNICODE, 320)
    b = C._train(UNICODE, 320)
    assert a.to_str() == b.to_str()


def test_cache_writes_once_and_reads_after(cache):
    key = C.corpus_key(UNICODE, 300)
    tok1 = C.train_tokenizer(UNICODE, 300)
    path = cache / f"bpe-{key[:16]}-v300.json"
    assert path.is_file()
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary file left behind
    before = path.stat()
    tok2 = C.train_tokenizer(UNICODE, 300)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert tok2.to_str() == tok1.to_str()
    # a different text gets its own file
    C.train_tokenizer(UNICODE + "more", 300)
    assert len(list(cache.glob("bpe-*-v300.json"))) == 2
    # and a different vocabulary another
    C.train_tokenizer(UNICODE, 310)
    assert len(list(cache.glob("bpe-*.json"))) == 3


def test_cached_file_is_what_is_returned(cache):
    """The cache is read, not re-trained: a (valid) tokenizer planted under the key comes back."""
    path = cache / f"bpe-{C.corpus_key(UNICODE, 300)[:16]}-v300.json"
    other = C._train("completely different words here, again and again\n" * 30, 300)
    cache.mkdir(parents=True)
    other.save(str(path))
    assert C.train_tokenizer(UNICODE, 300).to_str() == other.to_str() != C._train(UNICODE, 300).to_str()


def test_corrupt_cache_is_retrained_and_replaced(cache):
    path = cache / f"bpe-{C.corpus_key(UNICODE, 300)[:16]}-v300.json"
    cache.mkdir(parents=True)
    path.write_text("{not json", encoding="utf-8")
    tok = C.train_tokenizer(UNICODE, 300)
    assert tok.to_str() == C._train(UNICODE, 300).to_str()
    assert C.load_tokenizer(path).to_str() == tok.to_str()  # the damaged file was replaced


def test_default_cache_location(tmp_path, monkeypatch):
    monkeypatch.delenv("DEPTHPROBE_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert C.cache_dir_default() == tmp_path / ".cache" / "depthprobe" / "tokenizers"
    C.train_tokenizer(UNICODE, 300)
    assert len(list((tmp_path / ".cache" / "depthprobe" / "tokenizers").glob("bpe-*-v300.json"))) == 1
    monkeypatch.setenv("DEPTHPROBE_CACHE", str(tmp_path / "elsewhere"))
    assert C.cache_dir_default() == tmp_path / "elsewhere" / "tokenizers"


def test_explicit_cache_dir(tmp_path, cache):
    C.train_tokenizer(UNICODE, 300, cache_dir=tmp_path / "mine")
    assert len(list((tmp_path / "mine").glob("bpe-*-v300.json"))) == 1
    assert not cache.exists()


def test_small_corpus_keeps_the_vocabulary_it_reaches(tmp_path, cache):
    f = tmp_path / "tiny.txt"
    f.write_text("abab cdcd abab cdcd\n" * 20, encoding="utf-8")
    c = C.load_corpus(f, vocab=5000)
    assert 257 < c.vocab < 5000
    assert c.vocab == c.tokenizer.get_vocab_size() == len(c.token_bytes)
    assert int(c.train_ids.max()) < c.vocab


@pytest.mark.parametrize("vocab", [0, 100, 256])
def test_vocab_too_small(vocab, tmp_path):
    with pytest.raises(ProbeError, match="at least 257") as e:
        C.train_tokenizer(UNICODE, vocab, cache_dir=tmp_path)
    one_line_error(e)
    with pytest.raises(ProbeError, match="at least 257"):
        C.load_corpus(None, vocab=vocab, cache_dir=tmp_path)


def test_vocab_257_is_bytes_only(tmp_path):
    tok = C.train_tokenizer(UNICODE, 257, cache_dir=tmp_path)
    assert tok.get_vocab_size() == 257
    assert int(C.token_bytes(tok)[1:].max()) == 1


def test_hf_tokenizer(cache):
    tok = C.train_tokenizer(UNICODE, 300)
    hf = C.hf_tokenizer(tok)
    text = "The cat sat. 😀 café"
    assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text).ids
    assert hf.bos_token == "<|bos|>" and hf.bos_token_id == 0 and hf.pad_token_id == 0
    assert len(hf) == tok.get_vocab_size()
    ids = tok.encode(text).ids
    assert hf.convert_ids_to_tokens([0, *ids]) == ["<|bos|>", *[tok.id_to_token(i) for i in ids]]
    assert hf.decode(ids) == text
    assert hf.decode([0, *ids], skip_special_tokens=True) == text


def test_save_and_load_tokenizer(tmp_path):
    tok = C._train(UNICODE, 300)
    path = C.save_tokenizer(tok, tmp_path / "member")
    assert path == tmp_path / "member" / "tokenizer.json"
    assert sorted(p.name for p in path.parent.iterdir()) == ["tokenizer.json"]
    assert C.load_tokenizer(tmp_path / "member").to_str() == tok.to_str()
    assert C.load_tokenizer(path).to_str() == tok.to_str()


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(ProbeError, match="no tokenizer at") as e:
        C.load_tokenizer(tmp_path)
    one_line_error(e)
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"version": "1.0", "model": 3}\n', encoding="utf-8")
    with pytest.raises(ProbeError, match="not a readable tokenizer file") as e:
        C.load_tokenizer(tmp_path)
    one_line_error(e)


# ---------------------------------------------------------------- batches


def test_train_batch_rows_are_bos_then_windows():
    ids = torch.arange(1, 103, dtype=torch.int64)  # 102 tokens; context 5 -> 25 windows of 4
    b = C.train_batch(ids, seed=7, step=3, batch=6, context=5)
    assert b.shape == (6, 5) and b.dtype == torch.int64
    assert (b[:, 0] == 0).all()
    for row in b[:, 1:]:
        start = int(row[0]) - 1
        assert start % 4 == 0 and start + 4 <= 100  # a window, the short tail never used
        assert torch.equal(row, ids[start : start + 4])
    assert torch.equal(C.train_batch(ids, 7, 3, 6, 5, bos=99)[:, 0], torch.full((6,), 99))


def test_train_batch_is_a_pure_function_of_seed_and_step():
    ids = torch.arange(1, 1001, dtype=torch.int64)
    a = C.train_batch(ids, 1, 5, 8, 9)
    C._order.cache_clear()
    assert torch.equal(C.train_batch(ids, 1, 5, 8, 9), a)
    assert not torch.equal(C.train_batch(ids, 2, 5, 8, 9), a)
    assert not torch.equal(C.train_batch(ids, 1, 6, 8, 9), a)
    # the sample order does not depend on how it is cut into batches
    assert torch.equal(torch.cat([C.train_batch(ids, 1, s, 4, 9) for s in (10, 11)]), a)


def test_every_window_once_per_epoch():
    ids = torch.arange(1, 31, dtype=torch.int64)  # context 4 -> n = 10 windows; batch 3 crosses epochs
    n, batch = 10, 3
    rows = torch.cat([C.train_batch(ids, 3, s, batch, 4) for s in range(10)])  # 30 samples = 3 epochs
    windows = (rows[:, 1] - 1) // 3
    epochs = [windows[e * n : (e + 1) * n] for e in range(3)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(n))
    assert not torch.equal(epochs[0], epochs[1])
    # epoch e follows torch.randperm seeded with the documented mix of (seed, epoch)
    expected = torch.randperm(n, generator=torch.Generator().manual_seed(C._mix(3, 1)))
    assert torch.equal(epochs[1], expected)
    assert 0 <= C._mix(-5, 10**6) < 2**63


def test_context_too_long_for_training_stream():
    ids = torch.arange(1, 10, dtype=torch.int64)
    assert C.train_batch(ids, 0, 0, 2, 10).shape == (2, 10)  # exactly one window of 9
    with pytest.raises(ProbeError, match="--context 11 is longer than the training stream") as e:
        C.train_batch(ids, 0, 0, 2, 11)
    assert "larger --corpus" in one_line_error(e)
    with pytest.raises(ProbeError, match="--context 1 leaves nothing"):
        C.train_batch(ids, 0, 0, 2, 1)


def test_val_windows():
    ids = torch.arange(1, 24, dtype=torch.int64)  # 23 tokens, context 5 -> W = 5 windows, tail of 3 dropped
    w = C.val_windows(ids, 5)
    assert w.shape == (5, 5)
    assert (w[:, 0] == 0).all()
    assert torch.equal(w[:, 1:], ids[:20].view(5, 4))
    two = C.val_windows(ids, 5, limit=2)  # indices floor(j * 5 / 2): 0, 2
    assert torch.equal(two, w[[0, 2]])
    assert torch.equal(C.val_windows(ids, 5, limit=3), w[[0, 1, 3]])
    assert torch.equal(C.val_windows(ids, 5, limit=99), w)
    assert (C.val_windows(ids, 5, bos=7)[:, 0] == 7).all()
    with pytest.raises(ProbeError, match="smaller --context") as e:
        C.val_windows(ids, 25)
    one_line_error(e)


# ---------------------------------------------------------------- validation loss


def test_evaluate_uniform_logits(shakespeare):
    c = shakespeare
    context, limit = 65, 40

    def uniform(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*x.shape, c.vocab)

    out = C.evaluate(uniform, c, context, batch=16, limit=limit)
    windows = C.val_windows(c.val_ids, context, limit=limit)
    nbytes = int(c.token_bytes[windows[:, 1:]].sum())
    assert out["val_tokens"] == limit * (context - 1)
    assert out["val_bytes"] == nbytes
    assert abs(out["val_loss"] - math.log(c.vocab)) < 1e-9
    expected_bpb = math.log(c.vocab) / math.log(2) * out["val_tokens"] / nbytes
    assert abs(out["val_bpb"] - expected_bpb) < 1e-9


def test_evaluate_targets_are_the_next_tokens(cache, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(UNICODE, encoding="utf-8")
    c = C.load_corpus(f, vocab=300, val_fraction=0.5)
    context = 9

    def oracle(x: torch.Tensor) -> torch.Tensor:
        """Puts all the mass on the token that really comes next (known from the window itself)."""
        logits = torch.zeros(*x.shape, c.vocab)
        logits[:, :-1].scatter_(-1, x[:, 1:, None], 60.0)
        return logits

    def wrong_by_one(x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*x.shape, c.vocab)
        logits.scatter_(-1, x[:, :, None], 60.0)  # predicts the current token, not the next
        return logits

    out = C.evaluate(oracle, c, context)
    assert out["val_loss"] < 1e-20
    assert out["val_tokens"] == (len(c.val_ids) // (context - 1)) * (context - 1)
    assert C.evaluate(wrong_by_one, c, context)["val_loss"] > 1.0
    # batching does not change the answer
    a = C.evaluate(wrong_by_one, c, context, batch=1)
    b = C.evaluate(wrong_by_one, c, context, batch=64)
    assert a == pytest.approx(b, rel=1e-12)
