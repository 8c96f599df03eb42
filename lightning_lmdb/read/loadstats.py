"""Where a sample's time goes: :class:`LoaderStats`, per-process sums shared with DataLoader workers.

Every dataset object carries a small table in shared memory (one row per process: the owner and each
DataLoader worker, ~10 KB, created with the dataset so that it reaches workers started at any time --
``fork`` inherits it, ``spawn`` / ``forkserver`` receive it with the dataset). ``__getitem__`` adds its
read, decode and transform times (a few ``time.perf_counter()`` calls, ~2 us a sample) and the
process's CPU time to its own row; ``PerfMonitor`` reads them per epoch.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info


@dataclass(frozen=True)
class ProcessLoad:
    """What one process spent loading samples of one dataset in the current period (see :class:`LoaderStats`).

    Attributes:
        slot: ``0`` for the process that owns the dataset (``num_workers=0``), ``k + 1`` for DataLoader worker ``k``.
        pid: The process id.
        samples: Samples it loaded.
        read_s: Seconds getting their bytes into memory (LMDB lookup and page faults, or the file read).
        decode_s: Seconds turning bytes into an RGB image.
        transform_s: Seconds in ``transform`` and ``target_transform``.
        cpu_s: CPU seconds of the whole process (``time.process_time()``) from the end of its last sample of an
            earlier period (from its start when it had none) to the end of its last sample of this one.
    """

    slot: int
    pid: int
    samples: int
    read_s: float
    decode_s: float
    transform_s: float
    cpu_s: float


# Columns of a LoaderStats row.
_GEN, _PID, _SAMPLES, _READ, _DECODE, _TRANSFORM, _CPU_DONE, _CPU_BASE, _CPU_LAST = range(9)
_PAGE = mmap.PAGESIZE
_period: torch.Tensor | None = None  # the process-wide period number, in shared memory (see LoaderStats.next_period)


def _shared_period() -> torch.Tensor:
    global _period
    if _period is None:
        _period = torch.ones(1, dtype=torch.float64).share_memory_()
    return _period


class LoaderStats:
    """Per-process sums of a dataset's read / decode / transform time and CPU time, shared with its DataLoader workers.

    A ``float64`` table in shared memory with one row per process: row 0 for the process that owns the dataset,
    row ``k + 1`` for DataLoader worker ``k`` (:data:`MAX_WORKERS` workers at most are counted). Each process
    writes only its own row, so no lock is needed. The sums run over a **period**: a process-wide number, also
    in shared memory, that :meth:`next_period` increments (``PerfMonitor`` does it at the start of ``fit`` and at
    the end of each training epoch); a process's first sample of a new period starts its row afresh.

    Fork workers inherit the table; ``spawn`` / ``forkserver`` workers receive it (and the period) with the
    dataset, because a pickle made while starting a process (``multiprocessing``'s spawning context) shares
    them. Any other pickle of a dataset leaves its stats out.
    """

    #: DataLoader workers with a row of their own; samples of workers with a higher id are not counted.
    MAX_WORKERS = 128

    def __init__(self) -> None:
        self._table = torch.zeros(self.MAX_WORKERS + 1, _CPU_LAST + 1, dtype=torch.float64).share_memory_()
        self._period = _shared_period()
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None  # numpy views, per process
        self._last = (0, 0.0)  # (pid, its CPU time at its last sample): where its next period's CPU time starts

    def __getstate__(self) -> dict[str, Any]:
        return {"_table": self._table, "_period": self._period, "_arrays": None, "_last": (0, 0.0)}

    def _views(self) -> tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            self._arrays = (self._table.numpy(), self._period.numpy())
        return self._arrays

    @staticmethod
    def next_period() -> None:
        """Start a new period for every dataset of this process and its workers: the next samples count afresh."""
        _shared_period().add_(1.0)

    def record(self, read_s: float, decode_s: float, transform_s: float) -> None:
        """Add one sample's times to this process's row (called by ``__getitem__``)."""
        table, period = self._views()
        info = get_worker_info()
        slot = 0 if info is None else info.id + 1
        if slot >= len(table):
            return
        row, pid, gen = table[slot], os.getpid(), period[0]
        if row[_GEN] != gen or row[_PID] != pid:  # this process's first sample of the period
            base = self._last[1] if self._last[0] == pid else 0.0  # (a forked worker inherits its parent's _last)
            if row[_GEN] != gen:
                row[:] = 0.0
            else:  # another process used the slot earlier in the period: keep what it spent
                row[_CPU_DONE] += row[_CPU_LAST] - row[_CPU_BASE]
            row[_GEN], row[_PID], row[_CPU_BASE] = gen, pid, base
        row[_SAMPLES] += 1.0
        row[_READ] += read_s
        row[_DECODE] += decode_s
        row[_TRANSFORM] += transform_s
        row[_CPU_LAST] = cpu = time.process_time()
        self._last = (pid, cpu)

    def processes(self) -> list[ProcessLoad]:
        """What each process (owner and workers) spent in the current period, for those that loaded samples."""
        table, period = self._views()
        rows, gen = table.copy(), period[0]
        return [
            ProcessLoad(slot, int(row[_PID]), int(row[_SAMPLES]), float(row[_READ]), float(row[_DECODE]), float(row[_TRANSFORM]),
                        float(row[_CPU_DONE] + row[_CPU_LAST] - row[_CPU_BASE]))
            for slot, row in enumerate(rows) if row[_GEN] == gen and row[_SAMPLES] > 0
        ]


def touch_pages(buffer: bytes | memoryview) -> None:
    """Read one byte of every page of ``buffer``: the page faults of a memory-mapped record count as its read."""
    view = memoryview(buffer).cast("B")
    if len(view):
        bytes(view[::_PAGE])
        view[-1]
