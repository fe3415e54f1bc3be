"""Users' tasks from outside the library: a file or module named on the command line, or an
installed package's ``depthprobe.tasks`` entry points.

- ``probe run --plugin my_task.py`` (or ``--plugin package.module``) imports the plugin before the
  task is looked up; the plugin registers its tasks with ``@probes.register``, as in a notebook.
- An installed package declares its tasks in its ``pyproject.toml``::

      [project.entry-points."depthprobe.tasks"]
      my-task = "my_package.tasks:MyTask"

  and they join the registry lazily: the module is imported when the task is first used, and
  what it names must be a :class:`~depthprobe.probes.engine.task.Task` subclass (or instance).

``docs/plugins.md`` walks through writing one.
"""

from __future__ import annotations

import importlib
import importlib.util
import stat
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType

from depthprobe.probes.base.errors import ProbeError

ENTRY_POINT_GROUP = "depthprobe.tasks"


IGNORED: dict[str, list[str]] = {}  # group -> a line per entry point left out (`probe list tasks` / `families`)


def entry_point_tasks(taken: set[str], group: str = ENTRY_POINT_GROUP) -> dict[str, str]:
    """``name -> "module:object"`` of installed packages' tasks (or, with ``group``, study
    families: ``depthprobe.experiments``); a name in ``taken`` (the library's own keeps it) or a
    malformed entry is left out and said once, by ``probe list tasks`` / ``probe list families``
    (:data:`IGNORED`), not as a warning on every command."""
    kind = "task" if group == ENTRY_POINT_GROUP else "study family"
    entries: dict[str, str] = {}
    ignored = IGNORED.setdefault(group, [])
    ignored.clear()
    for ep in metadata.entry_points(group=group):
        dist = ep.dist.name if ep.dist is not None else "an installed package"
        if ep.name in taken or ep.name in entries:
            ignored.append(
                f"{dist}: {kind} {ep.name!r} ({ep.value}) is ignored: the name is already taken; rename its entry point"
            )
        elif ep.value.count(":") != 1:
            ignored.append(f"{dist}: entry point {ep.name} = {ep.value!r} is ignored: it is not 'module:Class'")
        else:
            entries[ep.name] = ep.value
    return entries


def entry_point_origins(entries: dict[str, str], group: str = ENTRY_POINT_GROUP) -> dict[str, str]:
    """``name -> "entry point module:Class of DIST"`` for the entries :func:`entry_point_tasks`
    kept: what a task (or study family) that fails to load is called in its one-line error."""
    origins = {}
    for ep in metadata.entry_points(group=group):
        if entries.get(ep.name) == ep.value:
            dist = ep.dist.name if ep.dist is not None else "an installed package"
            origins[ep.name] = f"entry point {ep.value} of {dist}"
    return origins


def _module_name(path: Path) -> str:
    """A file's module name: its stem under a private prefix, so it never shadows an installed module."""
    return "depthprobe_plugin_" + "".join(c if c.isalnum() else "_" for c in path.stem)


def _not_a_file(path: Path) -> str | None:
    """What ``path`` is when it is not a regular file ("does not exist", "is a folder", ...), else None."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"
    kinds = {stat.S_ISDIR: "is a folder", stat.S_ISFIFO: "is a FIFO (named pipe), not a file",
             stat.S_ISCHR: "is a character device, not a file", stat.S_ISBLK: "is a block device, not a file",
             stat.S_ISSOCK: "is a socket, not a file"}  # fmt: skip
    return next((what for test, what in kinds.items() if test(mode)), None)


def _import_file(path: Path, spec_text: str) -> ModuleType:
    what = _not_a_file(path)
    if what is not None:
        raise ProbeError(f"--plugin {spec_text} {what}; pass a Python file or an importable module name")
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ProbeError(f"--plugin {spec_text} is not a Python file; pass a .py file or a module name")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_plugin(spec_text: str) -> ModuleType:
    """Import a plugin (a ``.py`` file or a module name) so that the tasks it registers can run.

    Loading the same file or module again re-runs it; its tasks replace their earlier versions."""
    path = Path(spec_text)
    try:
        a_path = "/" in spec_text or "\\" in spec_text or (path.exists() and not path.is_dir())
        if spec_text.endswith(".py") or a_path:
            return _import_file(path, spec_text)
        if spec_text in sys.modules:
            return importlib.reload(sys.modules[spec_text])
        return importlib.import_module(spec_text)
    except ProbeError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name is not None and spec_text.startswith(exc.name):
            raise ProbeError(
                f"cannot import --plugin module {spec_text!r} ({exc}); pass a file path (my_task.py) "
                "or install the package that holds it"
            ) from None
        raise ProbeError(f"--plugin {spec_text} failed to import: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # the plugin's own code failed: say where, in one line
        raise ProbeError(f"--plugin {spec_text} failed to import: {type(exc).__name__}: {exc}") from None
    except SystemExit as exc:  # sys.exit(...) in a plugin would end `probe` with nothing written
        raise ProbeError(
            f"--plugin {spec_text} called sys.exit({exc.code!r}) while importing; a plugin registers "
            "tasks and must not exit (raise an exception instead)"
        ) from None
