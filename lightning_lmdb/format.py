"""The on-disk contract of a lightning_lmdb database.

Layout (format version 1)
-------------------------

A database is **one LMDB file** (``subdir=False``), e.g. ``train.lmdb``. Readers open it read-only
with ``lock=False``, so no lock file is needed beside it and a read-only filesystem works.

* Named sub-database ``records``: one record per image, keyed by its index in scan order as ten
  ASCII digits (``b"0000000042"``), written with ``append=True``. File names never touch a key.

  - ``storage="encoded"``: the value is the source file's bytes, untouched.
  - ``storage="decoded"``: the value is a 12-byte header (``<III``: height, width, channels) followed
    by RGB ``uint8`` pixels in row-major ``H x W x C`` order.

* Key ``meta`` of the main database: UTF-8 JSON (never pickle) with

  ``format`` (``"lightning_lmdb"``), ``version``, ``count``, ``storage``, ``classes``,
  ``class_to_idx``, ``targets`` (``-1`` for unlabelled images), ``paths`` (relative source path of
  each record), ``checksum`` (algorithm name) and ``checksums`` (one hex digest per record value),
  ``source`` (``root``, ``num_files``, ``bytes``, ``fingerprint`` over paths, targets, sizes and
  mtimes), ``options`` (the build options that shape the contents), ``skipped`` (list of
  ``{"path", "reason"}``), ``created``, ``library_version`` and ``build_id`` (a random identity of
  this build; absent in databases built before it existed). Readers validate every field's presence
  and type once at open (:class:`Metadata`): a missing field or a wrong type is a
  :class:`DatabaseError` naming the field.

* Key ``build-id`` of the main database: the same build id as ASCII, so a DataLoader worker can check
  that the file it opens is the build its dataset was created on without parsing ``meta``.

  ``meta`` and ``build-id`` are written in the same final transaction that completes the build: a
  file with no ``meta`` key is not a finished database.

* Key ``progress`` of the main database exists only while building: JSON with the number of source
  files consumed, a fingerprint of that prefix of the scan, the options and the files skipped so far.
  A rerun after a crash resumes from it. The named sub-database ``checksums`` (record key to hex
  digest, computed by the reader processes) also exists only while building; its digests move into
  ``meta``.

Files beside the target ``X.lmdb`` while building: ``X.lmdb.partial`` (the database being built, renamed
onto ``X.lmdb`` when complete), ``X.lmdb.partial-lock`` (LMDB's writer lock) and ``X.lmdb.build-lock``
(the lock that makes concurrent builders produce one build).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import struct
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

FORMAT_NAME = "lightning_lmdb"
FORMAT_VERSION = 1
RECORDS_DB = b"records"
META_KEY = b"meta"
BUILD_ID_KEY = b"build-id"
PROGRESS_KEY = b"progress"
CHECKSUMS_DB = b"checksums"
KEY_WIDTH = 10
CHECKSUM_ALGO = "blake2b-64"
STORAGES = ("encoded", "decoded")
_PIXEL_HEADER = struct.Struct("<III")


class DatabaseError(RuntimeError):
    """A file is not a usable lightning_lmdb database: incomplete, foreign, too new or damaged."""


def record_key(index: int) -> bytes:
    """The key of record ``index``: fixed-width ASCII digits, so byte order equals index order."""
    return b"%0*d" % (KEY_WIDTH, index)


def checksum(value: bytes | memoryview) -> str:
    """Hex digest stored per record in the metadata."""
    return hashlib.blake2b(value, digest_size=8).hexdigest()


def encode_pixels(pixels: np.ndarray) -> bytes:
    """Serialise an ``H x W x C`` ``uint8`` array as a ``decoded`` record value."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3:
        raise ValueError(f"Expected an H x W x C uint8 array, got shape {pixels.shape} dtype {pixels.dtype}.")
    height, width, channels = pixels.shape
    return _PIXEL_HEADER.pack(height, width, channels) + np.ascontiguousarray(pixels).tobytes()


def decode_pixels(value: bytes | memoryview) -> np.ndarray:
    """Parse a ``decoded`` record value into an ``H x W x C`` ``uint8`` array (a copy)."""
    height, width, channels = _PIXEL_HEADER.unpack_from(value)
    expected = _PIXEL_HEADER.size + height * width * channels
    if len(value) != expected:
        raise DatabaseError(f"Decoded record holds {len(value)} bytes, its header promises {expected}: the database is damaged.")
    return np.frombuffer(value, dtype=np.uint8, offset=_PIXEL_HEADER.size).reshape(height, width, channels).copy()


