"""Package discovery for the three top-level folders, installed under one name.

``probes/``, ``tasks/`` and ``cli/`` sit at the top of the repository (the design card asks for
them) and install as ``depthprobe.probes``, ``depthprobe.tasks`` and ``depthprobe.cli``. Every
folder below them is a package: found here, never listed by hand, so a new sub-package cannot be
left out of the wheel. A folder without an ``__init__.py`` (``tasks/data``,
``probes/render/assets``) is a data folder, a package without code whose files are its package
data (``pyproject.toml``). Everything else is in ``pyproject.toml``.
"""

import warnings

from setuptools import find_namespace_packages, setup

FOLDERS = {"probes": "depthprobe.probes", "tasks": "depthprobe.tasks", "cli": "depthprobe.cli"}

# setuptools tells every editable install of a project whose folders are mapped to other names
# (package_dir) that a folder named like the package in the working directory could shadow it.
# No folder is named depthprobe (that is why the folders install under it), so the notice is
# silenced, and only it.
warnings.filterwarnings("ignore", message="Editable installation")


def packages() -> list[str]:
    found = []
    for folder, name in FOLDERS.items():
        found.append(name)
        subs = find_namespace_packages(folder, exclude=["__pycache__", "*.__pycache__"])
        found += [f"{name}.{sub}" for sub in subs]
    return found


setup(packages=packages(), package_dir=dict((name, folder) for folder, name in FOLDERS.items()))
