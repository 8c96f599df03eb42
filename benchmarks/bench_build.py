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

``--vs-litdata`` compares a build with LitData's ``optimize`` (the call of ``benchmarks/peers.py``) on the same folders with
the same worker count (``--litdata-workers``, 2): icons (``--count``), ImageNet-like JPEGs (``--count``) and icons plus
``--wallpapers`` 2-4 Mpx JPEGs and lossy WebPs in one class folder. Each build is a fresh process (``optimize`` in a child of
this script, ``lightning-lmdb build SRC DST --workers N --validate LEVEL`` with the default storage): its wall time and
CPU (``RUSAGE_SELF`` + ``RUSAGE_CHILDREN`` deltas: the process and its workers). "Validation alone" is the CPU, in one
process on the files' bytes already read, of what each level checks of each file (a full decode where the default
storage stores pixels, else ``validate_file``); the table's last column is (build CPU - that) / images. ``--rounds``
rounds, the order of the builds reversed every other round; medians::

    python benchmarks/bench_build.py --vs-litdata --count 3000 --wallpapers 16 --rounds 2
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import folder_bytes, make_icon_folder, make_jpeg_folder, make_photo_folder, make_png_folder, photo_pixels  # noqa: E402

from lightning_lmdb.build.writer import build  # noqa: E402
from lightning_lmdb.codec.storage import STORAGES, VALIDATE_LEVELS  # noqa: E402

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


def make_wallpaper_folder(root: Path, icons: int, wallpapers: int, seed: int = 0) -> Path:
    """``icons`` icons (:func:`make_icon_folder`) plus ``wallpapers`` 2-4 Mpx photo-like images in ``wallpapers/``: JPEGs
    (quality 90) and lossy WebPs (quality 80), alternating; generated once, then reused."""
    from PIL import Image

    make_icon_folder(root, icons, seed=seed)
    marker = root / ".wallpapers"
    if marker.exists() and marker.read_text() == str(wallpapers):
        return root
    folder = root / "wallpapers"
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng((seed, 33))
    for i in range(wallpapers):
        width = int(rng.integers(1920, 2561))
        height = int(rng.uniform(2.0e6, 4.0e6) / width)
        image = Image.fromarray(photo_pixels(rng, width, height))
        if i % 2:
            image.save(folder / f"wall_{i:03d}.webp", quality=80)
        else:
            image.save(folder / f"wall_{i:03d}.jpg", quality=90)
    marker.write_text(str(wallpapers))
    return root


