"""Import every module that adds commands to the `probe` app; `probe --help` lists each by the
first sentence of its help (a command's own `--help` keeps the whole text)."""

from depthprobe.cli import atlas, compare, study, sweep, train, viz  # noqa: F401
from depthprobe.cli.main import app


def first_sentence(text: str) -> str:
    head, dot, rest = text.partition(". ")
    return head + "." if dot and rest else text


for _info in app.registered_commands:
    if isinstance(_info.help, str) and _info.short_help is None:
        _info.short_help = first_sentence(_info.help)
