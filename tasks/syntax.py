"""syntax (Clark et al. 2019, §4.2, Table 1): which attention heads find syntactic governors.

For every word and every head, the predicted governor is the most-attended OTHER word on
word-level attention (docs/syntax.md): the diagonal is zeroed, [CLS]/[SEP]/BOS are excluded, so
ROOT is never predicted. Two directions per head:

- ``dependent->head``: the argmax of the dependent's row (the word it attends to most);
- ``head->dependent``: the argmax of the dependent's column (the word attending to it most).

Accuracy per (relation, layer, head, direction); "ALL" counts every word, root and punct
included (a root word's governor is ROOT: always wrong). Argmax ties go to the leftmost word.
Best head: highest accuracy; ties go to the lowest layer, then the lowest head, then
dependent->head. Baseline: a fixed offset in -3..2 in CoNLL-U numbering (word k is position k,
ROOT is 0): predicted head = clip(k + offset, 0, n), as in Clark et al.'s code, so an offset can
land on ROOT (``baseline_root=false`` clips to the words 1..n instead); ties go to the offset
nearest 0, then the leftward one.

Only running counts are kept: correct[relation, direction, layer, head] and total[relation].
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from depthprobe.probes.base.batching import Batch, length_batches
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.scores import head_label
from depthprobe.probes.data.align import Encoded, encode_pieces, unit_matrix, word_attention, word_pieces_many
from depthprobe.probes.engine.task import Context, Examples, HeatmapPanel, Output, Task, ViewPanel, tidy
from depthprobe.probes.hooks.capture import Captured, Reduce, pattern_names
from depthprobe.probes.models.model import Model
from depthprobe.tasks.cards import CARDS, SyntaxOptions

SAMPLE = Path(__file__).parent / "data" / "sample_syntax.conllu"
ALL = "ALL"
ENCODE_CHUNK = 256  # sentences per tokenizer call when encoding a treebank
HEAD_CHUNK = 1  # heads per word-level attention computation (bounds its float64 maps; docs/syntax.md)
DIRECTIONS = ("dependent->head", "head->dependent")
OFFSETS = (-3, -2, -1, 0, 1, 2)
HEATMAP_RELATIONS = ("det", "nsubj", "obj", "amod", "case", "aux", "nmod:poss", "advmod", ALL)
# UD label -> Clark et al.'s Stanford Dependencies label
UD_TO_CLARK = {"obj": "dobj", "compound": "nn", "aux:pass": "auxpass", "nmod:poss": "poss", "compound:prt": "prt"}
# Clark et al. 2019, Table 1 (BERT-base, WSJ, Stanford Dependencies): head (1-indexed), accuracy,
# baseline accuracy. The heads are those printed by their public Syntax_Analysis notebook.
CLARK_TABLE1 = {
    ALL: ("7-6", 34.5, 26.3),
    "prep": ("7-4", 66.7, 61.8),
    "pobj": ("9-6", 76.3, 34.6),
    "det": ("8-11", 94.3, 51.7),
    "nsubj": ("8-2", 58.5, 45.5),
    "amod": ("4-10", 75.6, 68.3),
    "dobj": ("8-10", 86.8, 40.0),
    "aux": ("4-10", 81.1, 71.5),
    "poss": ("7-6", 80.5, 47.7),
}


Options = SyntaxOptions  # tasks/cards.py: the options, readable without importing this module


@dataclass(frozen=True)
class Tree:
    """One gold sentence: words, governors in CoNLL-U numbering (0 = ROOT), relation labels."""

    sent_id: str
    words: tuple[str, ...]
    heads: tuple[int, ...]
    rels: tuple[str, ...]


@dataclass(frozen=True)
class Example:
    tree: Tree
    enc: Encoded


# ---------------------------------------------------------------- reading


def trees_from_doc(doc, bounds: list[tuple[int, int]] | None = None) -> list[Tree]:
    """Sentences of a parsed spaCy Doc -> Trees: the doc's own sentences, or the given
    (start, end) token ranges. The root (a token that is its own head) gets HEAD 0, label root."""
    ids = doc.user_data.get("sent_ids") or []
    offset = doc.to_array("HEAD").view(np.int64)  # head.i - i, stored unsigned
    dep = doc.to_array("DEP")  # label hashes
    words = [t.text for t in doc]
    strings = doc.vocab.strings
    out: list[Tree] = []
    for k, (start, end) in enumerate(bounds if bounds is not None else ((s.start, s.end) for s in doc.sents)):
        off = offset[start:end]
        heads = np.where(off == 0, 0, np.arange(1, end - start + 1) + off)  # CoNLL-U numbering
        rels = tuple("root" if o == 0 else strings[int(d)] for o, d in zip(off, dep[start:end], strict=True))
        sid = ids[k] if k < len(ids) else f"{doc.user_data.get('source', 'text')}#{len(out) + 1}"
        out.append(Tree(sid, tuple(words[start:end]), tuple(int(h) for h in heads), rels))
    return out


def read_conllu_trees(path: Path) -> list[Tree]:
    """A CoNLL-U file or folder, validated (file:line errors), as Trees: each word's HEAD as
    written, its DEPREL (``_`` read as ``dep``), a root word labelled ``root``; the trees a
    spaCy Doc of the treebank gives, read without building one (spaCy is not imported)."""
    from depthprobe.probes.data.conllu import read_treebank

    return [
        Tree(
            s.sent_id,
            tuple(t.form for t in s.tokens),
            tuple(t.head for t in s.tokens),
            tuple("root" if t.head == 0 else t.deprel if t.deprel != "_" else "dep" for t in s.tokens),
        )
        for s in read_treebank(path)
    ]


def read_trees(data: Path | None, parser: str | None) -> list[Tree]:
    if parser is not None:
        if data is None:
            raise ProbeError("--parser parses raw text: give the text file with --data text.txt")
        if data.suffix in (".conllu", ".conll") or data.is_dir():
            raise ProbeError(f"{data} is a treebank, which has its own trees; drop --parser (it is for raw text files)")
        from depthprobe.probes.data.parse import parse_text

        trees = []
        for k, doc in enumerate(parse_text(data, parser)):
            doc.user_data["source"] = f"{data.name}:{k + 1}"
            trees.extend(trees_from_doc(doc))
        return trees
    if data is not None and data.is_file() and data.suffix in (".txt", ".text"):
        raise ProbeError(
            f"{data} is raw text; parse it with --parser NAME (an installed spaCy pipeline, "
            "e.g. en_core_web_sm) or give a CoNLL-U treebank"
        )
    return read_conllu_trees(data if data is not None else SAMPLE)


# ---------------------------------------------------------------- pure metric functions


def predict_governors(w: torch.Tensor, n_words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Most-attended other word, both directions.

    w: [batch, ..., word, word] word-to-word attention (specials already removed), OVERWRITTEN:
    its diagonal is zeroed and entries outside a sentence's words set to -inf. n_words: [batch].
    Returns (dependent->head: argmax of each row, head->dependent: argmax of each column), both
    [batch, ..., word]; ties go to the leftmost word (torch.argmax returns the first maximum).
    """
    n = w.shape[-1]
    w.diagonal(dim1=-2, dim2=-1).zero_()
    past_end = torch.arange(n, device=w.device)[None, :] >= n_words.to(w.device)[:, None]  # [b, n]
    outside = past_end[:, :, None] | past_end[:, None, :]  # [b, n, n]
    w.masked_fill_(outside.view(outside.shape[0], *([1] * (w.dim() - 3)), n, n), float("-inf"))
    # argmax over a contiguous last axis is several times faster than over a strided one
    return w.argmax(-1), w.transpose(-1, -2).contiguous().argmax(-1)


