"""Build a lightning_lmdb database from an image folder.

A pool of processes reads and fully decodes every file (so training never meets a corrupt image);
one writer appends records in batched transactions into ``TARGET.partial`` and records its progress
in the same transactions. The metadata is written in the final transaction, then the file is renamed
onto ``TARGET``. A crash at any moment leaves either the old target or nothing at ``TARGET``, and a
rerun resumes from the last committed batch. A file lock beside the target makes concurrent builders
produce one build: the others wait and then find it up to date.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import logging
import multiprocessing
import os
import shutil
import signal
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_connections
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
from tqdm import tqdm

from lightning_lmdb import database, envs, shards
from lightning_lmdb import format as fmt
from lightning_lmdb.codec import DEFAULT_MAX_PIXELS, ImageDecodeError, encode_record
from lightning_lmdb.errors import BuildError, DiskFullError, OptionError, SourceError, StaleDatabaseError
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.sources import NotRegularFileError, PrefixFingerprint, SourceScan, read_file, scan_source

log = logging.getLogger(__name__)

_BATCH_BYTES = 64 << 20
_MIN_MAP_SIZE = 16 << 20


#: Test-only fault injection: ``commit:N`` (after the N-th batch commit), ``final`` (inside the final
#: transaction, before it commits), ``rename`` (after the final commit, before the rename), ``fsync``
#: (after the rename, before the folder's fsync). The builder SIGKILLs itself (and its process group
#: when it leads one) at that point, so the fault suite can crash it at exact moments.
FAULT_ENV = "LIGHTNING_LMDB_TEST_KILL_AT"
_SKIP_HINT = "build with on_error='skip' (CLI: --on-error skip, Hydra: data.on_error=skip) to leave bad files out"


def _fault(point: str, count: int = 0) -> None:
    wanted = os.environ.get(FAULT_ENV)
    if not wanted:
        return
    name, _, n = wanted.partition(":")
    if name == point and (not n or int(n) == count):
        if os.getpgid(0) == os.getpid():
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class BuildReport:
    """What a call to :func:`build` did.

    Attributes:
        path: The finished database.
        action: ``"built"``, ``"resumed"`` or ``"up-to-date"``.
        records_written: Records committed by this call (0 when up to date).
        count: Records in the database.
        skipped: Files left out, with the reason.
        seconds: Wall time of this call.
    """

    path: Path
    action: str
    records_written: int
    count: int
    skipped: list[fmt.Skipped] = field(default_factory=list)
    seconds: float = 0.0


def build_lmdb(
    source: str | os.PathLike[str], target: str | os.PathLike[str], options: BuildOptions | None = None, **overrides: Any
) -> Path:
    """Pack an image folder into one LMDB file, or return at once if it is already up to date.

    Args:
        source: A folder in ImageFolder layout (one subfolder per class) or a flat folder of images.
        target: The database file to create, e.g. ``data/train.lmdb``. Must not lie inside ``source``.
        options: How to build (:class:`~lightning_lmdb.options.BuildOptions`; default options when ``None``).
        **overrides: Any option by name, e.g. ``storage="decoded"``, ``workers=0``, ``on_error="skip"``,
            ``on_stale="ignore"``, ``overwrite=True``, ``max_pixels=None``, ``commit_every=500``,
            ``progress=False``, ``shards=4`` (``target`` becomes a folder of 4 shard files and a manifest,
            see :mod:`lightning_lmdb.shards`), ``shard=1`` (with ``shards``: build that shard alone) (see
            :class:`~lightning_lmdb.options.BuildOptions` for each).

    Returns:
        The path of the finished database (with ``shard``: the folder, which is finished once every shard is).

    Raises:
        FileNotFoundError: No source folder.
        ValueError: A bad option, no images, or a target inside the source.
        FileExistsError: The target exists and is not a lightning_lmdb database (it is never touched).
        BuildError: A bad file with ``on_error="raise"``.
        StaleDatabaseError: The source changed, with ``on_stale="error"``.
        DiskFullError: The disk filled up (a rerun with space resumes).
    """
    return build(source, target, options, **overrides).path


def build(
    source: str | os.PathLike[str], target: str | os.PathLike[str], options: BuildOptions | None = None, **overrides: Any
) -> BuildReport:
    """Like :func:`build_lmdb`, returning a :class:`BuildReport` of what was done."""
    started = time.perf_counter()
    options = (options or BuildOptions()).replace(**overrides) if overrides else (options or BuildOptions())
    source_root = Path(source).expanduser().resolve()
    target = _checked_target(source_root, target)
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
    scan = scan_source(source_root)
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
            log.info("%s was built %s; rebuilding it.", target, reason)
        report = _Writer(scan, target, options).run()
    report.seconds = time.perf_counter() - started
    return report


def _checked_target(source_root: Path, target: str | os.PathLike[str]) -> Path:
    """``target`` made absolute; refused inside the source (it would be scanned as images). Nothing is created."""
    target = Path(target).expanduser().absolute()
    if target.resolve() == source_root or target.resolve().is_relative_to(source_root):
        raise SourceError(f"Target {str(target)!r} lies inside the source {str(source_root)!r}; put the database outside the image folder.")
    return target


def build_shards(source: str | os.PathLike[str], target: str | os.PathLike[str], options: BuildOptions,
                 indices: list[int] | None = None) -> BuildReport:
    """Build some shards of the sharded database ``target`` (``indices``; ``None``: all), then its manifest once all are there.

    What :func:`build` does with ``shards`` set (``options.shard`` is ignored here: ``indices`` says which). Every
    check that can refuse the build comes before the folder is created: a refused build leaves nothing behind. Several
    shards are built at once, each by its own process that reads, decodes and writes in-process (up to
    ``options.workers`` processes); a single shard is built with ``options.workers`` reader processes. Whichever
    call completes the last shard writes the manifest (the manifest lock arbitrates; the result is the same).

    Raises:
        As :func:`build_lmdb`; ``ValueError`` also for more shards than images or an index out of range.
    """
    count_of = options.shards
    if count_of is None:
        raise ValueError("build_shards needs options with shards= set (the shard count).")
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
    scan = scan_source(source_root)
    if count_of > len(scan.files):
        raise OptionError(f"shards={count_of} is more than the {len(scan.files)} images of {str(source_root)!r}; choose at most "
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
        log.info("%s was built %s; rebuilding it.", folder, reason)
    folder.mkdir(parents=True, exist_ok=True)
    if existing is not None or options.overwrite:
        _retire_manifest(folder, count_of)
    ranges = shards.shard_ranges([f.size for f in scan.files], count_of)
    todo = list(range(count_of)) if indices is None else sorted(set(indices))
    workers = available_cores() if options.workers is None else options.workers
    jobs = [_ShardJob(_sub_scan(scan, *ranges[i], with_special=i == 0), folder / shards.shard_name(i, count_of),
                      fmt.ShardInfo(i, count_of, *ranges[i], len(scan.files), scan.fingerprint()))
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
        raise BuildError(f"Every image in {str(source_root)!r} was skipped as unreadable; nothing to build. See the reasons above.")
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
                process = context.Process(target=_shard_process, args=(job, options, sender), name=f"build {job.path.name}",
                                          daemon=True)
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


def _shard_process(job: _ShardJob, options: BuildOptions, sender: Connection) -> None:
    """The body of a shard process: build the shard and send back ``("report", BuildReport)`` or ``("error", exception)``."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's terminate() ends it, whatever handler it inherited
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


