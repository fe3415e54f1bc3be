"""The task library. Importing this package registers every task (one module per task)."""
from tasks import attention_stats  # noqa: F401
