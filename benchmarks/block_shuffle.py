"""Cold-cache epoch reads of record bytes: exact shuffle vs block shuffle, with readahead off (data larger than RAM).

Usage:
    python benchmarks/block_shuffle.py [--database DB | --source FOLDER] [--dir /tmp/lightning_lmdb_blockshuffle]
                                       [--count 10000] [--workers 2 0] [--batch-size 32] [--limit N] [--passes 1]

Builds (or reuses) an encoded database of FOLDER -- by default ``DIR/photos_COUNT``, ImageNet-like JPEGs
generated once with ``benchmarks/common.py`` -- or reads ``--database`` as it is. For each mode it closes
this process's environments, evicts the file from the page cache (``posix_fadvise``, checked with
``mincore``), then reads one epoch of record bytes in the sampler's order through a DataLoader (no
decode: each record's pages are touched, and its length returned):

* ``exact, readahead off``: ``ResumableSampler(shuffle=True)``, the environment opened with readahead off
  (what the library does for data larger than RAM): one 4 KB read per page fault.
* ``block, readahead off, block reads``: ``shuffle="block"`` and ``LMDBImageDataset.read_blocks(True)``:
  one large read per block of ~4 MiB of records.
* ``block, readahead off, no block reads``: the order alone, to show what the reads add.
* ``exact, readahead on`` and ``sequential, readahead on``: references (readahead pays when data fits in RAM).

Prints a table and the ratio block / exact (readahead off, records/s; the target is >= 2x), and writes
``benchmarks/results/block_shuffle.md`` and ``.json`` (``--results`` names them). Figures are ratios within one run on one machine:
the absolute numbers depend on the disk (and on a VM, on the host's cache, which eviction cannot reach).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from bisect import bisect_right
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_photo_folder  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from lightning_lmdb import build_lmdb  # noqa: E402
from lightning_lmdb.read.dataset import LMDBImageDataset  # noqa: E402
from lightning_lmdb.read.loadstats import touch_pages  # noqa: E402
from lightning_lmdb.read.sampler import ResumableSampler  # noqa: E402
from lightning_lmdb.store import envs, shards
from lightning_lmdb.store import format as fmt  # noqa: E402
from lightning_lmdb.tools import pagecache as cache

RESULTS = Path(__file__).resolve().parent / "results"

#: (name, shuffle, readahead, block reads)
MODES: tuple[tuple[str, Any, bool, bool], ...] = (
    ("exact, readahead off", True, False, False),
    ("block, readahead off, block reads", "block", False, True),
    ("block, readahead off, no block reads", "block", False, False),
    ("exact, readahead on", True, True, False),
    ("sequential, readahead on", False, True, False),
)


class RecordBytes(LMDBImageDataset):
    """The record's length instead of its image: its pages are touched (read), nothing is decoded."""

    def _load(self, row: int, marks: list[float] | None = None) -> Any:
        part = bisect_right(self._starts, row) - 1  # one file, or the shard holding the row
        opened = self._opened(part)
        with opened.env.begin(buffers=True) as txn:
            value = txn.get(fmt.record_key(row - self._starts[part]), db=opened.records)
            touch_pages(value)
            return len(value)


