"""Word-level attention: sum over pieces TO a word, mean over pieces FROM a word."""

import pytest
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data.align import (
    Encoded,
    encode_words,
    pieces_of_words,
    unit_matrix,
    word_attention,
    word_pieces,
    word_pieces_many,
)


def test_split_word_sums_columns_and_averages_rows():
    # [CLS] w0 w1a w1b [SEP]: word 1 is split into two pieces
    enc = Encoded(ids=(1, 2, 3, 4, 5), unit_of_piece=(0, 1, 2, 2, 3), n_words=2)
    a = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0, 0.0],
            [0.1, 0.2, 0.3, 0.4, 0.0],
            [0.0, 1.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.5, 0.0, 0.5],
            [0.0, 0.0, 0.0, 0.0, 1.0],
        ],
        dtype=torch.float64,
    )
    m = unit_matrix([enc], 5)
    w = word_attention(a[None, None], m)[0, 0]  # [units, units]
    assert w.shape == (4, 4)
    # from w0 to the split word = 0.3 + 0.4
    assert abs(w[1, 2].item() - 0.7) < 1e-12
    # from the split word = mean of its two rows: to w0 (1.0 + 0)/2, to itself (0 + 0.5)/2, to SEP 0.25
    assert torch.allclose(w[2], torch.tensor([0.0, 0.5, 0.25, 0.25], dtype=torch.float64))
    # rows still sum to one
    assert torch.allclose(w.sum(-1), torch.ones(4, dtype=torch.float64))


def test_padding_units_are_zero_and_batch_matches_single():
    short = Encoded((1, 2, 3), (0, 1, 2), 1)
    long = Encoded((1, 2, 2, 3, 4), (0, 1, 1, 2, 3), 2)
    torch.manual_seed(0)
    a = torch.softmax(torch.randn(2, 3, 5, 5), -1)  # [batch, head, q, k]
    a[0, :, :, 3:] = 0  # the short example's padding keys get no attention
    w = word_attention(a, unit_matrix([short, long], 5))
    alone = word_attention(a[:1, :, :3, :3], unit_matrix([short], 3))
    assert torch.equal(w[0, :, :3, :3], alone[0])
    assert torch.count_nonzero(w[0, :, 3:, :]) == 0


def test_layer_axis_is_supported():
    enc = Encoded((1, 2, 3), (0, 1, 2), 1)
    a = torch.softmax(torch.randn(1, 2, 3, 3, 3), -1)  # [batch, layer, head, q, k]
    w = word_attention(a, unit_matrix([enc], 3))
    assert w.shape == (1, 2, 3, 3, 3)
    assert torch.allclose(w, a.double())  # one piece per unit: unchanged


def test_encode_words_encoder_and_decoder(tiny_bert, tiny_gpt2):
    e = encode_words(tiny_bert, ["The", "unhappiness", "."])
    toks = tiny_bert.tokenizer.convert_ids_to_tokens(list(e.ids))
    assert toks[0] == "[CLS]" and toks[-1] == "[SEP]"
    assert toks[2] == "un" and e.unit_of_piece.count(2) > 1  # split word: several pieces, one unit
    assert e.n_words == 3 and e.n_units == 5
    d = encode_words(tiny_gpt2, ["john", "ran"])
    assert d.ids[0] == tiny_gpt2.tokenizer.bos_token_id
    assert d.unit_of_piece[0] == 0 and max(d.unit_of_piece) == 2  # no [SEP] unit for decoders
    # the second word carries a leading space like running text
    assert tiny_gpt2.tokenizer.decode(list(d.ids[1:])) == "john ran"


def test_word_pieces_many_is_one_call_per_sequence_batched(tiny_bert, tiny_gpt2):
    seqs = [["The", "unhappiness", "."], [], ["a"], ["john", "ran", "unhappily", "home"]]
    for model in (tiny_bert, tiny_gpt2):
        batched = word_pieces_many(model, seqs)
        assert batched == [word_pieces(model, s) for s in seqs]
        assert batched[1] == [] and len(batched[3]) == 4
        words = [model.tokenizer.decode(p).strip() for p in batched[3]]
        assert words == ["john", "ran", "unhappily", "home"]


def test_pieces_of_words_long_text_and_space_pieces():
    # 3 words "ab cd e": a lone-space piece (3, 3) goes to the next word, a piece inside a word
    # to that word, and one covering two words is refused
    spans = [(0, 2), (3, 5), (6, 7)]
    assert pieces_of_words([(0, 1), (1, 2), (2, 3), (3, 5), (6, 7)], spans) == [[0, 1], [2, 3], [4]]
    long = [(k * 2, k * 2 + 1) for k in range(3000)]  # 3,000 one-letter words
    assert pieces_of_words(long, long) == [[k] for k in range(3000)]
    with pytest.raises(ProbeError, match="across a space"):
        pieces_of_words([(0, 5)], spans, "ab cd e")
