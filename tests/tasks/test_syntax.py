"""syntax task (Clark et al. Table 1): hand-built attention with known answers, split words,
baselines, tie rules, bad input, raw text through a real spaCy pipeline, and agreement with an
independent loop-over-words reference implementation on real model output."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from depthprobe.probes import ProbeError, run
from depthprobe.probes.data.align import Encoded, unit_matrix, word_attention
from depthprobe.probes.engine.execute import accumulate
from depthprobe.probes.engine.task import Batch, Context, RunConfig, get_task
from depthprobe.probes.hooks.capture import Captured, forward, pattern_names
from depthprobe.tasks.syntax import (
    ALL,
    DIRECTIONS,
    OFFSETS,
    SAMPLE,
    Example,
    Options,
    Tree,
    baseline_correct,
    best_head,
    best_offset,
    layer_governors,
    predict_governors,
)
from tests.helpers import probe_cli
from tests.reference.syntax import reference, reference_best

# ---------------------------------------------------------------- pure functions


def test_predict_governors_zeroes_diagonal_excludes_padding_and_breaks_ties_left():
    w = torch.tensor(
        [
            [
                [0.9, 0.05, 0.05, 0.0],  # word 0 attends to itself most: self is ignored
                [0.3, 0.3, 0.2, 0.2],  # 0.3 on word 0 beats 0.2 (its own 0.3 is ignored)
                [0.1, 0.1, 0.1, 0.7],  # column 3 is padding (a sentence of 3 words)
                [0.0, 0.0, 0.9, 0.0],
            ]
        ],
        dtype=torch.float64,
    )  # row 3 is padding
    dep_to_head, head_to_dep = predict_governors(w.clone(), torch.tensor([3]))
    assert dep_to_head[0, :3].tolist() == [1, 0, 0]  # row 0: tie 0.05/0.05 -> leftmost other word (1)
    # columns: who attends most to word 0? row 1 (0.3); to word 1? rows 0 and 2 tie (0.05 vs 0.1 -> 2);
    # to word 2? row 0 (0.05) vs row 1 (0.2) -> 1; padding row 3 never counts
    assert head_to_dep[0, :3].tolist() == [1, 2, 1]
    tie = torch.tensor([[[0.0, 0.4, 0.4], [0.5, 0.0, 0.5], [0.2, 0.2, 0.6]]], dtype=torch.float64)
    rows, cols = predict_governors(tie.clone(), torch.tensor([3]))
    assert rows[0].tolist() == [1, 0, 0] and cols[0].tolist() == [1, 0, 1]  # col 1: 0.4 vs 0.2
    # causal-style zeros: the first word sees nothing; zeroed diagonal and argmax -> itself (index 0)
    causal = torch.tensor([[[1.0, 0.0, 0.0], [0.4, 0.6, 0.0], [0.1, 0.2, 0.7]]], dtype=torch.float64)
    rows, cols = predict_governors(causal.clone(), torch.tensor([3]))
    assert rows[0].tolist() == [0, 0, 1] and cols[0].tolist() == [1, 2, 0]


def test_baseline_offsets_clip_to_root_or_words():
    # a 4-word sentence; CoNLL-U positions 1..4
    pos = torch.tensor([1, 2, 3, 4])
    n = torch.tensor([4, 4, 4, 4])
    gold = torch.tensor([0, 1, 4, 3])  # word 1 is the root
    got = baseline_correct(pos, n, gold, root=True)  # offsets -3..2
    # word 1: offsets -3, -2, -1 clip to 0 = ROOT (correct); 0 is itself; +1 -> 2, +2 -> 3
    assert got[0].tolist() == [True, True, True, False, False, False]
    # word 2 (gold 1): -1 -> 1; -3, -2 clip to 0
    assert got[1].tolist() == [False, False, True, False, False, False]
    # word 3 (gold 4): +1 -> 4, +2 -> 5 clipped to 4
    assert got[2].tolist() == [False, False, False, False, True, True]
    # word 4 (gold 3): -1 -> 3
    assert got[3].tolist() == [False, False, True, False, False, False]
    words_only = baseline_correct(pos, n, gold, root=False)
    assert words_only[0].tolist() == [False] * 6  # ROOT is never predicted
    assert words_only[1].tolist() == [True, True, True, False, False, False]  # clip to word 1


def test_best_head_and_offset_tie_rules():
    acc = np.zeros((2, 3, 4))  # [direction, layer, head]
    acc[1, 0, 3] = 0.5
    acc[0, 1, 0] = 0.5
    assert best_head(acc) == (0, 3, 1)  # lowest layer first, even in the other direction
    acc[0, 0, 3] = 0.5
    assert best_head(acc) == (0, 3, 0)  # same layer and head: dependent->head first
    acc[0, 0, 2] = 0.5
    assert best_head(acc) == (0, 2, 0)  # lower head first
    b = np.array([0.2, 0.4, 0.1, 0.0, 0.4, 0.1])  # offsets -3..2: -2 and +1 tie
    assert OFFSETS[best_offset(b)] == 1  # nearest 0 wins
    b = np.array([0.2, 0.3, 0.4, 0.0, 0.4, 0.1])
    assert OFFSETS[best_offset(b)] == -1  # equally near: the leftward one


# ---------------------------------------------------------------- hand-built attention maps


def _state(model, examples, baseline_root=True):
    task = get_task("syntax")
    ctx = Context(RunConfig(model="hand", task="syntax"), Options(baseline_root=baseline_root))
    return task, task.start(model, ctx, examples), ctx


def _pieces_from_words(word_att: np.ndarray, enc: Encoded, n_pos: int) -> torch.Tensor:
    """Piece-level attention whose word-level version (sum to, mean from) is word_att [units, units]."""
    units = np.array(enc.unit_of_piece)
    a = np.zeros((n_pos, n_pos))
    size = np.bincount(units)
    for p, u in enumerate(units):
        for q, v in enumerate(units):
            a[p, q] = word_att[u, v] / size[v]
    return torch.tensor(a, dtype=torch.float32)


# "the dog barked loudly ." with "barked" split into two pieces; [CLS] = unit 0, [SEP] = unit 6
TREE = Tree(
    "hand-1", ("the", "dog", "barked", "loudly", "."), (2, 3, 0, 3, 3), ("det", "nsubj", "root", "advmod", "punct")
)
ENC = Encoded(ids=(2, 10, 11, 12, 13, 14, 15, 3), unit_of_piece=(0, 1, 2, 3, 3, 4, 5, 6), n_words=5)


def _hand_maps() -> np.ndarray:
    """[layer=2, head=4, unit, unit] word-level maps with known answers."""
    n_units = 7
    maps = np.full((2, 4, n_units, n_units), 0.01)
    gov = [h for h in TREE.heads]  # unit of each word's governor (ROOT = unit 0 = [CLS])
    for i, g in enumerate(gov):  # head 0-0: every word attends to its governor
        maps[0, 0, i + 1, g] = 0.9
    for j, g in enumerate(gov):  # head 0-1: every governor attends to its dependents
        if g:
            maps[0, 1, g, j + 1] = 0.5
    for i in range(1, n_units):  # head 0-2: previous word
        maps[0, 2, i, i - 1] = 0.9
    for i in range(1, n_units):  # head 1-3: next word
        maps[1, 3, i, min(i + 1, n_units - 1)] = 0.9
    return maps


def test_hand_built_heads_give_known_accuracies(tiny_bert):
    task, state, ctx = _state(tiny_bert, [Example(TREE, ENC)])
    maps = _hand_maps()
    pattern = torch.stack(
        [
            torch.stack([_pieces_from_words(maps[layer_idx, h], ENC, len(ENC)) for h in range(4)])
            for layer_idx in range(2)
        ]
    )  # [layer, head, q, k]
    acts = Captured({name: pattern[layer_idx][None] for layer_idx, name in enumerate(pattern_names(2))})
    batch = Batch(torch.tensor([ENC.ids]), torch.ones(1, len(ENC), dtype=torch.long), [Example(TREE, ENC)])
    task.accumulate(state, batch, acts)
    out = task.finalize(state, ctx)
    s = out.scores.set_index(["relation", "direction", "layer", "head"])["value"]
    d2h, h2d = DIRECTIONS
    for rel in ("det", "nsubj", "advmod", "punct"):
        assert s[(rel, d2h, 0, 0)] == 1.0
        assert s[(rel, h2d, 0, 1)] == 1.0
    assert s[("root", d2h, 0, 0)] == 0.0  # ROOT is never predicted
    assert s[(ALL, d2h, 0, 0)] == pytest.approx(4 / 5)
    # previous-word head: "the" attends to [CLS] only, so it falls back to the leftmost other word
    # (dog: correct by the tie rule); dog->the no; barked is root; loudly->barked yes; . -> loudly no
    assert s[("det", d2h, 0, 2)] == 1.0 and s[("advmod", d2h, 0, 2)] == 1.0
    assert s[(ALL, d2h, 0, 2)] == pytest.approx(2 / 5)
    # next-word head: the->dog yes, dog->barked yes, loudly->. no, . -> itself/[SEP] excluded -> no
    assert s[("det", d2h, 1, 3)] == 1.0 and s[("nsubj", d2h, 1, 3)] == 1.0
    assert s[(ALL, d2h, 1, 3)] == pytest.approx(2 / 5)
    summary = out.summary.set_index("relation")
    assert summary.loc["det", "best_head"] == "0-0" and summary.loc["det", "clark_notation"] == "1-1"
    assert summary.loc[ALL, "accuracy"] == 80.0
    # baselines: +1 gets the and dog (2/5); -3 gets barked (ROOT), -1 loudly, -2 the final "."
    assert summary.loc[ALL, "offset"] == 1 and summary.loc[ALL, "baseline"] == 40.0
    assert summary.loc["punct", "offset"] == -2 and summary.loc["punct", "baseline"] == 100.0
    assert {h["where"]["relation"] for h in out.heatmaps} == {"det", "nsubj", "advmod", ALL}


def test_split_words_sum_to_and_mean_from(tiny_bert):
    # words a b c d; c is split into pieces c1 c2; units: 0 [CLS], 1 a, 2 b, 3 c, 4 d, 5 [SEP]
    enc = Encoded(ids=(2, 10, 11, 12, 13, 14, 3), unit_of_piece=(0, 1, 2, 3, 3, 4, 5), n_words=4)
    tree = Tree("split", ("a", "b", "c", "d"), (3, 0, 2, 1), ("x", "root", "y", "z"))
    a = torch.zeros(7, 7)
    a[:, 0] = 0.1
    # word a: 0.3 + 0.3 to the pieces of c (sum 0.6) beats 0.4 on single-piece d: c wins by the SUM
    a[1, 3], a[1, 4], a[1, 5] = 0.3, 0.3, 0.4
    # word c: piece c1 attends 0.6 to a and 0.3 to b; piece c2 0.0 to a and 0.8 to b:
    # the MEAN over c's pieces gives a 0.3 < b 0.55, so b (c's governor) wins; c1 alone would pick a
    a[3, 1], a[3, 2] = 0.6, 0.3
    a[4, 1], a[4, 2] = 0.0, 0.8
    # word d attends to a; b (root) attends to d
    a[5, 1] = 0.9
    a[2, 5] = 0.9
    task, state, ctx = _state(tiny_bert, [Example(tree, enc)])
    pat = torch.zeros(2, 4, 7, 7)
    pat[:] = a
    acts = Captured({name: pat[layer_idx][None] for layer_idx, name in enumerate(pattern_names(2))})
    task.accumulate(
        state, Batch(torch.tensor([enc.ids]), torch.ones(1, 7, dtype=torch.long), [Example(tree, enc)]), acts
    )
    out = task.finalize(state, ctx)
    s = out.scores.set_index(["relation", "direction", "layer", "head"])["value"]
    assert s[("x", DIRECTIONS[0], 0, 0)] == 1.0  # a -> c by summing c's pieces
    assert s[("y", DIRECTIONS[0], 0, 0)] == 1.0  # c -> b by averaging c's rows
    assert s[("z", DIRECTIONS[0], 0, 0)] == 1.0  # d -> a
    # head->dependent: who attends most to a? c (mean 0.3) vs d (0.9): d; a's governor is c -> wrong
    assert s[("x", DIRECTIONS[1], 0, 0)] == 0.0
    # who attends most to d? b (0.9 > a's 0.4): d's governor is a -> wrong; to c: a (0.6) -> wrong (b)
    assert s[(ALL, DIRECTIONS[1], 0, 0)] == 0.0


def test_padding_and_batching_do_not_change_counts(tiny_bert):
    """Two sentences in one padded batch count exactly what each counts alone."""
    task = get_task("syntax")
    ex_long = Example(TREE, ENC)
    short_enc = Encoded(ids=(2, 10, 11, 3), unit_of_piece=(0, 1, 2, 3), n_words=2)
    ex_short = Example(Tree("s", ("b", "a"), (0, 1), ("root", "det")), short_enc)
    maps = _hand_maps()
    long_pat = torch.stack(
        [torch.stack([_pieces_from_words(maps[layer_idx, h], ENC, 8) for h in range(4)]) for layer_idx in range(2)]
    )  # [layer, head, 8, 8]
    torch.manual_seed(0)
    short_pat = torch.softmax(torch.randn(2, 4, 4, 4), -1)  # [layer, head, 4, 4]
    together = torch.zeros(2, 2, 4, 8, 8)  # [layer, batch, head, q, k]; padding gets no attention
    together[:, 0] = long_pat
    together[:, 1, :, :4, :4] = short_pat

    def counts(items, pats):  # pats: [layer, batch, head, q, k]
        _, state, _ = _state(tiny_bert, [ex_long, ex_short])  # the same relation table every time
        ids = torch.zeros(len(items), pats.shape[-1], dtype=torch.long)
        acts = Captured({n: pats[layer_idx] for layer_idx, n in enumerate(pattern_names(2))})
        task.accumulate(state, Batch(ids, torch.ones_like(ids), items), acts)
        return state

    both = counts([ex_long, ex_short], together)
    alone = [counts([ex_long], long_pat[:, None]), counts([ex_short], short_pat[:, None])]
    for name in ("correct", "total", "base"):
        assert torch.equal(getattr(both, name), getattr(alone[0], name) + getattr(alone[1], name)), name
    assert both.total[-1].item() == 7


def _patterns_by_sentence(model, examples):
    """Each sentence alone through the one capture primitive: [layer, head, T, T] arrays."""
    names = pattern_names(model.info.n_layers)
    out = []
    for e in examples:
        ids = torch.tensor([e.enc.ids])
        acts = forward(model, ids, torch.ones_like(ids), names)
        out.append(torch.stack([acts[n][0] for n in names]).numpy())
    return out


def _patterns_by_batch(model, examples, batch_size):
    """The task's own batches (same padding, so bitwise the same attention); rows cut to length."""
    task = get_task("syntax")
    ctx = Context(RunConfig(model="x", task="syntax", batch_size=batch_size), Options())
    names = pattern_names(model.info.n_layers)
    got = {}
    for batch in task.batches(model, examples, ctx):
        acts = forward(model, batch.input_ids, batch.attention_mask, names)
        for row, e in enumerate(batch.items):
            t = len(e.enc)
            got[id(e)] = torch.stack([acts[n][row, :, :t, :t] for n in names]).numpy()
    return [got[id(e)] for e in examples]


