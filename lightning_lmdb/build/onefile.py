"""One build of a scanned source into one database file: a single-file database, or one shard of a sharded one.

:class:`_Writer` resumes or starts ``TARGET.partial``, fills it with what the reader pool
(:mod:`lightning_lmdb.build.readers`) made of each file, in batched transactions that also record its progress,
then writes the metadata in the final transaction and renames the file onto ``TARGET``. For a source whose
targets come with its records (``SourceScan.targets_from_records``: a dataset, :mod:`lightning_lmdb.sources.dataset`),
each record's progress entry also holds its target, checked against the kind as it arrives, and the metadata's
targets are made from those entries (so a resumed build has the targets of the records committed before). A source of
images with masks (:class:`lightning_lmdb.sources.masks.MaskScan`) is one such: each record holds an image and its mask, its target
is the classes the mask holds, and the metadata adds ``ignore_index`` and the masks' paths. Its error policy
(``on_error``), progress bar and disk-full diagnosis live here too, with the helpers every build shares: the
target check, the build lock and the reading of an existing database's metadata. The public entry points
are :func:`lightning_lmdb.build.writer.build` and :func:`lightning_lmdb.build.writer.build_lmdb`.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as _dt
import errno
import json
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
from tqdm import tqdm

from lightning_lmdb.build import readers
from lightning_lmdb.codec import storage as codec
from lightning_lmdb.errors import BuildError, DiskFullError, OptionError, RemoteError, SourceError
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.remote import urls
from lightning_lmdb.sources import masks
from lightning_lmdb.sources.base import PrefixFingerprint, SourceFile, SourceScan
from lightning_lmdb.sources.dataset import FoundTargets
from lightning_lmdb.store import database, envs, fsops
from lightning_lmdb.store import format as fmt
from lightning_lmdb.targets import TargetTable, width_of

log = logging.getLogger(__name__)

_BATCH_BYTES = 64 << 20
_MIN_MAP_SIZE = 16 << 20


#: Test-only fault injection: ``commit:N`` (after the N-th batch commit), ``final`` (inside the final
#: transaction, before it commits), ``rename`` (after the final commit, before the rename), ``fsync``
#: (after the rename, before the folder's fsync). The builder SIGKILLs itself (and its process group
#: when it leads one) at that point, so the fault suite can crash it at exact moments. With ``:INT``
#: (``commit:3:INT``) it sends SIGINT instead, as Ctrl-C does, to its process group when it or its parent
#: (a sharded build's) leads one, else to itself: a Ctrl-C test interrupts it at that point, not by a race.
FAULT_ENV = "LIGHTNING_LMDB_TEST_KILL_AT"
_SKIP_HINT = "build with on_error='skip' (CLI: --on-error skip, Hydra: data.on_error=skip) to leave bad files out"


def _fault(point: str, count: int = 0) -> None:
    wanted = os.environ.get(FAULT_ENV)
    if not wanted:
        return
    name, _, n = wanted.partition(":")
    n, _, interrupt = n.partition(":")
    if name == point and (not n or int(n) == count):
        if interrupt == "INT":
            if os.getpgid(0) in (os.getpid(), os.getppid()):
                os.killpg(0, signal.SIGINT)
            else:
                os.kill(os.getpid(), signal.SIGINT)
            return
        if os.getpgid(0) == os.getpid():
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class BuildReport:
    """What a call to :func:`lightning_lmdb.build.writer.build` did.

    Attributes:
        path: The finished database.
        action: ``"built"``, ``"resumed"`` or ``"up-to-date"``.
        records_written: Records committed by this call (0 when up to date).
        count: Records in the database.
        skipped: Files left out, with the reason.
        seconds: Wall time of this call.
        phases: Wall seconds of its parts, when it built or resumed one file: ``scan`` (listing the source), ``open``
            (opening or resuming the partial file, the resume's checks), ``write`` (reading, decoding and committing the
            records), ``finish`` (the metadata, the final commit and the rename). A resume's ``write`` is the work left.
        published: For a build to a URL (``s3://...``): what the push did (a
            :class:`~lightning_lmdb.store.published.PushReport`); ``path`` is then the local copy that was pushed.
    """

    path: Path
    action: str
    records_written: int
    count: int
    skipped: list[fmt.Skipped] = field(default_factory=list)
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    published: Any = None


def _checked_target(source_root: Path, target: str | os.PathLike[str]) -> Path:
    """``target`` made absolute; refused inside the source (it would be scanned as images). Nothing is created."""
    target = Path(target).expanduser().absolute()
    if target.resolve() == source_root or target.resolve().is_relative_to(source_root):
        raise SourceError(f"Target {str(target)!r} lies inside the source {str(source_root)!r}; put the database outside the image folder.")
    return target


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
    return fsops.file_lock(fsops.build_lock_path(target), on_wait=lambda: log.info(waiting, target))


def _plural(count: int, noun: str) -> str:
    """``"1 bad file"``, ``"2 bad files"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


