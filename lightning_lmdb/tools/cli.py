"""The ``lightning-lmdb`` command: build | push | pull | info | verify | bench | netfs.

``info`` and ``verify`` (without ``--source``) import neither torch nor torchvision: they answer in well under a second.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import lmdb

from lightning_lmdb import __version__
from lightning_lmdb.codec import decoders
from lightning_lmdb.errors import LightningLMDBError, OptionError
from lightning_lmdb.options import BuildOptions, choices
from lightning_lmdb.sources.base import SourceOptions, describe_kind, describe_kinds
from lightning_lmdb.targets import kind_names

if TYPE_CHECKING:
    from lightning_lmdb.tools.verify import VerifyReport

#: Exit status of an expected failure (bad arguments, missing or damaged files, I/O errors).
EXIT_ERROR = 2
#: Exit status after Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130

#: Expected failures: reported as one line on stderr, never with a traceback. Anything else -- a bare ``ValueError``
#: included -- is a bug and shows its traceback.
_EXPECTED_ERRORS = (LightningLMDBError, OSError, lmdb.Error)

#: What to try, per errno, when an OSError's own message gives no advice.
_ERRNO_HINTS = {
    errno.EACCES: "check the folder's permissions or choose another target",
    errno.EPERM: "check the folder's permissions or choose another target",
    errno.EROFS: "the filesystem is read-only; choose a target on a writable disk",
    errno.ENOSPC: "free some space or choose a target on another disk, then rerun (a build resumes where it stopped)",
    errno.EDQUOT: "your disk quota is used up; free some space or choose a target on another disk, then rerun",
    errno.ENOTDIR: "a part of that path is a file, not a folder; choose another path",
    errno.EEXIST: "a file is in the way of a folder the command needs; move it or choose another path",
    errno.EISDIR: "that path is a folder; name a file instead",
    errno.ENOENT: "check the path",
    errno.ENAMETOOLONG: "choose a shorter path",
    errno.EIO: "the disk reported an I/O error; check the disk and free space, then rerun",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n) and rerun",
}


def _build(args: argparse.Namespace) -> int:
    from lightning_lmdb.build.writer import build

    options = build_options(args)
    report = build(args.source, args.target, options, work_dir=args.work_dir)
    what = f"shard {options.shard}/{options.shards}: " if options.shard is not None else ""
    print(
        f"{report.path}: {what}{report.action}, {report.count} records ({report.records_written} written now), "
        f"{len(report.skipped)} skipped, {report.seconds:.1f} s{_phases(report.phases)}"
    )
    if report.published is not None:
        _print_push(report.published)
    noted = _source_notes(report.path) if options.shard is None else ""  # a shard job's part is not a database yet
    if noted:
        print(f"{report.path}: {noted}")
    return 0


#: What a source's ``target_meta`` counts that a build reports (detection: the box rules applied at the scan).
_NOTED = {"degenerate_dropped": "degenerate boxes dropped", "clipped": "boxes clipped to their image",
          "exif_rotated": "images with an EXIF rotation (boxes are on the stored pixels)"}


def _source_notes(path: os.PathLike[str]) -> str:
    """The non-zero counts of the database's ``target_meta`` that :data:`_NOTED` names, as one line ("" when none)."""
    from lightning_lmdb.store import database

    meta = database.load_meta(path)
    counted = getattr(meta, "target_meta", None) or {}
    return ", ".join(f"{counted[key]} {what}" for key, what in _NOTED.items() if isinstance(counted.get(key), int) and counted[key] > 0)


