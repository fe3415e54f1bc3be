"""depthprobe core: loading, scoped capture, word alignment, metrics, tasks and artifacts."""

from depthprobe.probes.api import Result, run
from depthprobe.probes.data.align import encode_words, word_attention
from depthprobe.probes.engine.errors import ProbeError
from depthprobe.probes.engine.task import TASKS, Batch, Context, Examples, Output, Task, get_task, register, task_names
from depthprobe.probes.hooks.cache import Cache, run_with_cache
from depthprobe.probes.hooks.capture import capture, forward, resolve_names
from depthprobe.probes.hooks.interventions import ablate_heads, patch
from depthprobe.probes.models.loading import (
    ALIASES,
    DEFAULT_MODEL,
    Model,
    NativeConfig,
    load,
    load_checkpoint,
    save_checkpoint,
)
from depthprobe.probes.render.compare import compare  # noqa: F401  (probe compare)
from depthprobe.probes.study import Study, study

__all__ = [
    "ALIASES",
    "DEFAULT_MODEL",
    "TASKS",
    "Batch",
    "Cache",
    "Context",
    "Examples",
    "Model",
    "NativeConfig",
    "Output",
    "ProbeError",
    "Result",
    "Study",
    "Task",
    "ablate_heads",
    "capture",
    "encode_words",
    "forward",
    "get_task",
    "load",
    "load_checkpoint",
    "patch",
    "register",
    "resolve_names",
    "run",
    "run_with_cache",
    "save_checkpoint",
    "study",
    "task_names",
    "word_attention",
]
