"""Block reads: the bytes of a block of records in one large read, the first time a process touches the block.

When a database is larger than RAM, its environment is opened with readahead off (``MADV_RANDOM``: see
:mod:`lightning_lmdb.read.dataset`), so each page of a record that is not cached is one 4 KB read. A block
shuffle (``ResumableSampler(shuffle="block")``) serves records block by block; with block reads on
(:meth:`lightning_lmdb.LMDBImageDataset.read_blocks`) the first sample a process loads from a block
reads the byte span of the whole block from the database file with one ``os.preadv`` into a reusable
buffer, which puts those pages in the page cache in one large sequential read whatever the readahead
flag. The block's other samples then find their pages cached (a minor fault each, no IO).

How the span is found without reading it: records are appended in key order, so a block's records
lie in the file between its lowest and its highest row (a build writes nothing else between them but
B-tree leaf pages). Only those two records are located, from their B-tree leaf nodes: a cursor's
``set_key`` reads the leaf page (one per ~150 records larger than a page) and, for a value in overflow
pages, the first of them; the node gives the value's size and first overflow page (LMDB 0.9's on-disk
layout: an 8-byte node header, the key, the page number), and that page's header is checked (its page
number, its overflow flag, its length) before it is trusted. ``txn.get`` cannot be used for this:
py-lmdb touches every page of the value it returns ("preload", with the GIL released), which with
readahead off is the page-at-a-time read this module avoids. The span runs from the lowest record's
page to the end of the highest record. A span that is implausibly large (more than :data:`SPAN_SLACK`
times the block's expected bytes -- its records times the file's bytes per record -- or more than
:data:`MAX_SPAN_BYTES`: e.g. a resumed build that reused freed pages, or a view whose rows are not in
file order), or a node that does not parse as expected, is not read: those records are then read as
without block reads. A span that misses some records (pages reused out of order) only reads less.

Per process, per dataset object (a view has its own, in its own index space): the file descriptor, the
buffer and a small LRU of the blocks already read (the last :data:`REMEMBERED_BLOCKS`) are created
lazily and never pickled or inherited -- a forked worker starts with none (``os.register_at_fork``), a
spawned one receives a dataset whose settings are two numbers. A block that drops out of the LRU is
read again the next time it is touched (in a later epoch it may have left the page cache).
:func:`counters` tells what this process read.

Off (the default) nothing here runs: the dataset holds no settings and loads exactly as before.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import struct
import sys
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import lmdb
import numpy as np

from lightning_lmdb.errors import OptionError
from lightning_lmdb.store import envs
from lightning_lmdb.store import format as fmt

log = logging.getLogger(__name__)

#: Bytes a block is sized to hold (see :func:`block_size_for`).
BLOCK_BYTES = 4 * 2**20
#: A span larger than this many times the block's expected bytes is not read (its records are not contiguous).
SPAN_SLACK = 4
#: A span larger than this is never read.
MAX_SPAN_BYTES = 64 * 2**20
#: Blocks each process remembers having read (twice the sampler's default window of 16).
REMEMBERED_BLOCKS = 32

_PAGE = mmap.PAGESIZE


def block_size_for(file_bytes: int, count: int) -> int:
    """Records per block so that a block holds about :data:`BLOCK_BYTES` of a file of ``file_bytes`` with ``count`` records.

    Returns:
        ``max(1, round(BLOCK_BYTES * count / file_bytes))`` (1 for an empty file or no records).
    """
    if file_bytes <= 0 or count <= 0:
        return 1
    return max(1, round(BLOCK_BYTES * count / file_bytes))


class BlockSource(Protocol):
    """What a dataset offers block reads (:class:`lightning_lmdb.LMDBImageDataset` does)."""

    def __len__(self) -> int: ...

    def _view_rows(self) -> np.ndarray | None: ...

    def _parts_of(self, rows: np.ndarray) -> list[tuple[envs.Opened, np.ndarray, int]]:
        """Each database file holding some of ``rows``: its environment, those rows numbered in it, its record count."""
        ...


@dataclass(frozen=True)
class BlockReads:
    """A dataset's block-read settings: all that a pickled dataset carries of them.

    Attributes:
        block_size: Records per block, in the dataset's index space (the sampler's ``block_size``).
        remember: Blocks each process remembers having read.
    """

    block_size: int
    remember: int = REMEMBERED_BLOCKS

    def __post_init__(self) -> None:
        for name in ("block_size", "remember"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                what = "records per block; or None for about 4 MiB of records" if name == "block_size" else "blocks remembered"
                raise OptionError(f"{name}={value!r} must be a positive integer ({what}).")

    def before_load(self, dataset: BlockSource, index: int) -> None:
        """Read the block of sample ``index`` of ``dataset`` unless this process read it recently."""
        reader = _READERS.get(dataset)
        if reader is None or reader.settings != self:
            reader = _READERS[dataset] = _Reader(self)
        reader.touch(dataset, index)


@dataclass
class Counters:
    """What block reads did in this process.

    Attributes:
        blocks_read: Blocks whose span was read.
        bytes_read: Bytes those reads returned.
        blocks_skipped: Blocks not read because their span was implausible (or the read failed).
    """

    blocks_read: int = 0
    bytes_read: int = 0
    blocks_skipped: int = 0


_COUNTERS = Counters()


def counters() -> Counters:
    """A copy of this process's block-read counters (a forked or spawned worker starts from zero)."""
    return Counters(**vars(_COUNTERS))


