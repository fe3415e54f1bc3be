"""``atlas(out)``: what depth buys, on one page (``probe atlas``).

One folder holds one run of each finding, each an ordinary folder of its own (the two depth laws
are study folders at their ``demo`` presets; the induction and kernel sweeps and the depth-usage
run are run folders), then ``atlas.csv`` (one row per finding and level: :mod:`.atlas_findings`)
and ``atlas.html`` (:mod:`probes.render.atlas`) drawn from those folders. Interrupted, it resumes:
a study folder continues (its finished members kept), a run folder written whole is kept, and the
page is drawn again from what is there. ``scale="smoke"`` runs the same steps at the smoke presets
in seconds (the tests' scale); its page says it shows no finding.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from depthprobe.probes.base import artifacts
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.experiments import atlas_findings as af
from depthprobe.probes.experiments import atlas_sections

Scale = Literal["demo", "smoke"]
SCALES: tuple[str, ...] = ("demo", "smoke")
ATLAS_JSON = "atlas.json"
ATLAS_CSV = "atlas.csv"
ATLAS_HTML = "atlas.html"


@dataclass(frozen=True)
class AtlasConfig:
    """Where the atlas runs: ``scale`` (demo: the findings; smoke: the mechanics in seconds),
    ``jobs`` (members or sweep depths at once, in local processes) and ``device``."""

    scale: Scale = "demo"
    jobs: int = 1
    device: str | None = None

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ProbeError(f"--scale must be one of {', '.join(SCALES)}, got {self.scale!r}")
        if self.jobs < 1:
            raise ProbeError(f"--jobs must be at least 1, got {self.jobs}")


@dataclass(frozen=True)
class Atlas:
    """A finished atlas: its folder, its rows (atlas.csv) and its page."""

    folder: Path
    rows: Any  # pandas DataFrame of atlas.csv

    @property
    def page(self) -> Path:
        return self.folder / ATLAS_HTML


def atlas(
    out: str | Path,
    *,
    jobs: int = 1,
    device: str | None = None,
    scale: str = "demo",
    echo: Callable[[str], None] | None = None,
) -> Atlas:
    """Run (or continue) the atlas in ``out``; returns it. Every input is checked before anything runs."""
    import pandas as pd

    cfg = AtlasConfig(scale=scale, jobs=jobs, device=device)  # type: ignore[arg-type]
    folder = Path(out)
    check_folder(folder, cfg)
    if device is not None:
        from depthprobe.probes.models.device import resolve_device

        resolve_device(device)
    say = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    folder.mkdir(parents=True, exist_ok=True)
    artifacts.write_json(folder / ATLAS_JSON, {"scale": cfg.scale})
    findings = atlas_sections.FINDINGS
    for i, finding in enumerate(findings, 1):
        run_finding(finding, folder, cfg, f"atlas [{i}/{len(findings)}] {finding.title}", say)
    shown = sorted(findings, key=lambda f: atlas_sections.PAGE_ORDER.index(f.slug))  # the laws first
    rows = pd.DataFrame([r for f in shown for r in f.rows(folder / f.slug, cfg)], columns=af.COLUMNS)
    artifacts.replace_file(folder / ATLAS_CSV, lambda tmp: rows.to_csv(tmp, index=False))
    from depthprobe.probes.render.atlas import atlas_page
    from depthprobe.probes.render.html import write_atomic

    sections = [f.section(folder / f.slug, cfg, rows[rows["finding"] == f.slug]) for f in shown]
    write_atomic(folder / ATLAS_HTML, atlas_page(sections, smoke=cfg.scale == "smoke"))
    say(f"atlas: {len(rows)} rows in {folder / ATLAS_CSV}; the page is {folder / ATLAS_HTML}")
    return Atlas(folder, rows)


def check_folder(folder: Path, cfg: AtlasConfig) -> None:
    """A new folder, an empty one, or an atlas of the same scale to continue; else one line."""
    artifacts.check_out(folder, "--out", may_exist=True)
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    meta = folder / ATLAS_JSON
    try:
        saved = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ProbeError(
            f"--out {folder} holds files but no readable {ATLAS_JSON}: it is not an atlas folder; "
            "pass a new --out or an empty folder"
        ) from None
    if saved.get("scale") != cfg.scale:
        raise ProbeError(
            f"--out {folder} holds an atlas at scale {saved.get('scale')!r}, not {cfg.scale!r}; "
            "pass a new --out to keep both, or remove it first"
        )


def run_finding(finding: Any, root: Path, cfg: AtlasConfig, label: str, say: Callable[[str], None]) -> None:
    """Run one finding in ``root/<slug>`` unless it is there already (a study continues itself)."""
    folder = root / finding.slug
    if finding.done(folder):
        say(f"{label}: kept ({folder} was finished before)")
        return
    say(f"{label}: running {finding.command(cfg, folder)}")
    start = time.perf_counter()
    finding.run(folder, cfg, say)
    say(f"{label}: done in {time.perf_counter() - start:.0f} s")


__all__ = ["ATLAS_CSV", "ATLAS_HTML", "SCALES", "Atlas", "AtlasConfig", "atlas"]
