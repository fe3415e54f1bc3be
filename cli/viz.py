"""`probe viz` (attention views of a model on a text) and `probe report` (re-render a run's report)."""

from __future__ import annotations

from pathlib import Path

import typer

from depthprobe.cli.main import app, guarded, prepare_out


def _read_text(text: str | None, file: Path | None) -> tuple[str, str]:
    from depthprobe.probes.base.errors import ProbeError

    if text is not None and file is None:
        return text, "--text"
    if file is None or text is not None:
        raise ProbeError('probe viz needs exactly one of --text "..." or --file PATH')
    try:
        return file.read_text(encoding="utf-8-sig"), str(file)
    except FileNotFoundError:
        raise ProbeError(f"--file {file} does not exist; check the path") from None
    except UnicodeDecodeError:
        raise ProbeError(f"--file {file} is not UTF-8 text; convert it (e.g. iconv -t utf-8)") from None
    except OSError as exc:
        raise ProbeError(f"--file {file} cannot be read: {exc.strerror}") from None


@app.command()
@guarded
def viz(
    model: str = typer.Option("minilm", "--model", "-m", help="Alias, Hugging Face id or local directory."),
    text: str | None = typer.Option(None, "--text", help="The text to show attention on."),
    file: Path | None = typer.Option(None, "--file", "-f", help="Read the text from this UTF-8 file instead."),
    layers: str | None = typer.Option(None, "--layers", help="0-indexed layers, e.g. 0,3 or 0-2 (default: all)."),
    heads: str | None = typer.Option(None, "--heads", help="0-indexed heads, e.g. 0,5 (default: all)."),
    words: bool = typer.Option(False, "--words/--pieces", help="Word-level attention (Clark et al.) or wordpieces."),
    max_tokens: int = typer.Option(
        512, "--max-tokens", help="Show at most this many tokens; the page says what was cut."
    ),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:N (default: CUDA when present)."),
    dtype: str = typer.Option("float32", "--dtype", help="Model dtype: float32, bfloat16 or float16."),
    kind: str = typer.Option(
        "layers",
        "--kind",
        help="layers: one view per layer; model: every layer x head at a glance; neuron: q, k and q*k of a query.",
    ),
    query: int | None = typer.Option(None, "--query", help="--kind neuron: the query position shown first."),
    out: Path = typer.Option(Path("attention.html"), "--out", "-o", help="The HTML page to write."),
) -> None:
    """Write one self-contained HTML page of attention views (one per layer, all chosen heads; or
    --kind model: every layer x head at a glance; --kind neuron: q, k and q*k behind the scores)."""
    from depthprobe.probes.api.inspect_views import check_kind
    from depthprobe.probes.api.viz import viz_page
    from depthprobe.probes.base.errors import ProbeError
    from depthprobe.probes.models.device import parse_dtype
    from depthprobe.probes.models.loading import load
    from depthprobe.probes.render.attention import index_ranges, parse_indices
    from depthprobe.probes.render.html import write_atomic

    prepare_out(out, may_exist=True, kind="file")
    check_kind(kind)
    if query is not None and kind != "neuron":
        raise ProbeError("--query is for --kind neuron; drop it or add --kind neuron")
    torch_dtype = parse_dtype(dtype)
    body, source = _read_text(text, file)
    if not body.strip():
        raise ProbeError(f"the text from {source} is empty; pass some words")
    if max_tokens < 3:
        raise ProbeError(f"--max-tokens must be at least 3, got {max_tokens}")
    for spec, what in ((layers, "layers"), (heads, "heads")):  # syntax checked before loading
        index_ranges(spec, what)
    mdl = load(model, device=device, dtype=torch_dtype)
    mdl.require_tokenizer("viz")
    page = viz_page(
        mdl,
        body,
        source=source,
        words=words,
        max_tokens=max_tokens,
        layers=parse_indices(layers, mdl.info.n_layers, "layers"),
        heads=parse_indices(heads, mdl.info.n_heads, "heads"),
        kind=kind,
        query=query,
    )
    path = write_atomic(out, page)
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")


@app.command()
@guarded
def report(run_dir: Path = typer.Argument(..., help="A run directory written by probe run or probe sweep.")) -> None:
    """Re-render RUN_DIR/report.html from the run's saved files."""
    from depthprobe.probes.render.report import write_report

    if run_dir.is_dir():
        prepare_out(run_dir / "report.html", "RUN_DIR", may_exist=True, kind="file")
    path = write_report(run_dir)
    typer.echo(f"wrote {path}")