def _retire_manifest(folder: Path, count_of: int) -> None:
    """Before a rebuild: remove the manifest first (readers then see an unfinished build, never a mix) and shards of another count."""
    with shards.manifest_lock(folder):
        with contextlib.suppress(FileNotFoundError):
            (folder / database.MANIFEST_NAME).unlink()
        for (_, of), path in database.shard_files(folder).items():
            if of != count_of:
                path.unlink()
        fmt.fsync_dir(folder)


def _plural(count: int, noun: str) -> str:
    """``"1 bad file"``, ``"2 bad files"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask where the OS has one), else all of them."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def available_cores() -> int:
    """How many CPU cores this process may run on (see :func:`usable_cpus`)."""
    return len(usable_cpus())


def _existing_meta(target: Path) -> fmt.Metadata | None:
    """Metadata of a finished database at ``target``, ``None`` if nothing is there."""
    if not target.exists():
        return None
    try:
        return database.load_meta(target)
    except fmt.DatabaseError as exc:
        raise FileExistsError(
            f"{str(target)!r} exists and is not a usable lightning_lmdb database ({exc}). "
            "It is left untouched: remove it yourself or choose another target."
        ) from exc


def _build_lock(target: Path) -> contextlib.AbstractContextManager[None]:
    """An exclusive lock on ``TARGET.build-lock`` (works across processes and, via NFS locks, nodes); logs when it waits."""
    waiting = "Another process is building %s; waiting for it to finish."
    return fmt.file_lock(fmt.build_lock_path(target), on_wait=lambda: log.info(waiting, target))


#: One file to read: (index, path, storage or "check", max_pixels, resize, quality).
_Task = tuple[int, str, str, int | None, int | None, int]


def _read_one(task: _Task) -> tuple[int, bytes | None, Any]:
    """Read, fully decode and checksum one file (runs in a pool worker).

    Returns:
        ``(index, value, checksum)``, or ``(index, None, reason)`` for a bad file.
    """
    index, path, storage, max_pixels, resize, quality = task
    try:
        data = read_file(path)
    except NotRegularFileError as exc:
        return index, None, exc.reason
    except OSError as exc:
        return index, None, f"cannot read the file ({exc.strerror or exc}). Check its permissions."
    try:
        if storage == "check":  # validation only (find_bad_files)
            encode_record(data, "encoded", max_pixels=max_pixels, name=path)
            return index, b"", b""
        value = encode_record(data, storage, max_pixels=max_pixels, name=path, resize=resize, quality=quality)
    except ImageDecodeError as exc:
        return index, None, exc.reason
    return index, value, fmt.checksum(value)


class _Writer:
    """One build of ``scan`` into ``target``: resume or start the partial file, fill it, finish it."""

    def __init__(self, scan: SourceScan, target: Path, options: BuildOptions, shard: fmt.ShardInfo | None = None,
                 line: int | None = None):
        self.scan, self.target, self.on_error, self.shard, self.line = scan, target, options.on_error, shard, line
        self.options = options.content()  # what shapes the contents: compared on resume, stored in the metadata
        self.workers = available_cores() if options.workers is None else options.workers
        self.commit_every, self.progress = options.commit_every, options.progress
        self.partial = fmt.partial_path(target)
        self.prefix = PrefixFingerprint(scan.files)
        self.written = self.written_bytes = self.commits = 0

    def run(self) -> BuildReport:
        finished = self._finished_partial()
        if finished is not None:  # killed after the final commit, before the rename: just finish the rename
            log.info("%s is a complete build of this source; renaming it into place.", self.partial)
            self._rename()
            return BuildReport(self.target, "resumed", 0, finished.count, finished.skipped)
        env, consumed, skipped = self._open_partial()
        try:
            if not consumed:
                skipped = self._special_files()
            dbs = (env.open_db(fmt.RECORDS_DB), env.open_db(fmt.CHECKSUMS_DB))
            action = "resumed" if consumed else "built"
            self._fill(env, dbs, consumed, skipped)
            count = self._finish(env, dbs, skipped)
        finally:
            env.close()
        _fault("rename")
        self._rename()
        if skipped:
            log.warning("Skipped %s while building %s:\n%s", _plural(len(skipped), "bad file"), self.target,
                        "\n".join(f"  {s['path']}: {s['reason']}" for s in skipped))
        return BuildReport(self.target, action, self.written, count, [fmt.Skipped(s["path"], s["reason"]) for s in skipped])

    def _rename(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fmt.partial_lock_path(self.target))
        envs.close(self.target)  # this process's readers of the old file reopen the new one (and notice the new build)
        os.replace(self.partial, self.target)
        _fault("fsync")
        fmt.fsync_dir(self.target.parent)

    def _special_files(self) -> list[dict[str, str]]:
        """Skips for the scan's non-regular files (FIFOs, sockets, devices), or a BuildError with ``on_error="raise"``."""
        if self.scan.special and self.on_error == "raise":
            path, reason = self.scan.special[0]
            raise BuildError(f"{self.scan.root / path}: {reason}\nRemove it, or {_SKIP_HINT}.")
        return [{"path": path, "reason": reason} for path, reason in self.scan.special]

    def _finished_partial(self) -> fmt.Metadata | None:
        """The metadata of ``TARGET.partial`` when it is a finished build of this source and options, else None."""
        if not self.partial.exists():
            return None
        try:
            env = envs.open_env(self.partial, validate_meta=False)
        except (fmt.DatabaseError, OSError):
            return None
        try:
            meta = fmt.read_meta(env, self.partial)
        except fmt.DatabaseError:
            return None
        finally:
            env.close()
        return meta if database.is_current(meta, self.scan, self.options, shard=self.shard) else None

    def _open_partial(self) -> tuple[lmdb.Environment, int, list[dict[str, str]]]:
        """Open ``TARGET.partial``, resuming it when it was started on the same source prefix and options."""
        if self.partial.exists():
            env = None
            try:
                env = self._open_env(max(self._initial_map_size(), 2 * self.partial.stat().st_size))
                with env.begin() as txn:
                    raw = txn.get(fmt.PROGRESS_KEY)
                state = json.loads(bytes(raw)) if raw is not None else None
                if (
                    state is not None
                    and state.get("version") == fmt.FORMAT_VERSION
                    and state["options"] == self.options
                    and 0 < state["consumed"] <= len(self.scan.files)
                    and state["prefix"] == self.scan.fingerprint(state["consumed"])
                ):
                    log.info("Resuming the build of %s after %d of %d files.", self.target, state["consumed"], len(self.scan.files))
                    return env, state["consumed"], state["skipped"]
            except (lmdb.Error, ValueError, KeyError, TypeError):
                pass  # unreadable: start over
            if env is not None:
                env.close()
            log.info("Discarding %s: it belongs to another source or options, or is unreadable.", self.partial)
            self.partial.unlink()
        return self._open_env(self._initial_map_size()), 0, []

    def _initial_map_size(self) -> int:
        # Start from the source size; a decoded build is larger and grows by doubling on MapFullError.
        return max(_MIN_MAP_SIZE, int(self.scan.total_bytes * 1.25))

    def _open_env(self, map_size: int) -> lmdb.Environment:
        return lmdb.open(str(self.partial), subdir=False, map_size=map_size, max_dbs=3, readahead=False, meminit=False)

    def _fill(self, env: lmdb.Environment, dbs: tuple[Any, Any], consumed: int, skipped: list[dict[str, str]]) -> None:
        files = self.scan.files
        opts = self.options
        tasks: list[_Task] = [(i, files[i].path, opts["storage"], opts["max_pixels"], opts.get("resize"), opts.get("quality", 0))
                              for i in range(consumed, len(files))]
        with env.begin() as txn:
            next_record = txn.stat(dbs[0])["entries"]
        batch: list[tuple[bytes, bytes, str]] = []
        batch_bytes = 0
        bar = tqdm(total=len(files), initial=consumed, unit="img", desc=f"build {self.target.name}", disable=not self.progress,
                   dynamic_ncols=True, position=self.line)
        started, nbytes = time.perf_counter(), 0
        with _read_files(tasks, self.workers) as results:
            for index, value, digest in results:
                if value is None:  # a bad file: the third field is the reason
                    error = digest
                    if self.on_error == "raise":
                        self._commit(env, dbs, batch, index, skipped)
                        bar.close()
                        where = "" if self.shard is None else f" of {self.target.name}"
                        raise BuildError(
                            f"{files[index].path}: {error}\nNothing was lost: the {_plural(index, 'file')}{where} before it "
                            f"{'is' if index == 1 else 'are'} committed and a rerun resumes there. "
                            f"Fix or remove the file, or {_SKIP_HINT}."
                        )
                    skipped.append({"path": files[index].relpath, "reason": error})
                else:
                    batch.append((fmt.record_key(next_record), value, digest))
                    next_record += 1
                    batch_bytes += len(value)
                    nbytes += len(value)
                bar.update(1)
                if len(batch) >= self.commit_every or batch_bytes >= _BATCH_BYTES:
                    self._commit(env, dbs, batch, index + 1, skipped)
                    batch, batch_bytes = [], 0
                    elapsed = max(time.perf_counter() - started, 1e-9)
                    bar.set_postfix_str(f"{nbytes / elapsed / 1e6:.1f} MB/s")
        self._commit(env, dbs, batch, len(files), skipped)
        bar.close()

    def _commit(
        self, env: lmdb.Environment, dbs: tuple[Any, Any], batch: list[tuple[bytes, bytes, bytes]], consumed: int,
        skipped: list[dict[str, str]],
    ) -> None:
        state = {"version": fmt.FORMAT_VERSION, "consumed": consumed, "prefix": self.prefix.advance(consumed), "options": self.options,
                 "skipped": skipped}
        records, checksums = dbs

        def write(txn: lmdb.Transaction) -> None:
            for key, value, digest in batch:
                txn.put(key, value, db=records, append=True)
                txn.put(key, digest, db=checksums, append=True)
            txn.put(fmt.PROGRESS_KEY, fmt.dump_json(state))

        nbytes = sum(len(value) for _, value, _ in batch)
        self._write(env, write, pending=nbytes)
        self.written += len(batch)
        self.written_bytes += nbytes
        self.commits += 1
        _fault("commit", self.commits)

    def _write(self, env: lmdb.Environment, write: Any, pending: int) -> None:
        """``_write_growing``, turning a full disk (LMDB reports only "Input/output error") into :class:`DiskFullError`."""
        try:
            _write_growing(env, write)
        except lmdb.Error as exc:
            free = shutil.disk_usage(self.partial.parent).free
            if free > max(4 * pending, 8 << 20):
                raise OSError(
                    errno.EIO, f"Writing {self.partial} failed ({exc}). Nothing committed before was lost: rerun to resume."
                ) from exc
            done = self.written_bytes
            estimate = self._estimated_bytes()
            raise DiskFullError(
                errno.ENOSPC,
                f"The disk holding {self.partial.parent} is full ({free / 1e6:.1f} MB free): the build of {self.target.name} "
                f"needs about {max(estimate - done, pending) / 1e6:.1f} MB more ({done / 1e6:.1f} MB written of an estimated "
                f"{estimate / 1e6:.1f} MB). Nothing was lost: free space (or choose a target on another disk) and rerun; "
                "the build resumes after the last committed batch.",
            ) from exc

    def _estimated_bytes(self) -> int:
        """The database's expected final size: the source size for encoded storage, extrapolated from what was written otherwise."""
        if (self.options["storage"] == "encoded" and self.options.get("resize") is None) or not self.written:
            return int(self.scan.total_bytes * 1.12)
        return int(self.written_bytes / self.written * len(self.scan.files) * 1.02)

    def _finish(self, env: lmdb.Environment, dbs: tuple[Any, Any], skipped: list[dict[str, str]]) -> int:
        skipped_paths = {s["path"] for s in skipped}
        kept = [f for f in self.scan.files if f.relpath not in skipped_paths]
        records, checksum_db = dbs
        with env.begin() as txn:
            entries = txn.stat(records)["entries"]
            checksums = b"".join(bytes(digest) for _, digest in txn.cursor(db=checksum_db))
        if len(checksums) != entries * fmt.CHECKSUM_SIZE:
            raise fmt.DatabaseError(f"{self.partial} holds checksums of the wrong size; delete it and build again.")
        checksums = np.frombuffer(checksums, dtype=np.uint8).reshape(entries, fmt.CHECKSUM_SIZE)
        if not entries == len(kept):
            raise fmt.DatabaseError(f"{self.partial} holds {entries} records but {len(kept)} were expected; delete it and build again.")
        if not kept and self.shard is None:  # a shard may hold no record: build_shards refuses a build with none at all
            raise BuildError(f"Every image in {str(self.scan.root)!r} was skipped as unreadable; nothing to build. See the reasons above.")
        from lightning_lmdb import __version__

        meta = fmt.Metadata(
            version=fmt.FORMAT_VERSION,
            count=len(kept),
            storage=self.options["storage"],
            classes=self.scan.classes,
            class_to_idx=self.scan.class_to_idx,
            checksum=fmt.CHECKSUM_ALGO,
            source=fmt.SourceInfo(
                root=str(self.scan.root), num_files=len(self.scan.files) + len(self.scan.special),
                bytes=self.scan.total_bytes, fingerprint=self.scan.fingerprint(),
            ),
            options={**self.options, "on_error": self.on_error},
            skipped=[fmt.Skipped(s["path"], s["reason"]) for s in skipped],
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            library_version=__version__,
            build_id=fmt.new_build_id(),
            targets=np.array([f.target for f in kept], dtype=np.int32),
            paths=fmt.PathTable.from_strings(f.relpath for f in kept),
            checksums=checksums,
            shard=self.shard,
        )

        def write(txn: lmdb.Transaction) -> None:
            txn.delete(fmt.PROGRESS_KEY)
            # A handle opened in this transaction: drop() closes it even when the transaction then aborts
            # (MapFullError), and the retry after the map grows needs a live one.
            txn.drop(env.open_db(fmt.CHECKSUMS_DB, txn=txn), delete=True)
            fmt.write_meta(txn, meta)
            _fault("final")

        self._write(env, write, pending=meta.count * 64 + 65536)  # the arrays: ~40 bytes a record, plus the header
        env.sync(True)
        return len(kept)


