"""Every architecture family: word alignment from offsets, loading routes, and every read-only task
on a tiny random model of each family (built and saved by the tests)."""

import pytest
import torch
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes import load, run
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data.align import pieces_of_words, running_text, word_pieces
from depthprobe.probes.hooks.capture import capture, forward
from depthprobe.probes.models.architectures import ARCHITECTURES
from depthprobe.probes.models.model import Model, ModelInfo
from tests.tiny_families import FALLBACK, SEQ2SEQ, SUPPORTED, build_tokenizer

WORDS = ["the", "old", "man", "walked", "to", "london", "on", "monday", "."]
KINDS = ("bytelevel", "roberta", "metaspace-first", "metaspace-never", "wordpiece")
TASKS = ("attention-stats", "syntax", "coref", "induction", "kernels")


def _text_model(tok) -> Model:
    info = ModelInfo(
        name="tok", source="local", resolved="-", causal=True, n_layers=1, n_heads=1, d_model=1, max_len=64, weights="-"
    )
    return Model(bridge=None, tokenizer=tok, info=info, device=torch.device("cpu"))


@pytest.fixture(scope="module", params=KINDS)
def tokenizer(request):
    return build_tokenizer(request.param)


def test_alignment_reproduces_running_text(tokenizer):
    pieces = word_pieces(_text_model(tokenizer), WORDS)
    running = tokenizer(" ".join(WORDS), add_special_tokens=False)["input_ids"]
    assert [i for p in pieces for i in p] == running
    for word, p in zip(WORDS, pieces, strict=True):  # each word's pieces spell that word (and its leading space)
        assert tokenizer.decode(p).strip().lower() == word
    # every word but the first carries the space before it, as in running text, so joining the
    # words' pieces decodes to the sentence itself
    assert tokenizer.decode(running).lower().replace(" .", ".") == " ".join(WORDS).replace(" .", ".")


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace-never"])
def test_word_by_word_tokenization_would_drop_the_space(kind):
    """Qwen2/Llama-3 (byte-level, no prefix space) and Gemma (no prepended \u2581): a word tokenised on
    its own has no space piece, so tokenising words one at a time gives other pieces."""
    tok = build_tokenizer(kind)
    alone = tok(WORDS, add_special_tokens=False)["input_ids"]
    aligned = word_pieces(_text_model(tok), WORDS)
    assert alone[0] == aligned[0]  # the first word has no space before it either way
    assert all(a != b for a, b in zip(alone[1:], aligned[1:], strict=True))
    assert all(tok.convert_ids_to_tokens(p)[0][0] in "\u0120\u2581" for p in aligned[1:])


def test_pieces_of_words_known_offsets():
    text, spans = running_text(["ab", "cd", "e"])
    assert text == "ab cd e" and spans == [(0, 2), (3, 5), (6, 7)]
    # a lone space piece (2, 3) goes to the next word; pieces may split words
    assert pieces_of_words([(0, 1), (1, 2), (2, 3), (3, 5), (5, 7)], spans, text) == [[0, 1], [2, 3], [4]]
    # a trailing space-only piece goes to the last word
    assert pieces_of_words([(0, 2), (2, 5), (5, 7), (7, 7)], spans, text) == [[0], [1], [2, 3]]
    with pytest.raises(ProbeError, match="across a space"):
        pieces_of_words([(0, 5), (5, 7)], spans, text)


def test_alignment_regression_on_tiny_bert_and_gpt2(tiny_bert, tiny_gpt2):
    """The word -> piece maps of the WordPiece and GPT-2 models are those of word-by-word
    tokenisation with a space before every word but the first (the previous rule)."""
    for model, prefix in ((tiny_bert, ""), (tiny_gpt2, " ")):
        tok = model.tokenizer
        old = tok([(prefix + w if i else w) for i, w in enumerate(WORDS)], add_special_tokens=False)["input_ids"]
        assert word_pieces(model, WORDS) == old


# ----------------------------------------------------------------------------- loading routes


@pytest.mark.parametrize("family", SUPPORTED + FALLBACK)
def test_every_family_loads_with_the_right_causal_flag(tiny_family_dir, family):
    m = load(str(tiny_family_dir(family)), device="cpu")
    encoders = {"bert", "roberta", *FALLBACK}
    assert m.info.causal is (family not in encoders)
    assert (m.info.n_layers, m.info.n_heads) == (2, 4)


