"""Sources: what a database is built from, scanned through one entry point, :func:`scan_source`.

Every consumer (the builder, the raw datasets, the DataModule's backends, ``verify``) calls
:func:`scan_source` and reads the :class:`SourceScan` it returns: the classes, and per sample a file
path, a path relative to the source's root, a target, a size and a modification time.

**Adding a source kind** is one module plus one line here: the module defines

* ``accepts(path) -> bool``: is this path of my kind (cheap: no scan);
* ``scan(path) -> SourceScan``: the full scan (the builder and the raw datasets);
* ``has_samples(path) -> bool``: a cheap check that it lists at least one image (``LMDBDataModule``
  refuses an empty source at construction, before any build);
* ``classes(path) -> (classes, class_to_idx)``: the classes, as cheaply as the kind allows
  (``LMDBDataModule.num_classes`` before ``setup``);

and its name goes in :data:`SOURCE_KINDS`, tried in order. Today there is one kind,
:mod:`lightning_lmdb.folder` (an ImageFolder-layout or flat folder).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from lightning_lmdb.errors import NotRegularFileError

#: Target given to every sample of a source without labels (e.g. a flat folder).
NO_TARGET = -1
#: The modules of the source kinds, tried in order by :func:`scan_source` (each defines ``accepts`` and ``scan``).
SOURCE_KINDS: tuple[str, ...] = ("lightning_lmdb.folder",)


def kind_of(source: str | os.PathLike[str]) -> ModuleType | None:
    """The module of the first source kind of :data:`SOURCE_KINDS` that accepts ``source``; ``None`` if none does."""
    path = Path(source).expanduser()
    return next((kind for kind in map(importlib.import_module, SOURCE_KINDS) if kind.accepts(path)), None)


def scan_source(source: str | os.PathLike[str]) -> SourceScan:
    """Scan ``source`` with the first source kind of :data:`SOURCE_KINDS` that accepts it.

    Raises:
        FileNotFoundError: ``source`` is of no known kind (it does not exist, or is not a folder).
        SourceError: ``source`` holds no images (the kind's own message).
    """
    kind = kind_of(source)
    if kind is None:
        raise FileNotFoundError(f"Source folder {str(source)!r} does not exist or is not a folder. Pass the folder that holds your images.")
    return kind.scan(source)


@dataclass(frozen=True)
class SourceFile:
    """One image file of a scanned source.

    Attributes:
        path: Absolute path of the file.
        relpath: Path relative to the source root, with ``/`` separators.
        target: Class index, or ``NO_TARGET`` for a source without labels.
        size: File size in bytes at scan time.
        mtime_ns: Modification time in nanoseconds at scan time.
    """

    path: str
    relpath: str
    target: int
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class SourceScan:
    """The result of scanning a source.

    Attributes:
        root: The resolved source (the folder the relative paths are relative to).
        classes: Class names in index order (empty without labels).
        class_to_idx: Class name to index.
        files: Samples in the source's order (ImageFolder order for a folder).
        special: ``(relpath, reason)`` of entries named like images that are not regular files.
    """

    root: Path
    classes: list[str]
    class_to_idx: dict[str, int]
    files: list[SourceFile]
    special: list[tuple[str, str]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        """Sum of the file sizes."""
        return sum(f.size for f in self.files)

    def fingerprint(self, stop: int | None = None) -> str:
        """A digest of relative paths, targets, sizes and mtimes of ``files[:stop]``.

        Any file added, removed, renamed, relabelled or modified changes it.
        """
        return PrefixFingerprint(self.files).advance(len(self.files) if stop is None else stop)


class PrefixFingerprint:
    """Fingerprints of growing prefixes of a file list, computed incrementally (each file hashed once)."""

    def __init__(self, files: list[SourceFile]):
        self._files, self._done, self._digest = files, 0, hashlib.sha256()

    def advance(self, stop: int) -> str:
        """The fingerprint of ``files[:stop]``; ``stop`` must not decrease between calls."""
        for f in self._files[self._done : stop]:
            self._digest.update(f"{f.relpath}\0{f.target}\0{f.size}\0{f.mtime_ns}\n".encode("utf-8", "surrogatepass"))
        self._done = max(self._done, stop)
        return self._digest.copy().hexdigest()


def not_regular_reason(mode: int) -> str:
    kind = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device", stat.S_IFDIR: "a folder"}.get(stat.S_IFMT(mode), "not a regular file")
    return f"is {kind}, not an image file; it is never opened (reading it could block forever). Remove it or rename it."


def read_file(path: str | os.PathLike[str]) -> bytes:
    """Read a whole image file, refusing anything but a regular file without ever blocking on it.

    The file is opened with ``O_NONBLOCK`` (so a FIFO does not wait for a writer) and checked with
    ``fstat`` before any read.

    Raises:
        NotRegularFileError: A FIFO, socket, device or folder.
        OSError: It cannot be opened or read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(os.fspath(path), not_regular_reason(st.st_mode))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)
