"""Building a sharded database: a folder of K shard files over contiguous ranges of the scan, and a manifest.

:func:`build_shards` checks everything that can refuse the build, splits the scan into ranges
of even estimated work (:func:`lightning_lmdb.build.workcut.work_ranges`), builds each shard as a single-file build of its range
(:class:`lightning_lmdb.build.onefile._Writer` with a ``shard`` header) -- several at once, each in a process of
its own -- and writes the manifest once every shard is there. :func:`lightning_lmdb.build.writer.build` calls it
when ``shards`` is set. The layout of a sharded folder is described in :mod:`lightning_lmdb.store.shards`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import signal
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_connections
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from lightning_lmdb.build import readers, workcut
from lightning_lmdb.build.onefile import BuildReport, _build_lock, _checked_target, _existing_meta, _Writer
from lightning_lmdb.errors import BuildError, OptionError, StaleDatabaseError
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.remote import fs as remote_fs
from lightning_lmdb.remote.urls import is_remote, redact
from lightning_lmdb.sources.base import SourceScan, scan_source
from lightning_lmdb.store import database, fsops, shards
from lightning_lmdb.store import format as fmt

log = logging.getLogger(__name__)


def build_shards(source: str | os.PathLike[str], target: str | os.PathLike[str], options: BuildOptions,
                 indices: list[int] | None = None) -> BuildReport:
    """Build some shards of the sharded database ``target`` (``indices``; ``None``: all), then its manifest once all are there.

    What :func:`lightning_lmdb.build.writer.build` does with ``shards`` set (``options.shard`` is ignored here: ``indices``
    says which). Every check that can refuse the build comes before the folder is created: a refused build leaves
    nothing behind. Several shards are built at once, each by its own process that reads, decodes and writes
    in-process (up to ``options.workers`` processes); a single shard is built with ``options.workers`` reader
    processes. Whichever call completes the last shard writes the manifest (the manifest lock arbitrates; the result
    is the same).

    Raises:
        As :func:`lightning_lmdb.build.writer.build_lmdb`; ``ValueError`` also for more shards than images or an index out of range.
    """
    count_of = options.shards
    if count_of is None:
        raise ValueError("build_shards needs options with shards= set (the shard count).")
    if is_remote(source):  # object storage: the URL as it is, the target local
        source_root: Any = source
        folder = Path(target).expanduser().absolute()
    else:
        source_root = Path(source).expanduser().resolve()
        folder = _checked_target(source_root, target)
    bad = [i for i in indices or [] if not 0 <= i < count_of]
    if bad:
        raise OptionError(f"shard indices {bad} out of range for shards={count_of} (0 to {count_of - 1}).")
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{str(folder)!r} is a file (a single-file database?); a sharded build makes a folder there. Remove it "
                              "or choose another target. It is left untouched.")
    if folder.is_dir() and any(folder.iterdir()) and not database.is_sharded(folder):
        raise FileExistsError(f"{str(folder)!r} is a folder that is not a sharded database; choose a new or empty folder as the "
                              "target. It is left untouched.")
    existing = _existing_sharded_meta(folder)
    if existing is not None and options.on_stale == "ignore" and not options.overwrite:
        return BuildReport(folder, "up-to-date", 0, existing[0].count, existing[0].skipped)
    scan = scan_source(source_root, options.manifest)
    if count_of > len(scan.files):
        raise OptionError(f"shards={count_of} is more than the {len(scan.files)} images of {redact(str(source_root))!r}; choose at most "
                         f"{len(scan.files)}.")
    if existing is not None and not options.overwrite:
        meta, built_with = existing
        current = database.is_current(meta, scan, options.content())
        if built_with == count_of and (options.on_stale == "ignore" or current):
            return BuildReport(folder, "up-to-date", 0, meta.count, meta.skipped)
        reason = (f"with {built_with} shards, not {count_of}" if built_with != count_of and current
                  else database.stale_reason(folder, meta, scan, options.content()))
        if options.on_stale == "error":
            raise StaleDatabaseError(f"{str(folder)!r} was built {reason}. Rebuild it with on_stale='rebuild' (CLI: --on-stale "
                                     "rebuild), or keep it as it is with on_stale='ignore'.")
        log.warning("%s was built %s; rebuilding it.", folder, reason)
    folder.mkdir(parents=True, exist_ok=True)
    if existing is not None or options.overwrite:
        _retire_manifest(folder, count_of)
    ranges = workcut.work_ranges(scan, options.storage, options.resize, count_of)
    _claim_cut(folder, count_of, ranges)
    todo = list(range(count_of)) if indices is None else sorted(set(indices))
    workers = readers.available_cores() if options.workers is None else options.workers
    jobs = [_ShardJob(_sub_scan(scan, *ranges[i], with_special=i == 0), folder / shards.shard_name(i, count_of),
                      fmt.ShardInfo(i, count_of, *ranges[i], len(scan.files), scan.fingerprint(), shards.CUT_METHOD))
            for i in todo]
    if len(jobs) == 1 or workers <= 1:  # one shard: its files read by this build's pool (or in this process with workers=0)
        reports = [_build_shard(job, options) for job in jobs]
    else:  # one process per shard, each reading, decoding and writing in-process: no pipe between readers and a writer
        reports = _build_in_shard_processes(jobs, options.replace(workers=0), workers)
    written = sum(r.records_written for r in reports)
    actions = {r.action for r in reports}
    action = "built" if "built" in actions else "resumed" if "resumed" in actions else "up-to-date"
    missing = [i for i in range(count_of) if not (folder / shards.shard_name(i, count_of)).exists()]
    if missing:  # a job array's task: the task completing the last shard writes the manifest
        log.info("Built shard(s) %s of %d of %s; shard(s) %s are still to be built.", todo, count_of, folder, missing)
        return BuildReport(folder, action, written, sum(r.count for r in reports), [s for r in reports for s in r.skipped])
    if not any(database.load_meta(path).count for path in database.database_files(folder)):
        raise BuildError(f"Every image in {redact(str(source_root))!r} was skipped as unreadable; nothing to build. See the reasons above.")
    meta = shards.finalize(folder)
    return BuildReport(folder, action, written, meta.count, meta.skipped)


@dataclass(frozen=True)
class _ShardJob:
    scan: SourceScan
    path: Path
    info: fmt.ShardInfo
    line: int = 0  # its progress bar's line


def _build_in_shard_processes(jobs: list[_ShardJob], options: BuildOptions, workers: int) -> list[BuildReport]:
    """Build each job in a process of its own, up to ``workers`` at once; their reports, in job order.

    The first shard that fails ends the build: its error is raised here -- a process that dies without a result
    (killed alone, e.g. by the out-of-memory killer) as a :class:`BuildError` naming its shard -- and the other shard
    processes are terminated, as they are on Ctrl-C. What each shard committed stays, and a rerun resumes there.
    (A ``multiprocessing.Pool`` waits forever for the result of a worker killed alone.)
    """
    context = multiprocessing.get_context()
    waiting = list(reversed(jobs))
    running: dict[Connection, tuple[_ShardJob, BaseProcess]] = {}  # each process's end of the pipe it sends its result on
    reports: dict[Path, BuildReport] = {}
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                busy = {job.line for job, _ in running.values()}
                job = replace(waiting.pop(), line=min(set(range(workers)) - busy))  # a progress line no running shard uses
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(target=_shard_process, args=(job, options, sender, remote_fs.registered()),
                                          name=f"build {job.path.name}", daemon=True)
                process.start()
                sender.close()  # the child's copy is the only one left: the pipe ends (EOF) when the child does
                running[receiver] = (job, process)
            for receiver in wait_for_connections(list(running)):
                job, process = running.pop(receiver)
                reports[job.path] = _shard_result(job, process, receiver)
    finally:
        for _, process in running.values():
            process.terminate()
        for receiver, (_, process) in running.items():
            process.join()
            receiver.close()
    return [reports[job.path] for job in jobs]


def _shard_process(job: _ShardJob, options: BuildOptions, sender: Connection,
                   storage: dict[str, dict[str, Any]] | None = None) -> None:
    """The body of a shard process: build the shard and send back ``("report", BuildReport)`` or ``("error", exception)``;
    ``storage``: the parent's object-storage options (:func:`lightning_lmdb.remote.fs.registered`, in memory only)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's terminate() ends it, whatever handler it inherited
    remote_fs.adopt(storage)
    try:
        result: tuple[str, Any] = ("report", _build_shard(job, options))
    except Exception as exc:  # noqa: BLE001 - raised again by the parent
        result = ("error", exc)
    try:
        sender.send(result)
    except Exception:  # noqa: BLE001 - an exception that does not pickle: its text
        sender.send(("error", BuildError(f"Building {job.path} failed: {type(result[1]).__name__}: {result[1]}")))


