"""Import every module that adds commands to the `probe` app (one line each)."""
from cli import sweep  # noqa: F401
from cli import viz  # noqa: F401
from cli import train  # noqa: F401
from cli import compare  # noqa: F401