def _items(model, examples):
    tok = model.tokenizer
    out = []
    for e in examples:  # our own encoding of the words, checked against the task's
        pieces = [
            tok(w if not model.info.causal or k == 0 else " " + w, add_special_tokens=False)["input_ids"]
            for k, w in enumerate(e.tree.words)
        ]
        units = [0] + [k + 1 for k, p in enumerate(pieces) for _ in p]
        if not model.info.causal:
            units.append(len(pieces) + 1)
        assert tuple(units) == e.enc.unit_of_piece
        out.append((e.tree.words, e.tree.heads, e.tree.rels, units))
    return out


def _assert_matches(result, acc, base, count):
    s = result.scores
    assert list(s.columns[:6]) == ["model", "task", "layer", "head", "metric", "value"]
    assert {"relation", "direction", "count"} <= set(s.columns)
    n_layers, n_heads = next(iter(acc.values())).shape[1:]
    assert len(s) == len(count) * 2 * n_layers * n_heads
    for (rel, d), g in s.groupby(["relation", "direction"]):
        mine = np.zeros((n_layers, n_heads))
        mine[g["layer"].to_numpy(), g["head"].to_numpy()] = g["value"].to_numpy()
        assert np.array_equal(mine, acc[rel][DIRECTIONS.index(d)]), (rel, d)
        assert (g["count"] == count[rel]).all()
    best = reference_best(acc, base)
    summary = result.summary.set_index("relation")
    assert set(summary.index) == set(count)
    assert list(summary.index[:1]) == [ALL]
    counts = summary["count"].iloc[1:].tolist()
    assert counts == sorted(counts, reverse=True)  # by frequency
    for rel, ((layer, head, d), a, off, b) in best.items():
        row = summary.loc[rel]
        assert row["best_head"] == f"{layer}-{head}", rel
        assert row["clark_notation"] == f"{layer + 1}-{head + 1}"
        assert row["direction"] == DIRECTIONS[d], rel
        assert row["accuracy"] == pytest.approx(100 * a, abs=0.006)
        assert row["offset"] == off, rel
        assert row["baseline"] == pytest.approx(100 * b, abs=0.006)
        assert row["gain"] == pytest.approx(100 * (a - b), abs=0.011)