def _write_growing(env: lmdb.Environment, write: Any) -> None:
    """Run ``write(txn)`` in one write transaction, doubling the map size on ``MapFullError``."""
    while True:
        try:
            with env.begin(write=True) as txn:
                write(txn)
            return
        except lmdb.MapFullError:
            env.set_mapsize(env.info()["map_size"] * 2)


def find_bad_files(scan: SourceScan, *, max_pixels: int | None = DEFAULT_MAX_PIXELS, workers: int | None = None) -> list[fmt.Skipped]:
    """The files of ``scan`` a build with ``on_error="skip"`` would leave out, each with the reason.

    Reads and decodes every file exactly as the builder does (same checks, same process pool), so the
    raw backend of an A/B can serve the samples a database would hold without building one.

    Args:
        scan: The scanned source folder.
        max_pixels: The builder's decompression-bomb limit.
        workers: Reader processes (``None``: one per core; ``0``: in this process).
    """
    bad = [fmt.Skipped(path, reason) for path, reason in scan.special]
    tasks: list[_Task] = [(i, f.path, "check", max_pixels, None, 0) for i, f in enumerate(scan.files)]
    with _read_files(tasks, available_cores() if workers is None else workers) as results:
        bad += [fmt.Skipped(scan.files[i].relpath, reason) for i, value, reason in results if value is None]
    return bad


