"""Import every module that adds commands to the `probe` app (one line each)."""

from depthprobe.cli import sweep  # noqa: F401
from depthprobe.cli import viz  # noqa: F401
from depthprobe.cli import train  # noqa: F401
from depthprobe.cli import compare  # noqa: F401