def test_matches_reference_on_tiny_bert_sample(tiny_bert):
    """Batch size 1: the reference runs each sentence on its own through capture."""
    result = run(tiny_bert, "syntax", batch_size=1)
    task = get_task("syntax")
    examples = task.load(tiny_bert, Context(RunConfig(model="x", task="syntax"), Options()))
    assert any(len(e.enc) - 2 > e.enc.n_words for e in examples)  # split words are exercised
    acc, base, count = reference(_items(tiny_bert, examples), _patterns_by_sentence(tiny_bert, examples))
    _assert_matches(result, acc, base, count)
    assert count["ALL"] == result.headline["n_words"]


def test_matches_reference_on_tiny_gpt2_with_causal_note(tiny_gpt2):
    result = run(tiny_gpt2, "syntax", batch_size=8, baseline_root=False)
    task = get_task("syntax")
    examples = task.load(tiny_gpt2, Context(RunConfig(model="x", task="syntax"), Options()))
    acc, base, count = reference(
        _items(tiny_gpt2, examples), _patterns_by_batch(tiny_gpt2, examples, 8), baseline_root=False
    )
    _assert_matches(result, acc, base, count)
    assert any("causal model" in n and "rightward governor" in n for n in result.notes)


@pytest.mark.slow
def test_matches_reference_on_minilm_ewt_slice(minilm, shared_data, tmp_path):
    ewt = shared_data / "ud-ewt-dev" / "en_ewt-ud-dev.conllu"
    result = run(minilm, "syntax", ewt, limit=400, batch_size=32)
    task = get_task("syntax")
    ctx = Context(RunConfig(model="x", task="syntax", data=str(ewt), limit=400), Options())
    examples = task.load(minilm, ctx)
    assert len(examples) == 400
    acc, base, count = reference(_items(minilm, examples), _patterns_by_batch(minilm, examples, 32))
    _assert_matches(result, acc, base, count)
    summary = result.summary.set_index("relation")
    # a real encoder finds determiners' nouns far above the fixed-offset baseline
    assert summary.loc["det", "accuracy"] > summary.loc["det", "baseline"] + 10
    path = result.save(tmp_path / "run")
    assert (path / "baselines.csv").exists() and (path / "scores.csv").exists()


