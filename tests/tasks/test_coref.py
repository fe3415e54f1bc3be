"""coref: readers (Entity brackets, CoNLL-2012, GAP), windows, baselines on hand-built documents,
padding invariance, and the task against an independent plain-Python reference implementation
of docs/coref.md on real model output (tiny BERT; slow: minilm on an OntoGUM document and GAP)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from depthprobe.probes import ProbeError, run
from depthprobe.probes.data import conll2012, coref_chains, coref_formats
from depthprobe.probes.data import gap as gap_data
from depthprobe.probes.hooks.capture import forward, pattern_names
from depthprobe.tasks import coref as cr
from depthprobe.tasks.coref import chains as cr_chains
from depthprobe.tasks.coref import common as cr_common
from depthprobe.tasks.coref import gap as cr_gap
from tests.reference.coref import ref_chains

# ---------------------------------------------------------------- helpers


def conllu(docs: dict[str, list[str]]) -> str:
    """Compact rows 'form upos feats head deprel entity' ('-' = empty) -> CoNLL-U text.
    Each list item is one sentence, rows separated by ';'."""
    out = []
    for name, sents in docs.items():
        out.append(f"# newdoc id = {name}")
        for k, sent in enumerate(sents, 1):
            out.append(f"# sent_id = {name}-{k}")
            for i, row in enumerate(r.strip() for r in sent.split(";")):
                form, upos, feats, head, dep, ent = row.split()
                misc = f"Entity={ent}" if ent != "-" else "_"
                out.append(
                    "\t".join(
                        [
                            str(i + 1),
                            form,
                            form.lower(),
                            upos,
                            "_",
                            feats if feats != "-" else "_",
                            head,
                            dep,
                            "_",
                            misc,
                        ]
                    )
                )
            out.append("")
    return "\n".join(out) + "\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def queries_of(path: Path) -> list[tuple[str, cr_chains.Query, tuple[str, ...]]]:
    """Every evaluated mention of each document, one window per document (no model needed)."""
    out = []
    for doc in coref_formats.read_chain_docs(path):
        words = tuple(t.text for t in doc)
        for q in cr_chains.window_queries(doc, coref_chains.mentions(doc), 0, len(doc)):
            out.append((" ".join(words[q.start : q.end + 1]), q, words))
    return out


def text(words, c) -> str:
    return " ".join(words[c.start : c.end + 1])


# ---------------------------------------------------------------- Entity brackets


def test_brackets_read_left_to_right_with_corefud_ids():
    assert coref_chains.parse_brackets("(13(3(14)", "f", 1) == [("open", "13"), ("open", "3"), ("single", "14")]
    assert coref_chains.parse_brackets("1)13)14)", "f", 1) == [("close", "1"), ("close", "13"), ("close", "14")]
    assert coref_chains.parse_brackets("(e12-person-1-new)e3)", "f", 1) == [("single", "e12"), ("close", "e3")]
    assert coref_chains.parse_brackets("(e5[1/2]-place-2", "f", 1) == [("open", "e5")]
    assert coref_chains.parse_brackets("(12|12)|(7)", "f", 1) == [("open", "12"), ("close", "12"), ("single", "7")]


def test_nested_mentions_and_closing_the_latest_open(tmp_path):
    # "[[his] mother] saw [[the man] near [the man]]": entity 2 nested in entity 2 closes innermost first
    text_ = conllu(
        {
            "d": [
                "his PRON Gender=Masc|Number=Sing|Person=3 2 nmod:poss (1(3);"
                "mother NOUN Number=Sing 3 nsubj 1);"
                "saw VERB - 0 root -;"
                "the DET - 5 det (2(2;"
                "man NOUN Number=Sing 3 obj 2);"
                "near ADP - 8 case -;"
                "the DET - 8 det (2;"
                "man NOUN Number=Sing 5 nmod 2)2)"
            ]
        }
    )
    doc = coref_formats.read_chain_docs(write(tmp_path, "n.conllu", text_))[0]
    got = [(m.start, m.end, m.chain, doc[m.head].text) for m in coref_chains.mentions(doc)]
    assert got == [
        (0, 0, "3", "his"),
        (0, 1, "1", "mother"),
        (3, 4, "2", "man"),
        (3, 7, "2", "man"),
        (6, 7, "2", "man"),
    ]
    assert sorted(doc.spans) == ["coref_1", "coref_2", "coref_3"]
    assert [s.text for s in doc.spans["coref_2"]] == ["the man", "the man near the man", "the man"]
    assert doc.user_data["coref_heads"][(3, 8)] == 4  # first word whose head leaves the span


def test_chain_ids_are_per_document(tmp_path):
    text_ = conllu(
        {
            "a": ["John PROPN - 2 nsubj (1);ran VERB - 0 root -", "He PRON - 2 nsubj (1);left VERB - 0 root -"],
            "b": ["Mary PROPN - 2 nsubj (1);ran VERB - 0 root -", "She PRON - 2 nsubj (1);left VERB - 0 root -"],
        }
    )
    docs = coref_formats.read_chain_docs(write(tmp_path, "two.conllu", text_))
    assert [d.user_data["doc_id"] for d in docs] == ["a", "b"]
    assert [[m.start for m in coref_chains.mentions(d)] for d in docs] == [[0, 2], [0, 2]]


@pytest.mark.parametrize(
    "entity, line, what",
    [
        ("(1", 3, "never closed"),  # opened on the first word, never closed
        ("2)", 3, "no open mention"),
        ("1)x", 3, "cannot read"),
        ("()", 3, "without an entity id"),
    ],
)
def test_bad_brackets_fail_with_file_and_line(tmp_path, entity, line, what):
    p = write(tmp_path, "bad.conllu", conllu({"d": [f"John PROPN - 2 nsubj {entity};ran VERB - 0 root -"]}))
    with pytest.raises(ProbeError, match=rf"bad.conllu:{line}: .*{what}"):
        coref_formats.read_chain_docs(p)


# ---------------------------------------------------------------- CoNLL-2012

CONLL12 = """#begin document (test/doc1); part 000
doc1 0 0 John NNP (NP*) - - - - * (0)
doc1 0 1 saw VBD (VP* see - - - * -
doc1 0 2 the DT (NP* - - - - * (1
doc1 0 3 president NN *) - - - - * -
doc1 0 4 of IN (PP* - - - - * -
doc1 0 5 the DT (NP* - - - - * (2
doc1 0 6 company NN *)) - - - - * 1)|2)
doc1 0 7 . . *)) - - - - * -

