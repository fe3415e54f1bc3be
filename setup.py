"""Package discovery for the three top-level folders, installed under one name.

``probes/``, ``tasks/`` and ``cli/`` sit at the top of the repository (the design card asks for
them) and install as ``depthprobe.probes``, ``depthprobe.tasks`` and ``depthprobe.cli``. Every
folder below them with an ``__init__.py`` is a package: found here, never listed by hand, so a
new sub-package cannot be left out of the wheel. Everything else is in ``pyproject.toml``.
"""

from setuptools import find_packages, setup

FOLDERS = {"probes": "depthprobe.probes", "tasks": "depthprobe.tasks", "cli": "depthprobe.cli"}


def packages() -> list[str]:
    found = []
    for folder, name in FOLDERS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(folder)]
    return found


setup(packages=packages(), package_dir=dict((name, folder) for folder, name in FOLDERS.items()))
