"""Build throughput and size per storage mode: 1 worker vs all workers, on generated JPEGs or PNGs.

Usage:
    python benchmarks/bench_build.py [--count 10000] [--dir /tmp/lightning_lmdb_bench]     # JPEGs, every storage
    python benchmarks/bench_build.py --folder pngs --count 5000 --storages encoded auto --repeats 3 --workers all

``--folder pngs`` is the peers benchmark's folder of mixed-mode PNGs (``benchmarks/common.py``), ``jpegs``
(the default) 10,000 small JPEGs. Prints, per storage and worker count, the median of ``--repeats``
builds: seconds, images/s, MB/s, the database size against the source (apparent file bytes and
allocated disk blocks), then each storage's time against the first one's. The source files are in
the page cache (they were just generated or read), so this measures decode, encode and write, not the disk.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import folder_bytes, make_jpeg_folder, make_png_folder  # noqa: E402

from lightning_lmdb.build.writer import build  # noqa: E402
from lightning_lmdb.codec.storage import STORAGES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--folder", choices=("jpegs", "pngs"), default="jpegs")
    parser.add_argument("--storages", nargs="+", choices=STORAGES, default=list(STORAGES))
    parser.add_argument("--workers", choices=("both", "all", "one"), default="both", help="1 worker, all cores, or both")
    parser.add_argument("--repeats", type=int, default=1, help="builds per configuration (the median is reported)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_bench"))
    args = parser.parse_args()
    make = make_jpeg_folder if args.folder == "jpegs" else make_png_folder
    source = make(args.dir / f"{args.folder}_{args.count}", args.count)
    apparent, allocated = folder_bytes(source)
    cores = len(os.sched_getaffinity(0))
    counts = {"both": (1, cores), "all": (cores,), "one": (1,)}[args.workers]
    print(f"source: {args.count} {args.folder}, {apparent / 1e6:.1f} MB ({allocated / 1e6:.1f} MB on disk), {cores} cores, "
          f"median of {args.repeats} build(s)")
    print(f"{'storage':>8} {'workers':>7} {'seconds':>8} {'images/s':>9} {'MB/s':>7} {'db MB':>8} {'db/src':>7} {'db/disk':>8}")
    seconds: dict[tuple[str, int], float] = {}
    for storage in args.storages:
        for workers in counts:
            runs = [build(source, args.dir / f"{args.folder}-{storage}.lmdb", storage=storage, workers=workers, overwrite=True,
                          progress=False) for _ in range(args.repeats)]
            seconds[storage, workers] = took = statistics.median(r.seconds for r in runs)
            count, size = runs[-1].count, runs[-1].path.stat().st_size
            print(f"{storage:>8} {workers:>7} {took:8.2f} {count / took:9.0f} {apparent / 1e6 / took:7.1f} {size / 1e6:8.1f} "
                  f"{size / apparent:7.3f} {size / allocated:8.3f}")
    for workers in counts:
        base = args.storages[0]
        for storage in args.storages[1:]:
            print(f"{workers} worker(s): {storage} build time / {base} = {seconds[storage, workers] / seconds[base, workers]:.2f}x")
    if len(counts) > 1:
        for storage in args.storages:
            print(f"{storage}: {cores} workers / 1 worker = {seconds[storage, 1] / seconds[storage, cores]:.2f}x")


if __name__ == "__main__":
    main()
