"""The task library. Importing this package registers every task (one module per task)."""
from tasks import attention_stats  # noqa: F401
from tasks import coref  # noqa: F401
from tasks import kernels  # noqa: F401
from tasks import syntax  # noqa: F401
from tasks import induction  # noqa: F401
