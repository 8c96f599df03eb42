"""Stage a database to node-local disk: copied once per node from shared or network storage, checked, resumable.

A database on network storage is read from there every epoch: each page fault a round trip. Training
reads it from a local copy instead (``LMDBDataModule(local_cache_dir=...)``, or :func:`stage`):

* **Checked**: the source is hashed block by block (SHA-256 of each ``block_size`` bytes) while it is
  copied; the copy is then written to disk (``fsync``), dropped from the page cache and read back, and
  every block's digest must equal the source's. LMDB files are not byte-identical between two builds
  of the same folder, so the copy is compared with the file it was copied from, never with another build.
* **Resumable**: the copy grows in ``<name>.staging`` beside a record of the blocks done so far
  (``<name>.staging.json``, written after each block is on disk). A copy killed midway continues from
  its last complete block -- after those blocks are re-read and found equal to the record -- as long
  as the source is still the same file (size, mtime and build id).
* **Skipped when current**: a finished copy keeps its record (``<name>.staged.json``); staging again
  only compares the source's identity with it and the copy's size (no byte is read).
* **Space checked first**: a copy that cannot fit in ``local_dir``'s free space is refused before a byte is
  copied, and a disk that fills up midway ends in :class:`~lightning_lmdb.build.writer.DiskFullError`; either way
  the message names ``local_dir`` and the bytes still to copy, and the copy so far is kept for a rerun to resume.
* **Once per node**: a file lock (``<name>.staging.lock``) makes concurrent callers wait for one copy.
* **Sharded databases**: every shard file is staged as above into ``local_dir/<folder name>/``, then the
  manifest is copied last, so a copy killed midway is never a database, and resumes shard by shard.
* **Remote databases** (:func:`stage_remote`, a database published with :func:`lightning_lmdb.store.published.push`): the
  marker is read and one listing checks the parts; each part is downloaded by ranged GETs of one block each, with
  ``If-Match`` its ETag (a part replaced mid-download fails at once), and each block's SHA-256 must equal the marker's
  before it is recorded done. Resumable, space-checked, locked and skipped when current as above; the local copy is a
  normal database (a sharded one gets its manifest last).

No pickle: the records are JSON.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lightning_lmdb.build.writer import DiskFullError
from lightning_lmdb.errors import OptionError, RemoteChangedError, StagingError
from lightning_lmdb.remote import objects, urls
from lightning_lmdb.store import database, published
from lightning_lmdb.store import format as fmt

#: Bytes hashed (and recorded as done) at a time.
DEFAULT_BLOCK_SIZE = 64 << 20
_READ_SIZE = 1 << 20
_RECORD_FORMAT = 1
#: Test hook: ``LIGHTNING_LMDB_TEST_STAGE_KILL_AFTER=N`` kills the process once N blocks are recorded.
FAULT_ENV = "LIGHTNING_LMDB_TEST_STAGE_KILL_AFTER"


@dataclass
class StageReport:
    """What :func:`stage` did.

    Attributes:
        path: The local copy.
        action: ``"copied"``, ``"resumed"`` (a killed copy continued) or ``"up-to-date"`` (nothing copied).
        bytes_copied: Bytes read from the source by this call.
        seconds: Wall time of this call, the check included.
    """

    path: Path
    action: str
    bytes_copied: int
    seconds: float


@dataclass
class _Identity:
    source: str
    size: int
    mtime_ns: int
    build_id: str | None

    @classmethod
    def of(cls, source: Path) -> _Identity:
        st = source.stat()
        return cls(str(source), st.st_size, st.st_mtime_ns, database.load_meta(source).build_id)


def staged_path(source: str | os.PathLike[str], local_dir: str | os.PathLike[str]) -> Path:
    """Where :func:`stage` puts the copy of ``source``: ``local_dir/<source file name>``."""
    return Path(local_dir).expanduser() / Path(source).name


def stage(source: str | os.PathLike[str], local_dir: str | os.PathLike[str], *, block_size: int = DEFAULT_BLOCK_SIZE) -> StageReport:
    """Copy the database ``source`` to ``local_dir`` (or keep the copy already there), checked block by block.

    Args:
        source: A finished database file or sharded folder (on shared or network storage).
        local_dir: A folder on the node's local disk (created if missing).
        block_size: Bytes per hashed block (what a resumed copy redoes at most).

    Returns:
        A :class:`StageReport`; its ``path`` is the copy to read.

    Raises:
        FileNotFoundError: No database at ``source``.
        DatabaseError: ``source`` is not a finished, valid database.
        StagingError: The copy read back differently from the source (it is deleted; the message says which block).
        DiskFullError: ``local_dir`` has too little free space for the copy, or filled up during it (the copy so far
            is kept: a rerun resumes).
        ValueError: ``local_dir`` is where ``source`` already is, or ``block_size`` < 1.
    """
    started = time.perf_counter()
    source = Path(source).expanduser().absolute()
    if database.is_sharded(source):
        return _stage_sharded(source, local_dir, block_size, started)
    target = staged_path(source, local_dir)
    if block_size < 1:
        raise OptionError(f"block_size={block_size} must be >= 1 byte.")
    if target.parent.resolve() == source.parent.resolve():
        raise OptionError(f"local_dir {str(target.parent)!r} holds the database {str(source)!r} itself; stage it to another folder.")
    target.parent.mkdir(parents=True, exist_ok=True)
    with fmt.file_lock(target.with_name(target.name + ".staging.lock")):
        identity = _Identity.of(source)
        if _is_current(target, identity):
            return StageReport(target, "up-to-date", 0, time.perf_counter() - started)
        _require_space(target.parent, source.name, identity.size, _local_bytes(target, identity))
        partial, progress = _partial_files(target)
        digests = _resumable_blocks(partial, progress, identity, block_size)
        action = "resumed" if digests else "copied"
        try:
            copied = _copy(source, partial, progress, identity, block_size, digests)
            _check(partial, progress, digests, block_size, source)
            _finish(partial, target, _record(identity, block_size, digests))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            free = shutil.disk_usage(target.parent).free
            raise _disk_full(target.parent, source.name, identity.size, _local_bytes(target, identity), free, stopped=True) from exc
    return StageReport(target, action, copied, time.perf_counter() - started)


def _stage_sharded(source: Path, local_dir: str | os.PathLike[str], block_size: int, started: float) -> StageReport:
    """Stage each shard of a sharded folder, then its manifest (last); drop local shard files the manifest does not list."""
    parts = database.parts(source)  # the manifest's shards (refused, saying what to run, before it is written)
    target = staged_path(source, local_dir)
    if target.absolute() == source or target.resolve() == source.resolve():
        raise OptionError(f"local_dir {str(Path(local_dir))!r} holds the database {str(source)!r} itself; stage it to another folder.")
    target.mkdir(parents=True, exist_ok=True)
    identities = [_Identity.of(Path(part.path)) for part in parts]
    have = sum(_local_bytes(staged_path(i.source, target), i) for i in identities)
    _require_space(target, source.name, sum(i.size for i in identities), have)  # all shards up front, not shard by shard
    reports = [stage(part.path, target, block_size=block_size) for part in parts]
    wanted = {Path(part.path).name for part in parts}
    data = (source / database.MANIFEST_NAME).read_bytes()
    with fmt.file_lock(target / (database.MANIFEST_NAME + ".staging.lock")):
        for path in database.shard_files(target).values():
            if path.name not in wanted:
                path.unlink()
        copy = target / database.MANIFEST_NAME
        if not (copy.exists() and copy.read_bytes() == data):
            fmt.write_atomically(copy, data)
    database.load_meta(target)  # the copies match the manifest (counts, build ids, header digests)
    actions = {r.action for r in reports}
    action = "resumed" if "resumed" in actions else "copied" if "copied" in actions else "up-to-date"
    return StageReport(target, action, sum(r.bytes_copied for r in reports), time.perf_counter() - started)


def _partial_files(target: Path) -> tuple[Path, Path]:
    """The copy in progress (``<name>.staging``) and its record of the blocks done (``<name>.staging.json``)."""
    return target.with_name(target.name + ".staging"), target.with_name(target.name + ".staging.json")


def _done_record(target: Path) -> Path:
    """The record a finished copy keeps: the source it came from (``<name>.staged.json``)."""
    return target.with_name(target.name + ".staged.json")


def _is_current(target: Path, identity: _Identity) -> bool:
    """Whether ``target`` is a finished copy of the source ``identity`` names (no byte is read)."""
    if not target.exists() or target.stat().st_size != identity.size:
        return False
    return _read_record(_done_record(target)).get("identity") == asdict(identity)


def _local_bytes(target: Path, identity: _Identity) -> int:
    """Bytes of the source already on local disk that staging keeps: all if ``target`` is current, else the copy in progress."""
    if _is_current(target, identity):
        return identity.size
    partial = _partial_files(target)[0]
    return min(partial.stat().st_size, identity.size) if partial.exists() else 0


def _require_space(local_dir: Path, name: str, size: int, have: int) -> None:
    """Refuse, before copying, a copy of ``size`` bytes (``have`` of them already there) that ``local_dir`` has no room for."""
    free = shutil.disk_usage(local_dir).free
    if free < size - have:
        raise _disk_full(local_dir, name, size, have, free, stopped=False)


def _disk_full(local_dir: Path, name: str, size: int, have: int, free: int, *, stopped: bool) -> DiskFullError:
    """The one-line error for a ``local_dir`` too full to hold the rest of ``name``'s copy."""
    fix = "free space (or choose another local_dir) and rerun"
    if stopped:
        state, advice = "filled up", f"The copy so far and its record are kept: {fix}; staging resumes where it stopped."
    elif have:
        state, advice = "has too little free space", f"Nothing was copied now: {fix}; staging resumes from the bytes already there."
    else:
        state, advice = "has too little free space", f"Nothing was copied: {fix}."
    return DiskFullError(
        errno.ENOSPC,
        f"The disk holding local_dir {str(local_dir)!r} {state}: staging {name} needs {size - have:,} more bytes "
        f"({have:,} of {size:,} are there) and {free:,} bytes are free. {advice}",
    )