# ---------------------------------------------------------------- data handling and errors


def test_sample_treebank_covers_the_main_relations():
    from depthprobe.probes.data.conllu import read_treebank

    sents = read_treebank(SAMPLE)
    rels = Counter(t.deprel for s in sents for t in s.tokens)
    assert len(sents) >= 30
    for rel in (
        "det",
        "nsubj",
        "obj",
        "amod",
        "case",
        "aux",
        "aux:pass",
        "nmod:poss",
        "advmod",
        "compound",
        "compound:prt",
        "obl",
        "nmod",
        "mark",
        "cc",
        "conj",
        "cop",
        "xcomp",
        "ccomp",
        "acl:relcl",
        "punct",
        "root",
        "iobj",
        "nsubj:pass",
        "advcl",
    ):
        assert rels[rel] >= 1, rel
    for s in sents:
        assert sum(t.head == 0 for t in s.tokens) == 1  # one root per sentence


def test_max_len_skips_and_counts(tiny_bert):
    full = run(tiny_bert, "syntax")
    short = run(tiny_bert, "syntax", max_len=30)
    assert full.counts["skipped"] == 0
    assert short.counts["skipped"] > 0
    assert short.counts["examples"] + short.counts["skipped"] == full.counts["examples"]
    assert any("skipped" in n for n in short.notes)


