"""What the depth-law families (docs/protocols.md §3.9) share: the plan, the tables, the page.

A law family trains small native decoders at every depth x width x seed (and per seed, and per
group where the family has groups, a control: by default a wide 2-layer model with at least the
parameters of the deepest member) on a synthetic task, evaluates them per evaluation key (``k``
for khop, ``T`` for groups, a length range for crasp) and finds the first depth that solves each
key. A family module subclasses :class:`LawExperiment` with its Config (a
:class:`~.law_config.LawConfig`), its groups (:meth:`LawExperiment.groups`: names, the family's own
level, shapes, controls), its data (the :class:`~.law_member.LawTask` half: ``source``,
``eval_sets``, ``scores``), its law table (its prediction lives there, nowhere else;
``law_columns``: its header) and its prediction's text.

Tables (besides members.csv): ``accuracy.csv`` (per member and key: final accuracy,
``step_reached``), ``curves.csv`` (accuracy per evaluation step and key), ``law.csv`` (the family's),
and what the family adds (khop: ``hops.csv``, ``hop_layers.csv``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.experiments.batching import read_batch_members
from depthprobe.probes.experiments.law_config import CPU_FLOPS, ROW_COLUMNS, USAGE_SEQUENCES, LawGroup, LawJob
from depthprobe.probes.experiments.protocol import Experiment
from depthprobe.probes.training.rates import device_label, estimate

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from depthprobe.probes.experiments.law_member import Predict
    from depthprobe.probes.models.model import Model
    from depthprobe.probes.training.loop import BatchSource


class LawExperiment(Experiment):
    """A depth-law family; subclasses give the groups, the data, the law table and the prediction's text."""

    columns: ClassVar[list[str]] = ROW_COLUMNS
    aliases: ClassVar[dict[str, str]] = {"d_model": "d_models"}
    resumable: ClassVar[tuple[str, ...]] = ("device", "batch_members")  # batched members equal members alone
    parsers: ClassVar[dict[str, Any]] = {"batch_members": read_batch_members}
    Job: ClassVar[type[LawJob]] = LawJob  # the family's member jobs
    key: ClassVar[str]  # the evaluation key's column: k, T, max_length
    second: ClassVar[str]  # accuracy.csv's second accuracy column
    extra_tables: ClassVar[tuple[str, ...]] = ()  # member tables gathered besides accuracy and curves
    member_overhead_s: ClassVar[float] = 0.3  # smoke members beyond the first: 0.1-0.3 s besides training
    prediction: ClassVar[str] = ""  # the prediction, for the page
    member_columns: ClassVar[tuple[str, ...]] = ()  # members.csv's columns copied onto accuracy.csv
    id_columns: ClassVar[tuple[str, ...]] = ("group", "depth", "d_model", "heads", "seed", "control")
    law_columns: ClassVar[list[str]]  # law.csv's columns (its header when no member finished)

    # -- what a law family gives ---------------------------------------------------------------
    def groups(self, cfg: Any) -> list[LawGroup]:
        """The members' groups (one, unnamed, for a family without groups): each with the family's
        level, the members' vocabulary and context and the control's shape (:func:`.law_config.wide_control`)."""
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

    def probe(self, job: LawJob, model: Model, folder: Path, source: BatchSource) -> None:
        """What the family measures on a trained member besides accuracy, and records of its
        training on ``source`` (a curriculum's moves): files in ``folder``."""

    def usage(self, job: LawJob, sets: dict[int, Any]) -> tuple[torch.Tensor, dict[int, Any]]:
        """The depth-usage probe's token ids [example, pos] (every row one whole sequence, no
        padding): :data:`USAGE_SEQUENCES` sequences of the largest key, from the evaluation seed
        space; and the final evaluation ``sets`` that ``skipped_accuracy.csv`` reads (all)."""
        inputs = self.eval_sets(job, USAGE_SEQUENCES)
        return inputs[max(inputs)][0], sets

    def middle(self, config: Any, tables: dict[str, pd.DataFrame]) -> list[str]:
        """The page's sections between the heatmaps and the learning curves: the control against
        the deepest member (a family adds its own, or draws its controls its own way)."""
        from depthprobe.probes.render import laws

        return [laws.control(self.key, tables["accuracy.csv"], tables["members.csv"])]

    # -- the protocol --------------------------------------------------------------------------
    def plan(self, config: Any) -> list[LawJob]:
        """Every member, seed-major: (per group) depth x width, then the control (with ``control``)."""
        jobs = []
        for g in self.groups(config):
            for seed in range(config.seeds):
                shapes = [(depth, d, False) for d in config.d_models for depth in config.depths]
                shapes += [(*g.control, True)] if config.control and g.control is not None else []
                jobs += [
                    self.Job(config, depth, d, seed, control, g.name, g.level, g.vocab, g.context)
                    for depth, d, control in shapes
                ]
        return jobs

    def base_row(self, job: LawJob) -> dict[str, Any]:
        return {**super().base_row(job), **job.ids(), "heads": job.config.heads, "steps": job.config.steps}

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
        check_eval_sets(len(self.eval_sets(biggest, 1)), config, biggest.native().n_ctx, device)

    def member_bytes(self, config: Any, job: LawJob) -> int:
        """A member's training memory: its weights, gradients, AdamW's moments and a batch's activations."""
        from depthprobe.probes.models.device import native_bytes

        native = job.native()
        per_token = native.layers * native.d_model * 24 + native.d_vocab  # activations kept for backward
        return native_bytes(native, training=True) + config.batch_size * native.n_ctx * per_token * 4

    def plan_row(self, config: Any, job: LawJob, context: Any) -> dict[str, Any]:
        """The member's parameters, training tokens (steps x batch x context), FLOPs (6 N per
        token) and estimated CPU minutes, and its training seconds from measured rates."""
        params = job.native().n_params()
        tokens = config.steps * config.batch_size * job.context
        row = {k: v for k, v in {**self.base_row(job), "params": params}.items() if v is not None or k == "group"}
        flops = 6.0 * params * tokens
        row.update(tokens=tokens, flops=flops, cpu_minutes=flops / CPU_FLOPS / 60)
        row["est_seconds"], row["source"] = estimate(self.name, plan_device(config), config.steps)
        return row

    def plan_total(self, table: pd.DataFrame, jobs: int) -> str:
        """From measured rates (``est_seconds``) where there are some, else from FLOPs."""
        if not table["est_seconds"].notna().any():
            return super().plan_total(table, jobs)
        total = float(table["est_seconds"].sum()) / 60
        at_once = f"; with --jobs {jobs}: at least {total / jobs:.3g} min wall" if jobs > 1 else ""
        what = f"{len(table)} members, at most {total:.3g} min one member at a time"
        return f"estimated training: {what}{at_once}; {table['source'].iloc[0]}"

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
        from depthprobe.probes.experiments.law_member import run_law_batch

        return run_law_batch(self, jobs, self.base_row)

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

    def skipped_view(self, config: Any, tables: dict[str, pd.DataFrame]) -> tuple[str, float | None, Any]:
        return self.key, config.threshold, tables.get("law.csv")

    def page(
        self,
        config: Any,
        tables: dict[str, pd.DataFrame],
        folder: Path,
        predicted: pd.DataFrame | None = None,
        behind: pd.DataFrame | None = None,
    ) -> list[str]:
        """The prediction, the law table (a blank measured depth says why: ``behind``, the
        accuracies behind its rows, default all), the heatmaps (``predicted``: the predicted first
        depth per cell, columns d_model, group where there are groups, :attr:`key`, predicted_depth;
        default law.csv's rows where they are per :attr:`key`), :meth:`middle` and the learning
        curves (probes/render/laws.py)."""
        import pandas as pd

        from depthprobe.probes.render import laws

        acc, law, members = tables.get("accuracy.csv", pd.DataFrame()), tables["law.csv"], tables["members.csv"]
        if acc.empty:
            return [laws.intro(self.prediction), "<p class='note'>no member finished; there is nothing to plot.</p>"]
        return [
            laws.intro(self.prediction),
            laws.law_table(law, acc if behind is None else behind, config.threshold),
            laws.heatmaps(self.key, acc, law, threshold=config.threshold, predicted=predicted),
            *self.middle(config, tables),
            laws.curves(self.key, tables.get("curves.csv", pd.DataFrame()), members, config.threshold),
        ]


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