def partial_path(target: Path) -> Path:
    """Where the database is built before it is renamed onto ``target``."""
    return target.with_name(target.name + ".partial")


def build_lock_path(target: Path) -> Path:
    """The file locked by a builder of ``target``."""
    return target.with_name(target.name + ".build-lock")


def open_env(path: str | os.PathLike[str], *, readahead: bool = True, validate_meta: bool = True) -> lmdb.Environment:
    """Open a finished database read-only after checking it is whole and ours (a private environment).

    Most callers want :func:`shared` instead: py-lmdb refuses a second environment on a file this process
    already has open. This is for callers that need an environment of their own (e.g. to choose
    ``readahead``) and have closed this process's shared one first (:func:`close`).

    Args:
        path: The database file.
        readahead: Let the OS read ahead on page faults (see ``dataset.py`` for when to turn it off).
        validate_meta: Parse and check the metadata; ``False`` keeps only the cheap checks.

    Returns:
        An open read-only environment with no lock file (``lock=False``).

    Raises:
        FileNotFoundError: No database at ``path``.
        DatabaseError: Incomplete, foreign, newer-format, truncated or damaged database.
    """
    path = Path(path)
    if not path.exists():
        if partial_path(path).exists():
            raise DatabaseError(
                f"{str(path)!r} is an incomplete build ({partial_path(path).name} exists beside it). "
                "Run the build again: it resumes where it stopped."
            )
        raise FileNotFoundError(f"No database at {str(path)!r}. Build it first: lightning-lmdb build SOURCE {path}")
    if path.is_dir():
        raise DatabaseError(
            f"{str(path)!r} is a folder, not a lightning_lmdb database file (a directory-style LMDB is not ours). "
            "Build one with: lightning-lmdb build SOURCE TARGET.lmdb"
        )
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, subdir=False, max_dbs=2, readahead=readahead)
    except lmdb.Error as exc:
        if "already open" in str(exc):
            raise DatabaseError(
                f"{str(path)!r} is already open in this process; use lightning_lmdb.format.shared() or close() it first."
            ) from exc
        raise DatabaseError(f"{str(path)!r} is not an LMDB file ({exc}). Point at a file made by lightning-lmdb build.") from exc
    try:
        _check_not_truncated(env, path)
        if validate_meta:
            read_meta(env, path)
    except BaseException:
        env.close()
        raise
    return env


def _check_not_truncated(env: lmdb.Environment, path: Path) -> None:
    # A truncated data file kills readers with SIGBUS on the first touch of a missing page.
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    actual = path.stat().st_size
    if needed > actual:
        raise DatabaseError(
            f"{str(path)!r} is truncated: it holds {actual} bytes but its pages need {needed} "
            "(an interrupted copy or a full disk). Copy it again or rebuild it."
        )


# --- one environment per database file per process ------------------------------------------------


@dataclass
class Opened:
    """This process's read-only environment on one database file.

    Attributes:
        path: The absolute path it was opened at.
        env: The environment.
        records: The ``records`` sub-database.
        identity: The file's :func:`_identity` when opened (a rebuild renames a new file in place; a copy
            over it rewrites the same inode, changing its size or ctime).
        build_id: The build's identity (see :func:`read_build_id`).
    """

    path: str
    env: lmdb.Environment
    records: Any
    identity: tuple[int, ...]
    build_id: str


_OPEN: dict[str, Opened] = {}
_OPEN_LOCK = threading.RLock()