def _finish(partial: Path, target: Path, record: dict[str, Any]) -> None:
    """Replace ``target`` (an outdated copy, if any) with the checked ``partial``, its record written first.

    The record is written before the rename so that a kill or a full disk in between leaves the copy in
    progress and its record of blocks done: a rerun finds them all intact and only renames.
    """
    done = _done_record(target)
    for stale in (done, target):
        with suppress(FileNotFoundError):
            stale.unlink()
    _write_record(done, record)
    os.replace(partial, target)
    _partial_files(target)[1].unlink()
    fmt.fsync_dir(target.parent)


def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}
    return record if isinstance(record, dict) and record.get("format") == _RECORD_FORMAT else {}


def _record(identity: _Identity, block_size: int, digests: list[str]) -> dict[str, Any]:
    """A copy's record: the source it came from and the SHA-256 of each of its blocks."""
    return {"format": _RECORD_FORMAT, "identity": asdict(identity), "block_size": block_size, "blocks": digests}


def _write_record(path: Path, record: dict[str, Any]) -> None:
    fmt.write_atomically(path, json.dumps(record).encode("utf-8"))


def _resumable_blocks(partial: Path, progress: Path, identity: _Identity, block_size: int) -> list[str]:
    """The digests of the blocks a killed copy of the same source finished, re-read and found intact (else none)."""
    record = _read_record(progress)
    if record.get("identity") != asdict(identity) or record.get("block_size") != block_size or not partial.exists():
        return []
    digests = [d for d in record.get("blocks", []) if isinstance(d, str)]
    good = []
    with open(partial, "rb") as handle:
        for digest in digests:
            block = _hash_block(handle, block_size)
            if block is None or block[0] != digest:
                break
            good.append(digest)
    return good


