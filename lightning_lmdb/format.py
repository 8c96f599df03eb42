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
  ``{"path", "reason"}``), ``created`` and ``library_version``.

  ``meta`` is written in the same final transaction that completes the build: a file with no
  ``meta`` key is not a finished database.

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

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

FORMAT_NAME = "lightning_lmdb"
FORMAT_VERSION = 1
RECORDS_DB = b"records"
META_KEY = b"meta"
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
    """Open a finished database read-only after checking it is whole and ours.

    Args:
        path: The database file.
        readahead: Let the OS read ahead on page faults (see ``dataset.py`` for when to turn it off).
        validate_meta: Parse and check the metadata; ``False`` skips that (large) parse when the caller
            already validated this file, keeping only the cheap truncation check.

    Returns:
        An open read-only environment with no lock file (``lock=False``).

    Raises:
        FileNotFoundError: No database at ``path``.
        DatabaseError: Incomplete, foreign, newer-format or truncated database.
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


def load_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check a database file (as :func:`open_env`) and return its metadata, parsed once; nothing stays open.

    Raises:
        FileNotFoundError: No database at ``path``.
        DatabaseError: Incomplete, foreign, newer-format or truncated database.
    """
    env = open_env(path, validate_meta=False)
    try:
        return read_meta(env, path)
    finally:
        env.close()


def read_meta(env: lmdb.Environment, path: str | os.PathLike[str] = "<database>") -> dict[str, Any]:
    """Read and validate the metadata of an open database.

    Raises:
        DatabaseError: No metadata (incomplete or foreign), unreadable JSON, or a newer format version.
    """
    with env.begin() as txn:
        raw = txn.get(META_KEY)
        building = txn.get(PROGRESS_KEY) is not None
    if raw is None:
        if building:
            raise DatabaseError(f"{str(path)!r} is an unfinished build. Run the build again: it resumes where it stopped.")
        raise DatabaseError(f"{str(path)!r} is an LMDB file but not a lightning_lmdb database (no metadata). Build one with lightning-lmdb build.")
    try:
        meta = json.loads(bytes(raw).decode("utf-8"))
    except ValueError as exc:
        raise DatabaseError(f"Metadata of {str(path)!r} is not valid JSON ({exc}): the database is damaged; rebuild it.") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise DatabaseError(f"{str(path)!r} is an LMDB file but not a lightning_lmdb database. Build one with lightning-lmdb build.")
    version = meta.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise DatabaseError(
            f"{str(path)!r} has format version {version!r}; this lightning_lmdb reads up to {FORMAT_VERSION}. "
            "Upgrade lightning_lmdb or rebuild the database with this version."
        )
    return meta


def dump_json(obj: Any) -> bytes:
    """Serialise metadata: compact JSON (ASCII-escaped, so even undecodable file names round-trip)."""
    return json.dumps(obj, separators=(",", ":")).encode("ascii")