def _bad(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


GOOD = "1\tDogs\tdog\tNOUN\tNNS\t_\t2\tnsubj\t_\t_\n2\tbark\tbark\tVERB\tVBP\t_\t0\troot\t_\t_\n\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("1\tDogs\tdog\tNOUN\n", ":1: expected 10 tab-separated columns"),
        (
            GOOD + "1\tCats\tcat\tNOUN\tNNS\t_\t5\tnsubj\t_\t_\n2\tnap\tnap\tVERB\tVBP\t_\t0\troot\t_\t_\n",
            ":4: HEAD 5 points outside",
        ),
        ("1\ta\ta\tX\tX\t_\t2\tdep\t_\t_\n2\tb\tb\tX\tX\t_\t1\tdep\t_\t_\n", "cycle"),
        (b"1\tca\xff\tx\tX\tX\t_\t0\troot\t_\t_\n", ":1: not valid UTF-8"),
    ],
)
def test_malformed_conllu_fails_with_file_and_line(tiny_bert, tmp_path, text, message):
    path = _bad(tmp_path, "bad.conllu", text)
    with pytest.raises(ProbeError, match=message) as err:
        run(tiny_bert, "syntax", path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_raw_text_needs_a_parser_and_a_missing_pipeline_says_how_to_install(tiny_bert, tmp_path):
    text = _bad(tmp_path, "t.txt", "The dog barked.\n")
    with pytest.raises(ProbeError, match="--parser"):
        run(tiny_bert, "syntax", text)
    with pytest.raises(ProbeError, match=r"not installed.*python -m spacy download en_core_web_sm"):
        run(tiny_bert, "syntax", text, parser="en_core_web_sm")
    with pytest.raises(ProbeError, match="does not exist"):
        run(tiny_bert, "syntax", text, parser=str(tmp_path / "nowhere"))
    with pytest.raises(ProbeError, match="not a spaCy pipeline"):
        run(tiny_bert, "syntax", text, parser=str(tmp_path))
    with pytest.raises(ProbeError, match="drop --parser"):
        run(tiny_bert, "syntax", SAMPLE, parser="en_core_web_sm")


def test_cli_parser_flag_missing_pipeline_is_one_line(tmp_path):

    text = _bad(tmp_path, "t.txt", "The dog barked.\n")
    res = probe_cli(
        "run", "--task", "syntax", "--data", str(text), "--parser", "en_core_web_sm", "--out", str(tmp_path / "o")
    )
    assert res.exit_code == 2
    lines = [ln for ln in res.output.strip().splitlines() if ln]
    assert len(lines) == 1 and "python -m spacy download en_core_web_sm" in lines[0]


@pytest.fixture(scope="module")
def spacy_pipeline(tmp_path_factory) -> Path:
    """A real (tiny, barely trained) spaCy pipeline with a parser, saved as a local directory."""
    import spacy
    from spacy.training import Example as SpacyExample

    from depthprobe.probes.data.conllu import read_treebank, to_doc

    nlp = spacy.blank("en")
    nlp.add_pipe("parser")
    golds = [to_doc([s], nlp.vocab) for s in read_treebank(SAMPLE)]
    examples = [SpacyExample(nlp.make_doc(g.text), g) for g in golds]
    optimizer = nlp.initialize(lambda: examples)
    for _ in range(2):
        nlp.update(examples, sgd=optimizer)
    path = tmp_path_factory.mktemp("spacy") / "pipe"
    nlp.to_disk(path)
    return path


def test_raw_text_with_a_local_pipeline(tiny_bert, spacy_pipeline, tmp_path):
    import spacy

    text = _bad(
        tmp_path, "t.txt", "The dog barked at the mail carrier.\n\nMy sister reads old books. She likes them.\n"
    )
    result = run(tiny_bert, "syntax", text, parser=str(spacy_pipeline))
    nlp = spacy.load(spacy_pipeline)
    docs = [nlp(line) for line in ("The dog barked at the mail carrier.", "My sister reads old books. She likes them.")]
    n_words = sum(len(d) for d in docs)
    assert result.headline["n_words"] == n_words
    assert result.headline["n_sentences"] == sum(len(list(d.sents)) for d in docs)
    # the relations are the pipeline's own, root renamed to "root"
    labels = Counter("root" if t.head.i == t.i else t.dep_ for d in docs for t in d)
    got = result.summary.set_index("relation")["count"].to_dict()
    assert got.pop(ALL) == n_words and got == dict(labels)
    assert any("spaCy pipeline" in n for n in result.notes)


def test_memory_is_flat_running_counts_only(tiny_bert):
    """The state holds fixed-size count tensors, whatever the number of sentences."""
    task = get_task("syntax")
    ctx = Context(RunConfig(model="x", task="syntax"), Options())
    examples = task.load(tiny_bert, ctx)
    state = task.start(tiny_bert, ctx, examples)
    shapes = (state.correct.shape, state.total.shape, state.base.shape)
    for batch in task.batches(tiny_bert, examples, ctx):
        task.accumulate(
            state, batch, forward(tiny_bert, batch.input_ids, batch.attention_mask, task.hook_names(tiny_bert, ctx))
        )
    assert (state.correct.shape, state.total.shape, state.base.shape) == shapes
    assert state.correct.shape == (len(state.relations), 2, 2, 4)


def test_trees_read_through_spacy_keep_the_conllu_columns(shared_data):
    """The Doc route loses nothing: words, heads and full labels equal the CoNLL-U columns."""
    from depthprobe.probes.data.conllu import read_treebank
    from depthprobe.tasks.syntax import read_trees

    for path in (SAMPLE, shared_data / "ud-ewt-dev"):
        trees, sents = read_trees(path, None), read_treebank(path)
        assert [t.words for t in trees] == [tuple(s.words) for s in sents]
        assert [t.heads for t in trees] == [tuple(k.head for k in s.tokens) for s in sents]
        assert [t.rels for t in trees] == [tuple(k.deprel for k in s.tokens) for s in sents]
        assert [t.sent_id for t in trees] == [s.sent_id for s in sents]


def test_cli_parser_flag_runs_raw_text(tiny_bert_dir, spacy_pipeline, tmp_path):

    text = _bad(tmp_path, "t.txt", "The dog barked at the mail carrier.\n")
    out = tmp_path / "run"
    res = probe_cli(
        "run",
        "--model",
        str(tiny_bert_dir),
        "--task",
        "syntax",
        "--data",
        str(text),
        "--parser",
        str(spacy_pipeline),
        "--out",
        str(out),
    )
    assert res.exit_code == 0, res.output
    assert "ALL" in res.output and (out / "scores.csv").exists() and (out / "baselines.csv").exists()
    import json

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["options"] == {"parser": str(spacy_pipeline)}


def test_layer_governors_in_head_chunks_equal_the_whole_layer_at_once():
    """Heads go HEAD_CHUNK at a time: 6 heads in chunks give bitwise the governors and the shown
    word-level attention of one computation over the whole layer."""
    torch.manual_seed(3)
    encs = [
        Encoded(ids=tuple(range(9)), unit_of_piece=(0, 1, 1, 2, 3, 3, 3, 4, 5), n_words=4),
        Encoded(ids=tuple(range(5)), unit_of_piece=(0, 1, 2, 3, 4), n_words=3),
    ]
    pattern = torch.softmax(torch.randn(2, 6, 9, 9), -1)  # [batch, head, query, key]
    pattern[1, :, 5:, :] = 0.0
    pattern[1, :, :, 5:] = 0.0  # padding of the shorter sentence
    units = unit_matrix(encs, 9)
    n_words = torch.tensor([4, 3])
    whole = word_attention(pattern, units)[..., 1:5, 1:5]
    shown = whole[0, :, :4, :4].to(torch.float32)
    dep, gov = predict_governors(whole.clone(), n_words)
    got_dep, got_gov, got_shown = layer_governors(pattern, units, n_words, show=0)
    assert torch.equal(got_dep, dep) and torch.equal(got_gov, gov)
    assert got_dep.shape == (2, 6, 4)
    assert torch.equal(got_shown, shown)
    assert layer_governors(pattern, units, n_words, show=None)[2] is None


def test_a_run_reduces_each_pattern_as_its_hook_fires(tiny_bert):
    """Through the engine, syntax's accumulate gets each layer's governors, never the pattern
    tensors [batch, head, pos, pos]; the counts equal those from whole patterns."""
    task = get_task("syntax")
    ctx = Context(RunConfig(model="x", task="syntax", batch_size=4), Options())
    examples = task.load(tiny_bert, ctx)
    kinds = set()

    def observe(batch, acts):
        kinds.update(type(acts[n]).__name__ for n in pattern_names(tiny_bert.info.n_layers))

    state, n_batches = accumulate(task, tiny_bert, ctx, examples, observe=observe)
    assert n_batches > 1 and kinds == {"tuple"}
    whole = task.start(tiny_bert, ctx, examples)
    for batch in task.batches(tiny_bert, examples, ctx):
        acts = forward(tiny_bert, batch.input_ids, batch.attention_mask, task.hook_names(tiny_bert, ctx))
        assert all(acts[n].dim() == 4 for n in task.hook_names(tiny_bert, ctx))
        task.accumulate(whole, batch, acts)
    for name in ("correct", "total", "base"):
        assert torch.equal(getattr(state, name), getattr(whole, name)), name
    assert torch.equal(state.view["w"], whole.view["w"])