class _Writer:
    """One build of ``scan`` into ``target``: resume or start the partial file, fill it, finish it."""

    def __init__(self, scan: SourceScan, target: Path, options: BuildOptions, shard: fmt.ShardInfo | None = None,
                 line: int | None = None):
        self.scan, self.target, self.on_error, self.shard, self.line = scan, target, options.on_error, shard, line
        self.options = options.content()  # what shapes the contents: compared on resume, stored in the metadata
        self.workers = readers.default_readers(scan) if options.workers is None else options.workers
        self.commit_every, self.progress = options.commit_every, options.progress
        self.validate = options.validate  # how kept files are checked: not a content option (the records are the same)
        self.partial = fsops.partial_path(target)
        self.prefix = PrefixFingerprint(scan.files, scan.identity, scan.root)
        self.written = self.written_bytes = self.commits = 0
        if isinstance(scan, masks.MaskScan):
            _check_mask_build(scan, options, shard)

    def run(self) -> BuildReport:
        clock = time.perf_counter()
        phases: dict[str, float] = {}

        def lap(name: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            phases[name], clock = now - clock, now

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
            lap("open")
            self._fill(env, dbs, consumed, skipped)
            lap("write")
            count = self._finish(env, dbs, skipped)
        finally:
            env.close()
        _fault("rename")
        self._rename()
        lap("finish")
        log.debug("%s %s: %d records written, %s", action.capitalize(), self.target, self.written,
                  ", ".join(f"{name} {seconds:.3f} s" for name, seconds in phases.items()))
        if skipped:
            log.warning("Skipped %s while building %s:\n%s", _plural(len(skipped), "bad file"), self.target,
                        "\n".join(f"  {_shown(s['path'])}: {s['reason']}" for s in skipped))
        return BuildReport(self.target, action, self.written, count, [fmt.Skipped(s["path"], s["reason"]) for s in skipped],
                           phases=phases)

    def _rename(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fsops.partial_lock_path(self.target))
        envs.close(self.target)  # this process's readers of the old file reopen the new one (and notice the new build)
        os.replace(self.partial, self.target)
        _fault("fsync")
        fsops.fsync_dir(self.target.parent)

    def _special_files(self) -> list[dict[str, str]]:
        """Skips for the scan's non-regular files (FIFOs, sockets, devices), or a BuildError with ``on_error="raise"``."""
        if self.scan.special and self.on_error == "raise":
            path, reason = self.scan.special[0]
            where = urls.join(self.scan.root, path) if urls.is_remote(self.scan.root) else self.scan.root / path
            raise BuildError(f"{urls.redact(str(where))}: {reason}\nFix or remove it, or {_SKIP_HINT}.")
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
                if state is None or state.get("consumed") == 0:
                    why = "it holds no progress (the build before stopped before its first commit)"
                elif state.get("version") != fmt.PROGRESS_VERSION:
                    why = f"it was written by another version of lightning_lmdb (progress version {state.get('version')!r})"
                elif state["options"] != self.options:
                    why = "it was started with other build options"
                elif not (0 < state["consumed"] <= len(self.scan.files) and state["prefix"] == self.scan.fingerprint(state["consumed"])):
                    why = "its source changed since it was started (files added, removed, modified or relabelled)"
                else:
                    log.info("Resuming the build of %s after %d of %d files.", self.target, state["consumed"], len(self.scan.files))
                    if state.get("checksum", fmt.LEGACY_CHECKSUM_ALGO) != fmt.CHECKSUM_ALGO:
                        _recompute_checksums(env, state.get("checksum", fmt.LEGACY_CHECKSUM_ALGO))
                    return env, state["consumed"], state["skipped"]
            except (lmdb.Error, ValueError, KeyError, TypeError, AttributeError) as exc:
                why = f"it is unreadable ({exc})"
            if env is not None:
                env.close()
            log.info("Discarding %s: %s; building from the start.", self.partial, why)
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
        dataset, _ = readers.sample_source(self.scan)
        tasks = readers.tasks_of(self.scan, opts["storage"], opts["max_pixels"], opts.get("resize"), opts.get("quality", 0), consumed,
                                 validate=self.validate)
        with env.begin() as txn:
            next_record = txn.stat(dbs[0])["entries"]
        fitting = None  # with targets from the records: checks each target against the kind of those before it
        if self.scan.targets_from_records:
            fitting = readers.record_targets(self.scan)
            for target in self._committed_targets(env, dbs[1]):
                fitting.check(target)
        bar = tqdm(total=len(files), initial=consumed, unit="img", desc=f"build {self.target.name}", disable=not self.progress,
                   dynamic_ncols=True, position=self.line)
        started, nbytes = time.perf_counter(), 0
        sizes = [f.size for f in files[consumed:]]
        growth = 1 if opts["storage"] == "encoded" and opts.get("resize") is None else readers.GROWTH
        done = consumed  # the files read and handled so far (committed with the batch when object storage fails)
        try:
            self._fill_from(tasks, dataset, sizes, growth, env, dbs, skipped, fitting, bar, next_record, started, nbytes, done)
        except RemoteError as exc:  # an object changed since the scan (or storage failed): what was read before it is kept
            self._commit(env, dbs, self._pending, self._done, skipped)
            bar.close()
            raise type(exc)(f"{exc} Nothing was lost: the {_plural(self._done, 'file')} before it "
                            f"{'is' if self._done == 1 else 'are'} committed and a rerun resumes there.") from exc
        self._commit(env, dbs, self._pending, len(files), skipped)
        bar.close()

    def _fill_from(self, tasks: list[Any], dataset: Any, sizes: list[int], growth: int, env: lmdb.Environment, dbs: tuple[Any, Any],
                   skipped: list[dict[str, str]], fitting: Any, bar: Any, next_record: int, started: float, nbytes: int,
                   done: int) -> None:
        files = self.scan.files
        batch: list[tuple[bytes, bytes, str]] = []
        batch_bytes = 0
        self._pending: list[tuple[bytes, bytes, str]] = batch
        self._done = done
        with readers._read_files(tasks, self.workers, dataset, sizes, growth, shared=True) as results:
            for index, value, digest in results:
                if value is not None and fitting is not None:  # the entry ends with the record's target
                    misfit = fitting.check(fmt.split_entry(digest)[1])
                    if misfit is not None:
                        value, digest = None, misfit
                if value is None:  # a bad file: the third field is the reason
                    error = digest
                    if self.on_error == "raise":
                        self._commit(env, dbs, batch, index, skipped)
                        bar.close()
                        where = "" if self.shard is None else f" of {self.target.name}"
                        origin = f"{files[index].origin}: " if files[index].origin else ""
                        raise BuildError(
                            f"{origin}{_shown_path(files[index].path)}: {error}\nNothing was lost: the {_plural(index, 'file')}{where} "
                            f"before it "
                            f"{'is' if index == 1 else 'are'} committed and a rerun resumes there. "
                            f"Fix or remove the file, or {_SKIP_HINT}."
                        )
                    origin = f"{files[index].origin}: " if files[index].origin else ""
                    skipped.append({"path": files[index].relpath, "reason": origin + error})
                else:
                    batch.append((fmt.record_key(next_record), value, digest))
                    next_record += 1
                    batch_bytes += len(value)
                    nbytes += len(value)
                bar.update(1)
                self._done = index + 1
                if len(batch) >= self.commit_every or batch_bytes >= _BATCH_BYTES:
                    self._commit(env, dbs, batch, index + 1, skipped)
                    batch, batch_bytes = [], 0
                    self._pending = batch
                    elapsed = max(time.perf_counter() - started, 1e-9)
                    bar.set_postfix_str(f"{nbytes / elapsed / 1e6:.1f} MB/s")

    def _commit(
        self, env: lmdb.Environment, dbs: tuple[Any, Any], batch: list[tuple[bytes, bytes, bytes]], consumed: int,
        skipped: list[dict[str, str]],
    ) -> None:
        state = {"version": fmt.PROGRESS_VERSION, "consumed": consumed, "prefix": self.prefix.advance(consumed), "options": self.options,
                 "skipped": skipped, "checksum": fmt.CHECKSUM_ALGO}
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

    def _committed_targets(self, env: lmdb.Environment, checksum_db: Any) -> list[Any]:
        """The targets of the committed records of a ``targets_from_records`` scan (the ends of their progress entries)."""
        with env.begin() as txn:
            return [self._split(bytes(entry))[1] for _, entry in txn.cursor(db=checksum_db)]

    def _split(self, entry: bytes) -> tuple[bytes, Any]:
        try:
            return fmt.split_entry(entry)
        except ValueError as exc:
            raise fmt.DatabaseError(f"{self.partial} holds a progress entry without its target ({exc}); delete it and build "
                                    "again.") from None

    def _finish(self, env: lmdb.Environment, dbs: tuple[Any, Any], skipped: list[dict[str, str]]) -> int:
        # The files skipped while reading: a special entry may carry a kept file's path (a manifest row listing it twice).
        skipped_paths = collections.Counter(s["path"] for s in skipped) - collections.Counter(path for path, _ in self.scan.special)
        kept = [f for f in self.scan.files if f.relpath not in skipped_paths]
        records, checksum_db = dbs
        scan = self.scan
        record_targets: list[Any] = []
        with env.begin() as txn:
            entries = txn.stat(records)["entries"]
            if scan.targets_from_records:  # each entry: digest, codec, then the record's target
                split = [self._split(bytes(entry)) for _, entry in txn.cursor(db=checksum_db)]
                progress = b"".join(head for head, _ in split)
                record_targets = [target for _, target in split]
            else:
                progress = b"".join(bytes(entry) for _, entry in txn.cursor(db=checksum_db))
        storage = codec.storage_mode(self.options["storage"])
        if len(progress) == entries * (fmt.CHECKSUM_SIZE + 1):  # digest + record codec
            table = np.frombuffer(progress, dtype=np.uint8).reshape(entries, fmt.CHECKSUM_SIZE + 1)
            checksums, codecs = table[:, :fmt.CHECKSUM_SIZE], table[:, fmt.CHECKSUM_SIZE].copy()
        elif len(progress) == entries * fmt.CHECKSUM_SIZE and storage.default_codec is not None:  # begun by an earlier version
            checksums = np.frombuffer(progress, dtype=np.uint8).reshape(entries, fmt.CHECKSUM_SIZE)
            codecs = np.full(entries, storage.default_codec, dtype=np.uint8)
        else:
            raise fmt.DatabaseError(f"{self.partial} holds checksums of the wrong size; delete it and build again.")
        if not entries == len(kept):
            raise fmt.DatabaseError(f"{self.partial} holds {entries} records but {len(kept)} were expected; delete it and build again.")
        if not kept and self.shard is None:  # a shard may hold no record: build_shards refuses a build with none at all
            raise BuildError(f"Every image in {str(self.scan.root)!r} was skipped as unreadable; nothing to build. See the reasons above.")
        from lightning_lmdb import __version__

        if scan.targets_from_records:
            try:
                found = readers.record_targets(scan).finish(record_targets)
            except ValueError as exc:
                raise fmt.DatabaseError(f"{self.partial} holds a target that does not fit ({exc}); delete it and build again.") from None
            class_to_idx = {c: k for k, c in enumerate(found.classes)}
        else:
            found = FoundTargets(str(scan.target_kind), scan.classes, scan.target_names, [f.target for f in kept])
            class_to_idx = scan.class_to_idx
        table = TargetTable.pack(found.kind, found.targets, width_of(found.kind, found.classes, found.target_names))
        split_names = list(scan.split_names or [])
        meta = fmt.Metadata(
            version=fmt.FORMAT_VERSION,
            count=len(kept),
            storage=self.options["storage"],
            classes=found.classes,
            class_to_idx=class_to_idx,
            checksum=fmt.CHECKSUM_ALGO,
            source=fmt.SourceInfo(
                root=_shown_path(self.scan.root), num_files=len(self.scan.files) + len(self.scan.special),
                bytes=self.scan.total_bytes, fingerprint=self.scan.fingerprint(),
            ),
            options={**self.options, "on_error": self.on_error,
                     **({"zstd_level": codec.ZSTD_LEVEL} if storage.name == "auto" else {})},
            skipped=[fmt.Skipped(s["path"], s["reason"]) for s in skipped],
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            library_version=__version__,
            build_id=fmt.new_build_id(),
            targets=table.index,
            codecs=codecs,
            paths=fmt.PathTable.from_strings(f.relpath for f in kept),
            checksums=checksums,
            shard=self.shard,
            target_kind=table.kind,
            target_names=list(found.target_names),
            labels=table.labels,
            label_offsets=table.offsets,
            values=table.values,
            target_arrays=dict(table.extra or {}),
            target_meta=dict(scan.target_meta or {}),
            split_names=split_names,
            splits=scan.split_indices(kept),
            **(_mask_fields(scan, kept) if isinstance(scan, masks.MaskScan) else {}),
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


def _shown_path(path: Any) -> str:
    """A source path (its root, a file) as the metadata and messages show it: as it is, or a URL redacted (no credential in it)."""
    return urls.redact(str(path)) if urls.is_remote(path) else str(path)


def _check_mask_build(scan: masks.MaskScan, options: BuildOptions, shard: fmt.ShardInfo | None) -> None:
    """Refuse the build options a source with masks cannot be built with, before anything is read."""
    if shard is not None and scan.num_classes is None and not scan.classes:
        raise OptionError(f"A sharded build of {str(scan.root)!r}, whose targets are segmentation masks, needs num_classes= (or "
                          "classes=): each shard is built alone and cannot know the largest class id of the others. Give the number "
                          "of classes (CLI --num-classes), or build one file.")


def _mask_fields(scan: masks.MaskScan, kept: list[SourceFile]) -> dict[str, Any]:
    """The metadata fields of a database of images with masks: ``ignore_index`` and the masks' paths (relative to the source's
    root when inside it, else absolute)."""
    prefix = str(scan.root).rstrip(os.sep) + os.sep
    paths = (f.mask[len(prefix):].replace(os.sep, "/") if f.mask.startswith(prefix) else f.mask for f in kept)
    return {"ignore_index": scan.ignore_index, "mask_paths": fmt.PathTable.from_strings(paths)}


def _recompute_checksums(env: lmdb.Environment, algorithm: str) -> None:
    """Turn the progress entries of a partial build begun under checksum ``algorithm`` into
    :data:`~lightning_lmdb.store.format.CHECKSUM_ALGO`
    ones, each record checked against its old checksum first, so the finished database has one algorithm.

    Raises:
        ValueError: An unknown algorithm, or a committed record that does not match its entry (the partial is then discarded).
    """
    if algorithm not in fmt.CHECKSUMS:
        raise ValueError(f"unknown checksum algorithm {algorithm!r}")
    size = fmt.CHECKSUM_SIZE
    with env.begin(write=True) as txn:
        records, entries = env.open_db(fmt.RECORDS_DB, txn=txn), env.open_db(fmt.CHECKSUMS_DB, txn=txn)
        for key, entry in list(txn.cursor(db=entries)):
            value = txn.get(key, db=records)
            if value is None or fmt.checksum(value, algorithm) != entry[:size]:
                raise ValueError(f"record {key!r} does not match its progress entry")
            txn.put(key, fmt.checksum(value) + entry[size:], db=entries)
        raw = txn.get(fmt.PROGRESS_KEY)
        txn.put(fmt.PROGRESS_KEY, fmt.dump_json({**json.loads(raw), "checksum": fmt.CHECKSUM_ALGO}))


def _write_growing(env: lmdb.Environment, write: Any) -> None:
    """Run ``write(txn)`` in one write transaction, doubling the map size on ``MapFullError``."""
    while True:
        try:
            with env.begin(write=True) as txn:
                write(txn)
            return
        except lmdb.MapFullError:
            env.set_mapsize(env.info()["map_size"] * 2)


def _shown(path: str) -> str:
    """A path as a log line shows it: as it is, or quoted with escapes when it holds a NUL, a control character or a lone
    surrogate (which no UTF-8 log handler can write)."""
    return path if path.isprintable() else repr(path)
