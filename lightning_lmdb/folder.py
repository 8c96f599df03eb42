"""Scan a source folder exactly like ``torchvision.datasets.ImageFolder``.

Two layouts are accepted:

* **ImageFolder layout** -- one subfolder per class. Classes, ``class_to_idx``, the file set and the
  sample order come from torchvision's own ``find_classes`` / ``make_dataset`` /
  ``IMG_EXTENSIONS``, so they equal ``ImageFolder`` on the same folder.
* **Flat folder** -- images directly in the folder and no subfolders with images: samples without
  labels (``classes == []``, every target ``-1``).

The one difference from ImageFolder's file set: only regular files (and symbolic links to them) are
images. A FIFO, socket or device named like an image would block or never end when read; it is listed
apart (``SourceScan.special``) and never opened, and the builder refuses or skips it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, has_file_allowed_extension, make_dataset

from lightning_lmdb.errors import NotRegularFileError, SourceError

#: Target given to every sample of a flat (unlabelled) folder.
NO_TARGET = -1


@dataclass(frozen=True)
class SourceFile:
    """One image file of a scanned source folder.

    Attributes:
        path: Absolute path of the file.
        relpath: Path relative to the source root, with ``/`` separators.
        target: Class index, or ``NO_TARGET`` for a flat folder.
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
    """The result of scanning a source folder.

    Attributes:
        root: The resolved source folder.
        classes: Class names in index order (empty for a flat folder).
        class_to_idx: Class name to index.
        files: Samples in ImageFolder order.
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


def scan_folder(source: str | os.PathLike[str]) -> SourceScan:
    """Scan ``source`` as ImageFolder would (or as a flat folder of images).

    Args:
        source: The folder to scan.

    Returns:
        The classes and the files in ImageFolder order.

    Raises:
        FileNotFoundError: ``source`` does not exist or is not a folder.
        ValueError: ``source`` holds no image with one of ``IMG_EXTENSIONS``.
    """
    root = Path(source).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"Source folder {str(source)!r} does not exist or is not a folder. Pass the folder that holds your images.")
    try:
        classes, class_to_idx = find_classes(root)
    except FileNotFoundError:
        classes, class_to_idx = [], {}
    if classes:
        try:
            samples = make_dataset(root, class_to_idx, IMG_EXTENSIONS)
        except FileNotFoundError as exc:
            raise SourceError(
                f"{exc} in {str(root)!r}. ImageFolder refuses such a folder too: add images to each class folder "
                "or remove the empty ones."
            ) from exc
    else:
        samples = sorted(
            (entry.path, NO_TARGET)
            for entry in os.scandir(root)
            # Not is_file(): like make_dataset's os.walk, keep FIFOs, devices and dangling links, reported below.
            if not entry.is_dir() and has_file_allowed_extension(entry.name, IMG_EXTENSIONS)
        )
    if not samples:
        raise SourceError(
            f"No images found in {str(root)!r}: expected files ending in {', '.join(IMG_EXTENSIONS)} either in one "
            "subfolder per class (ImageFolder layout) or directly in the folder. Check the path."
        )
    files, special = [], []
    for path, target in samples:
        relpath = Path(path).relative_to(root).as_posix()
        try:
            st = os.stat(path)
            size, mtime_ns = st.st_size, st.st_mtime_ns
        except OSError:  # e.g. a dangling symlink: the builder reports it when it fails to read it
            size, mtime_ns = 0, 0
        else:
            if not stat.S_ISREG(st.st_mode):
                special.append((relpath, _not_regular_reason(st.st_mode)))
                continue
        files.append(SourceFile(path=path, relpath=relpath, target=target, size=size, mtime_ns=mtime_ns))
    return SourceScan(root=root, classes=list(classes), class_to_idx=dict(class_to_idx), files=files, special=special)


def _not_regular_reason(mode: int) -> str:
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
            raise NotRegularFileError(os.fspath(path), _not_regular_reason(st.st_mode))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)