doc1 0 0 He PRP (NP*) - - - - * (0)
doc1 0 1 met VBD (VP* - - - - * -
doc1 0 2 her PRP (NP*) - - - - * (1)
doc1 0 3 . . *)) - - - - * -

#end document
#begin document (test/doc2); part 000
doc2 0 0 Cats NNS (NP*) - - - - * (0)
doc2 0 1 purr VBP (VP*) - - - - * -
doc2 0 2 . . *) - - - - * -

doc2 0 0 They PRP (NP*) - - - - * (0)
doc2 0 1 sleep VBP (VP*) - - - - * -
#end document
"""


def test_conll2012_reader_chains_heads_and_types(tmp_path):
    docs = coref_formats.read_chain_docs(write(tmp_path, "x.v4_gold_conll", CONLL12))
    assert [d.user_data["doc_id"] for d in docs] == ["(test/doc1); part 000", "(test/doc2); part 000"]
    d = docs[0]
    assert [s.text for s in d.sents] == ["John saw the president of the company .", "He met her ."]
    got = [(d[m.start : m.end + 1].text, m.chain, d[m.head].text, d[m.head].pos_) for m in coref_chains.mentions(d)]
    assert got == [
        ("John", "0", "John", "PROPN"),
        ("the president of the company", "1", "president", "NOUN"),
        ("the company", "2", "company", "NOUN"),
        ("He", "0", "He", "PRON"),
        ("her", "1", "her", "PRON"),
    ]
    assert str(d[8].morph) == "Gender=Masc|Number=Sing|Person=3"
    assert [m.chain for m in coref_chains.mentions(docs[1])] == ["0", "0"]  # chain ids restart per document


def test_ptb_head_rule():
    assert conll2012.ptb_head(["DT", "NN", "IN", "DT", "NN"]) == 1  # the president of the company
    assert conll2012.ptb_head(["PRP$", "NN"]) == 1  # his mother
    assert conll2012.ptb_head(["NNP", "POS", "NN"]) == 2  # John 's dog
    assert conll2012.ptb_head(["DT", "JJ"]) == 1  # no noun: the last word before any post-modifier
    assert conll2012.ptb_head(["NNP", "CC", "NNP"]) == 0  # John and Mary: the first conjunct


@pytest.mark.parametrize(
    "text_, line, what",
    [
        ("doc 0 0 John NNP * (0)\n", 1, "outside #begin document"),
        ("#begin document (a); part 000\ndoc 0 0 John NNP * (0\n#end document\n", 2, "never closed"),
        ("#begin document (a); part 000\ndoc 0 0 John NNP * 0)\n#end document\n", 2, "no open mention"),
        ("#begin document (a); part 000\ndoc 0 0 John NNP * (0)\n", 1, "no #end document"),
        ("#begin document (a); part 000\ndoc 0 John\n#end document\n", 2, "at least 5 columns"),
    ],
)
def test_conll2012_errors(tmp_path, text_, line, what):
    with pytest.raises(ProbeError, match=rf"bad_conll:{line}: .*{what}"):
        coref_formats.read_chain_docs(write(tmp_path, "bad_conll", text_))


# ---------------------------------------------------------------- GAP

GAP_HEADER = "\t".join(gap_data.GAP_COLUMNS)


def gap_row(i: int, text_: str, pron: str, a: str, a_ok: bool, b: str, b_ok: bool, pron_n: int = 1) -> str:
    def off(s: str, n: int = 1) -> int:
        k = -1
        for _ in range(n):
            k = text_.index(s, k + 1)
        return k

    return "\t".join(
        [
            f"t-{i}",
            text_,
            pron,
            str(off(pron, pron_n)),
            a,
            str(off(a)),
            str(a_ok).upper(),
            b,
            str(off(b)),
            str(b_ok).upper(),
            "http://example.org",
        ]
    )


GAP_ROWS = [
    gap_row(1, "john saw mary . she was happy .", "she", "john", False, "mary", True),
    gap_row(2, "mary told john that he was late .", "he", "mary", False, "john", True),
    gap_row(3, "the man saw john and he ran .", "he", "man", True, "john", False),
    gap_row(4, "mary met john . his dog was big .", "his", "mary", False, "john", True),
    gap_row(5, "john and mary ran . her car was red .", "her", "john", False, "mary", True),
    gap_row(6, "john saw mary . she was sad .", "she", "john", False, "mary", False),  # no true candidate
]


def test_gap_reader(tmp_path):
    p = write(tmp_path, "g.tsv", GAP_HEADER + "\n" + "\n".join(GAP_ROWS) + "\n")
    rows = gap_data.read_gap(p)
    assert [r.line for r in rows] == [2, 3, 4, 5, 6, 7]
    assert [r.gender for r in rows[:3]] == ["feminine", "masculine", "masculine"]
    assert [r.answerable for r in rows] == [True] * 5 + [False]
    spans = rows[0].spans()
    assert [rows[0].text[s:e] for s, e in (spans["pronoun"], spans["A"], spans["B"])] == ["she", "john", "mary"]
    assert (rows[0].a_coref, rows[0].b_coref) == (False, True)


def test_gap_bad_offsets_name_the_line(tmp_path):
    bad = GAP_ROWS[1].split("\t")
    bad[5] = "3"  # A-offset no longer points at "mary"
    p = write(tmp_path, "g.tsv", GAP_HEADER + "\n" + GAP_ROWS[0] + "\n" + "\t".join(bad) + "\n")
    with pytest.raises(ProbeError, match=r"g.tsv:3: A-offset 3 does not point at 'mary'"):
        gap_data.read_gap(p)
    bad[5], bad[9] = bad[5].replace("3", "0"), "maybe"
    p.write_text(GAP_HEADER + "\n" + "\t".join(bad) + "\n")
    with pytest.raises(ProbeError, match=r"g.tsv:2: B-coref is 'maybe'"):
        gap_data.read_gap(p)
    p.write_text("ID\tText\n1\tx\n")
    with pytest.raises(ProbeError, match=r"g.tsv:1: not a GAP header"):
        gap_data.read_gap(p)


def test_gap_nearest_baseline_distance_and_ties():
    base = dict(id="x", pronoun_offset=10, pronoun="he", a_coref=True, b_coref=False, line=2, text="")
    # A ends 2 before the pronoun, B starts 3 after it
    assert cr_gap.gap_nearest(gap_data.GapExample(a="ab", a_offset=6, b="cd", b_offset=15, **base)) == 0
    # A ends 4 before, B starts 1 after: B is nearer
    assert cr_gap.gap_nearest(gap_data.GapExample(a="ab", a_offset=4, b="cd", b_offset=13, **base)) == 1
    # equal gaps: the candidate appearing first wins
    assert cr_gap.gap_nearest(gap_data.GapExample(a="ab", a_offset=6, b="cd", b_offset=14, **base)) == 0


# ---------------------------------------------------------------- windows


def test_windows_pack_whole_sentences_and_a_long_one_ends_the_window():
    spans, skipped = cr_chains.doc_windows([10, 200, 5, 5, 120, 3], n_special=2, limit=128)
    assert spans == [(0, 1), (2, 4), (4, 6)] and skipped == 1
    spans, skipped = cr_chains.doc_windows([126, 1], n_special=2, limit=128)  # 126 + 2 fits exactly
    assert spans == [(0, 1), (1, 2)] and skipped == 0


def test_window_membership_and_evaluated_mentions(tmp_path):
    # chain 1: John (s1) ... he (s2) ... him (s3); chain 2 spans sentences 2-3 in one mention
    text_ = conllu(
        {
            "d": [
                "John PROPN - 2 nsubj (1);ran VERB - 0 root -",
                "Then ADV - 3 advmod -;he PRON - 3 nsubj (1);left VERB - 0 root (2",
                "Bill PROPN - 2 nsubj -;saw VERB - 0 root 2);him PRON - 2 obj (1)",
            ]
        }
    )
    doc = coref_formats.read_chain_docs(write(tmp_path, "w.conllu", text_))[0]
    ms = coref_chains.mentions(doc)
    # window = sentences 2-3 only: "he" has no earlier chain-mate starting inside; "him" does
    qs = cr_chains.window_queries(doc, ms, 2, 8)
    assert [(q.start, q.end) for q in qs] == [(5, 5)]  # "him" (window-relative 7 - 2)
    assert [(c.start, c.end) for c in qs[0].cands] == [(2, 4), (1, 1)]  # "left Bill saw" then "he"
    # window = sentence 2 only: the mention crossing into sentence 3 is not part of it
    assert cr_chains.window_queries(doc, ms, 2, 5) == ()


def test_mention_whose_only_earlier_mate_contains_it_is_evaluated_and_wrong(tmp_path):
    # "[the dog that bit [the dog]]" with both in chain 1 (contrived, but it happens in real data)
    text_ = conllu(
        {
            "d": [
                "the DET - 2 det (1;dog NOUN Number=Sing 0 root -;that PRON - 4 nsubj -;bit VERB - 2 acl -;"
                "the DET - 6 det (1;dog NOUN Number=Sing 4 obj 1)1)"
            ]
        }
    )
    doc = coref_formats.read_chain_docs(write(tmp_path, "c.conllu", text_))[0]
    qs = cr_chains.window_queries(doc, coref_chains.mentions(doc), 0, len(doc))
    assert len(qs) == 1 and (qs[0].start, qs[0].end) == (4, 5)
    assert qs[0].cands == () and qs[0].baselines == (False, False, False)


# ---------------------------------------------------------------- baselines on hand-built documents

BASELINE_DOCS = {
    # M = "The dog": nearest is "a cat" (wrong), head match "The old dog" (right)
    "headmatch": [
        "The DET - 3 det (1;old ADJ - 3 amod -;dog NOUN Number=Sing 4 nsubj 1);barked VERB - 0 root -;"
        "at ADP - 7 case -;a DET - 7 det (2;cat NOUN Number=Sing 4 obl 2)",
        "The DET - 2 det (1;dog NOUN Number=Sing 3 nsubj 1);ran VERB - 0 root -",
    ],
    # M = "the red car": exact string beats the nearer head match "a car"
    "exact": [
        "the DET - 3 det (1;red ADJ - 3 amod -;car NOUN Number=Sing 4 nsubj 1);stopped VERB - 0 root -",
        "A DET - 2 det (2;car NOUN Number=Sing 3 nsubj 2);passed VERB - 0 root -",
        "the DET - 3 det (1;red ADJ - 3 amod -;car NOUN Number=Sing 4 nsubj 1);left VERB - 0 root -",
    ],
    # M = "she": "the boys" is nearest but plural, "Mary" agrees; the sieve skips past "the boys"
    "agree": [
        "Mary PROPN Number=Sing 2 nsubj (1);met VERB - 0 root -;the DET - 4 det (2;boys NOUN Number=Plur 2 obj 2)",
        "she PRON Case=Nom|Gender=Fem|Number=Sing|Person=3 2 nsubj (1);smiled VERB - 0 root -",
    ],
    # M = "I": third-person "John" is nearest; first-person "me" agrees
    "person": [
        "me PRON Number=Sing|Person=1 2 nsubj (1);waited VERB - 0 root -",
        "John PROPN Number=Sing 2 nsubj (2);called VERB - 0 root -",
        "I PRON Number=Sing|Person=1 2 nsubj (1);answered VERB - 0 root -",
    ],
    # M = "it": nested candidates sharing a start: "[[his] mother]" -> the longer one is nearer
    "nested": [
        "his PRON Gender=Masc|Number=Sing|Person=3 2 nmod:poss (2(3);mother NOUN Number=Sing 3 nsubj 2);"
        "sang VERB - 0 root -",
        "She PRON Gender=Fem|Number=Sing|Person=3 2 nsubj (2);smiled VERB - 0 root -",
    ],
}


def test_baselines_choose_the_known_answers(tmp_path):
    p = write(tmp_path, "b.conllu", conllu(BASELINE_DOCS))
    docs = {d.user_data["doc_id"]: d for d in coref_formats.read_chain_docs(p)}

    def choices(name: str) -> tuple[str, list[str]]:
        doc = docs[name]
        words = [t.text for t in doc]
        m = coref_chains.mentions(doc)[-1]  # the last mention is M
        q = next(
            q for q in cr_chains.window_queries(doc, coref_chains.mentions(doc), 0, len(doc)) if q.start == m.start
        )
        idx = cr_chains.baseline_picks(doc, 0, m, q.cands)
        return " ".join(words[m.start : m.end + 1]), [text(words, q.cands[i]) for i in idx]

    assert choices("headmatch") == ("The dog", ["a cat", "The old dog", "The old dog"])
    assert choices("exact") == ("the red car", ["A car", "A car", "the red car"])
    assert choices("agree") == ("she", ["the boys", "the boys", "Mary"])
    assert choices("person") == ("I", ["John", "John", "me"])
    m_text, picked = choices("nested")
    assert m_text == "She" and picked[0] == "his mother"  # nearest = the longer of the nested pair
    # correctness flags follow the chains: "his mother" is chain 2 like "She"
    q = cr_chains.window_queries(docs["nested"], coref_chains.mentions(docs["nested"]), 0, len(docs["nested"]))[-1]
    assert q.baselines[0] is True


def test_types_follow_the_head_upos(tmp_path):
    p = write(tmp_path, "b.conllu", conllu(BASELINE_DOCS))
    kinds = {(name, cr_chains.TYPES[q.kind]) for name, q, _ in queries_of(p)}
    assert ("The dog", "nominal") in kinds and ("she", "pronoun") in kinds
    assert cr_chains.mention_type("PROPN") == 1 and cr_chains.mention_type("NUM") == 2


def assert_matches_reference(result, ref: dict) -> None:
    s = result.scores
    n_all = sum(ref["n"].values())
    assert result.headline["n_mentions"] == n_all and n_all > 0
    for t in cr_chains.TYPES:
        assert result.headline["n_by_type"][t] == ref["n"][t]
    for row in s.itertuples():
        want_n = n_all if row.type == "all" else ref["n"][row.type]
        types = cr_chains.TYPES if row.type == "all" else (row.type,)
        want = sum(ref["correct"][(t, row.layer, row.head)] for t in types) / want_n
        assert row.value == pytest.approx(want, abs=1e-12), (row.type, row.layer, row.head)
    for b in cr_chains.BASELINES:
        got = result.headline["baselines"][b]
        want_all = sum(ref["base"][(b, t)] for t in cr_chains.TYPES)
        assert got["all"] == pytest.approx(100 * want_all / n_all, abs=0.01)
        for t in cr_chains.TYPES:
            if ref["n"][t]:
                assert got[t] == pytest.approx(100 * ref["base"][(b, t)] / ref["n"][t], abs=0.01)


def test_task_equals_reference_on_the_sample_tiny_bert(tiny_bert):
    r = run(tiny_bert, "coref", batch_size=3, max_len=64)
    assert_matches_reference(r, ref_chains(tiny_bert, cr.SAMPLE, 64))
    assert all(r.headline["n_by_type"][t] > 0 for t in cr_chains.TYPES)  # the sample covers every type


def test_task_equals_reference_on_ontogum_tiny_bert(tiny_bert, shared_data):
    doc = shared_data / "ontogum-dev" / "GUM_interview_gaming.conllu"
    r = run(tiny_bert, "coref", doc, max_len=64, batch_size=4)
    assert_matches_reference(r, ref_chains(tiny_bert, doc, 64))
    assert r.counts["skipped"] > 0  # long sentences are skipped and counted


def test_padding_does_not_change_any_number(tiny_bert):
    import pandas as pd

    a = run(tiny_bert, "coref", batch_size=1, max_len=64)
    b = run(tiny_bert, "coref", batch_size=8, max_len=64)
    key = ["type", "layer", "head"]
    pd.testing.assert_series_equal(a.scores.set_index(key)["value"], b.scores.set_index(key)["value"], rtol=0, atol=0)
    # the same window alone vs padded behind a longer one: identical per-head predictions
    from depthprobe.probes.engine.task import Context, RunConfig

    task = cr.Coref()
    ctx = Context(RunConfig(model="t", task="coref", max_len=64), cr.Options())
    ex = task.load(tiny_bert, ctx)
    short = min(ex, key=lambda w: len(w.encoded))
    long_ = max(ex, key=lambda w: len(w.encoded))
    assert len(short.encoded) < len(long_.encoded)
    states = []
    for items in ([short], [long_, short]):
        st = task.start(tiny_bert, ctx, cr.CorefExamples(items, 0, "", "chains", {}))
        for batch in cr_common.budget_batches(items, [w.encoded.ids for w in items], 8, tiny_bert.pad_id, 1):
            task.accumulate(st, batch, forward(tiny_bert, batch.input_ids, batch.attention_mask, pattern_names(2)))
        states.append(st)
    alone = states[0].correct
    st_long = task.start(tiny_bert, ctx, cr.CorefExamples([long_], 0, "", "chains", {}))
    for batch in cr_common.budget_batches([long_], [long_.encoded.ids], 8, tiny_bert.pad_id, 1):
        task.accumulate(st_long, batch, forward(tiny_bert, batch.input_ids, batch.attention_mask, pattern_names(2)))
    assert torch.equal(states[1].correct - st_long.correct, alone)


def test_conll2012_end_to_end_and_format_option(tiny_bert, tmp_path):
    p = write(tmp_path, "x_conll", CONLL12)
    r = run(tiny_bert, "coref", p, max_len=64)
    assert r.headline["n_by_type"] == {"pronoun": 3, "proper": 0, "nominal": 0}
    with pytest.raises(ProbeError, match="format"):
        run(tiny_bert, "coref", p, format="xml")


def test_outputs_summary_heatmaps_and_views(tiny_bert):
    r = run(tiny_bert, "coref", max_len=64, views=2)
    methods = list(r.summary["method"])
    assert methods == ["mentions evaluated", "best head", "nearest", "head match", "rule-based"]
    assert set(r.scores["type"]) == {"all", "pronoun", "proper", "nominal"}
    assert len(r.scores) == 4 * 2 * 4
    assert r.heatmaps[0]["where"] == {"type": "all"}
    assert len(r.views) == 2
    v = r.views[0]
    assert len(v["pattern"]) == 1 and len(v["pattern"][0]) == len(v["tokens"])
    row = v["pattern"][0][v["query"]]
    for c in v["candidates"]:
        assert c["attention"] == pytest.approx(row[c["head"]], abs=1e-4)
    layer, head = map(int, r.headline["best_head"].split("-"))  # L-H, 0-indexed
    best = r.scores[(r.scores.type == "all")].sort_values(["value", "layer", "head"], ascending=[False, True, True])
    assert (best.iloc[0]["layer"], best.iloc[0]["head"]) == (layer, head)
    assert r.headline["best_head_clark"] == f"{layer + 1}-{head + 1}"


def test_best_head_ties_go_to_lowest_layer_then_head():
    c = torch.tensor([[1, 3, 3], [3, 0, 0]])
    assert cr_common.best_head(c) == (0, 1)


def test_no_evaluable_mentions_is_an_error(tiny_bert, tmp_path):
    p = write(tmp_path, "s.conllu", conllu({"d": ["John PROPN - 2 nsubj (1);ran VERB - 0 root -"]}))
    with pytest.raises(ProbeError, match="no mention has an earlier mention"):
        run(tiny_bert, "coref", p)


# ---------------------------------------------------------------- GAP end to end


def ref_gap(model, rows: list[gap_data.GapExample], limit: int) -> dict:
    tok = model.tokenizer
    L, H = model.info.n_layers, model.info.n_heads
    out = {"n": {}, "correct": {}, "nearest": {}, "first": {}}
    for ex in rows:
        if ex.a_coref == ex.b_coref:
            continue
        enc = tok(ex.text, add_special_tokens=False, return_offsets_mapping=True)
        ids = [model.cls_id] + enc["input_ids"] + [model.sep_id]
        if len(ids) > limit:
            continue
        offs = [None] + enc["offset_mapping"] + [None]

        def pieces(start, length, offs=offs):
            return [i for i, o in enumerate(offs) if o and o[0] < start + length and o[1] > start]

        pr, pa, pb = (
            pieces(ex.pronoun_offset, len(ex.pronoun)),
            pieces(ex.a_offset, len(ex.a)),
            pieces(ex.b_offset, len(ex.b)),
        )
        acts = forward(model, torch.tensor([ids]), None, pattern_names(L))
        g = ex.gender
        label = 0 if ex.a_coref else 1
        pe = ex.pronoun_offset + len(ex.pronoun)
        da = (
            ex.pronoun_offset - (ex.a_offset + len(ex.a))
            if ex.a_offset + len(ex.a) <= ex.pronoun_offset
            else ex.a_offset - pe
        )
        db = (
            ex.pronoun_offset - (ex.b_offset + len(ex.b))
            if ex.b_offset + len(ex.b) <= ex.pronoun_offset
            else ex.b_offset - pe
        )
        near = 0 if da < db or (da == db and ex.a_offset <= ex.b_offset) else 1
        out["n"][g] = out["n"].get(g, 0) + 1
        out["nearest"][g] = out["nearest"].get(g, 0) + int(near == label)
        out["first"][g] = out["first"].get(g, 0) + int(label == 0)
        for layer_idx, name in enumerate(pattern_names(L)):
            a = acts[name][0].tolist()
            for h in range(H):
                to_a = sum(sum(a[h][r][c] for c in pa) for r in pr) / len(pr)
                to_b = sum(sum(a[h][r][c] for c in pb) for r in pr) / len(pr)
                pred = 1 if to_b > to_a else 0 if to_a > to_b else near
                out["correct"][(g, layer_idx, h)] = out["correct"].get((g, layer_idx, h), 0) + int(pred == label)
    return out


def check_gap(r, ref: dict) -> None:
    n_all = sum(ref["n"].values())
    assert r.headline["n_examples"] == n_all
    for row in r.scores.itertuples():
        gs = list(ref["n"]) if row.gender == "all" else [row.gender]
        want = sum(ref["correct"].get((g, row.layer, row.head), 0) for g in gs) / sum(ref["n"][g] for g in gs)
        assert row.value == pytest.approx(want, abs=1e-12)
    gap = r.headline["gap"]
    assert gap["nearest"]["all"] == pytest.approx(100 * sum(ref["nearest"].values()) / n_all, abs=0.01)
    assert gap["first candidate"]["all"] == pytest.approx(100 * sum(ref["first"].values()) / n_all, abs=0.01)
    for g in ("masculine", "feminine"):
        if g in ref["n"]:
            assert gap["nearest"][g] == pytest.approx(100 * ref["nearest"][g] / ref["n"][g], abs=0.01)


def test_gap_end_to_end_equals_reference(tiny_bert, tmp_path):
    p = write(tmp_path, "g.tsv", GAP_HEADER + "\n" + "\n".join(GAP_ROWS) + "\n")
    r = run(tiny_bert, "coref", p, batch_size=2)
    check_gap(r, ref_gap(tiny_bert, gap_data.read_gap(p), 64))
    assert r.headline["n_examples"] == 5
    assert list(r.summary["method"]) == ["examples", "best head", "nearest", "first candidate"]
    assert {"masculine", "feminine", "F/M"} <= set(r.summary.columns)
    assert any("1 of 6 rows" in n for n in r.notes)
    # a row over the piece limit is skipped and counted
    r2 = run(tiny_bert, "coref", p, gap_max_len=10)
    assert r2.counts["skipped"] == 5 - r2.headline["n_examples"] and r2.counts["skipped"] > 0


# ---------------------------------------------------------------- slow: the real offline model


@pytest.mark.slow
def test_minilm_equals_reference_on_an_ontogum_document(minilm, shared_data):
    doc = shared_data / "ontogum-dev" / "GUM_bio_byron.conllu"
    r = run(minilm, "coref", doc)
    assert_matches_reference(r, ref_chains(minilm, doc, 128))
    assert r.headline["accuracy"] > r.headline["baselines"]["nearest"]["all"]


@pytest.mark.slow
def test_minilm_gap_equals_reference(minilm, shared_data, tmp_path):
    src = shared_data / "gap-dev" / "gap-development.tsv"
    lines = src.read_text(encoding="utf-8").split("\n")
    p = write(tmp_path, "gap.tsv", "\n".join(lines[:61]) + "\n")
    r = run(minilm, "coref", p)
    check_gap(r, ref_gap(minilm, gap_data.read_gap(p), 512))


# ---------------------------------------------------------------- CLI, decoders, bert-base


def test_cli_run_and_bad_data(tiny_bert_dir, tmp_path):
    import json

    from typer.testing import CliRunner

    from depthprobe.cli.main import app

    runner = CliRunner()
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "run",
            "--model",
            str(tiny_bert_dir),
            "--task",
            "coref",
            "--max-len",
            "64",
            "--out",
            str(out),
            "-O",
            "views=1",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "best head" in res.output and "rule-based" in res.output and "Clark" in res.output
    assert {"scores.csv", "summary.csv", "views.json", "manifest.json"} <= {p.name for p in out.iterdir()}
    assert len(json.loads((out / "views.json").read_text())) == 1
    bad = write(tmp_path, "bad.conllu", conllu({"d": ["John PROPN - 2 nsubj (1;ran VERB - 0 root -"]}))
    res = runner.invoke(app, ["run", "--model", str(tiny_bert_dir), "--task", "coref", "--data", str(bad)])
    assert res.exit_code == 2 and "bad.conllu:3:" in res.output and "never closed" in res.output


def test_decoder_windows_have_no_sep(tiny_gpt2, tiny_bert):
    from depthprobe.probes.engine.task import Context, RunConfig, get_task

    task = get_task("coref")
    for model, has_sep in ((tiny_gpt2, False), (tiny_bert, True)):  # the encoder shows the check can fail
        ctx = Context(RunConfig(model=model.name, task="coref", max_len=64), task.parse_options({}))
        windows = task.load(model, ctx)
        assert windows
        sep = model.tokenizer.sep_token_id
        for w in windows:
            ids, units, n = w.encoded.ids, w.encoded.unit_of_piece, w.encoded.n_words
            assert ids[0] == model.cls_id and units[0] == 0
            assert (sep is not None and sep in ids) == has_sep  # [SEP] nowhere in a decoder's window
            assert (units[-1] == n + 1) == has_sep  # no unit after the last word
            assert max(units) == n + has_sep
    r = run(tiny_gpt2, "coref", max_len=64)
    assert r.headline["n_mentions"] > 0 and len(r.scores) == 4 * 2 * 4


def test_bert_base_without_a_cache_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ProbeError, match=r"bert-base-cased.*not in the local cache"):
        run("bert-base", "coref")


def test_gap_span_covering_no_token_is_an_error(tiny_bert, tmp_path):
    cols = GAP_ROWS[0].split("\t")
    cols[4], cols[5] = " ", str(cols[1].index(" "))  # A is a lone space: it matches its offset but no piece
    p = write(tmp_path, "g.tsv", GAP_HEADER + "\n" + "\t".join(cols) + "\n")
    with pytest.raises(ProbeError, match=r"g.tsv:2: A span .* covers no token"):
        run(tiny_bert, "coref", p)
