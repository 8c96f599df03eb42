"""File-system pieces of building and staging: the files a build makes beside its target, durable writes, a file lock.

A build of ``X.lmdb`` works in ``X.lmdb.partial`` (:func:`partial_path`, renamed onto ``X.lmdb`` when
complete), beside LMDB's lock file of it ``X.lmdb.partial-lock`` (:func:`partial_lock_path`) and the lock
that makes concurrent builders produce one build, ``X.lmdb.build-lock`` (:func:`build_lock_path`); see
"While building" in :mod:`lightning_lmdb.store.format`. :func:`fsync_dir` and :func:`write_atomically` make
renames and small files durable; :func:`file_lock` is the cross-process (and, through NFS, cross-node) lock.
All are re-exported by :mod:`lightning_lmdb.store.format`, where callers find them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path


def partial_path(target: Path) -> Path:
    """Where the database is built before it is renamed onto ``target``."""
    return target.with_name(target.name + ".partial")


def build_lock_path(target: Path) -> Path:
    """The file locked by a builder of ``target``."""
    return target.with_name(target.name + ".build-lock")


def partial_lock_path(target: Path) -> Path:
    """LMDB's lock file of the database being built (``lock=True`` on the ``.partial`` file)."""
    return target.with_name(partial_path(target).name + "-lock")


def build_files(target: Path) -> tuple[Path, ...]:
    """The files a build of ``target`` makes beside it on its way: the lock files first, then the ``.partial`` file."""
    return build_lock_path(target), partial_lock_path(target), partial_path(target)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or a new file in the folder ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once (a temp file beside it, fsynced, renamed, the folder fsynced)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str], *, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the file ``path`` for the ``with`` block, waiting for it as long as it takes.

    The lock works across processes and, through NFS locks, across nodes. The lock file is created if
    missing and left in place (deleting it would let a waiter lock a file no newcomer sees).

    Args:
        path: The lock file.
        on_wait: Called once, before waiting, when another holder has the lock (e.g. to say why we wait).

    Yields:
        Nothing; the lock is held until the block exits.
    """
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
