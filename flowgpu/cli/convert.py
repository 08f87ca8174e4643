"""``flowgpu convert``: a ``.npy`` file, Zarr array, HDF5 dataset or TIFF stack rewritten as a GPU-friendly Zarr 3 store."""

from __future__ import annotations

import json

import click
from dask.utils import format_bytes, parse_bytes

from flowgpu.cli.common import handle_errors
from flowgpu.io.convert import check
from flowgpu.io.convert import convert as convert_array
from flowgpu.io.zarrwrite import CODECS
from flowgpu.runtime.session import Session


class _Bytes(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):
        try:
            n = parse_bytes(value) if isinstance(value, str) else int(value)
        except (ValueError, TypeError):
            self.fail(f"{value!r} is not a size; give e.g. 4MiB or 1GiB", param, ctx)
        if n < 1:
            self.fail(f"{value!r}: give a size of at least 1 byte", param, ctx)
        return n


@click.command()
@click.argument("src")
@click.argument("dst", type=click.Path())
@click.option("--codec", type=click.Choice(CODECS), default="zstd", show_default=True,
              help="Compressor of the new store (nvCOMP decodes both; zstd is the smaller, and on an H200 reads "
                   "as fast as lz4 and writes faster: fewer bytes to move).")
@click.option("--level", type=int, default=None, help="zstd level for zarr's CPU encoder (the GPU's is fixed).")
@click.option("--chunk-bytes", type=_Bytes(), default=None,
              help="Bytes of one chunk, what nvCOMP decodes at once (default 64KiB, the fastest on a GPU; "
                   "zarr-python on a CPU reads 4MiB chunks about 6x faster; at most 16MiB).")
@click.option("--shard-bytes", type=_Bytes(), default=None,
              help="Bytes of one shard, what one task reads (default: the chunk size the workers' budget allows, "
                   "at most 1GiB).")
@click.option("--component", default=None,
              help="The array inside SRC: a Zarr group's component, or an HDF5 dataset's path such as /group/temp.")
@click.option("--backend", type=click.Choice(["auto", "gpu", "cpu"]), default=None,
              help="Where to encode: gpu (nvCOMP), cpu (zarr), auto (the GPU when there is one).")
@click.option("--workers", "n_workers", type=click.IntRange(min=1), default=None, help="Workers of a CPU cluster.")
@click.option("--overwrite", is_flag=True, help="Replace DST even when flowgpu did not write it.")
@click.option("--checksum/--no-checksum", default=None,
              help="End each chunk in zarr's crc32c, checked on every read (default: flowgpu.zarr.checksum, off).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@handle_errors
def convert(src: str, dst: str, codec: str, level: int | None, chunk_bytes: int | None, shard_bytes: int | None,
            component: str | None, backend: str | None, n_workers: int | None, overwrite: bool, checksum: bool | None,
            as_json: bool) -> None:
    """Rewrite SRC (a .npy file, a Zarr array, an HDF5 dataset, a multi-page TIFF file or a quoted glob of
    TIFF pages such as 'pages/*.tif') as a Zarr 3 store DST that the GPU decodes (nvCOMP codec, chunks and
    shards sized for the workers). DST appears only when complete."""
    check(src, dst, codec=codec, chunk_bytes=chunk_bytes, overwrite=overwrite)  # bad input: before any cluster
    options = {k: v for k, v in (("backend", backend), ("n_workers", n_workers)) if v is not None}
    with Session(dashboard_address=None, **options):
        out = convert_array(src, dst, codec=codec, level=level, chunk_bytes=chunk_bytes, shard_bytes=shard_bytes,
                            component=component, overwrite=overwrite, checksum=checksum)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    ratio = out["bytes"] / out["stored_bytes"] if out["stored_bytes"] else float("nan")
    shards = f", shards {tuple(out['shards'])}" if out["shards"] else ""
    click.echo(f"wrote {out['path']}: {tuple(out['shape'])} {out['dtype']}, chunks {tuple(out['chunks'])}{shards}, "
               f"{out['codec']}, {format_bytes(out['stored_bytes'])} for {format_bytes(out['bytes'])} "
               f"({ratio:.2f}x)")
