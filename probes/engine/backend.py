"""Where the members of a study or a sweep run: one :class:`Backend`, the same six settings for both
(``probe study`` and ``probe sweep``: ``--backend``, ``--address``, ``--cpus-per-member``,
``--gpus-per-member``, ``--retries``, ``--jobs``), checked in one place and turned into
:func:`.distributed.map_jobs`' placing arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from depthprobe.probes.base.errors import ProbeError


@dataclass(frozen=True)
class Backend:
    """Where members run: ``local`` (``jobs`` processes) or ``ray`` (one task per member); the
    same six settings for a study and a sweep (``probes/api/sweep.py``)."""

    backend: str = "local"
    address: str | None = None
    cpus_per_member: float = 1
    gpus_per_member: float = 0
    retries: int = 0
    jobs: int | Literal["auto"] | None = None  # auto: the study chooses (batching.chosen_jobs)

    def check(self) -> None:
        """Refuse bad settings before anything runs, one line each."""
        from depthprobe.probes.engine.distributed import check_jobs, check_member_backend

        check_member_backend(self.backend, self.address, self.cpus_per_member, self.gpus_per_member, self.retries)
        if self.jobs is not None and self.jobs != "auto":
            check_jobs(self.jobs)
            if self.backend != "local" and self.jobs != 1:
                raise ProbeError("--jobs applies to --backend local (Ray places members by --cpus-per-member); drop it")

    def placing(self, units: int) -> dict[str, Any]:
        """``map_jobs``' placing arguments for ``units`` units (local: at most ``jobs`` processes)."""
        processes = 1 if self.backend == "ray" else min(self.jobs if isinstance(self.jobs, int) else 1, max(1, units))
        return {
            "backend": self.backend,
            "address": self.address,
            "retries": self.retries,
            "cpus_per_job": self.cpus_per_member,
            "gpus_per_job": self.gpus_per_member,
            "processes": processes,
        }


__all__ = ["Backend"]
