"""What the depth-law families (docs/protocols.md §3.9) share: the config, the plan, the tables, the page.

A law family trains small native decoders at every depth x width x seed (and per seed, and per
group where the family has groups, a wide 2-layer control with at least the parameters of the
deepest member) on a synthetic task, evaluates them per evaluation key (``k`` for khop, ``T`` for
groups) and finds the first depth that solves each key. A family module (``khop``, ``groups``)
subclasses :class:`LawExperiment` with its Config fields, its data (``source``, ``eval_sets``,
``scores``), its law table (its prediction lives there, nowhere else; ``law_columns``: its header)
and its prediction's text.

Tables (besides members.csv): ``accuracy.csv`` (per member and key: final accuracy,
``step_reached``), ``curves.csv`` (accuracy per evaluation step and key), ``law.csv`` (the family's),
and what the family adds (khop: ``hops.csv``, ``hop_layers.csv``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import ranged
from depthprobe.probes.experiments.batching import check_batch_members, read_batch_members
from depthprobe.probes.experiments.protocol import (
    MAX_SEQUENCES,
    RUN_COLUMNS,
    Experiment,
    at_least,
    check_field_ranges,
    check_members,
    distinct,
    positive,
)
from depthprobe.probes.training.rates import device_label, estimate
from depthprobe.probes.training.schedule import warmup_cosine

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from depthprobe.probes.experiments.law_member import Predict
    from depthprobe.probes.models.model import Model, NativeConfig
    from depthprobe.probes.training.loop import BatchSource

# training FLOP/s of the reference machine (2 cores) for law members, evaluations included: the cpu
# presets' 6 N x tokens over their members' measured CPU-minutes (khop 26.7 min: 3.7e10; groups
# 15 min on shared cores: 3.0e10; the lower taken)
CPU_FLOPS = 3.0e10
MAX_STEPS = 100_000_000  # training steps of a member
MAX_EVALS = 100_000  # learning-curve evaluations of a member (steps / eval_every)
USAGE_SEQUENCES = 32  # sequences the depth-usage probe of a member reads (member_depth.py)
ROW_COLUMNS = [
    "family",
    "member",
    "group",
    "depth",
    "d_model",
    "heads",
    "seed",
    "control",
    "params",
    "params_nonembed",
    "steps",
    "train_s",
    "steps_per_s",
    "batch",
    *RUN_COLUMNS,
]


@dataclass(frozen=True)
class LawConfig:
    """The settings every law family has. Members: every depth x width x seed, and with
    ``control`` a wide 2-layer model with at least the parameters of the deepest member. The
    defaults are the cpu scale: a preset sets what differs (:data:`COMMON`, the families' presets)."""

    preset: str = "smoke"
    depths: tuple[int, ...] = (1, 2)
    d_models: tuple[int, ...] = (64,)
    heads: int = 4
    seeds: int = 1
    steps: int = 3000
    batch_size: int = 32
    lr: float = 2e-3
    warmup_frac: float = 0.05
    weight_decay: float = ranged(0.01, min=0, max=10)  # AdamW's decoupled decay (per update: lr x this)
    eval_every: int = 250  # learning-curve evaluations every this many steps (and at the end)
    curve_sequences: int = ranged(128, min=1, max=MAX_SEQUENCES)  # sequences per key of each learning-curve evaluation
    eval_sequences: int = ranged(1000, min=1, max=MAX_SEQUENCES)  # sequences per key of the final evaluation
    threshold: float = 0.99  # accuracy that counts as solved (law.csv, step_reached)
    control: bool = True
    device: str | None = None
    depth_usage: bool = True  # each member's depth_usage.csv and skipped_accuracy.csv (experiments/member_depth.py)
    batch_members: str | int = "auto"  # auto, off or N: members of one shape trained as one model (batching.py)

    def __post_init__(self) -> None:
        check_field_ranges(self)  # the ranged() fields, a family's own included
        check_batch_members(self.batch_members)
        at_least(self, 1, "heads", "steps", "batch_size", "eval_every", "curve_sequences", "eval_sequences")
        check_members(self)
        if self.steps > MAX_STEPS or self.steps // self.eval_every > MAX_EVALS:
            raise ProbeError(
                f"--steps {self.steps:,} with --eval-every {self.eval_every:,} is too long: at most {MAX_STEPS:,} "
                f"steps and {MAX_EVALS:,} learning-curve evaluations; lower --steps or raise --eval-every"
            )
        bad = [d for d in self.d_models if d < 1 or d % self.heads]
        if not self.d_models or bad:
            raise ProbeError(
                f"--d-models must be positive multiples of the {self.heads} heads, got {list(self.d_models)}"
            )
        distinct(self, "d_models")
        positive(self, "lr")
        if not 0 < self.threshold <= 1:
            raise ProbeError(f"--threshold must be in (0, 1], got {self.threshold}")
        if not 0 <= self.warmup_frac < 1:
            raise ProbeError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")

    @property
    def warmup(self) -> int:
        return max(1, round(self.warmup_frac * self.steps))

    def lr_at(self, step: int) -> float:
        """Linear warm-up over ``warmup`` updates, then cosine decay to 0."""
        return warmup_cosine(step, self.lr, self.steps, self.warmup)

    def eval_steps(self) -> list[int]:
        """The learning-curve evaluation steps: every ``eval_every`` and the last."""
        return sorted({*range(self.eval_every, self.steps + 1, self.eval_every), self.steps})


# what a preset sets beyond the Config's defaults (the cpu scale), the same for every law family
COMMON: dict[str, dict[str, Any]] = {
    "smoke": {
        "d_models": (16,),
        "heads": 2,
        "steps": 40,
        "batch_size": 16,
        "eval_every": 20,
        "curve_sequences": 16,
        "eval_sequences": 32,
    },
    "cpu": {"seeds": 2},
    "gpu": {"seeds": 3, "eval_every": 500, "curve_sequences": 256, "eval_sequences": 2000},
}


@dataclass(frozen=True)
class LawJob:
    """One member: ``depth`` layers of width ``d_model`` (``control``: the wide shallow control),
    ``seed`` (init and data order), ``group`` for families with groups."""

    config: Any
    depth: int
    d_model: int
    seed: int
    control: bool = False
    group: str | None = None
    vocab: int = 0
    context: int = 0
    dest: str | None = None  # members/<name>/ when the member writes its own folder (local backend)

    @property
    def name(self) -> str:
        kind = "control-" if self.control else ""
        group = f"{self.group}-" if self.group else ""
        return f"{group}{kind}L{self.depth}-d{self.d_model}-s{self.seed}"

    def ids(self) -> dict[str, Any]:
        """What the member is, as the columns of its tables (``group`` where the family has groups)."""
        fields = (
            ["group", "depth", "d_model", "seed", "control"] if self.group else ["depth", "d_model", "seed", "control"]
        )
        return {"member": self.name, **{f: getattr(self, f) for f in fields}}

    def native(self) -> NativeConfig:
        from depthprobe.probes.models.model import NativeConfig

        return NativeConfig(
            layers=self.depth,
            d_model=self.d_model,
            heads=self.config.heads,
            d_vocab=self.vocab,
            n_ctx=self.context,
            attn_only=False,
            seed=self.seed,
        )


class LawExperiment(Experiment):
    """A depth-law family; subclasses give the data, the law table and the prediction's text."""

    columns: ClassVar[list[str]] = ROW_COLUMNS
    aliases: ClassVar[dict[str, str]] = {"d_model": "d_models"}
    resumable: ClassVar[tuple[str, ...]] = ("device", "batch_members")  # batched members equal members alone
    parsers: ClassVar[dict[str, Any]] = {"batch_members": read_batch_members}
    Job: ClassVar[type[LawJob]] = LawJob  # the family's member jobs
    key: ClassVar[str]  # the evaluation key's column: k or T
    second: ClassVar[str]  # accuracy.csv's second accuracy column
    extra_tables: ClassVar[tuple[str, ...]] = ()  # member tables gathered besides accuracy and curves
    prediction: ClassVar[str] = ""  # the prediction, for the page
    member_columns: ClassVar[tuple[str, ...]] = ()  # members.csv's columns copied onto accuracy.csv
    law_columns: ClassVar[list[str]]  # law.csv's columns (its header when no member finished)

    # -- what a law family gives ---------------------------------------------------------------
    def groups_of(self, cfg: Any) -> list[str | None]:
        return [None]

    def shape(self, cfg: Any, group: str | None) -> tuple[int, int]:
        """(vocabulary, context) of the members (of ``group``)."""
        raise NotImplementedError

    def source(self, job: LawJob) -> BatchSource:
        raise NotImplementedError

    def eval_sets(self, job: LawJob, n: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        raise NotImplementedError

    def scores(self, job: LawJob, predict: Predict, sets: dict[int, Any]) -> dict[int, tuple[float, float]]:
        """Per key of ``sets`` (key -> (inputs, targets)): the accuracy and the second accuracy, of
        the predictions ``predict(inputs)`` (the member intact, or with a block skipped)."""
        raise NotImplementedError

    def law(self, cfg: Any, accuracy: pd.DataFrame) -> pd.DataFrame:
        """law.csv from the finished members' accuracies (never empty)."""
        raise NotImplementedError

    def probe(self, job: LawJob, model: Model, folder: Path) -> None:
        """What the family measures on a trained member besides accuracy (files in ``folder``)."""

    def usage_inputs(self, job: LawJob) -> torch.Tensor:
        """The depth-usage probe's token ids [example, pos] (every row one whole sequence, no
        padding): :data:`USAGE_SEQUENCES` sequences of the largest key, from the evaluation seed space."""
        sets = self.eval_sets(job, USAGE_SEQUENCES)
        return sets[max(sets)][0]

    def usage_keys(self, job: LawJob) -> set[Any] | None:
        """The keys whose final evaluation sets ``skipped_accuracy.csv`` reads (``None``: all)."""
        return None

    def prepare(self, config: Any, jobs: list[LawJob], say: Any) -> None:
        """Refuse, before anything is written, a member that cannot fit: its weights, gradients,
        AdamW's moments and a training batch's activations against the memory available."""
        from depthprobe.probes.models.device import check_size, resolve_device

        device = resolve_device(config.device) if config.device is not None else None
        biggest = max(jobs, key=lambda j: self.member_bytes(config, j))
        what = (
            f"member {biggest.name} with batches of {config.batch_size} (lower --batch-size, the length or the width)"
        )
        check_size(biggest.native().n_params(), self.member_bytes(config, biggest), what, device)
        check_eval_sets(self, config, biggest.native().n_ctx, device)

    def eval_keys(self, config: Any) -> int:
        """How many evaluation sets (keys: hop counts, lengths, ranges) one evaluation builds."""
        return 1

    def member_bytes(self, config: Any, job: LawJob) -> int:
        """A member's training memory: its weights, gradients, AdamW's moments and a batch's activations."""
        from depthprobe.probes.models.device import native_bytes

        native = job.native()
        per_token = native.layers * native.d_model * 24 + native.d_vocab  # activations kept for backward
        return native_bytes(native, training=True) + config.batch_size * native.n_ctx * per_token * 4

    # -- batched members (experiments/batching.py) ----------------------------------------------
    def batches(self, config: Any, jobs: list[LawJob], processes: int) -> list[Any]:
        """Members of one network shape (all but the seed) in batches of ``--batch-members``."""
        from depthprobe.probes.experiments import batching
        from depthprobe.probes.models.device import resolve_device

        device = resolve_device(config.device).type
        mode = config.batch_members
        return batching.plan_units(
            jobs,
            shape=lambda j: dataclasses.replace(j.native(), seed=0),
            size=lambda j: batching.batch_size(mode, device, j.d_model),
            processes=processes,
            auto=mode == "auto",
        )

    def run_batch(self, jobs: tuple[LawJob, ...]) -> list[Any]:
        from depthprobe.probes.experiments.law_batch import run_law_batch

        return run_law_batch(self, jobs)

    def after_update(self, job: LawJob, source: BatchSource, model: Model, done: int) -> bool:
        """What the family does after update ``done`` (groups: the length curriculum's check);
        True when it used the model (its seconds are then not training time)."""
        return False

    def training_files(self, job: LawJob, source: BatchSource, folder: Path) -> None:
        """Files about the training itself (groups: when the curriculum moved on), in ``folder``."""

    # -- the protocol --------------------------------------------------------------------------
    def plan(self, config: Any) -> list[LawJob]:
        """Every member, seed-major: (per group) depth x width, then the control (with ``control``)."""
        jobs = []
        for group in self.groups_of(config):
            vocab, context = self.shape(config, group)
            ctrl = self.control_shape(config, group, vocab, context) if config.control else None
            for seed in range(config.seeds):
                shapes = [(depth, d) for d in config.d_models for depth in config.depths]
                jobs += [
                    self.Job(config, depth, d, seed, group=group, vocab=vocab, context=context) for depth, d in shapes
                ]
                if ctrl is not None:
                    jobs.append(self.Job(config, *ctrl, seed, control=True, group=group, vocab=vocab, context=context))
        return jobs

    def control_shape(self, config: Any, group: str | None, vocab: int, context: int) -> tuple[int, int] | None:
        """The control's (depth, width): 2 layers at :func:`control_width` (None: that is a member already)."""
        wide = control_width(config, vocab, context)
        return None if 2 in config.depths and wide in config.d_models else (2, wide)

    def base_row(self, job: LawJob) -> dict[str, Any]:
        return {**super().base_row(job), **job.ids(), "heads": job.config.heads, "steps": job.config.steps}

    def plan_row(self, config: Any, job: LawJob, context: Any) -> dict[str, Any]:
        """The member's parameters, training tokens (steps x batch x context), FLOPs (6 N per
        token) and estimated CPU minutes."""
        params = job.native().n_params()
        tokens = config.steps * config.batch_size * job.context
        row = {k: v for k, v in {**self.base_row(job), "params": params}.items() if v is not None or k == "group"}
        flops = 6.0 * params * tokens
        row.update(tokens=tokens, flops=flops, cpu_minutes=flops / CPU_FLOPS / 60)
        row["est_seconds"], row["source"] = estimate(self.name, plan_device(config), config.steps)
        return row

    def measure(self, job: LawJob, folder: Path, row: dict[str, Any]) -> dict[str, Any]:
        from depthprobe.probes.experiments import law_member

        return law_member.measure(self, job, folder, row)

    def line(self, row: dict[str, Any]) -> str:
        return f"{row['steps_per_s']:.1f} steps/s, {row['wall_s']:.0f} s"

    def facts(self, config: Any) -> list[str]:
        return [f"threshold {config.threshold}", f"steps {config.steps}"]

    def tables(self, config: Any, members: pd.DataFrame, folder: Path) -> dict[str, pd.DataFrame]:
        """The members' tables gathered (accuracy with :attr:`member_columns` of members.csv), and law.csv."""
        import pandas as pd

        from depthprobe.probes.experiments.folder import gather

        tables = {name: gather(folder, members, name) for name in ("accuracy.csv", "curves.csv", *self.extra_tables)}
        if tables["accuracy.csv"].empty:  # no member finished: law.csv's header alone
            tables["law.csv"] = pd.DataFrame(columns=self.law_columns)
            return tables
        acc = tables["accuracy.csv"].merge(members[["member", *self.member_columns]], on="member", how="left")
        acc["step_reached"] = acc["step_reached"].astype("Int64")  # a step, or empty when never reached
        tables["accuracy.csv"] = acc
        tables["law.csv"] = self.law(config, acc)
        return tables

    def headline(self, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
        return tables["law.csv"]

    def page(self, config: Any, tables: dict[str, pd.DataFrame], folder: Path) -> list[str]:
        """The prediction, the law table (a blank measured depth says why, from :meth:`behind_law`),
        the heatmaps, :meth:`middle`, the learning curves and (khop) the hop summary
        (probes/render/laws.py)."""
        import pandas as pd

        from depthprobe.probes.render import laws

        acc, law, members = tables.get("accuracy.csv", pd.DataFrame()), tables["law.csv"], tables["members.csv"]
        if acc.empty:
            return [laws.intro(self.prediction), "<p class='note'>no member finished; there is nothing to plot.</p>"]
        return [
            laws.intro(self.prediction),
            laws.law_table(law, self.behind_law(config, acc), config.threshold),
            laws.heatmaps(self.key, acc, law, threshold=config.threshold, predicted=self.predicted_cells(law)),
            *self.middle(tables),
            laws.curves(self.key, tables.get("curves.csv", pd.DataFrame()), members, config.threshold),
            laws.hop_summary(tables.get("hop_layers.csv", pd.DataFrame())),
        ]

    def predicted_cells(self, law: pd.DataFrame) -> pd.DataFrame | None:
        """law.csv's predicted first depth per heatmap cell column (None: law.csv's own rows, which
        are per :attr:`key` where law.csv has that column)."""
        return None

    def middle(self, tables: dict[str, pd.DataFrame]) -> list[str]:
        """The page's sections between the heatmaps and the learning curves: the wide shallow control."""
        from depthprobe.probes.render import laws

        return [laws.control(self.key, tables["accuracy.csv"], tables["members.csv"])]

    def behind_law(self, config: Any, acc: pd.DataFrame) -> pd.DataFrame:
        """The accuracies behind law.csv's rows, which say why a measured depth is blank: all."""
        return acc


def control_width(cfg: Any, vocab: int, context: int) -> int:
    """The smallest width (a multiple of the heads) at which a 2-layer member has at least the
    parameters of the deepest, widest member."""
    deepest = LawJob(cfg, max(cfg.depths), max(cfg.d_models), 0, vocab=vocab, context=context).native()
    width = max(cfg.d_models)
    while dataclasses.replace(deepest, layers=2, d_model=width).n_params() < deepest.n_params():
        width += cfg.heads
    return width


def plan_device(config: Any) -> str | None:
    """The rates' name (training/rates.py) of the device the members would train on."""
    from depthprobe.probes.models.device import resolve_device

    dev = resolve_device(config.device)
    if dev.type != "cuda":
        return device_label(dev.type)
    import torch

    return device_label("cuda", torch.cuda.get_device_name(dev))


def measured_depth(rows: pd.DataFrame, threshold: float, seeds: int) -> int | None:
    """The smallest depth whose accuracy is >= ``threshold`` for each of the ``seeds`` seeds."""
    for depth, at in rows.groupby("depth", sort=True):
        if at["seed"].nunique() >= seeds and bool((at["accuracy"] >= threshold).all()):
            return int(depth)
    return None


def measured_depths(acc: pd.DataFrame, keys: list[str], cfg: Any, sort: bool = True) -> pd.DataFrame:
    """Per ``keys`` (controls left out): ``measured_depth`` (:func:`measured_depth`; empty when no
    depth reached the threshold in every seed), one row per setting."""
    import pandas as pd

    main = acc[~acc["control"].astype(bool)]
    rows = [(*key, measured_depth(at, cfg.threshold, cfg.seeds)) for key, at in main.groupby(keys, sort=sort)]
    return pd.DataFrame(rows, columns=[*keys, "measured_depth"]).astype({"measured_depth": "Int64"})


__all__ = ["COMMON", "LawConfig", "LawExperiment", "LawJob", "control_width", "measured_depth", "measured_depths"]


EVAL_TOKEN_BYTES = 24  # an evaluation set's inputs, targets and predictions: int64 each, per token
SET_OPTIONS = ("eval_sequences", "curve_sequences", "hop_sequences", "check_sequences")


def check_eval_sets(exp: LawExperiment, config: Any, n_ctx: int, device: Any) -> None:
    """Refuse, before anything is written, evaluation sets a member cannot hold: each sequence
    option (``--eval-sequences``, ``--curve-sequences``, khop's ``--hop-sequences``, groups'
    ``--check-sequences``) builds sets of that many sequences per key of up to ``n_ctx`` tokens at
    once (:data:`EVAL_TOKEN_BYTES` a token), checked against the memory available."""
    from depthprobe.probes.models.device import _human, available_memory

    free = available_memory(device)
    if free is None:
        return
    keys = exp.eval_keys(config)
    for name in (n for n in SET_OPTIONS if hasattr(config, n)):
        n = getattr(config, name)
        need = n * keys * n_ctx * EVAL_TOKEN_BYTES
        if need > free:
            flag = f"--{name.replace('_', '-')}"
            raise ProbeError(
                f"{flag} {n:,} needs about {_human(need, 'B')} for its evaluation sets ({keys} key(s) of up to "
                f"{n_ctx} tokens) but {_human(free, 'B')} is available; lower {flag}"
            )