def layer_governors(
    pattern: torch.Tensor, units: torch.Tensor, n_words: torch.Tensor, show: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One layer's pattern [batch, head, query, key] -> predicted governors in both directions
    ([batch, head, word] each, as :func:`predict_governors`) and, when ``show`` is a row, that
    sentence's word-level attention [head, n, n] (float32, CPU). Heads go HEAD_CHUNK (1) at a time,
    so the float64 word-level maps of a whole layer are never held at once (each head's are
    computed alone: the chunking changes no value)."""
    n_max = int(n_words.max())
    dep, gov, shown = [], [], []
    for h in range(0, pattern.shape[1], HEAD_CHUNK):
        w = word_attention(pattern[:, h : h + HEAD_CHUNK], units)[..., 1 : n_max + 1, 1 : n_max + 1]  # [b, h, n, n]
        if show is not None:
            n = int(n_words[show])
            shown.append(w[show, :, :n, :n].to("cpu", torch.float32))
        d, g = predict_governors(w, n_words)
        dep.append(d)
        gov.append(g)
    return torch.cat(dep, 1), torch.cat(gov, 1), torch.cat(shown) if shown else None


def baseline_correct(position: torch.Tensor, n: torch.Tensor, gold: torch.Tensor, root: bool) -> torch.Tensor:
    """Fixed-offset baselines: [words] CoNLL-U positions, lengths, gold heads -> [words, offsets] bool."""
    off = torch.tensor(OFFSETS, device=position.device)
    pred = position[:, None] + off[None, :]  # [m, offsets]
    low = 0 if root else 1
    pred = torch.minimum(pred.clamp(min=low), n[:, None])
    return pred == gold[:, None]


def best_head(acc: np.ndarray) -> tuple[int, int, int]:
    """acc: [direction, layer, head] -> (layer, head, direction) of the best; ties: lowest layer,
    lowest head, dependent->head first."""
    flat = np.transpose(acc, (1, 2, 0)).reshape(-1)  # order: layer, head, direction
    k = int(np.argmax(flat))
    n_heads, n_dir = acc.shape[2], acc.shape[0]
    return k // (n_heads * n_dir), (k // n_dir) % n_heads, k % n_dir


def best_offset(acc: np.ndarray) -> int:
    """acc: [offsets] -> index of the best offset; ties: nearest 0, then the leftward one."""
    order = sorted(range(len(OFFSETS)), key=lambda i: (-acc[i], abs(OFFSETS[i]), OFFSETS[i]))
    return order[0]


# ---------------------------------------------------------------- the task


@dataclass
class State:
    model: Model
    relations: list[str]  # row r of the counts; the last row is ALL
    index: dict[str, int]
    baseline_root: bool
    correct: torch.Tensor  # [relation, direction, layer, head] float64
    total: torch.Tensor  # [relation] float64
    base: torch.Tensor  # [relation, offset] float64
    sentences: int = 0
    view: dict | None = None  # word-level attention of one example sentence, for the report


class Syntax(Task[Options, State]):
    name = "syntax"
    description = CARDS["syntax"].description

    def load(self, model: Model, ctx: Context[Options]) -> Examples:
        trees = read_trees(ctx.data, ctx.options.parser)
        limit = model.input_limit(ctx.config.max_len)
        kept: list[Example] = []
        skipped, wanted = 0, ctx.config.limit
        for start in range(0, len(trees), ENCODE_CHUNK):  # one tokenizer call per chunk of sentences
            if wanted is not None and len(kept) >= wanted:
                break
            chunk = trees[start : start + ENCODE_CHUNK]
            for tree, pieces in zip(chunk, word_pieces_many(model, [t.words for t in chunk]), strict=True):
                if wanted is not None and len(kept) >= wanted:
                    break
                enc = encode_pieces(model, pieces)
                if len(enc) > limit:
                    skipped += 1
                else:
                    kept.append(Example(tree, enc))
        if not kept:
            raise ProbeError(
                f"every sentence is longer than --max-len {limit} pieces; raise --max-len "
                f"(model limit {model.info.max_len})"
            )
        return Examples(kept, skipped=skipped, why=f"longer than {limit} pieces incl. specials")

    def batches(self, model: Model, examples: list[Any], ctx: Context[Options]) -> Iterator[Batch]:
        return length_batches(examples, [e.enc.ids for e in examples], ctx.config.batch_size, model.pad_id)

    def hook_names(self, model: Model, ctx: Context[Options]) -> list[str]:
        return pattern_names(model.info.n_layers)

    def start(self, model: Model, ctx: Context[Options], examples: Examples) -> State:
        freq = Counter(r for e in examples for r in e.tree.rels)
        relations = [*sorted(freq, key=lambda r: (-freq[r], r)), ALL]
        L, H, R = model.info.n_layers, model.info.n_heads, len(relations)
        f64: dict[str, Any] = dict(dtype=torch.float64, device=model.device)
        return State(
            model=model,
            relations=relations,
            index={r: i for i, r in enumerate(relations)},
            baseline_root=ctx.options.baseline_root,
            correct=torch.zeros(R, len(DIRECTIONS), L, H, **f64),
            total=torch.zeros(R, **f64),
            base=torch.zeros(R, len(OFFSETS), **f64),
        )

    def reducer(self, state: State, batch: Batch) -> Reduce:
        """Each layer's pattern -> its predicted governors (and the shown sentence's word-level
        attention) as the hook fires: a batch never holds every layer's attention maps."""
        items: list[Example] = list(batch.items)
        layers = {name: layer for layer, name in enumerate(pattern_names(state.model.info.n_layers))}
        n_words = torch.tensor([e.enc.n_words for e in items])
        show = self._view_row(state, items)
        units: list[torch.Tensor] = []  # [b, unit, pos], built on the first pattern (its length and device)

        def reduce(name: str, pattern: torch.Tensor) -> Any:
            if name not in layers:
                return pattern
            if not units:
                units.append(unit_matrix([e.enc for e in items], pattern.shape[-1], pattern.device))
            return layer_governors(pattern, units[0], n_words, show)

        return reduce

    def accumulate(self, state: State, batch: Batch, acts: Captured) -> None:
        info = state.model.info
        items: list[Example] = list(batch.items)
        names = pattern_names(info.n_layers)
        dev = state.correct.device
        n_max = max(e.enc.n_words for e in items)
        n_words = torch.tensor([e.enc.n_words for e in items], device=dev)
        pred = torch.empty(
            len(items), len(DIRECTIONS), info.n_layers, info.n_heads, n_max, dtype=torch.long, device=dev
        )  # [b, dir, layer, head, word]: predicted governor (word index)
        shown, reduce = [], self.reducer(state, batch)
        for layer, name in enumerate(names):  # reduced as each hook fired (or here, given whole patterns)
            got = acts[name]
            pred[:, 0, layer], pred[:, 1, layer], view = reduce(name, got) if torch.is_tensor(got) else got
            if view is not None:
                shown.append(view)
        show = self._view_row(state, items)
        if show is not None and shown:
            state.view = {
                "words": list(items[show].tree.words),
                "sent_id": items[show].tree.sent_id,
                "w": torch.stack(shown),
            }  # [layer, head, n, n]
        gold = torch.zeros(len(items), n_max, dtype=torch.long, device=dev)  # [b, n] CoNLL-U heads
        rel = torch.zeros(len(items), n_max, dtype=torch.long, device=dev)
        for b, e in enumerate(items):
            gold[b, : e.enc.n_words] = torch.tensor(e.tree.heads)
            rel[b, : e.enc.n_words] = torch.tensor([state.index[r] for r in e.tree.rels])
        real = torch.arange(n_max, device=dev)[None, :] < n_words[:, None]  # [b, n]
        hit = pred + 1 == gold[:, None, None, None, :]  # predicted unit == gold unit (ROOT = 0 never)
        hit = hit.permute(0, 4, 1, 2, 3)[real]  # [b, n, dir, l, h] -> [words, dir, l, h]
        position = torch.arange(1, n_max + 1, device=dev)[None, :].expand(len(items), n_max)[real]
        base = baseline_correct(
            position, n_words[:, None].expand(-1, n_max)[real], gold[real], state.baseline_root
        )  # [words, offset]
        self._add(state, rel[real], hit, base)
        state.sentences += len(items)

    @staticmethod
    def _add(state: State, r: torch.Tensor, hit: torch.Tensor, base: torch.Tensor) -> None:
        """Scatter per-word hits into the per-relation counts (and ALL) with one matmul each.
        float32 counts are exact here (a batch has far fewer than 2**24 words)."""
        m, n_rel = r.numel(), len(state.relations)
        member = torch.zeros(m, n_rel, dtype=torch.float32, device=r.device)  # [words, relation]
        member[torch.arange(m, device=r.device), r] = 1.0
        member[:, -1] = 1.0  # every word counts in ALL
        flat = hit.reshape(m, -1).to(torch.float32)  # [words, dir * layer * head]
        state.correct += (member.T @ flat).view(state.correct.shape).to(torch.float64)
        state.total += member.sum(0).to(torch.float64)
        state.base += (member.T @ base.to(torch.float32)).to(torch.float64)

    @staticmethod
    def _view_row(state: State, items: list[Example]) -> int | None:
        """Row of one short sentence whose attention the report shows (until one is found)."""
        if state.view is not None:
            return None
        return next((b for b, e in enumerate(items) if 5 <= e.enc.n_words <= 20), None)

    def merge(self, a: State, b: State) -> State:
        if a.relations != b.relations:
            raise ValueError("syntax: merge needs two states started over the same examples")
        a.correct += b.correct.to(a.correct.device)
        a.total += b.total.to(a.total.device)
        a.base += b.base.to(a.base.device)
        a.sentences += b.sentences
        a.view = a.view if a.view is not None else b.view  # the first shown sentence, as one run finds it
        return a

    def finalize(self, state: State, ctx: Context[Options]) -> Output:
        info = state.model.info
        correct, total, base = (t.cpu().numpy() for t in (state.correct, state.total, state.base))
        acc = correct / np.maximum(total, 1)[:, None, None, None]  # [relation, dir, layer, head]
        base_acc = base / np.maximum(total, 1)[:, None]  # [relation, offset]
        scores = self._scores(state, acc, total, ctx)
        summary, best, heads = self._summary(state, acc, base_acc, total)
        baselines = pd.DataFrame(
            [
                {"relation": rel, "offset": off, "count": int(total[i]), "accuracy": float(base_acc[i, j])}
                for i, rel in enumerate(state.relations)
                for j, off in enumerate(OFFSETS)
            ]
        )
        heatmaps: list[HeatmapPanel] = [
            {
                "title": f"{rel}: {b['direction']} (best {b['best_head']}, {b['accuracy']:.1f}%)",
                "metric": "accuracy",
                "where": {"relation": rel, "direction": b["direction"]},
            }
            for rel, b in best.items()
            if rel in HEATMAP_RELATIONS
        ]
        headline = {
            "n_sentences": state.sentences,
            "n_words": int(total[-1]),
            "best": {rel: best[rel] for rel in HEATMAP_RELATIONS if rel in best},
        }
        return Output(
            scores=scores,
            summary=summary,
            notes=self._notes(state, ctx),
            headline=headline,
            heatmaps=heatmaps,
            views=self._views(state, best, heads, info.causal),
            files={"baselines.csv": baselines.to_csv(index=False).encode()},
        )

    def _scores(self, state: State, acc: np.ndarray, total: np.ndarray, ctx: Context) -> pd.DataFrame:
        _R, _D, _L, _H = acc.shape
        r, d, layer, head = (g.reshape(-1) for g in np.meshgrid(*map(np.arange, acc.shape), indexing="ij"))
        df = pd.DataFrame(
            {
                "layer": layer,
                "head": head,
                "metric": "accuracy",
                "value": acc.reshape(-1),
                "relation": np.array(state.relations, dtype=object)[r],
                "direction": np.array(DIRECTIONS, dtype=object)[d],
                "count": total[r].astype(int),
            }
        )
        return tidy(df, ctx.config.model, self.name)

    def _summary(
        self, state: State, acc: np.ndarray, base_acc: np.ndarray, total: np.ndarray
    ) -> tuple[pd.DataFrame, dict, dict[str, tuple[int, int]]]:
        rows: list[dict] = []
        best: dict = {}
        heads: dict[str, tuple[int, int]] = {}
        order = [len(state.relations) - 1, *range(len(state.relations) - 1)]  # ALL first
        for i in order:
            rel = state.relations[i]
            layer, head, d = best_head(acc[i])
            j = best_offset(base_acc[i])
            a, b = 100 * acc[i, d, layer, head], 100 * base_acc[i, j]
            clark = UD_TO_CLARK.get(rel, rel)
            published = CLARK_TABLE1.get(clark)
            row = {
                "relation": rel,
                "count": int(total[i]),
                "best_head": head_label(layer, head),
                "clark_notation": head_label(layer + 1, head + 1),
                "direction": DIRECTIONS[d],
                "accuracy": round(a, 2),
                "baseline": round(b, 2),
                "offset": OFFSETS[j],
                "gain": round(a - b, 2),
                "clark_label": clark if published or rel in UD_TO_CLARK else "",
                "clark_head": published[0] if published else "",
                "clark_accuracy": published[1] if published else None,
                "clark_baseline": published[2] if published else None,
            }
            rows.append(row)
            heads[rel] = (int(layer), int(head))  # structured; the rows carry the printed labels
            best[rel] = {
                k: row[k]
                for k in ("best_head", "clark_notation", "direction", "accuracy", "baseline", "offset", "count")
            }
        return pd.DataFrame(rows), best, heads

    @staticmethod
    def _notes(state: State, ctx: Context) -> list[str]:
        info = state.model.info
        notes = [
            f"{state.sentences} sentences, {int(state.total[-1])} words; predicted governor = most-attended other "
            "word (diagonal zeroed, specials excluded, ties to the leftmost word); ALL includes root and punct "
            "(a root's governor is ROOT, never predicted)",
            "best head: ties go to the lowest layer, then head, then dependent->head; layer-head is 0-indexed, "
            "clark_notation is Clark et al.'s 1-indexed form",
            "baseline: best fixed offset in -3..2, predicted head = clip(position + offset, "
            + ("0 (ROOT)" if state.baseline_root else "1")
            + ", n) in CoNLL-U numbering",
            "Clark et al. (BERT-base, WSJ, Stanford Dependencies) beside ours: obj~dobj, compound~nn, "
            "aux:pass~auxpass, nmod:poss~poss, compound:prt~prt; UD has no pobj/prep (the preposition is a case "
            "dependent of its noun), and Clark's special case for poss + 's is not applied",
        ]
        if info.causal:
            notes.insert(
                0,
                "causal model: a word only sees leftward words, so dependent->head cannot predict a "
                "rightward governor and head->dependent cannot predict a leftward one (a word with no "
                "visible other word falls back to the leftmost word by the tie rule)",
            )
        if ctx.options.parser:
            notes.append(f"trees predicted by the spaCy pipeline {ctx.options.parser!r} (its label scheme)")
        return notes

    @staticmethod
    def _views(state: State, best: dict, best_heads: dict[str, tuple[int, int]], causal: bool) -> list[ViewPanel]:
        if state.view is None:
            return []
        heads, labels = [], []
        for rel in HEATMAP_RELATIONS:
            if rel in best:
                layer, head = best_heads[rel]
                heads.append((layer, head))
                labels.append(f"{head_label(layer, head)} {rel} ({best[rel]['direction']})")
        w = state.view["w"]
        pattern = [w[layer, head].tolist() for layer, head in heads]
        return [
            {
                "title": f"word-level attention of the best heads on {state.view['sent_id']}",
                "tokens": state.view["words"],
                "pattern": pattern,
                "heads": labels,
                "causal": causal,
            }
        ]