def reset_counters() -> None:
    """Set this process's counters back to zero."""
    _COUNTERS.blocks_read = _COUNTERS.bytes_read = _COUNTERS.blocks_skipped = 0


class _Reader:
    """One dataset object's block reads in this process: the file, the buffer, the blocks already read."""

    def __init__(self, settings: BlockReads):
        self.settings = settings
        self.seen: OrderedDict[int, None] = OrderedDict()
        # per database file (one, or each shard): an unbuffered FileIO (closed when garbage-collected) and the
        # file it was opened on, as envs.Opened.identity
        self.files: dict[str, tuple[Any, tuple[int, ...]]] = {}
        self.buffer = bytearray()
        self.lock = threading.Lock()
        self.warned = False

    def touch(self, dataset: BlockSource, index: int) -> None:
        if index < 0:
            index += len(dataset)
        block = index // self.settings.block_size
        with self.lock:
            if block in self.seen:
                self.seen.move_to_end(block)
                return
            self.seen[block] = None
            if len(self.seen) > self.settings.remember:
                self.seen.popitem(last=False)
            start = block * self.settings.block_size
            stop = min(len(dataset), start + self.settings.block_size)
            rows = dataset._view_rows()
            rows = np.arange(start, stop) if rows is None else rows[start:stop]
            for opened, local, count in dataset._parts_of(rows):  # a block of a sharded database may span two shards
                try:
                    span = _span(opened, local, count)
                except lmdb.Error as exc:  # a damaged page on the way to a record (lmdb.CorruptedError, PageNotFoundError, ...)
                    raise envs.damaged(opened.path, exc, getattr(dataset, "path", None)) from exc
                if span is None:
                    _COUNTERS.blocks_skipped += 1
                    continue
                try:
                    got = self._read(opened, *span)
                except OSError as exc:  # the read only warms the cache: the sample's own read reports real errors
                    _COUNTERS.blocks_skipped += 1
                    if not self.warned:
                        log.warning("Block read of %s failed (%s); its samples are read page by page.", opened.path, exc)
                        self.warned = True
                    continue
                _COUNTERS.blocks_read += 1
                _COUNTERS.bytes_read += got

    def _read(self, opened: envs.Opened, offset: int, length: int) -> int:
        file, identity = self.files.get(opened.path, (None, None))
        if file is None or identity != opened.identity:
            file = open(opened.path, "rb", buffering=0)  # kept open; closed with the reader
            self.files[opened.path] = file, envs._identity(os.fstat(file.fileno()))
        if len(self.buffer) < length:
            self.buffer = bytearray(length)
        view = memoryview(self.buffer)
        fd, got = file.fileno(), 0
        while got < length:
            n = os.preadv(fd, [view[got:length]], offset + got)
            if n == 0:  # end of file
                break
            got += n
        return got