def shared(path: str | os.PathLike[str], *, readahead: bool = True, fresh: bool = True) -> Opened:
    """This process's environment on ``path``, opened and checked once and shared by every caller.

    py-lmdb >= 2.0 refuses to open a file twice in one process, so every reader of a database --
    datasets, ``verify``, ``info``, the builder's up-to-date check -- goes through here. All of them
    are closed right before any ``fork`` (a child never inherits one) and reopen lazily.

    Args:
        path: The database file.
        readahead: Used when this call opens the environment (the first opener chooses).
        fresh: Check (one ``stat``) that the file at ``path`` is still the one opened; if it was
            replaced (a rebuild) or rewritten (a copy over it), close the old environment and open the file. Datasets pass
            ``False`` on their per-sample path and compare build ids instead.

    Raises:
        FileNotFoundError: No database at ``path``.
        DatabaseError: Incomplete, foreign, newer-format, truncated or damaged database.
    """
    key = os.path.abspath(path)
    opened = _OPEN.get(key)
    if opened is not None and not fresh:
        return opened
    with _OPEN_LOCK:
        opened = _OPEN.get(key)
        if opened is not None and fresh:
            try:
                current = _identity(os.stat(key)) == opened.identity
            except OSError:
                current = False
            if not current:
                close(key)
                opened = None
        if opened is None:
            env = open_env(key, readahead=readahead, validate_meta=False)
            try:
                st = os.stat(key)
                records = env.open_db(RECORDS_DB, create=False)
                opened = Opened(key, env, records, _identity(st), read_build_id(env, key))
            except lmdb.Error as exc:
                env.close()
                raise DatabaseError(f"{key!r} has no records table ({exc}): not a lightning_lmdb database or damaged; rebuild it.") from exc
            except BaseException:
                env.close()
                raise
            _OPEN[key] = opened
        return opened


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """Which file, in which state: device and inode (a rebuild renames a new file onto the path) plus size and
    ctime (a copy over the path rewrites the same inode; any write changes its ctime, which no tool can set back)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns


def close(path: str | os.PathLike[str]) -> None:
    """Close this process's environment on ``path`` if one is open (it reopens lazily when needed)."""
    with _OPEN_LOCK:
        opened = _OPEN.pop(os.path.abspath(path), None)
        if opened is not None:
            opened.env.close()


def close_all() -> None:
    """Close every database environment this process opened (they reopen lazily on the next read)."""
    with _OPEN_LOCK:
        while _OPEN:
            _, opened = _OPEN.popitem()
            opened.env.close()


def open_paths() -> list[str]:
    """Paths of the database environments open in this process."""
    return list(_OPEN)


os.register_at_fork(before=close_all)


@contextlib.contextmanager
def reading(path: str | os.PathLike[str]) -> Iterator[Opened]:
    """This process's environment on ``path`` for the ``with`` block; closed after it unless it was open before."""
    was_open = os.path.abspath(path) in _OPEN
    opened = shared(path)
    try:
        yield opened
    finally:
        if not was_open:
            close(path)


def read_build_id(env: lmdb.Environment, path: str | os.PathLike[str] = "<database>") -> str:
    """The identity of a finished build: the ``build-id`` key, or (older builds) a digest of the metadata bytes."""
    with env.begin(buffers=True) as txn:
        value = txn.get(BUILD_ID_KEY)
        if value is not None:
            return bytes(value).decode("ascii", "replace")
        raw = txn.get(META_KEY)
        if raw is None:
            _raise_no_meta(txn, path)
        return "meta:" + hashlib.blake2b(raw, digest_size=16).hexdigest()


def load_meta(path: str | os.PathLike[str]) -> Metadata:
    """Check a database file and return its validated metadata (reusing this process's environment on it).

    Raises:
        FileNotFoundError: No database at ``path``.
        DatabaseError: Incomplete, foreign, newer-format, truncated or damaged database.
    """
    with reading(path) as opened:
        return read_meta(opened.env, path)


def _raise_no_meta(txn: lmdb.Transaction, path: str | os.PathLike[str]) -> None:
    if txn.get(PROGRESS_KEY) is not None:
        raise DatabaseError(f"{str(path)!r} is an unfinished build. Run the build again: it resumes where it stopped.")
    raise DatabaseError(f"{str(path)!r} is an LMDB file but not a lightning_lmdb database (no metadata). Build one with lightning-lmdb build.")


def read_meta(env: lmdb.Environment, path: str | os.PathLike[str] = "<database>") -> Metadata:
    """Read and validate the metadata of an open database.

    Raises:
        DatabaseError: No metadata (incomplete or foreign), unreadable JSON, a newer format version,
            or a field missing or of the wrong type (named in the message).
    """
    with env.begin() as txn:
        raw = txn.get(META_KEY)
        if raw is None:
            _raise_no_meta(txn, path)
    try:
        obj = json.loads(bytes(raw).decode("utf-8"))
    except ValueError as exc:
        raise DatabaseError(f"Metadata of {str(path)!r} is not valid JSON ({exc}): the database is damaged; rebuild it.") from exc
    return Metadata.from_json(obj, path)


# --- the metadata, as a type ------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceInfo:
    """What the database was built from.

    Attributes:
        root: The source folder.
        num_files: Image files scanned (records plus skipped files).
        bytes: Their total size.
        fingerprint: Digest of paths, targets, sizes and mtimes (see ``folder.SourceScan.fingerprint``).
    """

    root: str
    num_files: int
    bytes: int
    fingerprint: str


