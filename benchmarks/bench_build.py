"""Build throughput and size per storage mode: 1 worker vs all workers, on generated JPEGs or PNGs.

Usage:
    python benchmarks/bench_build.py [--count 10000] [--dir /tmp/lightning_lmdb_bench]     # JPEGs, every storage
    python benchmarks/bench_build.py --folder pngs --count 5000 --storages encoded auto --repeats 3 --workers all

``--folder pngs`` is the peers benchmark's folder of mixed-mode PNGs (``benchmarks/common.py``), ``jpegs``
(the default) 10,000 small JPEGs. Prints, per storage and worker count, the median of ``--repeats``
builds: seconds, images/s, MB/s, the database size against the source (apparent file bytes and
allocated disk blocks), then each storage's time against the first one's. The source files are in
the page cache (they were just generated or read), so this measures decode, encode and write, not the disk.

``--resume`` measures instead what a resume costs against a full build, from the CLI (a fresh ``lightning-lmdb build`` process
each, as a user runs it): the full build's wall time and CPU per image (the process and its readers: ``RUSAGE_CHILDREN``),
then a build killed by the test hook (``LIGHTNING_LMDB_TEST_KILL_AT``) after 90 % of its records were committed and its
resume's wall time. ``--trees`` runs the same for several source trees of lightning_lmdb (each on ``PYTHONPATH``),
alternating, so a change is compared with its base in one run::

    git archive <base> | tar -x -C /tmp/base
    python benchmarks/bench_build.py --resume --folder icons --count 3000 --repeats 3 --trees /tmp/base .
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import folder_bytes, make_icon_folder, make_jpeg_folder, make_photo_folder, make_png_folder  # noqa: E402

from lightning_lmdb.build.writer import build  # noqa: E402
from lightning_lmdb.codec.storage import STORAGES  # noqa: E402

FOLDERS = {"jpegs": make_jpeg_folder, "pngs": make_png_folder, "icons": make_icon_folder, "photos": make_photo_folder}


def cli_build(tree: Path, source: Path, target: Path, workers: int, every: int, kill_at: str | None = None) -> tuple[float, float, str]:
    """One ``lightning-lmdb build`` process of ``tree``'s lightning_lmdb: (wall seconds, CPU seconds of it and its readers, its
    report line); ``kill_at``: the test hook's kill point (the process is then killed there)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("LIGHTNING_LMDB_TEST_KILL_AT", None)
    if kill_at:
        env["LIGHTNING_LMDB_TEST_KILL_AT"] = kill_at
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lightning_lmdb.tools.cli", "build", str(source), str(target), "--workers",
                           str(workers), "--commit-every", str(every), "--quiet"], env=env, capture_output=True, text=True,
                          start_new_session=True, cwd=tree)  # -m puts the working folder first on sys.path
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if kill_at is None and done.returncode != 0:
        raise SystemExit(f"the build failed: {done.stderr}")
    return wall, cpu, done.stdout.strip()


def remove_build(target: Path) -> None:
    for path in target.parent.glob(target.name + "*"):
        path.unlink()


def resume_bench(args: argparse.Namespace, source: Path, count: int) -> None:
    """Full build vs resumed after 90 % from the CLI, per tree, alternating; medians of ``--repeats``."""
    workers = len(os.sched_getaffinity(0)) if args.workers in ("both", "all") else 1
    every = max(1, count // 10)  # 10 commits: killed after the 9th, 90 % committed
    trees = [Path(t).resolve() for t in (args.trees or ["."])]
    runs: dict[Path, dict[str, list[float]]] = {t: {"full": [], "cpu": [], "resume": []} for t in trees}
    line = ""
    for _ in range(args.repeats):
        for tree in trees:
            target = args.dir / "resume.lmdb"
            remove_build(target)
            wall, cpu, _ = cli_build(tree, source, target, workers, every)
            runs[tree]["full"].append(wall)
            runs[tree]["cpu"].append(cpu)
            remove_build(target)
            cli_build(tree, source, target, workers, every, kill_at="commit:9")
            wall, _, line = cli_build(tree, source, target, workers, every)
            assert "resumed" in line, line
            runs[tree]["resume"].append(wall)
            remove_build(target)
    print(f"source: {count} {args.folder}, {workers} workers, commit every {every}, median of {args.repeats}; last resume: {line}")
    print(f"{'tree':>30} {'full s':>7} {'CPU ms/img':>11} {'resume s':>9} {'resume/full':>12}")
    for tree, got in runs.items():
        full, resume = statistics.median(got["full"]), statistics.median(got["resume"])
        print(f"{str(tree)[-30:]:>30} {full:7.2f} {statistics.median(got['cpu']) / count * 1e3:11.3f} {resume:9.2f} "
              f"{resume / full:12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--folder", choices=tuple(FOLDERS), default="jpegs")
    parser.add_argument("--resume", action="store_true", help="full build vs resumed after 90 %% from the CLI (see above)")
    parser.add_argument("--trees", nargs="+", help="with --resume: lightning_lmdb source trees to compare (default: this one)")
    parser.add_argument("--storages", nargs="+", choices=STORAGES, default=list(STORAGES))
    parser.add_argument("--workers", choices=("both", "all", "one"), default="both", help="1 worker, all cores, or both")
    parser.add_argument("--repeats", type=int, default=1, help="builds per configuration (the median is reported)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_bench"))
    args = parser.parse_args()
    source = FOLDERS[args.folder](args.dir / f"{args.folder}_{args.count}", args.count)
    if args.resume:
        resume_bench(args, source, args.count)
        return
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
