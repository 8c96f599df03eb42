"""Sharded build vs one process: a ``decoded`` build with K shards (K processes, each decoding and writing in-process).

Usage:
    python benchmarks/bench_shards.py [--count 10000] [--dir /tmp/lightning_lmdb_bench] [--shards 2] [--rounds 2]
    python benchmarks/bench_shards.py --mixed [--icons 400] [--wallpapers 32] [--rounds 3]

``--mixed``: a folder of small PNG icons followed by large JPEG wallpapers (decoded ~2x vs ~10x their files), built
``decoded`` in one process and in K shards cut by estimated work (this library) and by source bytes (the cut before
it), each shard's wall time from its start to its file's completion; and the cost of reading the headers the cut
needs, locally and through the latency mount (:mod:`lightning_lmdb.tools.netfs`, 0.5 ms, where FUSE is usable).
Writes ``benchmarks/results/shards_mixed.{md,json}``.

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
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_jpeg_folder, photo_pixels  # noqa: E402
from PIL import Image  # noqa: E402

from lightning_lmdb.build import workcut  # noqa: E402
from lightning_lmdb.build.writer import build  # noqa: E402
from lightning_lmdb.sources.folder import scan_folder  # noqa: E402
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
    parser.add_argument("--mixed", action="store_true", help="the icons + wallpapers folder, work cut vs byte cut")
    parser.add_argument("--icons", type=int, default=400)
    parser.add_argument("--wallpapers", type=int, default=32)
    args = parser.parse_args()
    if args.mixed:
        mixed(args)
        return
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


def make_mixed_folder(root: Path, icons: int, wallpapers: int) -> Path:
    """``icons`` small photo-like PNGs (class ``icons``, 96-192 px) then ``wallpapers`` photo-like JPEGs of 2-4 Mpx (``wallpapers``)."""
    marker = root / ".complete"
    if marker.exists() and marker.read_text() == f"{icons} {wallpapers} v2":
        return root
    rng = np.random.default_rng(0)
    (root / "icons").mkdir(parents=True, exist_ok=True)
    (root / "wallpapers").mkdir(parents=True, exist_ok=True)
    for i in range(icons):  # photo-like content: ~2.5 bytes a pixel, so the icons are a good part of the folder's bytes
        side = int(rng.integers(96, 193))
        Image.fromarray(photo_pixels(rng, side, side)).save(root / "icons" / f"icon_{i:05d}.png")
    for i in range(wallpapers):
        width = int(rng.integers(1920, 2561))
        Image.fromarray(photo_pixels(rng, width, width * 2 // 3)).save(root / "wallpapers" / f"wall_{i:04d}.jpg", quality=90)
    marker.write_text(f"{icons} {wallpapers} v2")
    return root


def _timed_build(source: Path, target: Path, **options: object) -> tuple[float, list[float]]:
    """Build ``target``; the wall time and each shard's (from the start to its file's last write, the rename keeping it)."""
    _remove(target)
    os.sync()  # the build before's dirty pages written out first, not during this one
    start = time.time()
    report = build(source, target, storage="decoded", progress=False, **options)
    files = shards.database_files(target) if options.get("shards") else []
    return report.seconds, [os.stat(f).st_mtime - start for f in files]


def _cpu() -> float:
    """CPU seconds of this process and its finished children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _header_cost(source: Path, files: list, threads: int) -> float:
    """Seconds per file to compute the decoded works of ``files`` (headers read by ``threads`` threads)."""
    workcut.HEADER_THREADS = threads
    start = time.perf_counter()
    workcut.scan_works(files, "decoded", None)
    return (time.perf_counter() - start) / len(files)