@dataclass(frozen=True)
class Skipped:
    """A source file left out of the database, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class Metadata:
    """The validated metadata of a finished database (see the module docstring for the layout).

    Build it with :meth:`from_json` (validates every field once) and read it by attribute.
    """

    version: int
    count: int
    storage: str
    classes: list[str]
    class_to_idx: dict[str, int]
    targets: list[int]
    paths: list[str]
    checksum: str
    checksums: list[str]
    source: SourceInfo
    options: dict[str, Any]
    skipped: list[Skipped]
    created: str
    library_version: str
    build_id: str | None = None

    @classmethod
    def from_json(cls, obj: Any, path: str | os.PathLike[str] = "<database>") -> Metadata:
        """Validate parsed metadata JSON.

        Raises:
            DatabaseError: Not ours, a newer version, or a field missing or of the wrong type (named).
        """
        if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
            raise DatabaseError(f"{str(path)!r} is an LMDB file but not a lightning_lmdb database. Build one with lightning-lmdb build.")
        version = obj.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
            raise DatabaseError(
                f"{str(path)!r} has format version {version!r}; this lightning_lmdb reads up to {FORMAT_VERSION}. "
                "Upgrade lightning_lmdb or rebuild the database with this version."
            )
        get = _Fields(obj, path)
        count = get("count", int)
        storage = get("storage", str)
        if storage not in STORAGES:
            get.fail("storage", f"is {storage!r}, not one of {STORAGES}")
        source = _Fields(get("source", dict), path, "source.")
        skipped = []
        for i, item in enumerate(get("skipped", list)):
            entry = _Fields(item if isinstance(item, dict) else get.fail(f"skipped[{i}]", "is not an object"), path, f"skipped[{i}].")
            skipped.append(Skipped(entry("path", str), entry("reason", str)))
        meta = cls(
            version=version,
            count=count,
            storage=storage,
            classes=get.list_of("classes", str),
            class_to_idx=get.dict_of("class_to_idx", int),
            targets=get.list_of("targets", int, length=count),
            paths=get.list_of("paths", str, length=count),
            checksum=get("checksum", str),
            checksums=get.list_of("checksums", str, length=count),
            source=SourceInfo(source("root", str), source("num_files", int), source("bytes", int), source("fingerprint", str)),
            options=get("options", dict),
            skipped=skipped,
            created=get("created", str),
            library_version=get("library_version", str),
            build_id=get("build_id", str) if "build_id" in obj else None,
        )
        if count < 0:
            get.fail("count", f"is {count}")
        return meta

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored under ``meta``."""
        obj = {"format": FORMAT_NAME, **dataclasses.asdict(self)}
        if obj["build_id"] is None:
            del obj["build_id"]
        return obj


class _Fields:
    """Typed access to one JSON object's fields; a missing field or wrong type is a ``DatabaseError`` naming it."""

    def __init__(self, obj: dict[str, Any], path: str | os.PathLike[str], prefix: str = ""):
        self.obj, self.path, self.prefix = obj, path, prefix

    def fail(self, name: str, problem: str) -> Any:
        raise DatabaseError(
            f"Metadata of {str(self.path)!r}: field {self.prefix}{name!r} {problem}. The database is damaged or was "
            "written by another tool; rebuild it with lightning-lmdb build."
        )

    def __call__(self, name: str, kind: type) -> Any:
        if name not in self.obj:
            self.fail(name, "is missing")
        value = self.obj[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.fail(name, f"should be {_JSON_NAMES[kind]}, not {type(value).__name__} ({_short(value)})")
        return value

    def list_of(self, name: str, kind: type, length: int | None = None) -> list[Any]:
        value = self(name, list)
        for i, item in enumerate(value):
            if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
                self.fail(f"{name}[{i}]", f"should be {_JSON_NAMES[kind]}, not {type(item).__name__} ({_short(item)})")
        if length is not None and len(value) != length:
            self.fail(name, f"holds {len(value)} entries, but count is {length}")
        return value

    def dict_of(self, name: str, kind: type) -> dict[str, Any]:
        value = self(name, dict)
        for key, item in value.items():
            if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
                self.fail(f"{name}[{key!r}]", f"should be {_JSON_NAMES[kind]}, not {type(item).__name__} ({_short(item)})")
        return value


_JSON_NAMES = {int: "an integer", str: "a string", list: "a list", dict: "an object"}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def new_build_id() -> str:
    """A fresh random build identity (written with the metadata of every finished build)."""
    return uuid.uuid4().hex


def dump_json(obj: Any) -> bytes:
    """Serialise metadata: compact JSON (ASCII-escaped, so even undecodable file names round-trip)."""
    return json.dumps(obj, separators=(",", ":")).encode("ascii")
