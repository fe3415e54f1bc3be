"""The task library: one module per task, registered lazily by name.

``TASKS`` and ``SWEEPS`` map a name to ``"module:Class"``. The API layer hands these tables to the
core's registries, which import a task's module only when the task is first used, so listing the
names or suggesting a close match imports no task. A new task adds one line here.
"""

TASKS = {
    "ablation": "depthprobe.tasks.ablation:Ablation",
    "attention-stats": "depthprobe.tasks.attention_stats:AttentionStats",
    "coref": "depthprobe.tasks.coref:Coref",
    "depth-usage": "depthprobe.tasks.depth_usage.task:DepthUsage",
    "hop-attention": "depthprobe.tasks.hop_attention:HopAttention",
    "induction": "depthprobe.tasks.induction.task:Induction",
    "kernels": "depthprobe.tasks.kernels.task:Kernels",
    "syntax": "depthprobe.tasks.syntax:Syntax",
}

SWEEPS = {
    "induction": "depthprobe.tasks.induction.sweep:InductionSweep",
    "kernels": "depthprobe.tasks.kernels.sweep:KernelSweep",
}
