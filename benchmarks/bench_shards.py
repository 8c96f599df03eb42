"""Sharded build vs one process: a ``decoded`` build with K shards (K processes, each decoding and writing in-process).

Usage:
    python benchmarks/bench_shards.py [--count 10000] [--dir /tmp/lightning_lmdb_bench] [--shards 2] [--rounds 2]

Builds the same generated JPEG folder (in the page cache: this measures decode + write, not the disk) as:

* ``one process``: one file, read and decoded in the writer's own process (``workers=0``);
* ``1 reader + writer``: one file, one reader process piping to the writer (``workers=1``);
* ``pool``: one file, ``K`` reader processes sending pixels through a pipe to the single writer (the default);
* ``K shards``: a sharded folder, ``K`` processes each reading, decoding and writing its own shard file.

Each configuration is built ``--rounds`` times in rotating order; the table shows the median and the speed-up
over one process, and the samples of the sharded database are checked equal to the single file's.
Writes ``benchmarks/results/shards_build.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_jpeg_folder  # noqa: E402

from lightning_lmdb.build.writer import build  # noqa: E402
from lightning_lmdb.store import shards  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _remove(target: Path) -> None:
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_bench"))
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--storage", default="decoded", choices=("decoded", "encoded"))
    args = parser.parse_args()
    source = make_jpeg_folder(args.dir / f"jpegs_{args.count}", args.count)
    cores = len(os.sched_getaffinity(0))
    for path in source.rglob("*.jpg"):  # into the page cache: every build then reads the source from memory
        path.read_bytes()
    configs = {
        "one process": dict(workers=0),
        "1 reader + writer": dict(workers=1),
        f"pool of {args.shards} readers": dict(workers=args.shards),
        f"{args.shards} shards": dict(workers=args.shards, shards=args.shards),
    }
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    sizes: dict[str, int] = {}
    for rnd in range(args.rounds):
        names = list(configs)
        names = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in names:
            target = args.dir / f"shards-bench-{name.replace(' ', '-')}.lmdb"
            _remove(target)
            report = build(source, target, storage=args.storage, progress=False, **configs[name])
            seconds[name].append(report.seconds)
            sizes[name] = shards.database_bytes(target)
            print(f"round {rnd}: {name}: {report.count} records in {report.seconds:.1f} s", flush=True)
    one = args.dir / "shards-bench-one-process.lmdb"
    sharded = args.dir / f"shards-bench-{args.shards}-shards.lmdb"
    a, b = shards.load_meta(one, arrays=True), shards.load_meta(sharded, arrays=True)
    same = (a.count == b.count and (a.checksums == b.checksums).all() and (a.targets == b.targets).all()
            and a.paths.tolist() == b.paths.tolist())
    base = statistics.median(seconds["one process"])
    rows = [{"config": name, "seconds": statistics.median(s), "images_per_s": a.count / statistics.median(s),
             "vs_one_process": base / statistics.median(s), "db_mb": sizes[name] / 1e6, "rounds": s} for name, s in seconds.items()]
    lines = [
        f"{args.storage} build of {a.count} generated JPEGs ({args.dir / f'jpegs_{args.count}'}), {cores} cores, median of "
        f"{args.rounds} rounds; sharded records identical to the single file's: {same}",
        "",
        "| build | seconds | images/s | vs one process | database MB |",
        "|---|---:|---:|---:|---:|",
        *(f"| {r['config']} | {r['seconds']:.1f} | {r['images_per_s']:.0f} | {r['vs_one_process']:.2f}x | {r['db_mb']:.0f} |"
          for r in rows),
        "",
        f"Reproduce: python benchmarks/bench_shards.py --count {args.count} --shards {args.shards} --rounds {args.rounds}",
    ]
    print("\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "shards_build.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "shards_build.json").write_text(json.dumps({"cores": cores, "count": a.count, "storage": args.storage,
                                                           "identical": bool(same), "rows": rows}, indent=1))
    for name in configs:
        _remove(args.dir / f"shards-bench-{name.replace(' ', '-')}.lmdb")
    if not same:
        raise SystemExit("the sharded database differs from the single file")


if __name__ == "__main__":
    main()