def _process_age() -> float | None:
    """Seconds since this process started (Linux: ``/proc/self/stat``), ``None`` where that cannot be read."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            started = int(stat.read().rsplit(b")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _phases(phases: dict[str, float]) -> str:
    """`` (start-up 0.2 s, scan 0.0 s, ...)``: where a build's time went, start-up being the process's before the build began;
    "" when the build reported no phases (up to date, a sharded build)."""
    if not phases:
        return ""
    age = _process_age()
    startup = [] if age is None else [("start-up", max(0.0, age - sum(phases.values())))]
    return " (" + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in [*startup, *phases.items()]) + ")"


def build_options(args: argparse.Namespace) -> BuildOptions:
    """The :class:`BuildOptions` of a parsed ``build`` command line (which checks them)."""
    return BuildOptions(
        storage=args.storage, workers=args.workers, on_error=args.on_error, overwrite=args.overwrite, on_stale=args.on_stale,
        max_pixels=args.max_pixels or None, resize=args.resize, quality=args.quality, commit_every=args.commit_every,
        progress=not args.quiet, manifest=manifest_options(args), validate=args.validate, **_shard_options(args),
    )


#: The manifest flags of ``build`` and ``verify``: ``(flag, SourceOptions field, metavar, help)``.
_MANIFEST_FLAGS = (
    ("--root", "root", "DIR", "the folder a manifest's relative image paths are relative to (default: the manifest's own folder); "
                              "a COCO JSON's images folder (default: found beside the JSON)"),
    ("--path-column", "path_column", "COLUMN", "a manifest's image column (default: path, else file_name)"),
    ("--label-column", "label_column", "COLUMN[,COLUMN...]", "a manifest's target column; several, comma-separated, for a regression "
                                                             "target of K numbers (default: label when present, else no target)"),
    ("--split-column", "split_column", "COLUMN", "a manifest's split column, train/val/test per row (default: split when present)"),
    ("--target-kind", "target_kind", None, "what a manifest's target is (default: inferred from its values)"),
    ("--label-sep", "label_sep", "SEP", "splits a CSV label cell into several labels, a multi-label target (e.g. '|')"),
    ("--classes", "classes", "NAME[,NAME...]", "a manifest's class names in index order, comma-separated (default: the sorted names "
                                               "found)"),
    ("--mask-column", "mask_column", "COLUMN", "a manifest's segmentation-mask column, a mask image path per row (default: mask "
                                               "when present)"),
    ("--masks-dir", "masks_dir", "DIR", "pairs an image folder with this folder of segmentation masks, matched by relative path "
                                        "without the extension (images/a/1.jpg with masks/a/1.png)"),
    ("--ignore-index", "ignore_index", "N", "the mask value of unlabelled pixels, kept as is and not a class (default: 255)"),
    ("--num-classes", "num_classes", "N", "the number of mask classes (default: the largest class id in the masks plus one)"),
    ("--clip-boxes", "clip_boxes", None, "detection sources: clip a box past its image's edge by more than a pixel to the image "
                                         "(default: such a box is refused; a pixel or less is always clipped)"),
)
#: The manifest flags that take an integer.
_INT_FLAGS = ("ignore_index", "num_classes")
#: The manifest flags that take no value (True when given).
_BOOL_FLAGS = ("clip_boxes",)


def _add_manifest_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that say how to read a manifest source (a .csv, .tsv or .jsonl file listing the images)."""
    group = parser.add_argument_group(f"manifest sources ({describe_kind('manifest')}) and segmentation masks (a mask column, or "
                                      "--masks-dir for an image folder)")
    for flag, field, metavar, text in _MANIFEST_FLAGS:
        choices = kind_names() if field == "target_kind" else None  # the registered kinds, when the parser is made
        if field in _BOOL_FLAGS:
            group.add_argument(flag, dest=f"manifest_{field}", default=None, action="store_const", const=True, help=text)
            continue
        group.add_argument(flag, dest=f"manifest_{field}", default=None, choices=choices, metavar=metavar, help=text,
                           type=int if field in _INT_FLAGS else None)


def manifest_options(args: argparse.Namespace) -> SourceOptions:
    """The :class:`SourceOptions` of a parsed ``build`` or ``verify`` command line (the flags left out are ``None``)."""
    given = {field: getattr(args, f"manifest_{field}", None) for _, field, _, _ in _MANIFEST_FLAGS}
    if given["classes"] is not None:
        given["classes"] = [name.strip() for name in given["classes"].split(",")]
    return SourceOptions.of({field: value for field, value in given.items() if value is not None})