def _span(opened: envs.Opened, rows: np.ndarray, count: int) -> tuple[int, int] | None:
    """``(offset, length)`` in the file of the page-aligned span from record ``min(rows)`` to the end of ``max(rows)``.

    ``None`` when a record cannot be located or the span is implausible for ``len(rows)`` of the file's ``count`` records.

    Raises:
        lmdb.Error: A damaged B-tree page on the way to a record.
    """
    if not len(rows) or not _LAYOUT_KNOWN:
        return None
    file_bytes = opened.identity[2]
    psize = opened.env.stat()["psize"]
    with opened.env.begin(buffers=True) as txn:
        cursor = txn.cursor(db=opened.records)
        first, last = int(rows.min()), int(rows.max())
        low = _locate(cursor, first, psize, file_bytes)
        high = low if last == first else _locate(cursor, last, psize, file_bytes)
    if low is None or high is None:
        return None
    offset = low[0] - low[0] % _PAGE
    end = -(-(high[0] + high[1]) // _PAGE) * _PAGE
    length = min(end, file_bytes) - offset
    expected = len(rows) * file_bytes / max(1, count)
    if length <= 0 or length > MAX_SPAN_BYTES or length > SPAN_SLACK * expected + 2 * _PAGE:
        return None
    return offset, length


# LMDB 0.9's page and node layout (lmdb's mdb.c), read only after a cursor has positioned on the node.
_P_LEAF, _P_OVERFLOW, _F_BIGDATA, _PAGE_HEADER = 0x02, 0x04, 0x01, 16
_LAYOUT_KNOWN = sys.byteorder == "little" and struct.calcsize("P") == 8  # pgno_t is a size_t; fields are native-endian


def _locate(cursor: Any, row: int, psize: int, file_bytes: int) -> tuple[int, int] | None:
    """``(file offset, size)`` of record ``row``'s value, from its leaf node (without touching the value's pages).

    ``cursor.key()`` with ``buffers=True`` is a view of the key inside its leaf page; the node header precedes it
    (``mn_lo``, ``mn_hi``: the data size; ``mn_flags``; ``mn_ksize``) and the data follows it: the value itself, or
    for an overflow value (``F_BIGDATA``) the number of its first page, whose header (page number, flags, pages)
    must agree. Anything unexpected gives ``None``.
    """
    key = fmt.record_key(row)
    if not cursor.set_key(key):
        return None
    address = np.frombuffer(cursor.key(), np.uint8).__array_interface__["data"][0]
    lo, hi, flags, ksize = struct.unpack("<HHHH", ctypes.string_at(address - 8, 8))
    page = address - address % psize
    pgno, _, page_flags = struct.unpack("<QHH", ctypes.string_at(page, 12))
    if ksize != len(key) or ctypes.string_at(address, ksize) != key or not page_flags & _P_LEAF or (pgno + 1) * psize > file_bytes:
        return None
    size = lo | hi << 16
    if not flags & _F_BIGDATA:
        return pgno * psize + (address + ksize - page), size
    (first,) = struct.unpack("<Q", ctypes.string_at(address + ksize, 8))
    if (first + 1) * psize > file_bytes:
        return None
    overflow = page + (first - pgno) * psize  # the map holds page n at map + n * psize; set_key has read this one
    number, _, overflow_flags, pages = struct.unpack("<QHHI", ctypes.string_at(overflow, 16))
    if number != first or not overflow_flags & _P_OVERFLOW or pages * psize < size + _PAGE_HEADER:
        return None
    return first * psize + _PAGE_HEADER, size


#: Per process: each dataset object's reader. Emptied in a forked child, which reopens what it needs.
_READERS: weakref.WeakKeyDictionary[Any, _Reader] = weakref.WeakKeyDictionary()


def _after_fork_in_child() -> None:
    _READERS.clear()
    reset_counters()


os.register_at_fork(after_in_child=_after_fork_in_child)