def _hash_block(handle: Any, block_size: int, copy_to: Any = None) -> tuple[str, int] | None:
    """(SHA-256 hex, bytes) of the next ``block_size`` bytes of ``handle`` (fewer at the end; ``None`` at end of file).

    With ``copy_to`` (a binary file), the bytes are also written there.
    """
    digest, left = hashlib.sha256(), block_size
    while left:
        data = handle.read(min(_READ_SIZE, left))
        if not data:
            break
        digest.update(data)
        if copy_to is not None:
            copy_to.write(data)
        left -= len(data)
    return None if left == block_size else (digest.hexdigest(), block_size - left)


def _copy(source: Path, partial: Path, progress: Path, identity: _Identity, block_size: int, digests: list[str]) -> int:
    """Append the source's blocks after the ``digests`` already done to ``partial``, recording each; return the bytes copied."""
    start = min(len(digests) * block_size, identity.size)  # the last block may be short: never pad the copy
    kill_after = int(os.environ.get(FAULT_ENV, "0") or 0)
    copied = 0
    with open(source, "rb") as src, open(partial, "r+b" if partial.exists() else "wb") as dst:
        src.seek(start)
        dst.seek(start)
        dst.truncate(start)
        while (block := _hash_block(src, block_size, copy_to=dst)) is not None:
            copied += block[1]
            dst.flush()
            os.fsync(dst.fileno())
            digests.append(block[0])
            _write_record(progress, _record(identity, block_size, digests))
            if kill_after and len(digests) >= kill_after:
                os._exit(17)
    now = source.stat()
    if (now.st_size, now.st_mtime_ns) != (identity.size, identity.mtime_ns):
        partial.unlink()
        progress.unlink()
        raise StagingError(f"{str(source)!r} changed while it was staged; stage it again (a rebuild replaces the file).")
    return copied