def _shard_options(args: argparse.Namespace) -> dict[str, int | None]:
    """``shards`` and ``shard`` from ``--shards K`` and ``--shard I/K`` (which must agree)."""
    shards, shard = args.shards, None
    if args.shard is not None:
        index, sep, count = args.shard.partition("/")
        if not sep or not index.isdigit() or not count.isdigit():
            raise OptionError(f"--shard {args.shard!r} must be I/K, e.g. --shard 0/4 (the first of 4 shards).")
        shard, count_of = int(index), int(count)
        if shards is not None and shards != count_of:
            raise OptionError(f"--shard {args.shard} says {count_of} shards but --shards says {shards}; give one of them.")
        shards = count_of
    return {"shards": shards, "shard": shard}


def _print_push(report: Any) -> None:
    print(f"{report.url}: {report.action}, build {report.build_id}, {report.parts} part(s), {report.bytes_uploaded:,} bytes "
          f"uploaded, {report.seconds:.1f} s")


def _push(args: argparse.Namespace) -> int:
    from lightning_lmdb.store.published import push

    _print_push(push(args.database, args.url, progress=not args.quiet))
    return 0


def _pull(args: argparse.Namespace) -> int:
    from lightning_lmdb.remote.urls import redact
    from lightning_lmdb.tools.publish import pull

    report = pull(args.url, args.database, progress=not args.quiet)
    print(f"{report.path}: {report.action} from {redact(args.url)}, {report.bytes_copied:,} bytes downloaded, {report.seconds:.1f} s")
    return 0


