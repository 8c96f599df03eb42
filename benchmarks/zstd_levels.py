"""The zstd level of ``storage="auto"``'s pixel records: database size, build time and decode speed per level.

Usage:
    python benchmarks/zstd_levels.py [--count 5000] [--levels 1 3 4] [--repeats 3]

On the peers benchmark's folder of mixed-mode PNGs (``benchmarks/common.py``), for ``encoded`` and then
``auto`` at each level: the median of ``--repeats`` builds with every core, the database's size against
the files' apparent bytes and their allocated disk blocks, and how many of its records one core
decodes per second (``codec.decode_record`` with ``decoder="opencv"``, records already in memory),
against OpenCV decoding the PNG files themselves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import folder_bytes, make_png_folder  # noqa: E402

from lightning_lmdb.build.writer import build  # noqa: E402
from lightning_lmdb.codec import storage as codec  # noqa: E402
from lightning_lmdb.codec.storage import decode_record  # noqa: E402
from lightning_lmdb.store import database, envs


def _decode_rate(path: Path) -> float:
    """Records per second one core decodes (best of 3 passes over the records held in memory)."""
    codecs = database.load_meta(path).codecs
    with envs.reading(path) as opened, opened.env.begin(db=opened.records) as txn:
        values = [bytes(value) for _, value in txn.cursor()]
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for value, kind in zip(values, codecs, strict=True):
            decode_record(value, int(kind), decoder="opencv")
        best = min(best, time.perf_counter() - started)
    return len(values) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 3, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_bench"))
    args = parser.parse_args()
    source = make_png_folder(args.dir / f"pngs_{args.count}", args.count)
    apparent, allocated = folder_bytes(source)
    print(f"source: {args.count} PNGs, {apparent / 1e6:.1f} MB ({allocated / 1e6:.1f} MB on disk), {len(os.sched_getaffinity(0))} cores")
    print(f"{'storage':>14} {'build s':>8} {'x encoded':>9} {'db/files':>9} {'db/disk':>8} {'decode/s/core':>14}")
    build(source, args.dir / "zstd-warmup.lmdb", storage="encoded", overwrite=True, progress=False)  # files cached, imports done
    base = None
    for level in [None, *args.levels]:
        storage = "encoded" if level is None else "auto"
        if level is not None:
            codec.ZSTD_LEVEL = level  # read at each record's encode; the forked readers inherit it
        target = args.dir / f"zstd-{level}.lmdb"
        took = statistics.median(build(source, target, storage=storage, overwrite=True, progress=False).seconds
                                 for _ in range(args.repeats))
        base = took if base is None else base
        size = target.stat().st_size
        name = storage if level is None else f"auto, level {level}"
        print(f"{name:>14} {took:8.2f} {took / base:8.2f}x {size / apparent:8.3f}x {size / allocated:7.3f}x {_decode_rate(target):14.0f}")
        envs.close_all()


if __name__ == "__main__":
    main()
