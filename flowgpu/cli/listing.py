"""``flowgpu info``, ``ops``, ``sources``, ``sinks`` and ``schema``: what this machine and the registries offer."""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from flowgpu import backend, pipeline
from flowgpu.cli.common import EXIT_FAILED, EXIT_INVALID, _console, _fail
from flowgpu.io.atomic import write_text
from flowgpu.io.sinks import SINKS
from flowgpu.io.sources import SOURCES
from flowgpu.ops import all_ops
from flowgpu.registry import Entry


@click.command()
def info() -> None:
    """Show what this machine offers: GPUs, CuPy, and the backend a Session would use."""
    n = backend.gpu_count()
    cupy = backend.import_cupy(strict=False) is not None if n else False
    click.echo(f"GPUs visible: {n}")
    click.echo(f"CuPy: {'yes' if cupy else 'no'}")
    click.echo(f"Session() would use: {'gpu (dask-cuda)' if n and cupy else 'cpu (distributed)'}")


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Print a table; every cell verbatim (docstrings hold '[lo, hi]', which rich would read as markup),
    less the docstrings' reStructuredText double backticks."""
    t = Table(*columns, title=title, title_justify="left")
    for row in rows:
        t.add_row(*(escape(cell.replace("``", "`")) for cell in row))
    _console(stderr=False).print(t)


def _options(entry: Entry) -> str:
    fields = entry.options.model_fields if entry.options is not None else {}
    return ", ".join(name if f.is_required() else f"{name}={f.default!r}" if f.default_factory is None
                     else f"{name}=..." for name, f in fields.items())


class _Written(str):
    """An annotation kept as text (``from __future__ import annotations``), shown without quotes."""

    def __repr__(self) -> str:
        return str(self)


def _as_written(sig: inspect.Signature) -> inspect.Signature:
    """``sig`` with its text annotations shown as written: ``x: Array``, not ``x: 'Array'``."""
    def shown(a: Any) -> Any:
        return _Written(a) if isinstance(a, str) else a
    return sig.replace(parameters=[p.replace(annotation=shown(p.annotation)) for p in sig.parameters.values()],
                       return_annotation=shown(sig.return_annotation))


@click.command()
def ops() -> None:
    """List the registered ops with their signatures."""
    rows = []
    for o in all_ops():
        try:
            sig = str(_as_written(o.signature))
        except (TypeError, ValueError):
            sig = "(...)"
        rows.append((o.name, o.kind, sig, o.summary))
    _table("flowgpu ops", ("op", "kind", "signature", "summary"), rows)


@click.command()
def sources() -> None:
    """List the registered sources (built in, registered in Python, or from plugins) with their options."""
    _table("flowgpu sources", ("source", "reads files", "options", "summary"),
           [(e.name, "yes" if e.has("reads_files") else "no", _options(e), e.summary) for e in SOURCES.entries()])


@click.command()
def sinks() -> None:
    """List the registered sinks with their capabilities and options."""
    _table("flowgpu sinks", ("sink", "capabilities", "options", "summary"),
           [(e.name, ", ".join(sorted(e.capabilities)) or "-", _options(e), e.summary) for e in SINKS.entries()])


@click.command()
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None, help="Write to a file.")
@click.option("--overwrite", is_flag=True, help="Replace a file at --output that is not a spec schema flowgpu wrote.")
def schema(output: str | None, overwrite: bool) -> None:
    """Print the JSON schema of spec files (for yaml-language-server's $schema modeline)."""
    spec_schema = pipeline.json_schema()
    text = json.dumps(spec_schema, indent=2) + "\n"
    if not output:
        click.echo(text, nl=False)
        return
    if os.path.lexists(output) and not overwrite and not _is_schema(output, spec_schema["title"]):
        _fail(f"--output {output!r} already exists and is not a spec schema flowgpu wrote; choose another path, or "
              "pass --overwrite to replace it", EXIT_INVALID)
    try:
        write_text(output, text, public=True)
    except OSError as e:
        _fail(f"cannot write {output}: {e.strerror}", EXIT_FAILED)


def _is_schema(path: str, title: str) -> bool:
    """Whether ``path`` holds a JSON schema of spec files (an earlier ``flowgpu schema -o``)."""
    try:
        with open(path, "rb") as f:
            found = json.loads(f.read(1 << 24))
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and found.get("title") == title and "$defs" in found