def parse_storage_options(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``--storage-option KEY=VALUE`` values as storage options: ``true`` / ``false`` as booleans, integers as ints, else strings.

    Raises:
        OptionError: A value without ``=`` (the message does not show it: it may be a secret).
    """
    options: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise OptionError("--storage-option takes KEY=VALUE (e.g. endpoint_url=http://minio:9000); one was given without '=' "
                              "(not shown: it may be a secret).")
        lowered = value.strip().lower()
        parsed: Any = value
        if lowered in ("true", "false"):
            parsed = lowered == "true"
        else:
            with contextlib.suppress(ValueError):
                parsed = int(value)
        options[key.strip()] = parsed
    return options


#: The arguments of each command that may be URLs (their storage options are registered for them).
_URL_ARGS = ("source", "target", "url", "database")


def _use_storage_options(args: argparse.Namespace) -> None:
    """Register ``--storage-option`` values for the URLs of the command (in this process only; never printed or saved)."""
    options = parse_storage_options(getattr(args, "storage_option", None))
    if not options:
        return
    from lightning_lmdb.remote import fs
    from lightning_lmdb.remote.urls import is_remote

    for name in _URL_ARGS:
        value = getattr(args, name, None)
        if is_remote(value):
            fs.use_options(value, options)


def _add_storage_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage-option", action="append", default=None, metavar="KEY=VALUE",
                        help="an option of the object storage of the command's s3:// URLs (repeatable), e.g. endpoint_url=http://"
                             "minio:9000, anon=true, key=... (default: the provider's standard credentials: AWS_* variables, "
                             "~/.aws); never printed or saved")


def _info_remote(args: argparse.Namespace) -> int:
    """``info URL`` of a published database: its marker, checked against one listing (nothing downloaded)."""
    from lightning_lmdb.remote.urls import redact
    from lightning_lmdb.store.published import open_published

    marker = open_published(args.target)
    info = {"url": redact(marker.url), "published": "complete (marker and every part listed)", "build_id": marker.build_id,
            "layout": marker.layout, "parts": len(marker.parts), "bytes": marker.size}
    if args.json:
        print(json.dumps({**info, "files": [{"path": p.path, "size": p.size, "etag": p.etag} for p in marker.parts]}, indent=2))
        return 0
    for key, value in info.items():
        print(f"{key:>16}: {value:,}" if isinstance(value, int) else f"{key:>16}: {value}")
    print(f"{'':>16}  (pull it to read its records: lightning-lmdb pull {redact(marker.url)} DB)")
    return 0


def _info(args: argparse.Namespace) -> int:
    from lightning_lmdb.remote.urls import is_remote
    from lightning_lmdb.tools.verify import describe_lmdb

    if is_remote(args.target):
        return _info_remote(args)
    info = describe_lmdb(args.target)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    classes, names = info.pop("classes"), info.pop("target_names", [])
    if names:  # K named numbers per record (regression), no classes
        del info["num_classes"]
        shown, label = f"K={len(names)}: " + ", ".join(names[:10]) + (", ..." if len(names) > 10 else ""), "targets"
    else:
        shown, label = ", ".join(classes[:10]) + (f", ... ({len(classes)} in all)" if len(classes) > 10 else ""), "classes"
    for key, value in info.items():
        if key == "skipped":
            value = f"{len(value)}" + "".join(f"\n    {s['path']}: {s['reason']}" for s in value)
        elif key == "size_ratio":
            value = f"{value:.3f} x source bytes"
        elif key == "codecs":
            value = ", ".join(f"{name} {count:,}" for name, count in value.items())
        print(f"{key:>16}: {value}")
    print(f"{label:>16}: {shown or '(unlabelled)'}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from lightning_lmdb.remote.urls import is_remote

    if is_remote(args.target):
        return _verify_remote(args)
    return _verify_local(args)


def _verify_remote(args: argparse.Namespace) -> int:
    """``verify URL`` of a published database: staged to a temporary folder (every block checked against the marker's
    SHA-256), every record of the copy checked, the copy removed."""
    import tempfile

    from lightning_lmdb.remote.urls import redact
    from lightning_lmdb.tools.staging import stage_remote

    if args.work_dir is not None:
        os.makedirs(args.work_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lightning-lmdb-verify-", dir=args.work_dir) as folder:
        staged = stage_remote(args.target, folder, progress=True)
        print(f"{redact(args.target)}: downloaded to a temporary copy ({staged.bytes_copied:,} bytes, every block matched the "
              "digest the push recorded)")
        return _verify_local(argparse.Namespace(**{**vars(args), "target": str(staged.path)}))


def _verify_local(args: argparse.Namespace) -> int:
    from lightning_lmdb.tools.verify import verify_lmdb

    manifest = manifest_options(args)
    if not manifest.is_default() and args.source is None:
        flags = " ".join(flag for flag, field, _, _ in _MANIFEST_FLAGS if getattr(args, f"manifest_{field}") is not None)
        raise OptionError(f"{flags} say how to read the source, and no --source was given: pass --source MANIFEST, or leave them out.")
    report = verify_lmdb(args.target, args.source, allow_skipped=args.allow_skipped, manifest=manifest)
    for line in report.problems[: args.max_problems]:
        print(line)
    _print_more(len(report.problems), args.max_problems, "problem")
    for skip in report.skipped[: args.max_problems]:
        print(f"{skip.path}: skipped at build time: {skip.reason}")
    _print_more(len(report.skipped), args.max_problems, "skipped file")
    how = "checksums only; pass --source to compare with the files"
    if args.source:
        how = f"checksums, and compared with the files in {args.source}"
    print(f"{report.path}: {report.checked} of {report.count} {_plural(report.count, 'record')} checked ({how}): {_verdict(report)}")
    return 0 if report.ok else 1


def _print_more(count: int, shown: int, noun: str) -> None:
    """``... and N more <noun>s`` when ``count`` lines were more than the ``shown`` ones printed."""
    if count > shown:
        print(f"... and {count - shown} more {_plural(count - shown, noun)}")


def _verdict(report: VerifyReport) -> str:
    """The end of ``verify``'s last line: OK or FAILED, with the counts of problems and skipped files."""
    skipped = len(report.skipped)
    files = f"{skipped} source {_plural(skipped, 'file')}"
    if not report.compared_with_source:
        was, is_ = ("was", "is") if skipped == 1 else ("were", "are")
        files += f" {was} skipped at build time"
        note = f" ({files} and {is_} not in the database; pass --source to check completeness)" if skipped else ""
    else:
        files += " skipped at build time"
        note = f" ({files}, accepted with --allow-skipped)" if skipped else ""
    if report.ok:
        return "OK" + note
    verdict = f"FAILED: {len(report.problems)} {_plural(len(report.problems), 'problem')}"
    if skipped and not report.allow_skipped:
        return f"{verdict}, {files} (pass --allow-skipped to accept {'it' if skipped == 1 else 'them'})"
    return verdict + note


def _plural(count: int, noun: str) -> str:
    return noun if count == 1 else noun + "s"


def _bench(args: argparse.Namespace) -> int:
    from lightning_lmdb.tools.bench import run_read_benchmark

    run_read_benchmark(
        args.source, args.target, passes=args.passes, limit=args.limit, workers=args.workers, decode=args.decode, seed=args.seed,
        decoder=args.decoder, latency_ms=args.latency_ms,
    )
    return 0


def _netfs(args: argparse.Namespace) -> int:
    from lightning_lmdb.tools import netfs

    with netfs.mount(args.source, args.mountpoint, latency_ms=args.latency_ms, jitter_ms=args.jitter_ms,
                     bandwidth_mb_s=args.bandwidth_mb_s, cache_contents=not args.no_cache) as mounted:
        cap = f", at most {args.bandwidth_mb_s:g} MB/s" if args.bandwidth_mb_s else ""
        print(f"serving {mounted.source} at {mounted.path}: {args.latency_ms:g} ms (+ up to {args.jitter_ms:g} ms) per request{cap}. "
              "Ctrl-C unmounts.", flush=True)
        try:
            while mounted.process is not None and mounted.process.poll() is None:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
    print(f"unmounted {mounted.path}")
    return 0


class _KindsHelp(str):
    """A help text whose ``{kinds}`` becomes the registered source kinds (:func:`~lightning_lmdb.sources.base.describe_kinds`) only when
    argparse shows it: listing them imports them, and ``info`` / ``verify`` never import torch."""

    def __mod__(self, params: Any) -> str:
        return str.__mod__(self.replace("{kinds}", describe_kinds(paths_only=True)), params)


def make_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lightning-lmdb``."""
    parser = argparse.ArgumentParser(
        prog="lightning-lmdb", description="Pack image folders into one LMDB file; inspect, verify, benchmark it; emulate network storage."
    )
    parser.add_argument("--version", action="version", version=f"lightning-lmdb {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help=_KindsHelp("pack SOURCE ({kinds}) into the LMDB file TARGET (or a sharded folder)"))
    build.add_argument("source", help=_KindsHelp("what to pack: {kinds}"))
    build.add_argument("target")
    # choices and defaults from BuildOptions, which checks every value
    valid = choices()
    build.add_argument("--storage", choices=valid["storage"], default=BuildOptions.storage,
                       help="encoded: original bytes; decoded: RGB pixels (default: %(default)s)")
    build.add_argument("--workers", type=int, default=BuildOptions.workers,
                       help="reader processes (default: one per core; 0: in this process)")
    build.add_argument("--on-error", choices=valid["on_error"], default=BuildOptions.on_error,
                       help="raise: stop at a bad file; skip: skip and record it (default: %(default)s)")
    build.add_argument("--on-stale", choices=valid["on_stale"], default=BuildOptions.on_stale,
                       help="when the source changed since the last build (default: %(default)s)")
    build.add_argument("--overwrite", action="store_true", default=BuildOptions.overwrite, help="rebuild even if up to date")
    build.add_argument("--max-pixels", type=int, default=BuildOptions.max_pixels,
                       help="refuse larger images (default: %(default)s; 0: no limit)")
    build.add_argument("--validate", choices=valid["validate"], default=BuildOptions.validate,
                       help="how files kept as their bytes are checked: reduced (JPEGs decoded at 1/8 scale), full (every file "
                            "decoded), header (no decode: a bad file fails when read) (default: %(default)s)")
    build.add_argument("--resize", type=int, default=BuildOptions.resize, metavar="S",
                       help="pre-resized storage: shrink images whose shorter side is larger than S to S (aspect kept, never upscaled)")
    build.add_argument("--quality", type=int, default=BuildOptions.quality,
                       help="JPEG quality of images --resize re-encodes (default: %(default)s)")
    build.add_argument("--commit-every", type=int, default=BuildOptions.commit_every, help="records per transaction (default: %(default)s)")
    build.add_argument("--quiet", action="store_true", default=not BuildOptions.progress, help="no progress bar")
    build.add_argument("--shards", type=int, default=BuildOptions.shards, metavar="K",
                       help="a sharded database: TARGET becomes a folder of K shard files and a manifest, built by K processes")
    build.add_argument("--shard", default=None, metavar="I/K",
                       help="build shard I of K alone (e.g. one task of a job array: --shard $SLURM_ARRAY_TASK_ID/K); the task that "
                            "completes the last shard writes the manifest")
    build.add_argument("--work-dir", default=None, metavar="DIR",
                       help="with an s3:// TARGET: the local folder the database is built in before it is pushed (default: "
                            "~/.cache/lightning_lmdb/publish/<hash of the URL>)")
    _add_manifest_flags(build)
    _add_storage_option(build)
    build.set_defaults(func=_build)

    push = sub.add_parser("push", help="publish the database DB at URL (s3://bucket/name.lmdb): resumable, checked, marker last")
    push.add_argument("database", metavar="DB")
    push.add_argument("url", metavar="URL")
    push.add_argument("--quiet", action="store_true", help="no progress lines")
    _add_storage_option(push)
    push.set_defaults(func=_push)

    pull = sub.add_parser("pull", help="download the published database URL to the local database DB (checked, resumable)")
    pull.add_argument("url", metavar="URL")
    pull.add_argument("database", metavar="DB")
    pull.add_argument("--quiet", action="store_true", help="no progress lines (the bytes downloaded and the rate, every 2 s)")
    _add_storage_option(pull)
    pull.set_defaults(func=_pull)

    info = sub.add_parser("info", help="describe a database (or a published one: s3://..., its marker)")
    info.add_argument("target")
    info.add_argument("--json", action="store_true", help="print JSON")
    _add_storage_option(info)
    info.set_defaults(func=_info)

    verify = sub.add_parser("verify", help="check every record (exit status 0 only when everything matches)")
    verify.add_argument("target", help="a database: a local path, or the URL of a published one (s3://...)")
    verify.add_argument("--source", default=None, help="compare with the source (a folder or a manifest) byte for byte")
    verify.add_argument(
        "--allow-skipped", action="store_true",
        help="with --source: accept source files that the build skipped as unreadable (they are still listed)",
    )
    verify.add_argument("--max-problems", type=int, default=50, help="problems to print")
    verify.add_argument("--work-dir", default=None,
                        help="for a database at a URL: where its temporary copy goes (default: the system's temporary folder)")
    _add_manifest_flags(verify)
    _add_storage_option(verify)
    verify.set_defaults(func=_verify)

    bench = sub.add_parser("bench", help="time shuffled reads of raw files vs the LMDB file, cold and warm page cache")
    bench.add_argument("source")
    bench.add_argument("target", help="the database (built from SOURCE first if missing or stale)")
    bench.add_argument("--passes", type=int, default=2, help="repetitions; the median is reported")
    bench.add_argument("--limit", type=int, default=None, help="samples per pass (default: every record)")
    bench.add_argument("--workers", type=int, default=None, help="build processes if a build is needed")
    bench.add_argument("--decode", action="store_true", help="also decode every sample to RGB")
    bench.add_argument("--decoder", choices=decoders.DECODERS, default="pil", help="with --decode: decoder (default: pil, ImageFolder's)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the shuffled order")
    bench.add_argument("--latency-ms", type=float, default=None,
                       help="read through a latency mount adding this per request (emulated network storage; needs FUSE)")
    bench.set_defaults(func=_bench)

    netfs = sub.add_parser("netfs", help="serve SOURCE read-only at MOUNTPOINT with a latency per request (emulated network storage)")
    netfs.add_argument("source")
    netfs.add_argument("mountpoint", help="an empty folder (created if missing)")
    netfs.add_argument("--latency-ms", type=float, default=0.5, help="added to every lookup, stat, open, readdir and read (default 0.5)")
    netfs.add_argument("--jitter-ms", type=float, default=0.0, help="up to this much more per request, at random")
    netfs.add_argument("--bandwidth-mb-s", type=float, default=None, help="cap on the bytes read per second (shared by all requests)")
    netfs.add_argument("--no-cache", action="store_true", help="drop a file's cached pages at every open (data larger than RAM)")
    netfs.set_defaults(func=_netfs)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lightning-lmdb`` console script.

    Returns:
        The exit status: 0 on success, 1 when ``verify`` found problems, 2 on an expected failure (a
        missing or damaged file, an I/O error such as a full disk or a permission denied, bad
        arguments; reported as one ``lightning-lmdb COMMAND: error: ...`` line on stderr, no
        traceback) and 130 when interrupted with Ctrl-C. Any other exception is a bug and propagates
        with its traceback.
    """
    for stream in (sys.stdout, sys.stderr):  # file names that are not valid UTF-8 print as their original bytes
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = make_parser().parse_args(argv)
    if args.command == "build":
        from lightning_lmdb.build.readers import keep_freed_memory

        keep_freed_memory()  # this process is ours: see the function
    try:
        with _interrupt_only_this_process():
            _use_storage_options(args)
            return args.func(args)
    except KeyboardInterrupt:
        rerun = "; rerun to resume" if args.command in ("build", "push", "pull") else ""
        _print_error(args.command, f"interrupted{rerun}", prefix="")
        return EXIT_INTERRUPTED
    except _EXPECTED_ERRORS as exc:
        _print_error(args.command, describe_error(exc, args))
        return EXIT_ERROR


def _print_error(command: str, message: str, prefix: str = "error: ") -> None:
    sys.stdout.flush()
    print(f"lightning-lmdb {command}: {prefix}{message}", file=sys.stderr)


def describe_error(exc: BaseException, args: argparse.Namespace | None = None) -> str:
    """One line describing an expected failure: what failed, on which file, and what to do.

    Args:
        exc: The exception (an ``OSError``, ``lmdb.Error``, ``ValueError`` or ``DatabaseError``).
        args: The parsed command line, to name the files involved when the exception does not.

    Returns:
        The message, without newlines.
    """
    command = getattr(args, "command", None)
    target = getattr(args, "target", None)
    context = f" (while {_ACTIVITY.get(command, 'working on')} {str(target)!r})" if target is not None else ""
    hint = None
    if isinstance(exc, OSError) and exc.strerror:
        # Only the system's own text ("Permission denied") lacks context and advice; our messages carry both.
        system_text = exc.errno is not None and exc.strerror == os.strerror(exc.errno)
        message = exc.strerror  # without the "[Errno N]" prefix
        names = [_path_text(name) for name in (exc.filename, exc.filename2) if name is not None]
        if names:
            message += ": " + " -> ".join(repr(name) for name in names)
        elif system_text:
            message += context
        if system_text:
            hint = _ERRNO_HINTS.get(exc.errno)
    elif isinstance(exc, lmdb.Error):
        message = f"LMDB failed: {exc}{context}"
        if command == "build":
            hint = "the disk may be full or failing; check free space and the disk, then rerun (the build resumes where it stopped)"
        else:
            hint = "the file may be damaged or on a failing disk; copy it again or rebuild it"
    else:
        message = str(exc) or type(exc).__name__
    if hint:
        message += f"; {hint}"
    from lightning_lmdb.remote.urls import redact

    return redact(" ".join(line.strip() for line in message.splitlines() if line.strip()))


_ACTIVITY = {"build": "building", "push": "pushing", "pull": "pulling", "info": "reading", "verify": "verifying",
             "bench": "benchmarking", "netfs": "serving"}


def _path_text(name: Any) -> str:
    return os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else str(name)


@contextlib.contextmanager
def _interrupt_only_this_process() -> Iterator[None]:
    """Make Ctrl-C interrupt this process only, not its forked worker processes.

    Ctrl-C sends SIGINT to the whole foreground process group; each builder worker would die printing
    its own traceback. With this handler (inherited by forked children) the workers ignore it, and
    this process raises ``KeyboardInterrupt``, which stops the pool and reports one line.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # handlers can only be set from the main thread; an ignored SIGINT (background job) or a caller's handler stays
        return
    owner = os.getpid()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() == owner:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    sys.exit(main())
