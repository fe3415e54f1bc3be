"""The offline report page of every study (``probe study``): one self-contained ``report.html``.

The frame is the same for every family: a header (family, preset, members ok/failed and the
family's facts; an absolute path shortened to its last part), the failed members with their error
(left out of every plot), the family's sections (``Experiment.page``, drawn from the study's
tables), the member table (``members.csv``, after the family's note on its columns) and the
settings (``study.json``'s config). A study without a finished member shows a note instead of the
family's sections. The page reports; it asserts nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from depthprobe.probes.render.html import esc, no_paths, page
from depthprobe.probes.render.html import table as html_table
from depthprobe.probes.render.study_data import cell_text, whole_columns

# one line per member (the table scrolls sideways); only the error column wraps
MEMBERS_STYLE = (
    ".members table.data td, .members table.data th { white-space: nowrap; } "
    ".members table.data td:last-child { white-space: normal; min-width: 24em; }"
)


def members_table(t: pd.DataFrame, note: str = "") -> str:
    """members.csv as a table, numbers formatted (whole numbers without decimals), after the
    family's ``note`` (HTML) on its columns; columns without a value in any row are left out."""
    cols = [
        c for c in t.columns if c in ("member", "status") or (t[c].notna() & t[c].astype(str).str.strip().ne("")).any()
    ]
    whole = whole_columns(t)
    records = [{c: cell_text(c, r[c], c in whole) for c in cols} for r in t.to_dict("records")]
    return f"<style>{MEMBERS_STYLE}</style>{note}<div class='members'>{html_table(records, cols)}</div>"


def failed_list(failed: pd.DataFrame) -> str:
    items = "".join(  # every members.csv has an error column (RUN_COLUMNS)
        f"<li><b>{esc(m)}</b>: {esc(e if isinstance(e, str) and e else 'no error recorded')}</li>"
        for m, e in zip(failed["member"], failed["error"], strict=True)
    )
    return f"<h2>Failed members</h2><p class='meta'>left out of every plot</p><ul class='error'>{items}</ul>"


def study_page(
    family: str,
    preset: str | None,
    members: pd.DataFrame,
    sections: Sequence[str],
    config: Mapping[str, Any],
    facts: Sequence[str] = (),
    members_note: str = "",
) -> str:
    """The study's report page (self-contained, offline) from its members, its family's sections,
    its family's note on the member table and its settings."""
    status = members["status"].fillna("").astype(str).str.strip()
    ok, failed = members[status == "ok"], members[status != "ok"]
    title = f"depthprobe study: {family}"
    head = [
        f"family {family}",
        f"preset {preset or 'none (explicit options)'}",
        *facts,
        f"members {len(ok)} ok, {len(failed)} failed",
    ]
    parts = [f"<h1>{esc(title)}</h1>", "<p class='meta'>" + " · ".join(esc(no_paths(f)) for f in head) + "</p>"]
    if len(failed):
        parts.append(failed_list(failed))
    if ok.empty:
        parts.append(
            f"<p class='note'>no member of this {esc(family)} study finished ({len(failed)} failed); "
            "there is nothing to plot. Fix the errors above and rerun probe study on the same folder "
            "(finished members are kept).</p>"
        )
    else:
        parts += list(sections)
    parts.append("<h2>Members</h2>" + members_table(members, members_note))
    settings = json.dumps(dict(config), indent=2, ensure_ascii=False, default=str)
    parts.append(
        f"<h2>Study settings</h2><details><summary>study.json config</summary><pre>{esc(settings)}</pre></details>"
    )
    return page(title, "\n".join(p for p in parts if p))


__all__ = ["members_table", "study_page"]
