"""Write every figure of a study's report as an SVG file of its own, drawn by the current code.

    python scripts/export_figures.py STUDY_FOLDER OUT_DIR [--prefix cpu-khop-]

The page is rendered again from the study folder's files (study.json and its tables; nothing is
trained), so the figures are the current code's, whichever version wrote the folder. Each
top-level figure (the accuracy heatmaps, the line charts, the ``data:`` images) becomes
OUT_DIR/PREFIX<its title>.svg, the title lower-cased with runs of other characters as ``-``
(``accuracy, d_model 16`` -> ``accuracy-d-model-16.svg``); a repeated title gets ``-2``, ``-3``.
Prints one line per file written.
"""

from __future__ import annotations

import argparse
import base64
import re
import sys
from pathlib import Path

SVG_NS = 'xmlns="http://www.w3.org/2000/svg"'


def top_level_svgs(html: str) -> list[str]:
    """The outermost ``<svg>...</svg>`` elements of a page, in order (charts nest their panels)."""
    out, depth, start = [], 0, 0
    for m in re.finditer(r"<svg\b|</svg>", html):
        if m.group(0) == "</svg>":
            depth -= 1
            if depth == 0:
                out.append(html[start : m.end()])
        else:
            if depth == 0:
                start = m.start()
            depth += 1
    return out


def figures(html: str) -> list[tuple[str, str]]:
    """(title, standalone SVG text) of every figure of a page: its inline SVGs and its SVG images."""
    found = []
    for svg in top_level_svgs(html):
        root = svg[: svg.index(">")]  # a row of charts is named by its own title, not its first panel's
        title = re.search(r"aria-label=['\"]([^'\"]*)['\"]", root) or re.search(
            r"class=['\"]title['\"][^>]*>([^<]*)<", svg
        )
        if "xmlns=" not in root:
            svg = svg.replace("<svg", f"<svg {SVG_NS}", 1)
        found.append((title.group(1) if title else "figure", svg))
    for alt, data in re.findall(r'<img alt="([^"]*)" src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', html):
        found.append((alt, base64.b64decode(data).decode("utf-8")))
    return found


def slug(title: str) -> str:
    """A file name's stem from a figure's title (HTML entities read as their characters)."""
    import html

    return re.sub(r"[^a-z0-9]+", "-", html.unescape(title).lower()).strip("-") or "figure"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path, help="a study folder written by probe study")
    parser.add_argument("out", type=Path, help="the folder the SVG files go to")
    parser.add_argument("--prefix", default="", help="put before each file name, e.g. cpu-khop-")
    args = parser.parse_args(argv)
    from depthprobe.probes.base.errors import ProbeError
    from depthprobe.probes.experiments.report import render_folder

    try:
        page = render_folder(args.study)
    except ProbeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    seen: dict[str, int] = {}
    for title, svg in figures(page):
        stem = args.prefix + slug(title)
        seen[stem] = seen.get(stem, 0) + 1
        path = args.out / (stem + (f"-{seen[stem]}" if seen[stem] > 1 else "") + ".svg")
        path.write_text(svg, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