def timed_process(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run ``command`` to its end: (wall seconds, CPU seconds of this process and its children meanwhile)."""
    before_self, before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, start_new_session=True)
    wall = time.perf_counter() - started
    after_self, after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{command[:4]} failed: {done.stderr[-2000:]}")
    cpu = sum(a.ru_utime - b.ru_utime + a.ru_stime - b.ru_stime
              for a, b in ((after_self, before_self), (after, before)))
    return wall, cpu


def litdata_child(source: Path, out: Path, workers: int) -> None:
    """In a fresh process: build ``source`` with LitData's ``optimize`` as ``benchmarks/peers.py`` does."""
    import shutil

    from peers import _build_litdata

    from lightning_lmdb.sources.folder import scan_folder

    shutil.rmtree(out, ignore_errors=True)
    files = scan_folder(source).files
    _build_litdata([f.path for f in files], [f.target for f in files], out, workers)


def validation_cpu(source: Path) -> tuple[int, dict[str, float]]:
    """(images, {level: CPU seconds}) of the validation each level does on ``source``'s files, in this process.

    A file whose default-storage record is pixels is decoded fully at every level (as the builder does); any other is
    checked by ``validate_file`` at the level. The files' bytes are read before timing; the median of 3 passes."""
    import warnings

    from lightning_lmdb.codec.decoders import decode_pil, open_checked
    from lightning_lmdb.codec.storage import _PixelsOnDemand, storage_mode, validate_file
    from lightning_lmdb.options import BuildOptions
    from lightning_lmdb.sources.folder import scan_folder

    warnings.filterwarnings("ignore", category=UserWarning)  # PIL's palette-transparency note, once per icon
    mode = storage_mode(BuildOptions.storage)
    files = []
    for f in scan_folder(source).files:
        data = Path(f.path).read_bytes()
        with open_checked(data) as opened:
            size = opened.size
        image = _PixelsOnDemand(data, size, None, f.path)
        mode.encode(data, image, None, 90)  # type: ignore[arg-type]
        files.append((data, image.decoded is not None))
    cpu = {}
    for level in VALIDATE_LEVELS:
        passes = []
        for _ in range(3):
            started = time.process_time()
            for data, pixels in files:
                if pixels:
                    decode_pil(data).close()
                else:
                    validate_file(data, level)
            passes.append(time.process_time() - started)
        cpu[level] = statistics.median(passes)
    return len(files), cpu


def vs_litdata(args: argparse.Namespace) -> None:
    """LitData ``optimize`` vs ``lightning-lmdb build`` per validation level, per folder (see the module docstring)."""
    import platform
    import shutil

    workers = args.litdata_workers
    makers = {"icons": (f"icons ({args.count})", lambda: make_icon_folder(args.dir / f"icons_{args.count}", args.count)),
              "jpegs": (f"JPEGs ({args.count})", lambda: make_photo_folder(args.dir / f"photos_{args.count}", args.count)),
              "wallpapers": (f"icons ({args.count}) + {args.wallpapers} wallpapers", lambda: make_wallpaper_folder(
                  args.dir / f"icons_walls_{args.count}_{args.wallpapers}", args.count, args.wallpapers))}
    folders = {makers[key][0]: makers[key][1]() for key in args.vs_folders}
    levels = ("full", "reduced", "header")
    here = Path(__file__).resolve()
    tree = here.parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(here.parent)])}
    env.pop("LIGHTNING_LMDB_TEST_KILL_AT", None)
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for round_ in range(args.rounds):
        for name, source in folders.items():
            kinds = ["litdata", *levels]
            for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
                if kind == "litdata":
                    out = args.dir / "vs_litdata_out"
                    command = [sys.executable, str(here), "--litdata-child", str(source), str(out), str(workers)]
                else:
                    out = args.dir / "vs_litdata.lmdb"
                    remove_build(out)
                    command = [sys.executable, "-m", "lightning_lmdb.tools.cli", "build", str(source), str(out), "--workers",
                               str(workers), "--validate", kind, "--quiet"]
                runs.setdefault((name, kind), []).append(timed_process(command, env))
                print(f"round {round_ + 1} {name} {kind}: {runs[name, kind][-1][0]:.2f} s", file=sys.stderr, flush=True)
                shutil.rmtree(args.dir / "vs_litdata_out", ignore_errors=True)
                remove_build(args.dir / "vs_litdata.lmdb")
    startup = statistics.median(timed_process([sys.executable, "-m", "lightning_lmdb.tools.cli", "build", "--help"], env)[1]
                                for _ in range(3))
    print(f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores, {workers} workers each, "
          f"Python {platform.python_version()}, median of {args.rounds} rounds (order reversed every other round); "
          f"the CLI's start alone (build --help): {startup * 1e3:.0f} ms CPU, in every build's CPU")
    print("| folder | build | wall s | x LitData | CPU ms/image | validation alone ms/image | CPU beyond validation ms/image |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, source in folders.items():
        images, checked = validation_cpu(source)
        base = statistics.median(w for w, _ in runs[name, "litdata"])
        for kind in ("litdata", *levels):
            wall = statistics.median(w for w, _ in runs[name, kind])
            cpu = statistics.median(c for _, c in runs[name, kind])
            label = "LitData optimize" if kind == "litdata" else f"ours, validate={kind}"
            alone = beyond = "-"
            if kind != "litdata":
                alone = f"{checked[kind] / images * 1e3:.3f}"
                beyond = f"{(cpu - checked[kind]) / images * 1e3:.3f}"
            print(f"| {name} | {label} | {wall:.2f} | {wall / base:.2f} | {cpu / images * 1e3:.3f} | {alone} | {beyond} |")


def main() -> None:
    if sys.argv[1:2] == ["--litdata-child"]:
        litdata_child(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--folder", choices=tuple(FOLDERS), default="jpegs")
    parser.add_argument("--resume", action="store_true", help="full build vs resumed after 90 %% from the CLI (see above)")
    parser.add_argument("--trees", nargs="+", help="with --resume: lightning_lmdb source trees to compare (default: this one)")
    parser.add_argument("--storages", nargs="+", choices=STORAGES, default=list(STORAGES))
    parser.add_argument("--workers", choices=("both", "all", "one"), default="both", help="1 worker, all cores, or both")
    parser.add_argument("--repeats", type=int, default=1, help="builds per configuration (the median is reported)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_bench"))
    parser.add_argument("--vs-litdata", action="store_true", help="LitData optimize vs a build per validation level (see above)")
    parser.add_argument("--litdata-workers", type=int, default=2, help="with --vs-litdata: workers of both builds")
    parser.add_argument("--wallpapers", type=int, default=16, help="with --vs-litdata: large images added to the icons")
    parser.add_argument("--vs-folders", nargs="+", choices=("icons", "jpegs", "wallpapers"),
                        default=["icons", "jpegs", "wallpapers"], help="with --vs-litdata: the folders")
    parser.add_argument("--rounds", type=int, default=2, help="with --vs-litdata: rounds (medians are reported)")
    args = parser.parse_args()
    if args.vs_litdata:
        vs_litdata(args)
        return
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