def read_epoch(path: Path, shuffle: Any, readahead: bool, block_reads: bool, workers: int, batch_size: int,
               limit: int | None) -> dict[str, Any]:
    """One cold epoch (or its first ``limit`` samples) of record bytes; the figures of the row."""
    dataset = RecordBytes(path, readahead=readahead).read_blocks(block_reads)
    order = list(ResumableSampler(dataset, shuffle=shuffle, seed=0))[:limit]
    envs.close_all()
    files = shards.database_files(path)
    cache.evict(files, sync=True)
    cached = max(cache.resident_fraction(f) for f in files)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=order, num_workers=workers, persistent_workers=False)
    started = time.perf_counter()
    records = read = 0
    for sizes, _ in loader:
        records += len(sizes)
        read += int(sizes.sum())
    seconds = time.perf_counter() - started
    envs.close_all()
    return {"records": records, "bytes": read, "seconds": seconds, "records_per_s": records / seconds,
            "mb_per_s": read / seconds / 1e6, "cached_after_evict": cached, "block_size": dataset.block_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", type=Path, help="read this database as it is (no build)")
    parser.add_argument("--source", type=Path, help="image folder to build the database from (default: generated)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_blockshuffle"), help="where generated data goes")
    parser.add_argument("--count", type=int, default=10_000, help="images of the generated folder")
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="DataLoader workers, one run of every mode each")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--limit", type=int, default=None, help="read only the first N samples of each epoch's order")
    parser.add_argument("--passes", type=int, default=1, help="repetitions; rows report the median")
    parser.add_argument("--results", default="block_shuffle", help="file name (stem) of the results in benchmarks/results/")
    parser.add_argument("--modes", nargs="+", default=[m[0] for m in MODES], choices=[m[0] for m in MODES], metavar="MODE")
    args = parser.parse_args()
    if args.database is not None:
        database = args.database.absolute()
    else:
        source = args.source or make_photo_folder(args.dir / f"photos_{args.count}", args.count)
        database = build_lmdb(source, args.dir / f"{Path(source).name}.lmdb")
    size, count = shards.database_bytes(database), len(LMDBImageDataset(database))
    print(f"{database}: {count} records, {size / 1e6:.0f} MB ({size / count / 1e3:.1f} KB a record); "
          f"{len(os.sched_getaffinity(0))} cores; block size {LMDBImageDataset(database).block_size} records")
    rows = []
    for workers in args.workers:
        for name, shuffle, readahead, block_reads in (m for m in MODES if m[0] in args.modes):
            runs = [read_epoch(database, shuffle, readahead, block_reads, workers, args.batch_size, args.limit)
                    for _ in range(args.passes)]
            run = sorted(runs, key=lambda r: r["records_per_s"])[len(runs) // 2]
            rows.append({"mode": name, "workers": workers, **run})
            print(f"  {name:38s} workers={workers}  {run['records_per_s']:9.0f} records/s  {run['mb_per_s']:7.1f} MB/s  "
                  f"{run['seconds']:6.1f} s  (cached after eviction: {run['cached_after_evict']:.1%})", flush=True)
    ratios = {}
    for workers in args.workers:
        by = {r["mode"]: r for r in rows if r["workers"] == workers}
        if "exact, readahead off" in by and "block, readahead off, block reads" in by:
            ratios[workers] = by["block, readahead off, block reads"]["records_per_s"] / by["exact, readahead off"]["records_per_s"]
            print(f"workers={workers}: block shuffle with block reads / exact shuffle, readahead off: {ratios[workers]:.1f}x "
                  "(target >= 2x)")
    command = "python benchmarks/block_shuffle.py " + " ".join(sys.argv[1:])
    write_results(database, size, count, rows, ratios, command, args.results)


def write_results(database: Path, size: int, count: int, rows: list[dict[str, Any]], ratios: dict[int, float], command: str,
                  stem: str) -> None:
    """``benchmarks/results/STEM.json`` (every figure) and ``STEM.md`` (the table)."""
    RESULTS.mkdir(exist_ok=True)
    info = {"database": str(database), "bytes": size, "records": count, "cores": len(os.sched_getaffinity(0)),
            "kernel": platform.release(), "command": command, "ratios_block_over_exact_readahead_off": ratios, "rows": rows}
    (RESULTS / f"{stem}.json").write_text(json.dumps(info, indent=2) + "\n")
    lines = [
        "# Block shuffle: one cold epoch of record bytes",
        "",
        f"`{command}` -- {count} records, {size / 1e6:.0f} MB ({size / count / 1e3:.1f} KB a record), "
        f"{info['cores']} cores, kernel {info['kernel']}. The file is evicted from the page cache before each row.",
        "",
        "| mode | workers | records/s | MB/s | seconds | cached after eviction |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {r['mode']} | {r['workers']} | {r['records_per_s']:.0f} | {r['mb_per_s']:.1f} | {r['seconds']:.1f} | "
          f"{r['cached_after_evict']:.1%} |" for r in rows),
        "",
        *(f"Block shuffle with block reads / exact shuffle, readahead off, {w} workers: **{x:.1f}x** (target >= 2x)."
          for w, x in ratios.items()),
        "",
    ]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines))
    print(f"wrote {RESULTS / stem}.md and .json")


if __name__ == "__main__":
    main()
