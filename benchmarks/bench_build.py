"""Build throughput and size: 1 worker vs all workers, encoded and decoded, on >= 10,000 generated JPEGs.

Usage:
    python benchmarks/bench_build.py [--count 10000] [--dir /tmp/lightning_lmdb_bench]

Prints images/s and MB/s per configuration, the speedup of all workers over one, and the database
size against the source (apparent file bytes and allocated disk blocks). The source files are in
the page cache (they were just generated or read), so this measures decode + write, not the disk.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import folder_bytes, make_jpeg_folder  # noqa: E402

from lightning_lmdb.writer import build  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_bench"))
    args = parser.parse_args()
    source = make_jpeg_folder(args.dir / f"jpegs_{args.count}", args.count)
    apparent, allocated = folder_bytes(source)
    cores = len(os.sched_getaffinity(0))
    print(f"source: {args.count} JPEGs, {apparent / 1e6:.1f} MB ({allocated / 1e6:.1f} MB on disk), {cores} cores")
    print(f"{'storage':>8} {'workers':>7} {'seconds':>8} {'images/s':>9} {'MB/s':>7} {'db MB':>8} {'db/src':>7} {'db/disk':>8}")
    rates = {}
    for storage in ("encoded", "decoded"):
        for workers in (1, cores):
            report = build(source, args.dir / f"{storage}.lmdb", storage=storage, workers=workers, overwrite=True, progress=False)
            size = report.path.stat().st_size
            rates[storage, workers] = report.count / report.seconds
            print(
                f"{storage:>8} {workers:>7} {report.seconds:8.2f} {report.count / report.seconds:9.0f} "
                f"{apparent / 1e6 / report.seconds:7.1f} {size / 1e6:8.1f} {size / apparent:7.3f} {size / allocated:8.3f}"
            )
    for storage in ("encoded", "decoded"):
        print(f"{storage}: {cores} workers / 1 worker = {rates[storage, cores] / rates[storage, 1]:.2f}x")


if __name__ == "__main__":
    main()
