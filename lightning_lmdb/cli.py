"""The ``lightning-lmdb`` command: build | info | verify | bench."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from lightning_lmdb.decode import DEFAULT_MAX_PIXELS
from lightning_lmdb.format import STORAGES, DatabaseError


def _build(args: argparse.Namespace) -> int:
    from lightning_lmdb.writer import build

    report = build(
        args.source, args.target, storage=args.storage, workers=args.workers, on_error=args.on_error,
        overwrite=args.overwrite, on_stale=args.on_stale, max_pixels=args.max_pixels or None,
        commit_every=args.commit_every, progress=not args.quiet,
    )
    print(
        f"{report.path}: {report.action}, {report.count} records ({report.records_written} written now), "
        f"{len(report.skipped)} skipped, {report.seconds:.1f} s"
    )
    return 0


def _info(args: argparse.Namespace) -> int:
    from lightning_lmdb.verify import describe_lmdb

    info = describe_lmdb(args.target)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    classes = info.pop("classes")
    shown = ", ".join(classes[:10]) + (f", ... ({len(classes)} in all)" if len(classes) > 10 else "")
    for key, value in info.items():
        if key == "skipped":
            value = f"{len(value)}" + "".join(f"\n    {s['path']}: {s['reason']}" for s in value)
        elif key == "size_ratio":
            value = f"{value:.3f} x source bytes"
        print(f"{key:>16}: {value}")
    print(f"{'classes':>16}: {shown or '(unlabelled)'}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from lightning_lmdb.verify import verify_lmdb

    report = verify_lmdb(args.target, args.source)
    for line in report.problems[: args.max_problems]:
        print(line)
    if len(report.problems) > args.max_problems:
        print(f"... and {len(report.problems) - args.max_problems} more problems")
    against = f" and against {args.source}" if args.source else " (checksums only; pass --source to compare with the files)"
    verdict = "OK" if report.ok else f"FAILED: {len(report.problems)} problems"
    print(f"{report.path}: {report.checked} of {report.count} records checked{against}: {verdict}")
    return 0 if report.ok else 1


def _bench(args: argparse.Namespace) -> int:
    from lightning_lmdb.bench import run_read_benchmark

    run_read_benchmark(
        args.source, args.target, passes=args.passes, limit=args.limit, workers=args.workers, decode=args.decode, seed=args.seed
    )
    return 0


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lightning-lmdb``."""
    parser = argparse.ArgumentParser(prog="lightning-lmdb", description="Pack image folders into one LMDB file; inspect, verify, benchmark it.")
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="pack SOURCE (ImageFolder layout or flat folder) into the LMDB file TARGET")
    build.add_argument("source")
    build.add_argument("target")
    build.add_argument("--storage", choices=STORAGES, default="encoded", help="encoded: original bytes (default); decoded: RGB pixels")
    build.add_argument("--workers", type=int, default=None, help="reader processes (default: one per core; 0: in this process)")
    build.add_argument("--on-error", choices=("raise", "skip"), default="raise", help="stop at a bad file (default) or skip and record it")
    build.add_argument("--on-stale", choices=("rebuild", "error", "ignore"), default="rebuild", help="when the source changed since the last build")
    build.add_argument("--overwrite", action="store_true", help="rebuild even if up to date")
    build.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS, help="refuse larger images (0: no limit)")
    build.add_argument("--commit-every", type=int, default=1000, help="records per transaction")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    build.set_defaults(func=_build)

    info = sub.add_parser("info", help="describe a database")
    info.add_argument("target")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=_info)

    verify = sub.add_parser("verify", help="check every record (exit status 0 only when everything matches)")
    verify.add_argument("target")
    verify.add_argument("--source", default=None, help="compare with the source folder byte for byte")
    verify.add_argument("--max-problems", type=int, default=50, help="problems to print")
    verify.set_defaults(func=_verify)

    bench = sub.add_parser("bench", help="time shuffled reads of raw files vs the LMDB file, cold and warm page cache")
    bench.add_argument("source")
    bench.add_argument("target", help="the database (built from SOURCE first if missing or stale)")
    bench.add_argument("--passes", type=int, default=2, help="repetitions; the median is reported")
    bench.add_argument("--limit", type=int, default=None, help="samples per pass (default: every record)")
    bench.add_argument("--workers", type=int, default=None, help="build processes if a build is needed")
    bench.add_argument("--decode", action="store_true", help="also decode every sample to RGB")
    bench.add_argument("--seed", type=int, default=0, help="seed of the shuffled order")
    bench.set_defaults(func=_bench)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lightning-lmdb`` console script."""
    for stream in (sys.stdout, sys.stderr):  # file names that are not valid UTF-8 print as their original bytes
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, FileExistsError, ValueError, DatabaseError) as exc:
        print(f"lightning-lmdb {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
