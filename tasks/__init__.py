"""The task library. Importing this package registers every task (one module per task)."""
from depthprobe.tasks import attention_stats  # noqa: F401
from depthprobe.tasks import coref  # noqa: F401
from depthprobe.tasks import kernels  # noqa: F401
from depthprobe.tasks import syntax  # noqa: F401
from depthprobe.tasks import induction  # noqa: F401