def _check(partial: Path, progress: Path, digests: list[str], block_size: int, source: Path) -> None:
    """Read the copy back from the disk (its pages dropped first) and compare every block with the source's digest."""
    index = 0
    with open(partial, "rb") as handle:
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        while index < len(digests):
            block = _hash_block(handle, block_size)
            if block is None or block[0] != digests[index]:
                break
            index += 1
        else:
            if handle.read(1) == b"":
                return
    partial.unlink()
    progress.unlink(missing_ok=True)
    raise StagingError(
        f"The staged copy {str(partial)!r} of {str(source)!r} read back differently from the source at block {index} "
        f"(bytes {index * block_size}-{(index + 1) * block_size - 1}); it was deleted. Check the local disk "
        "(dmesg, smartctl) and stage again."
    )


# --- remote databases ----------------------------------------------------------------------------------------------------

#: Test hook: ``LIGHTNING_LMDB_TEST_STAGE_REMOTE_KILL_AFTER=N`` kills the process once N downloaded blocks are recorded.
REMOTE_FAULT_ENV = "LIGHTNING_LMDB_TEST_STAGE_REMOTE_KILL_AFTER"
#: Blocks fetched at once (ranged GETs in flight; their bytes are held in memory until written, in order).
FETCH_BLOCKS = 4


@dataclass
class _RemoteIdentity:
    source: str
    size: int
    etag: str
    build_id: str


def remote_staged_path(url: str, local_dir: str | os.PathLike[str], name: str | None = None) -> Path:
    """Where :func:`stage_remote` puts the copy of the remote database ``url``: ``local_dir/<name>``, by default
    ``local_dir/<last part of the URL>``."""
    return Path(local_dir).expanduser() / (name or urls.name(url))


def stage_remote(url: str, local_dir: str | os.PathLike[str], *, name: str | None = None, progress: bool = False) -> StageReport:
    """Download the published database ``url`` to ``local_dir`` (or keep the copy already there), checked block by block.

    Args:
        url: A database published with :func:`lightning_lmdb.store.published.push` (``s3://bucket/train.lmdb``).
        local_dir: A folder on the node's local disk (created if missing).
        name: The copy's name in ``local_dir`` (default: the URL's last part, ``train.lmdb``).
        progress: Print the bytes downloaded (of the database's) and the rate, at most every 2 s (stderr).

    Returns:
        A :class:`StageReport` (``bytes_copied``: the bytes downloaded); its ``path`` is the copy to read.

    Raises:
        RemoteIncompleteError: No marker, or a part missing or different: the upload did not finish.
        RemoteChangedError: A part was replaced during the download (rerun).
        StagingError: A block did not match the marker's digest (it is not recorded; the message names it).
        DiskFullError: ``local_dir`` has too little free space, or filled up (the copy so far is kept: a rerun resumes).
    """
    started = time.perf_counter()
    marker = published.open_published(url.rstrip("/"))
    target = remote_staged_path(marker.url, local_dir, name)
    total = sum(part.size for part in marker.parts)
    if marker.layout == "file":
        part = marker.parts[0]
        target.parent.mkdir(parents=True, exist_ok=True)
        identity = _remote_identity(marker, part)
        have = _local_bytes(target, identity)
        _require_space(target.parent, target.name, part.size, have)
        meter = published.ByteMeter(total, progress, f"pull {urls.redact(marker.url)}", "downloaded", have)
        copied, action = _stage_remote_file(marker, part, target, meter.add)
        return StageReport(target, action, copied, time.perf_counter() - started)
    target.mkdir(parents=True, exist_ok=True)
    shards = [part for part in marker.parts if part.path != database.MANIFEST_NAME]
    manifests = [part for part in marker.parts if part.path == database.MANIFEST_NAME]
    if len(manifests) != 1:
        raise published.incomplete_error(marker.url, "a sharded database without one manifest part")
    have = sum(_local_bytes(target / part.path, _remote_identity(marker, part)) for part in shards)
    _require_space(target, target.name, sum(part.size for part in shards), have)
    meter = published.ByteMeter(total, progress, f"pull {urls.redact(marker.url)}", "downloaded", have)
    copied, actions = 0, set()
    for part in shards:
        done, action = _stage_remote_file(marker, part, target / part.path, meter.add)
        copied += done
        actions.add(action)
    manifest = manifests[0]
    with fmt.file_lock(target / (database.MANIFEST_NAME + ".staging.lock")):
        wanted = {part.path for part in shards}
        for path in database.shard_files(target).values():
            if path.name not in wanted:
                path.unlink()
        copy = target / database.MANIFEST_NAME
        if not (copy.exists() and [hashlib.sha256(copy.read_bytes()).hexdigest()] == list(manifest.blocks)):
            data = objects.read(marker.part_url(manifest), etag=manifest.etag)
            if [hashlib.sha256(data).hexdigest()] != list(manifest.blocks) or len(data) != manifest.size:
                raise _block_mismatch(marker, manifest, 0)
            fmt.write_atomically(copy, data)
            copied += len(data)
            actions.add("copied")
    database.load_meta(target)  # the copies match the manifest (counts, build ids, header digests)
    action = "resumed" if "resumed" in actions else "copied" if "copied" in actions else "up-to-date"
    return StageReport(target, action, copied, time.perf_counter() - started)


