"""How much work a file is to build, estimated from what a scan knows cheaply, and the shards cut by it.

A sharded build (:mod:`lightning_lmdb.build.sharded`) cuts the scan into contiguous ranges of even estimated work
(:func:`work_ranges`), so every shard -- and every ``--shard i/K`` task of a job array -- finishes at about the same
time. The work of one file, in byte-equivalents (:func:`file_work`):

* a file whose record is its own bytes (``storage="encoded"``; ``"auto"`` for lossy files -- JPEG, lossy WebP -- and
  16-bit PNGs): ``FILE_WORK + size``: reading, validating and writing scale with the file;
* a file whose record is made from its pixels (``"decoded"``; ``"auto"``'s zstd pixels for every other image; any
  image ``resize=`` shrinks): ``FILE_WORK + size + PIXEL_COST * width * height``: the decode, the conversion and
  the record scale with the pixels (a JPEG decodes to ~10x its file, a PNG to ~2x).

The unit is about what a byte of a kept file costs (~1.3 ns here). Calibrated on a ``decoded`` build in one process
(2 shared cores): 400 photo-like PNG icons (8.8 Mpx, 19 MB) took 0.24 s of CPU, 48 JPEG wallpapers (168 Mpx, 65 MB)
1.76 s -- fitted as ~0.35 ms a file (:data:`FILE_WORK`) and ~10.4 ns a pixel (:data:`PIXEL_COST`).

Only ``storage="encoded"`` without ``resize`` opens no file. Every other build reads each file's header: the first
:data:`HEADER_BYTES` (:func:`lightning_lmdb.codec.imageinfo.read_info`), or PIL's lazy open (the header only) for a
format it does not parse or a JPEG whose frame header comes later; headers are read by :data:`HEADER_THREADS` threads
(a network filesystem's latency overlaps). A file whose header cannot be read (damaged, vanished) or that claims more
than twice ``Image.MAX_IMAGE_PIXELS`` (refused by PIL before decoding: a bomb) counts as its bytes. Integer
arithmetic only: the same scan gives the same cut in every task.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from PIL import Image

from lightning_lmdb.codec.imageinfo import ImageInfo, read_info
from lightning_lmdb.sources.base import SourceFile, SourceScan
from lightning_lmdb.store.shards import cut_ranges

__all__ = ["FILE_WORK", "HEADER_BYTES", "HEADER_THREADS", "PIXEL_COST", "file_work", "header_info", "needs_headers", "scan_works",
           "work_ranges"]

#: Work of a file beyond its bytes and pixels (opening and reading it, the decoder set up, its checksum, record,
#: progress entry and put: ~0.35 ms measured, in byte-equivalents), so many tiny files are not taken for a light shard.
FILE_WORK = 1 << 18
#: Byte-equivalents of work per pixel of a file whose record is made from its pixels (decode, RGB conversion,
#: 3 record bytes, their checksum and write). It weighs pixels against kept bytes only where a build mixes both
#: (``"auto"``, ``resize=``); a ``"decoded"`` build's balance depends little on it (the pixels dominate).
PIXEL_COST = 8
#: How much of a file is read for its header: enough for a JPEG's frame header behind a typical Exif block.
HEADER_BYTES = 16384
#: Threads reading headers at once.
HEADER_THREADS = 16


def needs_headers(storage: str, resize: int | None) -> bool:
    """Whether the work of a build with ``storage`` and ``resize`` depends on the images' headers (else on sizes only)."""
    return storage != "encoded" or resize is not None


def header_info(path: str | os.PathLike[str]) -> ImageInfo | None:
    """The header facts of the image file at ``path`` (its first bytes; PIL's lazy open for other formats), ``None`` if unreadable."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            info = read_info(head)
            if info.pixels:
                return info
            f.seek(0)
            with Image.open(f) as image:  # reads the header only
                width, height = image.size
                fmt = (image.format or "other").lower()
            return ImageInfo("jpeg" if fmt == "jpeg" else "png" if fmt == "png" else fmt, width, height,
                             lossy=fmt == "jpeg" or info.lossy, bit_depth=info.bit_depth)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None


def file_work(size: int, info: ImageInfo | None, storage: str, resize: int | None) -> int:
    """The estimated work of one file of ``size`` bytes with header ``info`` (``None``: unknown) in byte-equivalents.

    Args:
        size: The file's size at scan time.
        info: Its header facts (:func:`header_info`); ``None`` when not read or unreadable: its bytes alone count.
        storage: The build's storage mode (a mode registered by a plugin counts as one that decodes).
        resize: The build's ``resize=``.
    """
    work = FILE_WORK + max(size, 0)
    if info is None or not info.pixels or info.pixels > 2 * (Image.MAX_IMAGE_PIXELS or 1 << 62):
        return work
    shrunk = resize is not None and min(info.width, info.height) > resize
    if storage == "encoded":
        kept = not shrunk
    elif storage == "auto":
        kept = info.lossy and not shrunk or (not shrunk and info.format == "png" and info.bit_depth > 8)
    else:
        kept = False
    return work if kept else work + PIXEL_COST * info.pixels


def scan_works(files: Sequence[SourceFile], storage: str, resize: int | None) -> list[int]:
    """:func:`file_work` of every file, in scan order (headers read by :data:`HEADER_THREADS` threads when the storage needs them)."""
    if not needs_headers(storage, resize):
        return [file_work(f.size, None, storage, resize) for f in files]
    with ThreadPoolExecutor(HEADER_THREADS) as pool:
        infos = list(pool.map(header_info, [f.path for f in files], chunksize=64))
    return [file_work(f.size, info, storage, resize) for f, info in zip(files, infos, strict=True)]


def work_ranges(scan: SourceScan, storage: str, resize: int | None, shards: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` of ``scan.files`` each of ``shards`` shards covers: contiguous, of even estimated work."""
    return cut_ranges(scan_works(scan.files, storage, resize), shards)
