"""Page-cache control without root: evict files, and measure how much of a file is cached.

A benchmark that claims a "cold" read must first make the data cold. Dropping every cache
(``echo 3 > /proc/sys/vm/drop_caches``) needs root; this module evicts just the files it is given
with ``posix_fadvise(POSIX_FADV_DONTNEED)``, which any user may do on a file they can read, and
proves it worked with :func:`resident_fraction` (``mmap`` + ``mincore``).

Limits (each one makes a later read look warmer than it should):

* **Dirty pages are not evicted.** A file that was just written keeps its unwritten pages in the
  cache until writeback; pass ``sync=True`` to :func:`evict` (an ``fsync`` first) for such files.
* **Pages mapped by a live memory map are not evicted.** An open LMDB environment maps its whole
  file: close every environment on the file (in every process) before evicting it.
* **Only file contents are evicted.** Directory entries, inodes and directory blocks stay cached,
  so an evicted folder of small files still opens faster than after a reboot; a "cold" pass over
  raw files measured this way is, if anything, flattering to raw files.
* **Below the guest.** On a virtual machine the host may cache the disk image; eviction here cannot
  reach that cache, so "cold" means "not in this kernel's page cache".
* Filesystems without a page cache of their own (tmpfs, some FUSE and network filesystems) ignore
  the advice: :func:`resident_fraction` then stays high, and callers should say so.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

__all__ = ["evict", "evict_tree", "resident_fraction", "resident_pages"]

_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.restype = ctypes.c_int
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
_MAP_FAILED = ctypes.c_void_p(-1).value


def evict(paths: Iterable[str | os.PathLike[str]], *, sync: bool = False) -> int:
    """Ask the kernel to drop the cached pages of each file.

    Args:
        paths: Regular files to evict.
        sync: ``fsync`` each file first, so pages written recently (dirty) become clean and can be
            dropped too. Needed for files written in the last ~30 s; costs little on clean files.

    Returns:
        The number of bytes advised (the sum of the files' sizes).

    Raises:
        FileNotFoundError: A file does not exist (named in the message).
        IsADirectoryError: A path is a folder; use :func:`evict_tree` for folders.
    """
    advised = 0
    for path in paths:
        with _opened(path, "Cannot evict {path!r} from the page cache: no such file.", stat.S_ISDIR,
                     "{path!r} is a folder; evict its files with evict_tree({path!r}).") as (fd, st):
            if sync:
                os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            advised += st.st_size
    return advised


@contextlib.contextmanager
def _opened(path: str | os.PathLike[str], missing: str, refused: Callable[[int], bool],
            refusal: str) -> Iterator[tuple[int, os.stat_result]]:
    """``path`` opened read-only, as ``(fd, fstat)``, closed after: a ``FileNotFoundError`` of ``missing`` when it does not exist,
    an ``IsADirectoryError`` of ``refusal`` when ``refused(st_mode)`` (both formatted with ``path``)."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(missing.format(path=path)) from None
    try:
        st = os.fstat(fd)
        if refused(st.st_mode):
            raise IsADirectoryError(refusal.format(path=path))
        yield fd, st
    finally:
        os.close(fd)


def evict_tree(root: str | os.PathLike[str], *, sync: bool = False) -> int:
    """Evict every regular file under ``root`` (symbolic links are not followed).

    Args:
        root: A folder.
        sync: ``fsync`` each file first (see :func:`evict`).

    Returns:
        The number of bytes advised.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        NotADirectoryError: ``root`` is a file; use :func:`evict` for files.
    """
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"Cannot evict {str(root)!r} from the page cache: no such folder.")
    if not root.is_dir():
        raise NotADirectoryError(f"{str(root)!r} is not a folder; evict a single file with evict([{str(root)!r}]).")
    files = (
        os.path.join(dirpath, name)
        for dirpath, _, names in os.walk(root)
        for name in names
        if os.path.isfile(os.path.join(dirpath, name)) and not os.path.islink(os.path.join(dirpath, name))
    )
    return evict(files, sync=sync)


def resident_fraction(path: str | os.PathLike[str]) -> float:
    """Fraction of a file's pages that are in the page cache, from 0.0 to 1.0.

    Maps the file (without touching any page) and asks ``mincore`` which pages are resident. The
    kernel answers truthfully only for files the caller owns or may write (otherwise it reports every
    page as resident), so other files are refused rather than measured wrongly.

    Args:
        path: A regular file. An empty file has no pages and gives 0.0.

    Returns:
        Resident pages / total pages.

    Raises:
        FileNotFoundError: No such file.
        PermissionError: The caller neither owns nor may write the file, so ``mincore`` cannot tell.
        OSError: ``mmap`` or ``mincore`` failed.
    """
    pages = resident_pages(path)
    return float(np.count_nonzero(pages)) / len(pages) if len(pages) else 0.0


def resident_pages(path: str | os.PathLike[str]) -> np.ndarray:
    """Which pages of a file are in the page cache: one ``bool`` per ``mmap.PAGESIZE`` bytes (page ``i`` holds
    bytes ``i * PAGESIZE`` onwards).

    Measured as :func:`resident_fraction` (``mmap`` + ``mincore``), with the same refusal of files the caller
    neither owns nor may write.

    Raises:
        FileNotFoundError: No such file.
        PermissionError: The caller neither owns nor may write the file, so ``mincore`` cannot tell.
        OSError: ``mmap`` or ``mincore`` failed.
    """
    path = os.fspath(path)
    with _opened(path, "Cannot measure the page-cache residency of {path!r}: no such file.", lambda mode: not stat.S_ISREG(mode),
                 "{path!r} is not a regular file; resident_fraction measures one file.") as (fd, st):
        if st.st_uid != os.geteuid() and os.geteuid() != 0 and not os.access(path, os.W_OK):
            raise PermissionError(
                f"Cannot measure the page-cache residency of {path!r}: mincore only reports it for files you own or may "
                "write (for others it claims every page is cached). Measure a copy you own."
            )
        size = st.st_size
        if size == 0:
            return np.zeros(0, dtype=bool)
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {path!r} failed: {os.strerror(err)}")
        try:
            pages = (size + _PAGE - 1) // _PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore on {path!r} failed: {os.strerror(err)}")
            return (np.frombuffer(vec, dtype=np.uint8) & 1).astype(bool)
        finally:
            _libc.munmap(addr, size)