def _remote_identity(marker: published.Marker, part: published.PublishedPart) -> _RemoteIdentity:
    return _RemoteIdentity(urls.redact(marker.part_url(part)), part.size, part.etag, marker.build_id)


def _stage_remote_file(marker: published.Marker, part: published.PublishedPart, target: Path,
                       on_block: Callable[[int], None]) -> tuple[int, str]:
    """Download one part to ``target`` (resuming, checking each block, ``on_block(bytes)`` after each);
    ``(bytes downloaded, action)``."""
    identity = _remote_identity(marker, part)
    with fmt.file_lock(target.with_name(target.name + ".staging.lock")):
        if _is_current(target, identity):
            return 0, "up-to-date"
        partial, progress = _partial_files(target)
        digests = _resumable_blocks(partial, progress, identity, part.block_size)  # type: ignore[arg-type]
        digests = [d for d, want in zip(digests, part.blocks, strict=False) if d == want]  # a prefix the marker agrees with
        action = "resumed" if digests else "copied"
        try:
            copied = _download(marker, part, partial, progress, identity, digests, on_block)
            _check(partial, progress, digests, part.block_size, urls.redact(marker.part_url(part)))  # type: ignore[arg-type]
            _finish(partial, target, _record(identity, part.block_size, digests))  # type: ignore[arg-type]
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            free = shutil.disk_usage(target.parent).free
            raise _disk_full(target.parent, target.name, part.size, _local_bytes(target, identity), free, stopped=True) from exc
    return copied, action


def _download(marker: published.Marker, part: published.PublishedPart, partial: Path, progress: Path, identity: _RemoteIdentity,
              digests: list[str], on_block: Callable[[int], None]) -> int:
    """Append the part's blocks after the ``digests`` already done to ``partial``, each checked and recorded; the bytes fetched."""
    start = min(len(digests) * part.block_size, part.size)
    kill_after = int(os.environ.get(REMOTE_FAULT_ENV, "0") or 0)
    source = marker.part_url(part)
    copied = 0
    with open(partial, "r+b" if partial.exists() else "wb") as dst:
        dst.seek(start)
        dst.truncate(start)
        for first_index in range(len(digests), len(part.blocks), FETCH_BLOCKS):
            indices = range(first_index, min(first_index + FETCH_BLOCKS, len(part.blocks)))
            requests = [(source, part.etag, i * part.block_size, min(part.size, (i + 1) * part.block_size)) for i in indices]
            try:
                fetched = objects.read_many(requests, concurrency=FETCH_BLOCKS)
            except RemoteChangedError as exc:
                raise RemoteChangedError(f"{urls.redact(source)} was replaced during the download (its ETag is no longer "
                                         f"{part.etag}: pushed again?). Rerun: the download starts over from the new "
                                         "marker.") from exc
            for index, data in zip(indices, fetched, strict=True):
                copied += len(data)
                if hashlib.sha256(data).hexdigest() != part.blocks[index]:
                    raise _block_mismatch(marker, part, index)
                dst.write(data)
                dst.flush()
                os.fsync(dst.fileno())
                digests.append(part.blocks[index])
                _write_record(progress, _record(identity, part.block_size, digests))  # type: ignore[arg-type]
                on_block(len(data))
                if kill_after and _count_downloaded() >= kill_after:
                    os._exit(17)
    return copied


_downloaded = [0]


def _count_downloaded() -> int:
    _downloaded[0] += 1
    return _downloaded[0]


def _block_mismatch(marker: published.Marker, part: published.PublishedPart, index: int) -> StagingError:
    return StagingError(
        f"Block {index} (bytes {index * part.block_size}-{min(part.size, (index + 1) * part.block_size) - 1}) of "
        f"{urls.redact(marker.part_url(part))} does not match the SHA-256 its marker records: the object is damaged or was "
        f"replaced. It was not kept; push the database again (lightning-lmdb push DB {urls.redact(marker.url)}) and rerun."
    )
