"""Opening databases: one read-only environment per database file per process.

py-lmdb >= 2.0 refuses to open a file twice in one process (the guard is keyed by the file's inode and
is inherited by forked DataLoader workers), and ``Environment`` objects cannot be pickled. So every
reader of a database -- datasets, ``verify``, ``info``, ``bench``, the builder's up-to-date check --
goes through :func:`shared`: the environment is opened lazily, checked once (exists, is an LMDB file,
is not truncated, has a build id), shared by every caller in the process, and closed right before any
``fork`` so a child never inherits one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from lightning_lmdb.store.format import (
    BUILD_ID_KEY,
    META_KEY,
    RECORDS_DB,
    DatabaseError,
    partial_path,
    raise_no_meta,
    read_meta,
)


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
                f"{str(path)!r} is already open in this process; use lightning_lmdb.store.envs.shared() or close() it first."
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


def damaged(file: str | os.PathLike[str], exc: lmdb.Error, database: str | os.PathLike[str] | None = None) -> DatabaseError:
    """The error for an LMDB failure while reading ``file`` (a damaged page: ``lmdb.CorruptedError``, ``PageNotFoundError``, ...).

    Raise it ``from exc``. It names the file, LMDB's own message and the fix.

    Args:
        file: The database file that failed.
        exc: LMDB's error.
        database: The database ``file`` belongs to (a sharded folder), when not ``file`` itself.
    """
    database = file if database is None else database
    which = repr(str(file)) if str(file) == str(database) else f"{str(file)!r} (a shard of {str(database)!r})"
    return DatabaseError(
        f"{which} is damaged: LMDB failed reading it ({type(exc).__name__}: {exc}). Check it with "
        f"`lightning-lmdb verify {shlex.quote(str(database))}`, then rebuild it or copy it again."
    )


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
            raise_no_meta(txn, path)
        return "meta:" + hashlib.blake2b(raw, digest_size=16).hexdigest()
