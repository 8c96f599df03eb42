"""The builder's readers: a pool of processes that read, fully decode and checksum source files.

Every file a build stores is decoded here first (so training never meets a corrupt image), either in
this process (``workers=0``) or in a pool of reader processes; :func:`find_bad_files` runs the same
reads without building anything. The pool is sized by :func:`available_cores` unless told otherwise.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import warnings
from collections.abc import Iterator
from typing import Any

from lightning_lmdb import format as fmt
from lightning_lmdb.codec import DEFAULT_MAX_PIXELS, ImageDecodeError, encode_record
from lightning_lmdb.sources import NotRegularFileError, SourceScan, read_file


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask where the OS has one), else all of them."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def available_cores() -> int:
    """How many CPU cores this process may run on (see :func:`usable_cpus`)."""
    return len(usable_cpus())


#: One file to read: (index, path, storage or "check", max_pixels, resize, quality).
_Task = tuple[int, str, str, int | None, int | None, int]


def _read_one(task: _Task) -> tuple[int, bytes | None, Any]:
    """Read, fully decode and checksum one file (runs in a pool worker).

    Returns:
        ``(index, value, entry)`` (``entry``: :func:`lightning_lmdb.format.progress_entry`, the digest and the
        record codec), or ``(index, None, reason)`` for a bad file.
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
        codec, value = encode_record(data, storage, max_pixels=max_pixels, name=path, resize=resize, quality=quality)
    except ImageDecodeError as exc:
        return index, None, exc.reason
    return index, value, fmt.progress_entry(value, codec)


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
