"""depthprobe's Python API: loading, scoped capture, word alignment, tasks, runs, studies.

Every name below is resolved on first use (PEP 562): ``import depthprobe.probes`` imports
nothing, so the CLI's help and any core module (``depthprobe.probes.base.errors``) stay light.
The table maps each public name to the module that defines it; ``dir()`` lists them and the
``TYPE_CHECKING`` block lets static checkers see them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> "module:attribute" (module relative to depthprobe.probes)
_NAMES: dict[str, str] = {
    "ALIASES": "models.architectures:ALIASES",
    "DEFAULT_MODEL": "models.architectures:DEFAULT_MODEL",
    "TASKS": "engine.task:TASKS",
    "AttributionWarning": "hooks.spot_check:AttributionWarning",
    "Batch": "engine.task:Batch",
    "Cache": "hooks.cache:Cache",
    "Context": "engine.task:Context",
    "Diverged": "base.errors:Diverged",
    "Examples": "engine.task:Examples",
    "Model": "models.model:Model",
    "NativeConfig": "models.model:NativeConfig",
    "Output": "engine.task:Output",
    "ProbeError": "base.errors:ProbeError",
    "Result": "api.run:Result",
    "SAE": "models.sae:SAE",
    "Experiment": "experiments.protocol:Experiment",
    "MemberOutput": "experiments.protocol:MemberOutput",
    "Study": "experiments.runner:Study",
    "Task": "engine.task:Task",
    "Text": "data.memory:Text",
    "ablate_heads": "hooks.interventions:ablate_heads",
    "attach_sae": "hooks.sae:attach_sae",
    "attribute": "hooks.attribution:attribute",
    "capture": "hooks.capture:capture",
    "circuit": "hooks.circuit:circuit",
    "compare": "api.compare:compare",
    "direct_logit_attribution": "hooks.lens:direct_logit_attribution",
    "encode_words": "data.align:encode_words",
    "faithfulness": "hooks.circuit:faithfulness",
    "forward": "hooks.capture:forward",
    "generate": "hooks.steering:generate",
    "get_task": "engine.task:get_task",
    "grad_edit": "hooks.backward:grad_edit",
    "load": "models.loading:load",
    "load_checkpoint": "models.loading:load_checkpoint",
    "load_sae": "models.sae:load_sae",
    "logit_lens": "hooks.lens:logit_lens",
    "patch": "hooks.interventions:patch",
    "prune": "hooks.circuit:prune",
    "ranged": "base.options:ranged",
    "register": "engine.task:register",
    "register_experiment": "experiments.protocol:register_experiment",
    "resolve_names": "hooks.capture:resolve_names",
    "run": "api.run:run",
    "run_with_cache": "hooks.cache:run_with_cache",
    "save_checkpoint": "models.checkpoints:save_checkpoint",
    "save_sae": "models.sae:save_sae",
    "skip_layers": "hooks.depth:skip_layers",
    "steer": "hooks.steering:steer",
    "steering_vector": "hooks.steering:steering_vector",
    "study": "experiments.runner:study",
    "sweep": "api.sweep:sweep",
    "task_names": "engine.task:task_names",
    "tidy": "engine.task:tidy",
    "top_activations": "api.top_activations:top_activations",
    "train": "api.train:train",
    "view": "api.viz:view",
    "word_attention": "data.align:word_attention",
}

__all__ = sorted(_NAMES)


def _resolve(name: str) -> Any:
    module, attr = _NAMES[name].split(":")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value  # later uses skip this function
    return value


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return _resolve(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:  # the public names only: not Any, TYPE_CHECKING, annotations, importlib
    return sorted(_NAMES)


if TYPE_CHECKING:  # what static checkers and IDEs see; never run
    from depthprobe.probes.api.compare import compare
    from depthprobe.probes.api.run import Result, run
    from depthprobe.probes.api.sweep import sweep
    from depthprobe.probes.api.top_activations import top_activations
    from depthprobe.probes.api.train import train
    from depthprobe.probes.api.viz import view
    from depthprobe.probes.base.errors import Diverged, ProbeError
    from depthprobe.probes.base.options import ranged
    from depthprobe.probes.data.align import encode_words, word_attention
    from depthprobe.probes.data.memory import Text
    from depthprobe.probes.engine.task import (
        TASKS,
        Batch,
        Context,
        Examples,
        Output,
        Task,
        get_task,
        register,
        task_names,
        tidy,
    )
    from depthprobe.probes.experiments.protocol import Experiment, MemberOutput, register_experiment
    from depthprobe.probes.experiments.runner import Study, study
    from depthprobe.probes.hooks.attribution import attribute
    from depthprobe.probes.hooks.backward import grad_edit
    from depthprobe.probes.hooks.cache import Cache, run_with_cache
    from depthprobe.probes.hooks.capture import capture, forward, resolve_names
    from depthprobe.probes.hooks.circuit import circuit, faithfulness, prune
    from depthprobe.probes.hooks.depth import skip_layers
    from depthprobe.probes.hooks.interventions import ablate_heads, patch
    from depthprobe.probes.hooks.lens import direct_logit_attribution, logit_lens
    from depthprobe.probes.hooks.sae import attach_sae
    from depthprobe.probes.hooks.spot_check import AttributionWarning
    from depthprobe.probes.hooks.steering import generate, steer, steering_vector
    from depthprobe.probes.models.architectures import ALIASES, DEFAULT_MODEL
    from depthprobe.probes.models.checkpoints import save_checkpoint
    from depthprobe.probes.models.loading import load, load_checkpoint
    from depthprobe.probes.models.model import Model, NativeConfig
    from depthprobe.probes.models.sae import SAE, load_sae, save_sae
