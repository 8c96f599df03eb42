"""Read throughput: raw files vs LMDB (readahead on and off), cold and warm page cache, shuffled order.

Usage:
    python benchmarks/bench_read.py [--count 10000] [--dir /tmp/lightning_lmdb_bench] [--passes 3]
                                    [--limit N] [--decode-limit N] [--latency-ms 0 0.5 2]

Generates (or reuses) ``DIR/jpegs_COUNT`` of photo-like JPEGs, builds ``DIR/bench_read.lmdb`` from it
if needed, then runs :func:`lightning_lmdb.tools.bench.run_read_benchmark` twice in this one process: reading
bytes only, and reading + decoding every sample to RGB (the end-to-end per-sample cost). "cold" passes
run right after the files and the database were evicted from the page cache (verified with mincore);
the ``cached`` column shows what survived eviction. Goal: LMDB never slower than raw files, cold
shuffled reads >= 4x raw files. ``--latency-ms`` repeats it through a latency mount of each value
(emulated network storage, :mod:`lightning_lmdb.tools.netfs`): every lookup, open and read a round trip.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_jpeg_folder  # noqa: E402

from lightning_lmdb.tools.bench import run_read_benchmark  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="images in the generated folder")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_bench"), help="where the folder and database live")
    parser.add_argument("--passes", type=int, default=3, help="repetitions; rows report the median")
    parser.add_argument("--limit", type=int, default=None, help="samples per pass, bytes only (default: all)")
    parser.add_argument("--decode-limit", type=int, default=None, help="samples per pass with decoding (default: all)")
    parser.add_argument("--latency-ms", nargs="+", type=float, default=[None], metavar="MS",
                        help="read through a latency mount of MS per request, once per value (default: straight from the disk)")
    args = parser.parse_args()
    started = time.perf_counter()
    source = make_jpeg_folder(args.dir / f"jpegs_{args.count}", args.count)
    target = args.dir / "bench_read.lmdb"
    print(f"{len(os.sched_getaffinity(0))} cores; source {source}; database {target}")
    results = []
    for ms in args.latency_ms:
        where = "the disk" if ms is None else f"a {ms:g} ms latency mount"
        print(f"\n== bytes only, from {where} ==")
        bytes_rows = run_read_benchmark(source, target, passes=args.passes, limit=args.limit, latency_ms=ms)
        print(f"\n== read + decode, from {where} ==")
        decode_rows = run_read_benchmark(source, target, passes=args.passes, limit=args.decode_limit, decode=True, latency_ms=ms)
        results += [(f"{where}, bytes", bytes_rows), (f"{where}, decode", decode_rows)]
    print()
    for label, rows in results:
        cold = {r["storage"]: r for r in rows if r["regime"] == "cold"}
        slower = [f"{r['storage']} {r['regime']} ({r['vs_raw']:.2f}x)" for r in rows if r["vs_raw"] < 1.0]
        not_evicted = [r["storage"] for r in rows if r["evicted"] is False]
        goal = " (goal >= 4x)" if label.endswith("bytes") else ""
        print(
            f"{label}: cold lmdb readahead=on / raw = {cold['lmdb readahead=on']['vs_raw']:.2f}x{goal}; "
            f"slower than raw: {', '.join(slower) or 'none'}; eviction failed: {', '.join(not_evicted) or 'never'}"
        )
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