EVAL_TOKEN_BYTES = 24  # an evaluation set's inputs, targets and predictions: int64 each, per token


def check_eval_sets(keys: int, config: Any, n_ctx: int, device: Any) -> None:
    """Refuse, before anything is written, evaluation sets a member cannot hold: each sequence
    option of the Config (a field named ``*_sequences``: ``--eval-sequences``, ``--curve-sequences``
    and a family's own) builds sets of that many sequences for each of ``keys`` keys of up to
    ``n_ctx`` tokens at once (:data:`EVAL_TOKEN_BYTES` a token), checked against the memory available."""
    from depthprobe.probes.models.device import available_memory, human_size

    free = available_memory(device)
    if free is None:
        return
    for name, n in dataclasses.asdict(config).items():
        need = n * keys * n_ctx * EVAL_TOKEN_BYTES if name.endswith("_sequences") else 0
        if need > free:
            flag = f"--{name.replace('_', '-')}"
            raise ProbeError(
                f"{flag} {n:,} needs about {human_size(need, 'B')} for its evaluation sets ({keys} key(s) of up to "
                f"{n_ctx} tokens) but {human_size(free, 'B')} is available; lower {flag}"
            )


__all__ = ["ROW_COLUMNS", "LawExperiment", "measured_depth", "measured_depths"]
