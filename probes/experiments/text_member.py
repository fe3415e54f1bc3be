"""One member of a text study (levine, petty, spa), as an independent job: build, probe at init,
train, evaluate, probe.

:class:`TextJob` is the member: it counts, builds, trains and saves itself (a native decoder; spa's
members subclass it). :func:`measure` is a pure function of its job (the same job gives the same
numbers on any machine with the same device kind). With ``TextJob.dest`` (the local backend) the
member writes its folder there itself, atomically; without it (a Ray task) it returns its files as
bytes. A probe run keeps its tables, not an HTML report. A member that fails raises; the runner
records it as ``failed`` with its error. Importing this module imports no torch (a family module
subclasses :class:`TextJob` and ``probe study --help`` imports the family modules).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthprobe.probes.base.artifacts import write_csv
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.experiments import member_depth
from depthprobe.probes.models import families

if TYPE_CHECKING:
    from depthprobe.probes.data import corpus as corpora
    from depthprobe.probes.models import family_member
    from depthprobe.probes.models.model import Model
    from depthprobe.probes.training.lm import LMConfig, Trainable


@dataclass(frozen=True)
class TextJob:
    """One member of a text study: its shape, seed and the study's settings. It counts, builds,
    trains and saves itself as a native decoder; a family whose members are another network gives
    a subclass (spa's :class:`~.spa.VariantJob`)."""

    member: family_member.Member
    seed: int
    config: Any
    corpus_digest: str | None = None  # the corpus text the driver checked: a member refuses another one
    dest: str | None = None  # members/<name>/ when the member writes its own folder (local backend)
    corpus: corpora.Corpus | None = field(default=None, compare=False, repr=False)  # the driver's (local backend)

    @property
    def name(self) -> str:
        return f"{self.member.name}-s{self.seed}"

    def net_config(self, vocab: int) -> Any:
        """The network's config (its ``n_params()``: the count --max-params sees, without building)."""
        return self.member.native(vocab, self.config.context, self.seed)

    def network(self, vocab: int, device: Any) -> Model:
        """The member's model at init, named after the member (no tokenizer)."""
        from depthprobe.probes.models.loading import load

        model = load(self.net_config(vocab), device=device)
        model.info = dataclasses.replace(model.info, name=self.name)
        return model

    def trainable(self, model: Model) -> Trainable:
        """How the training loop drives the model (training/lm.py)."""
        from depthprobe.probes.training import lm

        return lm.native(model)

    def save(self, model: Model, corpus: corpora.Corpus, folder: Path) -> None:
        """The trained member with its tokenizer, reloadable with ``probes.load(folder)``."""
        from depthprobe.probes.data import corpus as corpora
        from depthprobe.probes.models.checkpoints import save_checkpoint

        save_checkpoint(model, folder, self.stamp(corpus), write_more=partial(corpora.save_tokenizer, corpus.tokenizer))

    def sizes(self, vocab: int) -> tuple[int, int] | None:
        """(non-embedding, embedding) parameters without building the model (None: only by building)."""
        m = self.member
        nonembed = families.nonembed_params(m.depth, m.d_model, m.d_attn, m.d_ff)
        return nonembed, families.embed_params(m.d_model, vocab, self.config.context)

    # -- the same for every network ------------------------------------------------------------
    def build(self, corpus: corpora.Corpus, device: Any) -> Model:
        """The member's model at init, with the corpus's tokenizer attached."""
        from depthprobe.probes.data import corpus as corpora

        model = self.network(corpus.vocab, device)
        model.tokenizer = corpora.hf_tokenizer(corpus.tokenizer)
        model.special_ids = frozenset({corpus.bos})
        return model

    def counted(self, vocab: int) -> tuple[int, int]:
        """(non-embedding, embedding) parameters: :meth:`sizes`, or the model built on the CPU and counted."""
        return self.sizes(vocab) or families.count_params(self.network(vocab, "cpu"))

    def stamp(self, corpus: corpora.Corpus) -> dict[str, Any]:
        """What a saved checkpoint says it is."""
        return {"study": {"member": self.name, "family": self.member.family, "corpus": corpus.label}}

    @property
    def tokens(self) -> int:
        """Training tokens for the member's budget (the same for every member sharing it); without a
        budget (spa), for the weight matrices every variant shares, (4 width + 2 d_ff) * width * depth."""
        m = self.member
        shared = (4 * m.d_model + 2 * m.d_ff) * m.d_model * m.depth
        return int(self.config.tokens_for(m.budget if m.budget is not None else shared))

    def flops(self, tokens: float, nonembed: int, vocab: int) -> float:
        """Training FLOPs of ``tokens`` (Kaplan et al.'s 6 N + 6 L n_ctx d_attn per token)."""
        m = self.member
        return tokens * families.flops_per_token(nonembed, m.d_model * vocab, m.depth, m.d_attn, self.config.context)

    def size_columns(self, nonembed: int, embed: int) -> dict[str, Any]:
        """params_* columns, the embedding share and (with a budget) how far the count misses it."""
        m, total = self.member, nonembed + embed
        out: dict[str, Any] = {
            "params_nonembed": nonembed,
            "params_embed": embed,
            "params_total": total,
            "embed_share": embed / total,
        }
        if m.budget is not None:
            counted = total if m.match == "total" else nonembed
            out.update(match=m.match, budget_miss=(counted - m.budget) / m.budget)
        return out


def job_corpus(job: TextJob) -> corpora.Corpus:
    """The corpus the member trains on: the one the driver read and checked, carried by the job
    (a local study: a pipe serves too), else read here (a Ray member, a job run alone), refused
    when it is not the text the driver checked."""
    from depthprobe.probes.data.corpus import load_corpus

    cfg = job.config
    corpus = job.corpus if job.corpus is not None else load_corpus(cfg.corpus, vocab=cfg.vocab)
    if job.corpus_digest is not None and corpus.digest != job.corpus_digest:
        raise ProbeError(f"--corpus {cfg.corpus} changed while the study ran; rerun the study with a new --out")
    return corpus


def probe_inputs(corpus: corpora.Corpus, n: int, context: int) -> list[str]:
    """Up to ``n`` pieces of the validation text for the text probes (kernels, attention-stats):
    its lines of 3 or more words, in order; a line longer than the context (BOS + its pieces) is
    cut into runs of whole words that fit, so that a corpus without line breaks is probed too."""
    limit = context - 1
    out: list[str] = []
    for line in corpus.val_text.splitlines():
        if len(out) >= n:
            break
        if len(line.split()) < 3:
            continue
        if _n_pieces(corpus, line.strip()) <= limit:
            out.append(line.strip())
        else:
            out.extend(_cut(corpus, line.split(), limit))
    return out[:n]


def _n_pieces(corpus: corpora.Corpus, text: str) -> int:
    return len(corpus.tokenizer.encode(text, add_special_tokens=False).ids)


def _cut(corpus: corpora.Corpus, words: list[str], limit: int) -> list[str]:
    """Runs of whole words of at most ``limit`` pieces each (byte-level BPE pre-tokenizes at spaces,
    so a run's pieces are its words' pieces); runs of fewer than 3 words are dropped."""
    runs: list[list[str]] = [[]]
    size = 0
    for w in words:
        k = _n_pieces(corpus, " " + w if runs[-1] else w)
        if runs[-1] and size + k > limit:
            runs.append([])
            k = _n_pieces(corpus, w)
            size = 0
        runs[-1].append(w)
        size += k
    texts = [" ".join(r) for r in runs if len(r) >= 3]
    return [t for t in texts if _n_pieces(corpus, t) <= limit]


def lm_config(cfg: Any, tokens: int, lr: float, seed: int) -> LMConfig:
    from depthprobe.probes.training.lm import LMConfig

    return LMConfig(tokens=tokens, batch_size=cfg.batch_size, context=cfg.context, lr=lr, seed=seed)


def pick_lr(job: TextJob, corpus: corpora.Corpus, tokens: int, device: Any) -> tuple[float, list[dict[str, Any]]]:
    """The grid's best learning rate, each tried from the same init on lr_fraction of the budget."""
    from depthprobe.probes.training.lm import train_lm

    cfg = job.config
    if len(cfg.lrs) == 1:
        return cfg.lrs[0], []
    short = max(cfg.batch_size * cfg.context, round(tokens * cfg.lr_fraction))
    trials = []
    for lr in cfg.lrs:
        model = job.build(corpus, device)
        try:
            val = train_lm(job.trainable(model), corpus, lm_config(cfg, short, lr, job.seed)).val["val_loss"]
        except ProbeError:
            val = math.inf  # diverged at this rate
        trials.append({"lr": lr, "tokens": short, "val_loss": val})
    best = min(trials, key=lambda t: t["val_loss"])
    if not math.isfinite(best["val_loss"]):
        raise ProbeError(f"every learning rate of the grid diverged ({list(cfg.lrs)}); try smaller --lr values")
    return best["lr"], trials


def measure(job: TextJob, folder: Path, row: dict[str, Any]) -> dict[str, Any]:
    """Build, probe, train and probe the member (refused above --max-params), writing its files
    (checkpoint, loss.csv, runs/) into ``folder`` and its results into ``row``; returns its corpus
    for member.json."""
    import pandas as pd

    from depthprobe.probes.data.memory import Text
    from depthprobe.probes.experiments.probing import mean_metric, probe
    from depthprobe.probes.models.device import resolve_device, size_limit
    from depthprobe.probes.training.lm import LOG_COLUMNS, train_lm

    cfg = job.config
    device = resolve_device(cfg.device)
    corpus = job_corpus(job)
    lines = probe_inputs(corpus, cfg.probe_lines, cfg.context)  # the text probes read them in memory
    with size_limit(cfg.max_params):
        model = job.build(corpus, device)
    nonembed, embed = families.count_params(model)
    lr, trials = pick_lr(job, corpus, job.tokens, device)
    init = probe(model, "kernels", folder / "runs" / "kernels-init", data=lines, max_len=cfg.context)
    run = train_lm(job.trainable(model), corpus, lm_config(cfg, job.tokens, lr, job.seed))
    write_csv(folder / "loss.csv", pd.DataFrame(run.log, columns=LOG_COLUMNS))
    if trials:
        write_csv(folder / "lr_grid.csv", pd.DataFrame(trials))
    job.save(model, corpus, folder / "checkpoint")
    ind = probe(
        model,
        "induction",
        folder / "runs" / "induction",
        max_len=cfg.context,
        icl_text=Text(corpus.val_text),
        icl_windows=cfg.icl_windows,
        repeat_len=min(25, (cfg.context - 1) // 2),
    )
    ker = probe(model, "kernels", folder / "runs" / "kernels", data=lines, max_len=cfg.context)
    att = probe(model, "attention-stats", folder / "runs" / "attention-stats", data=lines, max_len=cfg.context)
    if cfg.depth_usage:  # after every other measurement: nothing above depends on it
        member_depth.write_depth_usage(model, lines, folder, job.name, max_len=cfg.context)
    row.update(job.size_columns(nonembed, embed))
    row.update(
        tokens=run.tokens,
        passes=run.tokens / corpus.train_ids.numel(),
        lr=lr,
        flops=job.flops(run.tokens, nonembed, corpus.vocab),
        val_loss=run.val["val_loss"],
        val_bpb=run.val["val_bpb"],
        induction_best=ind.headline.get("best_induction_score"),
        induction_chance=ind.headline.get("induction_chance"),
        icl_score=ind.headline.get("icl_score"),
        kernel_cos_last=ker.headline.get("final_mean_cosine"),
        kernel_cos_last_init=init.headline.get("final_mean_cosine"),
        entropy_mean=mean_metric(att, "entropy"),
        tokens_per_s=run.tokens_per_s,
        device=str(device),
    )
    return {"corpus": corpus.label, "corpus_key": corpus.key, "corpus_digest": corpus.digest}


__all__ = ["TextJob", "job_corpus", "measure", "probe_inputs"]