@pytest.mark.parametrize("family", FALLBACK + tuple(f"{f}@{s}" for f in SEQ2SEQ for s in ("encoder", "decoder")))
def test_read_only_route_gives_the_hugging_face_attentions(tiny_family_dir, family):
    fam, _, stack = family.partition("@")
    m = load(str(tiny_family_dir(fam)) + (f"@{stack}" if stack else ""), device="cpu")
    assert m.info.causal is (stack == "decoder")
    ids = torch.tensor([[m.cls_id, 7, 8, 9, 10]])
    acts = forward(m, ids, None, "blocks.*.attn.hook_pattern")
    hf = m.bridge.original_model
    with torch.no_grad():
        if stack == "encoder":
            ref = hf.get_encoder()(input_ids=ids, output_attentions=True).attentions
        elif stack == "decoder":
            enc = torch.full((1, 1), hf.config.eos_token_id)
            ref = hf(input_ids=enc, decoder_input_ids=ids, output_attentions=True).decoder_attentions
        else:
            ref = hf(input_ids=ids, output_attentions=True).attentions
    for i in range(2):
        assert torch.equal(acts[f"blocks.{i}.attn.hook_pattern"], ref[i])
    if stack == "decoder":  # causal: nothing above the diagonal
        assert torch.count_nonzero(torch.triu(ref[0][0, 0], 1)) == 0
    with (
        pytest.raises(ProbeError, match=r"read-only.*ignored"),
        torch.inference_mode(),
        capture(m, "blocks.0.attn.hook_pattern", lambda t, h: t * 0),
    ):
        m.bridge(ids)


@pytest.mark.parametrize("family", SEQ2SEQ)
def test_encoder_decoder_needs_a_stack(tiny_family_dir, family):
    path = str(tiny_family_dir(family))
    with pytest.raises(ProbeError, match=r"encoder-decoder; choose the stack.*@encoder or .*@decoder"):
        load(path, device="cpu")
    with pytest.raises(ProbeError, match=r"must be encoder or decoder.*did you mean 'encoder'"):
        load(path + "@encodr", device="cpu")


def test_stack_on_a_decoder_only_model_is_refused(tiny_gpt2_dir):
    with pytest.raises(ProbeError, match="GPT-2 is not an encoder-decoder model; drop @decoder"):
        load(f"{tiny_gpt2_dir}@decoder", device="cpu")


def test_unknown_architecture_is_one_line_exit_2(tmp_path):
    from transformers import MPNetConfig, MPNetForMaskedLM

    d = tmp_path / "mpnet"
    MPNetForMaskedLM(
        MPNetConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    ).save_pretrained(d)
    res = CliRunner().invoke(
        app, ["run", "--model", str(d), "--task", "attention-stats", "--out", str(tmp_path / "run")]
    )
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "architecture 'mpnet'" in lines[0] and "probe list architectures" in lines[0]
    assert not (tmp_path / "run").exists()


def test_list_architectures_shows_every_row():
    res = CliRunner().invoke(app, ["list", "architectures"])
    assert res.exit_code == 0, res.output
    for arch in ARCHITECTURES:
        line = next(ln for ln in res.output.splitlines() if ln.startswith(arch.name + " "))
        assert arch.model_types[0] in line and arch.causal in line
    assert "@encoder" in res.output and "read-only" in res.output


# ----------------------------------------------------------------------------- every task, every family


@pytest.mark.slow
@pytest.mark.parametrize(
    "family", SUPPORTED + FALLBACK + tuple(f"{f}@{s}" for f in SEQ2SEQ for s in ("encoder", "decoder"))
)
def test_every_read_only_task_runs_on_every_family(tiny_family_dir, family):
    fam, _, stack = family.partition("@")
    m = load(str(tiny_family_dir(fam)) + (f"@{stack}" if stack else ""), device="cpu")
    for task in TASKS:
        r = run(m, task)
        assert len(r.scores) > 0 and r.scores["value"].notna().any(), task
        layers = set(r.scores["layer"].dropna().astype(int))
        assert layers <= ({0, 1, 2} if task == "kernels" else {0, 1}), task  # kernels: input + 2 layers