def mixed(args: argparse.Namespace) -> None:
    """The ``--mixed`` benchmark (see the module docstring)."""
    source = make_mixed_folder(args.dir / f"mixed_{args.icons}_{args.wallpapers}", args.icons, args.wallpapers)
    cores = len(os.sched_getaffinity(0))
    for path in source.rglob("*.*"):
        path.read_bytes()
    scan = scan_folder(source)
    works = workcut.scan_works(scan.files, "decoded", None)
    cuts = {"work cut": workcut.work_ranges(scan, "decoded", None, args.shards),
            "byte cut": shards.shard_ranges([f.size for f in scan.files], args.shards)}
    held = {name: [sum(works[a:b]) for a, b in ranges] for name, ranges in cuts.items()}
    byte_cut = lambda scan, storage, resize, k: shards.shard_ranges([f.size for f in scan.files], k)  # noqa: E731
    work_ranges = workcut.work_ranges
    configs = ["one process", f"{args.shards} shards, work cut", f"{args.shards} shards, byte cut"]
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    shard_seconds: dict[str, list[list[float]]] = {name: [] for name in configs}
    for rnd in range(args.rounds):
        for name in configs[rnd % 3:] + configs[:rnd % 3]:
            workcut.work_ranges = byte_cut if "byte" in name else work_ranges
            target = args.dir / f"mixed-{name.replace(' ', '-').replace(',', '')}.lmdb"
            options = dict(workers=0) if name == "one process" else dict(workers=args.shards, shards=args.shards)
            wall, per_shard = _timed_build(source, target, **options)
            seconds[name].append(wall)
            shard_seconds[name].append(per_shard)
            print(f"round {rnd}: {name}: {wall:.2f} s, shards {[round(s, 2) for s in per_shard]}", flush=True)
            _remove(target)
    # each shard alone, as a job array's task in this process (workers=0): its wall and CPU seconds, free of the other
    # shard's contention for the cores (the machine may be shared: the concurrent rows above then understate the speed-up)
    alone: dict[str, list[list[tuple[float, float]]]] = {
        name: [[] for _ in range(1 if name == "one process" else args.shards)] for name in ["one process", *cuts]}
    for rnd in range(args.rounds):  # every build of a round, in rotating order: a drift in the machine's load hits all alike
        names = list(alone)
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            workcut.work_ranges = byte_cut if "byte" in name else work_ranges
            target = args.dir / "mixed-alone.lmdb"
            _remove(target)
            order = list(enumerate(alone[name]))
            for i, runs in order if rnd % 2 == 0 else order[::-1]:  # the shards in either order: neither always goes first
                options = dict(workers=0) if name == "one process" else dict(workers=0, shards=args.shards, shard=i)
                os.sync()  # the build before's dirty pages written out first, not during this one
                cpu, wall = _cpu(), time.perf_counter()
                build(source, target, storage="decoded", progress=False, **options)
                runs.append((time.perf_counter() - wall, _cpu() - cpu))
            _remove(target)
    for name, parts in alone.items():
        print(f"alone: {name}: {[[(round(w, 2), round(c, 2)) for w, c in runs] for runs in parts]}", flush=True)
    workcut.work_ranges = work_ranges
    local = {threads: _header_cost(source, scan.files, threads) for threads in (1, 16)}
    remote: dict[int, float] | str
    try:
        from lightning_lmdb.tools import netfs
        with netfs.mounted(source, args.dir / "mixed-mount", latency_ms=0.5) as mount:
            mounted = scan_folder(mount.path)
            remote = {threads: _header_cost(mount.path, mounted.files, threads) for threads in (1, 16)}
    except Exception as exc:  # noqa: BLE001 - reported, not fatal: FUSE may be absent
        remote = f"latency mount unavailable: {type(exc).__name__}: {exc}"
    workcut.HEADER_THREADS = 16
    base = statistics.median(seconds["one process"])
    rows = []
    for name in configs:
        wall = statistics.median(seconds[name])
        per_shard = [statistics.median(s[i] for s in shard_seconds[name]) for i in range(args.shards)] if "shards" in name else []
        rows.append({"config": name, "seconds": wall, "vs_one_process": base / wall, "shard_seconds": per_shard,
                     "shard_spread": max(per_shard) / min(per_shard) if per_shard else None, "rounds": seconds[name]})
    alone_cpu = {name: [statistics.median(c for _, c in runs) for runs in parts] for name, parts in alone.items()}
    alone_wall = {name: [statistics.median(w for w, _ in runs) for runs in parts] for name, parts in alone.items()}
    lines = [
        f"Load average at the end: {' / '.join(f'{v:.1f}' for v in os.getloadavg())} (other work on the machine slows the "
        "concurrent builds)",
        "",
        f"decoded build of {args.icons} PNGs (96-192 px) + {args.wallpapers} JPEG wallpapers (2-4 Mpx) ({source}), {cores} cores, median "
        f"of {args.rounds} rounds",
        "",
        "| build | seconds | vs one process | shard seconds (start to file done) | slowest / fastest shard |",
        "|---|---:|---:|---|---:|",
        *(f"| {r['config']} | {r['seconds']:.2f} | {r['vs_one_process']:.2f}x | "
          f"{' / '.join(f'{s:.2f}' for s in r['shard_seconds']) or '-'} | "
          f"{'-' if r['shard_spread'] is None else format(r['shard_spread'], '.2f')} |" for r in rows),
        "",
        "Estimated work per shard (byte-equivalents, workcut.file_work): "
        + "; ".join(f"{name} {' / '.join(f'{w / 1e6:.1f} M' for w in ws)} ({max(ws) / min(ws):.2f})" for name, ws in held.items()),
        f"Reading the headers for the cut, per file: local {local[1] * 1e6:.0f} us (1 thread), {local[16] * 1e6:.0f} us (16 threads); "
        + (f"latency mount 0.5 ms: {remote[1] * 1e6:.0f} us (1 thread), {remote[16] * 1e6:.0f} us (16 threads)"
           if isinstance(remote, dict) else str(remote)),
        "",
        "Each shard built alone (a job array's task, in one process), median wall / CPU seconds, and the speed-up over one "
        "process its slowest shard allows on 2 free cores (one process's CPU / the slowest shard's CPU):",
        "",
        "| build | wall seconds | CPU seconds | slowest / fastest shard (CPU) | speed-up its slowest shard allows |",
        "|---|---|---|---:|---:|",
        *(f"| {name}{' (each shard alone)' if name != 'one process' else ''} | {' / '.join(f'{w:.2f}' for w in alone_wall[name])} | "
          f"{' / '.join(f'{c:.2f}' for c in cpu)} | {max(cpu) / min(cpu):.2f} | {alone_cpu['one process'][0] / max(cpu):.2f}x |"
          for name, cpu in alone_cpu.items()),
        "",
        f"Reproduce: python benchmarks/bench_shards.py --mixed --icons {args.icons} --wallpapers {args.wallpapers} "
        f"--shards {args.shards} --rounds {args.rounds}",
    ]
    print("\n".join(lines))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "shards_mixed.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "shards_mixed.json").write_text(json.dumps({"cores": cores, "rows": rows, "held": held, "header_local_s": local,
                                                           "header_mount_s": remote,
                                                           "alone_wall_s": alone_wall, "alone_cpu_s": alone_cpu}, indent=1))


if __name__ == "__main__":
    main()