def _start_reader() -> None:
    """A reader process's start: SIGTERM's default action (the pool's terminate must end it) and the palette warning off.

    A forked reader inherits its parent's Python SIGTERM handler -- Lightning's, which only sets a flag, or a latency
    mount's -- and a pool that stops early (a bad file, Ctrl-C) would then wait forever for readers that do not end.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _ignore_palette_warning()


def _ignore_palette_warning() -> None:
    """Silence Pillow's "Palette images with Transparency expressed in bytes" warning in this process's filters.

    ``convert("RGB")`` (ImageFolder's decode, which the builder checks every file with) gives such a palette
    image its palette colours, the pixels ImageFolder sees: the warning names nothing wrong with the file,
    yet it was printed into the progress bar once per reader process. Added once per reader process (a pool
    initializer), or once per read in this process (:func:`_read_files`), never per image.
    """
    warnings.filterwarnings("ignore", message="Palette images with Transparency expressed in bytes", category=UserWarning)


@contextlib.contextmanager
def _read_files(tasks: list[_Task], workers: int) -> Iterator[Iterator[tuple[int, bytes | None, Any]]]:
    """:func:`_read_one` of every task, in order: in this process (``workers=0``) or in a pool of ``workers`` processes."""
    if workers == 0 or len(tasks) < 2:
        with warnings.catch_warnings():  # once for the whole read: this process's filters are as they were afterwards
            _ignore_palette_warning()
            yield map(_read_one, tasks)
        return
    # Large chunks keep the single writer process (the bottleneck on few cores) cheap per image.
    chunksize = max(1, min(64, len(tasks) // (4 * workers)))
    with multiprocessing.get_context().Pool(workers, initializer=_start_reader) as pool:
        yield pool.imap(_read_one, tasks, chunksize=chunksize)
