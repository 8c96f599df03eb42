"""Build a lightning_lmdb database from any source (an image folder, a manifest, a map-style ``Dataset``, or a kind registered
with :func:`lightning_lmdb.sources.base.register_source_kind`): :func:`build_lmdb` and :func:`build`.

A pool of processes reads and fully decodes every file (so training never meets a corrupt image);
one writer appends records in batched transactions into ``TARGET.partial`` and records its progress
in the same transactions. The metadata is written in the final transaction, then the file is renamed
onto ``TARGET``. A crash at any moment leaves either the old target or nothing at ``TARGET``, and a
rerun resumes from the last committed batch. A file lock beside the target makes concurrent builders
produce one build: the others wait and then find it up to date.

This module holds the entry points, which decide what to build; the work is done by
:mod:`lightning_lmdb.build.onefile` (one database file: the writer, its resume, error policy, progress,
disk-full diagnosis and metadata, and the test-only fault injection ``FAULT_ENV``),
:mod:`lightning_lmdb.build.sharded` (sharded databases) and :mod:`lightning_lmdb.build.readers` (the read and
decode process pool). The names callers import from here (``BuildReport``, ``build_shards``,
``find_bad_files``, ``available_cores``, the errors, ...) are re-exported.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from lightning_lmdb.build.onefile import FAULT_ENV, BuildReport, _build_lock, _checked_target, _existing_meta, _Writer
from lightning_lmdb.build.readers import _start_reader, available_cores, find_bad_files, usable_cpus  # noqa: F401 (_start_reader: tests)
from lightning_lmdb.build.sharded import build_shards
from lightning_lmdb.errors import BuildError, DiskFullError, OptionError, StaleDatabaseError
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.remote import urls
from lightning_lmdb.sources.base import scan_source
from lightning_lmdb.store import database, published

__all__ = [
    "build", "build_lmdb", "BuildReport",
    # Re-exported for the callers that import them from here (backends.py, datamodule.py, staging.py, experiment/callbacks.py, the tests).
    "FAULT_ENV", "BuildError", "DiskFullError", "StaleDatabaseError", "available_cores", "build_shards", "find_bad_files",
    "usable_cpus",
]

log = logging.getLogger(__name__)


def build_lmdb(
    source: str | os.PathLike[str] | Any, target: str | os.PathLike[str], options: BuildOptions | None = None, *,
    work_dir: str | os.PathLike[str] | None = None, **overrides: Any
) -> Path:
    """Pack a source into one LMDB file (or a sharded folder), or return at once if it is already up to date.

    Args:
        source: Any source :func:`lightning_lmdb.sources.base.scan_source` reads: a folder in ImageFolder layout (one subfolder per
            class) or a flat folder of images, a manifest (.csv/.tsv/.jsonl, or a folder with metadata.csv/.jsonl; read as
            ``options.manifest`` says), a map-style ``Dataset``, or a source of a registered kind.
        target: The database file to create, e.g. ``data/train.lmdb``. Must not lie inside ``source``. A URL
            (``s3://bucket/train.lmdb``) builds into ``work_dir`` and then publishes the database there
            (:func:`lightning_lmdb.store.published.push`; storage options registered with
            :func:`lightning_lmdb.remote.fs.use_options`).
        options: How to build (:class:`~lightning_lmdb.options.BuildOptions`; default options when ``None``).
        work_dir: With a URL target: the local folder the database is built in before it is pushed (default:
            ``~/.cache/lightning_lmdb/publish/<hash of the URL>``, or under ``$LIGHTNING_LMDB_CACHE``); its free space is
            checked before the build. Kept afterwards: a rerun finds the build up to date and the push resumes.
        **overrides: Any option by name, e.g. ``storage="decoded"``, ``workers=0``, ``on_error="skip"``,
            ``on_stale="ignore"``, ``overwrite=True``, ``max_pixels=None``, ``commit_every=500``,
            ``progress=False``, ``shards=4`` (``target`` becomes a folder of 4 shard files and a manifest,
            see :mod:`lightning_lmdb.store.shards`), ``shard=1`` (with ``shards``: build that shard alone) (see
            :class:`~lightning_lmdb.options.BuildOptions` for each).

    Returns:
        The path of the finished database (with ``shard``: the folder, which is finished once every shard is; with a URL
        target: the local copy that was pushed).

    Raises:
        FileNotFoundError: No source (a path that does not exist).
        ValueError: A bad option, no images, or a target inside the source.
        FileExistsError: The target exists and is not a lightning_lmdb database (it is never touched).
        BuildError: A bad file with ``on_error="raise"``.
        StaleDatabaseError: The source changed, with ``on_stale="error"``.
        DiskFullError: The disk filled up (a rerun with space resumes), or ``work_dir`` has too little free space.
        RemoteExistsError: A URL target holds another build already.
    """
    return build(source, target, options, work_dir=work_dir, **overrides).path


def build(
    source: str | os.PathLike[str], target: str | os.PathLike[str], options: BuildOptions | None = None, *,
    work_dir: str | os.PathLike[str] | None = None, **overrides: Any
) -> BuildReport:
    """Like :func:`build_lmdb`, returning a :class:`BuildReport` of what was done."""
    started = time.perf_counter()
    options = (options or BuildOptions()).replace(**overrides) if overrides else (options or BuildOptions())
    if urls.is_remote(target):
        return _build_and_push(source, str(target), options, work_dir, started)
    if urls.is_remote(source):  # object storage (s3://bucket/train/): a URL, never a Path; the target is local
        source_root: Any = source
        target = Path(target).expanduser().absolute()
    elif isinstance(source, (str, os.PathLike)):
        source_root = Path(source).expanduser().resolve()
        target = _checked_target(source_root, target)
    else:  # a dataset (lightning_lmdb.sources.dataset): nothing on disk to keep the target out of
        source_root, target = source, Path(target).expanduser().absolute()
        if options.shards is not None:
            raise OptionError(f"shards={options.shards} does not apply to a dataset source yet; build one file (leave shards unset).")
    if options.shards is not None:
        report = build_shards(source_root, target, options, None if options.shard is None else [options.shard])
        report.seconds = time.perf_counter() - started
        return report
    if database.is_sharded(target):
        raise FileExistsError(f"{str(target)!r} is a sharded database folder; build it with shards=K (CLI: --shards K), or choose "
                              "another target for a single-file database. It is left untouched.")
    meta = _existing_meta(target)  # a target that is not a database is refused before anything is created
    if meta is not None and options.on_stale == "ignore" and not options.overwrite:
        return BuildReport(target, "up-to-date", 0, meta.count, meta.skipped, time.perf_counter() - started)
    scanned = time.perf_counter()
    scan = scan_source(source_root, options.manifest)
    scanned = time.perf_counter() - scanned
    target.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(target):
        meta = _existing_meta(target)
        if meta is not None and not options.overwrite:
            if options.on_stale == "ignore" or database.is_current(meta, scan, options.content()):
                return BuildReport(target, "up-to-date", 0, meta.count, meta.skipped, time.perf_counter() - started)
            reason = database.stale_reason(target, meta, scan, options.content())
            if options.on_stale == "error":
                raise StaleDatabaseError(
                    f"{str(target)!r} was built {reason}. Rebuild it with on_stale='rebuild' (CLI: --on-stale rebuild), "
                    "or keep it as it is with on_stale='ignore'."
                )
            log.warning("%s was built %s; rebuilding it.", target, reason)  # a warning: seen outside Hydra too
        report = _Writer(scan, target, options).run()
    report.phases = {"scan": scanned, **report.phases}
    report.seconds = time.perf_counter() - started
    return report


def default_work_dir(url: str) -> Path:
    """Where a build to ``url`` happens before the push: ``<cache>/publish/<hash of the URL>`` (the cache:
    ``$LIGHTNING_LMDB_CACHE``, else ``$XDG_CACHE_HOME/lightning_lmdb``, else ``~/.cache/lightning_lmdb``)."""
    import hashlib

    if os.environ.get("LIGHTNING_LMDB_CACHE"):
        cache = Path(os.environ["LIGHTNING_LMDB_CACHE"]).expanduser()
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "lightning_lmdb"
    return cache / "publish" / hashlib.sha256(urls.redact(url).encode()).hexdigest()[:16]


def _build_and_push(source: Any, url: str, options: BuildOptions, work_dir: str | os.PathLike[str] | None,
                    started: float) -> BuildReport:
    """Build ``source`` into ``work_dir`` (its free space checked first), then publish it at ``url``."""
    if options.shard is not None:
        raise OptionError(f"shard={options.shard} builds one shard alone, which cannot be published to {urls.redact(url)} by itself: "
                          "build all shards (shards=K without shard), or build into a shared folder and push it when complete.")
    local_dir = Path(work_dir).expanduser().absolute() if work_dir is not None else default_work_dir(url)
    local_dir.mkdir(parents=True, exist_ok=True)
    local = local_dir / urls.name(url)
    if isinstance(source, (str, os.PathLike)) and _existing_meta_quiet(local) is None:
        _require_work_space(source, options, local_dir)
    report = build(source, local, options)
    report.published = published.push(report.path, url, progress=options.progress)
    report.seconds = time.perf_counter() - started
    return report


def _existing_meta_quiet(path: Path) -> Any:
    try:
        return database.load_meta(path) if path.exists() else None
    except Exception:  # noqa: BLE001 -- not a finished database: the build decides what to do with it
        return None


def _require_work_space(source: str | os.PathLike[str], options: BuildOptions, local_dir: Path) -> None:
    """Refuse a build into ``local_dir`` that cannot fit: at least the source's bytes (x 1.12, encoded storage's overhead)."""
    import errno
    import shutil

    scan = scan_source(source if urls.is_remote(source) else Path(source).expanduser().resolve(), options.manifest)
    need = int(scan.total_bytes * 1.12)
    free = shutil.disk_usage(local_dir).free
    if free < need:
        raise DiskFullError(errno.ENOSPC, f"The disk holding work_dir {str(local_dir)!r} has too little free space to build the "
                                          f"database before publishing it: it needs at least {need:,} bytes (the source's size and "
                                          f"the format's overhead) and {free:,} bytes are free. Nothing was built: free space, or "
                                          "pass work_dir= (CLI: --work-dir) on a larger disk, and rerun.")
