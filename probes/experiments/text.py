"""What the text-study families (levine, petty, spa; docs/protocols.md §3.7) share, as :class:`TextExperiment`.

A text family trains decoders of one equal-parameter family (``probes.models.families``) on a
corpus (read, split and tokenized once: ``data/corpus.py``) and probes every member at init and
after training. A family module gives its Config, its preset table, members
(:meth:`TextExperiment.members`), report section and prediction (the paper's expectation, which the
section states), and where its members are another network than the native decoder, their
:attr:`~TextExperiment.Job` (a :class:`~.text_member.TextJob` that counts, builds, trains and saves
itself: spa's ``VariantJob``); this base gives the corpus checks (a context the corpus cannot fill, a
validation text without probe inputs, ``--max-params`` below every member, more than
``max_passes`` passes over the training split: refused before anything is written), the plan's
costs (``plan.csv``), the member run (:mod:`.text_member`), the id columns of its depth tables, the
note on its member table and the probe curves of the report.

``plan.csv``'s CPU minutes are the training FLOPs (Kaplan et al.'s 6 N + 6 L n_ctx d_attn per
token, the learning-rate grid's trials included) divided by :attr:`TextExperiment.cpu_flops`,
training throughputs measured on this project's reference machine (2 CPU cores, one member at a
time): 33-39 GFLOP/s for native members (the lowest taken), 2.4-4.4k tokens/s for the spa cpu
preset's depth-8 member (1.58 MFLOP per token; the lowest taken); the probes add seconds to a
minute per member on top.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.experiments.protocol import RUN_COLUMNS, Experiment
from depthprobe.probes.experiments.text_config import parse_budgets, parse_vocab
from depthprobe.probes.experiments.text_member import TextJob, measure, probe_inputs

if TYPE_CHECKING:
    import pandas as pd

    from depthprobe.probes.data.corpus import Corpus
    from depthprobe.probes.models.family_member import Member
    from depthprobe.probes.render.study_data import StudyData

# a member's sizes, tokens and FLOPs (members.csv and plan.csv)
SIZES = [
    "budget",
    "match",
    "budget_miss",
    "params_nonembed",
    "params_embed",
    "params_total",
    "embed_share",
    "tokens",
    "passes",
    "flops",
]
SHAPES = ["depth", "d_model", "d_ff", "d_ff_ratio", "n_heads", "d_head"]
COLUMNS = [
    "family",
    "member",
    "variant",
    *SHAPES,
    *SIZES,
    "seed",
    "lr",
    "val_loss",
    "val_bpb",
    "induction_best",
    "induction_chance",
    "kernel_cos_last",
    "kernel_cos_last_init",
    "entropy_mean",
    "icl_score",
    "tokens_per_s",
    *RUN_COLUMNS,
]
PLAN_COLUMNS = ["family", "member", *SHAPES, *SIZES, "cpu_minutes"]  # plan.csv
TASK_ORDER = ("induction", "kernels", "kernels-init", "attention-stats")


class PassesRefused(ProbeError):
    """More passes over the training split than ``max_passes``; ``context`` is the corpus (a dry run reports it)."""

    def __init__(self, message: str, context: Any) -> None:
        super().__init__(message)
        self.context = context


class TextExperiment(Experiment):
    """A text-study family; subclasses give Config, presets and costs (one preset table), :meth:`members`,
    :meth:`section` and :attr:`prediction` (and their :attr:`Job` where it is not a native decoder)."""

    columns: ClassVar[list[str]] = COLUMNS
    resumable: ClassVar[tuple[str, ...]] = ("device", "max_params", "max_passes")
    aliases: ClassVar[dict[str, str]] = {"lr": "lrs", "width": "d_model"}
    # --budgets: levine's and petty's (another family refuses the option before any parser runs)
    parsers: ClassVar[dict[str, Callable[[str], Any]]] = {"vocab": parse_vocab, "budgets": parse_budgets}
    cpu_flops: ClassVar[float] = 3.3e10  # training FLOP/s of the reference machine for this family's members
    Job: ClassVar[type[TextJob]] = TextJob  # the member: how it is counted, built, trained and saved
    prediction: ClassVar[str]  # what the paper leads one to expect (the family's section says it)
    id_columns: ClassVar[tuple[str, ...]] = ("variant", "depth", "d_model", "n_heads", "budget", "seed")
    members_note: ClassVar[str] = (
        "<p class='meta'>embed_share: the embedding part (token embedding, positions, unembedding) of each member's "
        "parameters (params_total); budget_miss: how far the count --match names is from its budget; passes: passes "
        "over the training split.</p>"
    )

    # -- what a text family gives --------------------------------------------------------------
    def members(self, cfg: Any) -> list[Member]:
        raise NotImplementedError

    def section(self, study: StudyData) -> str:
        raise NotImplementedError

    def group(self, study: StudyData, row: Any) -> str:
        """The label of a member's line in the kernel section."""
        return str(row.get("variant") or "?")

    # -- the protocol --------------------------------------------------------------------------
    def plan(self, config: Any) -> list[TextJob]:
        """Every member of the study times every seed, in a fixed order (seed-major)."""
        members = self.members(config)
        return [self.Job(m, s, config) for s in range(config.seeds) for m in members]

    def base_row(self, job: TextJob) -> dict[str, Any]:
        """The member's shape columns (sizes at the configured vocabulary; a trained member's row
        replaces them with the counts of the built model)."""
        row = super().base_row(job)
        row.update({c: getattr(job.member, c) for c in ("variant", *SHAPES, "budget")}, seed=job.seed)
        sizes = job.sizes(job.config.vocab)
        if sizes is not None:
            row.update(job.size_columns(*sizes))
        return row

    def measure(self, job: TextJob, folder: Path, row: dict[str, Any]) -> dict[str, Any]:
        return measure(job, folder, row)

    def line(self, row: dict[str, Any]) -> str:
        return f"val_loss {row['val_loss']:.4f} nats/token ({row['val_bpb']:.4f} bits/byte), {row['wall_s']:.0f} s"

    def prepare(self, config: Any, jobs: list[TextJob], say: Callable[[str], None]) -> Corpus:
        """Read the corpus once and refuse what would fail every member (before anything is written)."""
        from depthprobe.probes.data.corpus import load_corpus

        corpus = load_corpus(config.corpus, vocab=config.vocab)  # a bad corpus fails here (its tokenizer is cached)
        self.check_corpus(config, corpus, jobs)
        worst = max(jobs, key=lambda j: j.tokens)
        tokens, train = worst.tokens, int(corpus.train_ids.numel())
        if tokens / train > config.max_passes:
            need = math.ceil(tokens / config.max_passes)
            raise PassesRefused(
                f"member {worst.member.name} would make {tokens / train:.1f} passes over the {train:,} training "
                f"tokens of {corpus.label}, more than --max-passes {config.max_passes:g}; give a larger --corpus (at "
                f"least {need:,} training tokens), fewer tokens (--tokens-per-param, --min-tokens), or raise "
                "--max-passes",
                corpus,
            )
        say(f"passes over the training split ({train:,} tokens): {tokens / train:.2f} (the most of any member)")
        return corpus

    def check_corpus(self, cfg: Any, corpus: Corpus, jobs: list[TextJob]) -> None:
        from depthprobe.probes.data import corpus as corpora

        corpora.train_batch(corpus.train_ids, 0, 0, 1, cfg.context)
        corpora.val_windows(corpus.val_ids, cfg.context, corpus.bos, limit=1)
        if not probe_inputs(corpus, 1, cfg.context):
            raise ProbeError(
                "the validation text (the last 10% of --corpus) has no line of 3 or more words for the probes "
                "(kernels, attention-stats); give a corpus of sentences or paragraphs, not one word a line"
            )
        smallest = min(j.net_config(corpus.vocab).n_params() for j in jobs)
        if cfg.max_params is not None and smallest > cfg.max_params:
            raise ProbeError(
                f"--max-params {cfg.max_params:,} is below every member (the smallest has {smallest:,} parameters); "
                "raise --max-params or drop it"
            )

    def bind(self, job: TextJob, context: Corpus, dest: str | None) -> TextJob:
        """A local member carries the corpus the driver read (its process reads nothing again; a pipe
        serves too); a Ray member reads it and checks its digest."""
        corpus = context if dest is not None else None
        return dataclasses.replace(job, corpus_digest=context.digest, dest=dest, corpus=corpus)

    def record(self, config: Any, context: Corpus) -> dict[str, Any]:
        return {"corpus": {"label": context.label, "digest": context.digest, "key": context.key}}

    def check_same(self, folder: Path, config: Any, context: Corpus, saved: dict[str, Any]) -> None:
        recorded = saved.get("corpus")
        if not isinstance(recorded, dict) or recorded.get("digest") != context.digest:
            raise ProbeError(
                f"{folder} holds a study of another text: --corpus {config.corpus or 'the built-in text'} changed "
                f"since that study ran; pass a new --out to study the new text (or remove {folder} to train every "
                "member again)"
            )

    def headline(self, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
        cols = [
            "member",
            "depth",
            "d_model",
            "d_ff",
            "params_nonembed",
            "params_total",
            "embed_share",
            "tokens",
            "passes",
            "val_loss",
            "val_bpb",
            "status",
        ]
        return tables["members.csv"][cols]

    def facts(self, config: Any) -> list[str]:
        return [f"corpus {config.corpus or 'built-in Tiny Shakespeare'}"]

    def plan_row(self, config: Any, job: TextJob, context: Corpus) -> dict[str, Any]:
        """One member's plan: its shape and sizes at the corpus's vocabulary, tokens, passes, cost."""
        nonembed, embed = job.counted(context.vocab)
        row = {**self.base_row(job), **job.size_columns(nonembed, embed)}
        tokens = job.tokens
        grid = len(config.lrs) * config.lr_fraction * tokens if len(config.lrs) > 1 else 0.0
        flops = job.flops(tokens + grid, nonembed, context.vocab)
        row.update(
            tokens=tokens,
            passes=tokens / int(context.train_ids.numel()),
            flops=flops,
            cpu_minutes=flops / self.cpu_flops / 60,
        )
        return {c: row.get(c) for c in PLAN_COLUMNS}

    def page(self, config: Any, tables: dict[str, pd.DataFrame], folder: Path) -> list[str]:
        from depthprobe.probes.render.study_data import StudyData
        from depthprobe.probes.render.study_sections import kernels_section, probes_section

        members = tables["members.csv"].copy()
        members["status"] = members["status"].fillna("").astype(str).str.strip()
        study = StudyData(folder, self.name, config.preset, dataclasses.asdict(config), members)
        return [self.section(study), kernels_section(study, self.group), probes_section(study, probe_curves(study))]


def probe_curves(study: StudyData) -> dict[str, tuple[pd.DataFrame, pd.DataFrame] | str]:
    """Each probe task (a run folder name under members/*/runs, TASK_ORDER first) of the drawn
    members (one seed per configuration), compared across depth (``probes.api.compare``): its
    table, labelled by member name, and its peaks; a task whose runs cannot be compared gives the
    reason instead."""
    from depthprobe.probes.api.compare import compare, is_run_dir, peaks
    from depthprobe.probes.render.study_data import probe_members

    found: dict[str, list[tuple[str, Path]]] = {}
    for m in probe_members(study):
        for d in sorted((study.folder / "members" / m / "runs").glob("[!.]*")):
            if is_run_dir(d):
                found.setdefault(d.name, []).append((m, d))
    out: dict[str, tuple[pd.DataFrame, pd.DataFrame] | str] = {}
    for task in [t for t in TASK_ORDER if t in found] + sorted(set(found) - set(TASK_ORDER)):
        try:
            table = compare([p for _, p in found[task]])
        except ProbeError as exc:
            out[task] = str(exc)
            continue
        name = {str(p): m for m, p in found[task]}
        table = table.assign(label=table["run"].map(name).fillna(table["label"]))
        out[task] = (table, peaks(table))
    return out


__all__ = ["COLUMNS", "PLAN_COLUMNS", "TextExperiment"]