def _shard_result(job: _ShardJob, process: BaseProcess, receiver: Connection) -> BuildReport:
    """What the shard process of ``job`` sent (once its pipe is readable): its report, or its error raised here."""
    try:
        kind, value = receiver.recv()
    except (EOFError, OSError):  # it ended without sending (all or part of) a result
        kind, value = "died", None
    finally:
        receiver.close()
    process.join()
    if kind == "report":
        return value
    if kind == "error":
        raise value
    raise BuildError(_died(job, process.exitcode))


def _died(job: _ShardJob, exitcode: int | None) -> str:
    """Why a shard's build failed when its process ended without a result, and what to do."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        how = f"was killed by {name}" + (" (what the out-of-memory killer sends: if memory is short, build with fewer workers)"
                                          if -exitcode == signal.SIGKILL else "")
    else:
        how = f"exited with code {exitcode} without a result"
    return (f"The process building shard {job.info.index}/{job.info.of} ({job.path}) {how}. Nothing committed was lost: the "
            "finished shards are kept and a rerun of the build resumes the others where they stopped.")


def _sub_scan(scan: SourceScan, start: int, stop: int, *, with_special: bool) -> SourceScan:
    """The part of ``scan`` one shard covers (the scan's non-regular files go with shard 0, as first entries of its skipped)."""
    return replace(scan, files=scan.files[start:stop], special=scan.special if with_special else [])


def _build_shard(job: _ShardJob, options: BuildOptions) -> BuildReport:
    """Build (or resume, or keep) one shard file: a single-file build of its range with a ``shard`` header."""
    with _build_lock(job.path):
        meta = _existing_meta(job.path)
        if meta is not None and not options.overwrite and database.is_current(meta, job.scan, options.content(), shard=job.info):
            return BuildReport(job.path, "up-to-date", 0, meta.count, meta.skipped)
        return _Writer(job.scan, job.path, options, job.info, job.line).run()


def _existing_sharded_meta(folder: Path) -> tuple[fmt.Metadata, int] | None:
    """``(metadata, shard count)`` of the finished sharded database in ``folder``, or ``None`` when it has no valid manifest."""
    if not (folder / database.MANIFEST_NAME).exists():
        return None
    try:
        meta, parts = database.open_database(folder)
    except (fmt.DatabaseError, OSError):
        return None
    return meta, len(parts)


#: The file in a sharded folder that records the cut of the build under way: ``{"method", "of", "bounds"}`` (JSON).
CUT_NAME = "cut.json"


def _claim_cut(folder: Path, count_of: int, ranges: list[tuple[int, int]]) -> None:
    """Record this build's cut in ``folder``; first restart a partial build cut another way (its shards and partial files removed).

    A folder holding shards or ``.partial`` files of ``count_of`` shards but no :data:`CUT_NAME` (a build of a library
    that cut by source bytes) or one naming another method is not resumed shard by shard: its ranges were cut another
    way, so its shards are built again from the start. Shards of the same method whose ranges moved (the source changed)
    are left to the per-shard checks, as before.
    """
    record = {"method": shards.CUT_METHOD, "of": count_of, "bounds": [start for start, _ in ranges] + [ranges[-1][1]]}
    path = folder / CUT_NAME
    with shards.manifest_lock(folder):
        try:
            old = json.loads(path.read_bytes())
        except FileNotFoundError:
            old = None
        except ValueError:
            old = {}
        method = old.get("method") if isinstance(old, dict) else None
        if method != shards.CUT_METHOD:
            targets = [folder / shards.shard_name(i, count_of) for i in range(count_of)]
            started = [p for t in targets for p in (t, fsops.partial_path(t)) if p.exists()]
            if started:
                log.warning("%s holds a partial sharded build cut by %s; this build cuts by %s: restarting it (its %d shard and "
                            "partial files are removed and built again, not merged).", folder,
                            "source bytes (no recorded method)" if method is None else repr(method), shards.CUT_METHOD, len(started))
                for p in started:
                    p.unlink()
        if old != record:
            fmt.write_atomically(path, (json.dumps(record) + "\n").encode("utf-8"))
        fsops.fsync_dir(folder)


def _retire_manifest(folder: Path, count_of: int) -> None:
    """Before a rebuild: remove the manifest first (readers then see an unfinished build, never a mix) and shards of another count."""
    with shards.manifest_lock(folder):
        with contextlib.suppress(FileNotFoundError):
            (folder / database.MANIFEST_NAME).unlink()
        for (_, of), path in database.shard_files(folder).items():
            if of != count_of:
                path.unlink()
        fsops.fsync_dir(folder)
