"""Block reads: the bytes of a block of records in one large read, the first time a process touches the block.

When a database is larger than RAM, its environment is opened with readahead off (``MADV_RANDOM``: see
:mod:`lightning_lmdb.dataset`), so each page of a record that is not cached is one 4 KB read. A block
shuffle (``ResumableSampler(shuffle="block")``) serves records block by block; with block reads on
(:meth:`lightning_lmdb.LMDBImageDataset.read_blocks`) the first sample a process loads from a block
reads the byte span of the whole block from the database file with one ``os.preadv`` into a reusable
buffer, which puts those pages in the page cache in one large sequential read whatever the readahead
flag. The block's other samples then find their pages cached (a minor fault each, no IO).

How the span is found without reading it: with ``buffers=True`` a read-only transaction's ``get``
returns a memoryview into LMDB's memory map, whose address minus the map's start is the record's offset
in the file. The start comes from ``/proc/self/maps`` (the mapping of the file that holds the address),
read once per environment: ``env.info()["map_addr"]`` is not it (LMDB reports the address recorded in
the meta page, 0 unless the file was built with ``MDB_FIXEDMAP``). Looking a record up touches only its
B-tree leaf page (one leaf holds the nodes of ~150 records larger than a page), not the value's own
pages, and numpy reads the view's address without touching them either. Without ``/proc`` (not Linux)
no block is read. The span runs from the block's lowest record address to the end of its
highest record. A span that is implausibly large for its records (more than :data:`SPAN_SLACK` times
their bytes, or more than :data:`MAX_SPAN_BYTES`: e.g. a resumed build that reused freed pages, or a
view whose rows are not in file order) is not read: those records are then read as without block reads.

Per process, per dataset object (a view has its own, in its own index space): the file descriptor, the
buffer and a small LRU of the blocks already read (the last :data:`REMEMBERED_BLOCKS`) are created
lazily and never pickled or inherited -- a forked worker starts with none (``os.register_at_fork``), a
spawned one receives a dataset whose settings are two numbers. A block that drops out of the LRU is
read again the next time it is touched (in a later epoch it may have left the page cache).
:func:`counters` tells what this process read.

Off (the default) nothing here runs: the dataset holds no settings and loads exactly as before.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from lightning_lmdb import envs
from lightning_lmdb import format as fmt

log = logging.getLogger(__name__)

#: Bytes a block is sized to hold (see :func:`block_size_for`).
BLOCK_BYTES = 4 * 2**20
#: A span larger than this many times its records' bytes is not read (the records are not contiguous).
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

    path: str

    def __len__(self) -> int: ...

    def _view_rows(self) -> np.ndarray | None: ...

    def _opened(self) -> envs.Opened: ...


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
                raise ValueError(f"{name}={value!r} must be a positive integer.")

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
        self.file: Any = None  # an unbuffered FileIO on the database file (closed when garbage-collected)
        self.identity: tuple[int, ...] | None = None  # the file it was opened on, as envs.Opened.identity
        self.buffer = bytearray()
        self.mapping: tuple[Any, int, int] | None = None  # (weakref to the envs.Opened, map start, file offset at start)
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
            opened = dataset._opened()
            span = _span(opened, rows, self._map_start)
            if span is None:
                _COUNTERS.blocks_skipped += 1
                return
            try:
                got = self._read(opened, *span)
            except OSError as exc:  # the read only warms the cache: the sample's own read reports real errors
                _COUNTERS.blocks_skipped += 1
                if not self.warned:
                    log.warning("Block read of %s failed (%s); its samples are read page by page.", opened.path, exc)
                    self.warned = True
                return
            _COUNTERS.blocks_read += 1
            _COUNTERS.bytes_read += got

    def _map_start(self, opened: envs.Opened, address: int) -> int | None:
        """The address of file offset 0 in ``opened``'s memory map (``address`` lies in it), or ``None`` if unknown."""
        if self.mapping is not None and self.mapping[0]() is opened:
            return self.mapping[1] - self.mapping[2]
        found = _find_mapping(address, opened.identity[1])
        if found is None:
            return None
        self.mapping = (weakref.ref(opened), *found)
        return found[0] - found[1]

    def _read(self, opened: envs.Opened, offset: int, length: int) -> int:
        if self.file is None or self.identity != opened.identity:
            self.file = open(opened.path, "rb", buffering=0)  # kept open; closed with the reader
            self.identity = envs._identity(os.fstat(self.file.fileno()))
        if len(self.buffer) < length:
            self.buffer = bytearray(length)
        view = memoryview(self.buffer)
        fd, got = self.file.fileno(), 0
        while got < length:
            n = os.preadv(fd, [view[got:length]], offset + got)
            if n == 0:  # end of file
                break
            got += n
        return got


def _span(opened: envs.Opened, rows: np.ndarray, map_start: Any) -> tuple[int, int] | None:
    """``(offset, length)`` in the file of the page-aligned span holding the records ``rows``, or ``None`` if implausible.

    ``map_start(opened, address)`` gives the address of file offset 0 in the map (``None``: unknown).
    """
    low, high, total = None, 0, 0
    with opened.env.begin(buffers=True) as txn:
        for row in rows.tolist():
            value = txn.get(fmt.record_key(row), db=opened.records)
            if value is None or len(value) == 0:  # a missing record is reported by the sample's own read
                continue
            address = np.frombuffer(value, np.uint8).__array_interface__["data"][0]  # no page touched
            low = address if low is None else min(low, address)
            high = max(high, address + len(value))
            total += len(value)
    if low is None:
        return None
    base = map_start(opened, low)
    if base is None:
        return None
    low, high = low - base, high - base
    offset = low - low % _PAGE
    end = -(-high // _PAGE) * _PAGE
    length = end - offset
    if offset < 0 or length > MAX_SPAN_BYTES or length > SPAN_SLACK * total + 2 * _PAGE:
        return None
    return offset, length


def _find_mapping(address: int, inode: int) -> tuple[int, int] | None:
    """``(start, file offset)`` of this process's memory mapping of the file ``inode`` that holds ``address``, from ``/proc/self/maps``."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or int(fields[4]) != inode:
                    continue
                start, end = (int(a, 16) for a in fields[0].split("-"))
                if start <= address < end:
                    return start, int(fields[2], 16)
    except (OSError, ValueError):
        pass
    return None


#: Per process: each dataset object's reader. Emptied in a forked child, which reopens what it needs.
_READERS: weakref.WeakKeyDictionary[Any, _Reader] = weakref.WeakKeyDictionary()


def _after_fork_in_child() -> None:
    _READERS.clear()
    reset_counters()


os.register_at_fork(after_in_child=_after_fork_in_child)
