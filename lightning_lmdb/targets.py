"""Typed targets: what a database stores per record beside its image, and what a dataset serves as ``ds[i][1]``.

A source's target kind (:data:`lightning_lmdb.sources.TargetKind`) says what a sample's target is:

============== ============================================= ===========================================
kind           stored (:mod:`lightning_lmdb.format` arrays)   served
============== ============================================= ===========================================
``class``      ``meta/targets``: ``int32`` class index        ``int`` (as ``ImageFolder``)
``none``       ``meta/targets``: ``-1``                       ``-1`` (as a flat folder)
``multilabel`` ``meta/labels`` (``int32`` class indices of     ``float32`` multi-hot tensor ``[C]`` over
               every record, concatenated) and                the classes
               ``meta/label-offsets`` (``int64``, count + 1)
``regression`` ``meta/values``: ``float32`` ``count x K``     ``float32`` tensor ``[K]``
============== ============================================= ===========================================

``meta/targets`` is always there (``-1`` for the kinds that are not ``class``), so a per-record class index
is one array read whatever the kind. :class:`TargetTable` holds one database's (or scan's) targets in numpy
arrays -- never one Python object per record -- and builds each sample's target on demand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lightning_lmdb.sources import NO_TARGET, Target

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, eq=False)
class TargetTable:
    """Every record's target, typed.

    Attributes:
        kind: ``"class"``, ``"none"``, ``"multilabel"`` or ``"regression"``.
        index: ``int32`` per record: the class index (``class``), else ``-1``.
        width: Length of a served target tensor: the number of classes (``multilabel``), K (``regression``), else 0.
        labels: ``multilabel``: each record's class indices, concatenated (``int32``).
        offsets: ``multilabel``: ``int64`` per record plus one; record ``i``'s labels are ``labels[offsets[i]:offsets[i+1]]``.
        values: ``regression``: ``float32`` ``count x K``.
    """

    kind: str
    index: np.ndarray
    width: int = 0
    labels: np.ndarray | None = None
    offsets: np.ndarray | None = None
    values: np.ndarray | None = None

    @classmethod
    def pack(cls, kind: str, targets: Sequence[Target], width: int = 0) -> TargetTable:
        """The table of a scan's per-file targets (:data:`lightning_lmdb.sources.Target`) of kind ``kind``.

        Args:
            kind: The target kind.
            targets: One target per record, of that kind.
            width: The number of classes (``multilabel``) or of values per record (``regression``).
        """
        count = len(targets)
        if kind == "multilabel":
            offsets = np.zeros(count + 1, dtype=np.int64)
            np.cumsum([len(t) for t in targets], out=offsets[1:])  # type: ignore[arg-type]
            labels = np.fromiter((i for t in targets for i in t), dtype=np.int32, count=int(offsets[-1]))  # type: ignore[union-attr]
            return cls(kind, np.full(count, NO_TARGET, dtype=np.int32), width, labels=labels, offsets=offsets)
        if kind == "regression":
            values = np.array(targets, dtype=np.float32).reshape(count, width)
            return cls(kind, np.full(count, NO_TARGET, dtype=np.int32), width, values=values)
        return cls(kind, np.array(targets, dtype=np.int32).reshape(count), 0)

    @classmethod
    def concat(cls, tables: Sequence[TargetTable]) -> TargetTable:
        """The tables of consecutive parts (a sharded database's shards) as one."""
        first = tables[0]
        index = np.concatenate([t.index for t in tables])
        if first.kind == "multilabel":
            starts = np.cumsum([0] + [len(t.labels) for t in tables[:-1]])  # type: ignore[arg-type]
            offsets = np.concatenate([[0]] + [t.offsets[1:] + s for t, s in zip(tables, starts, strict=True)])  # type: ignore[index]
            labels = np.concatenate([t.labels for t in tables])  # type: ignore[misc]
            return cls(first.kind, index, first.width, labels=labels, offsets=offsets.astype(np.int64))
        if first.kind == "regression":
            return cls(first.kind, index, first.width, values=np.concatenate([t.values for t in tables]))  # type: ignore[misc]
        return cls(first.kind, index)

    def __len__(self) -> int:
        return len(self.index)

    def item(self, row: int) -> int | torch.Tensor:
        """Record ``row``'s target as a dataset serves it: an ``int``, or a ``float32`` tensor ``[width]``."""
        if self.kind not in ("multilabel", "regression"):
            return int(self.index[row])
        import torch  # here: reading a database's metadata (info, verify) does not import torch

        if self.kind == "multilabel":
            assert self.labels is not None and self.offsets is not None
            hot = np.zeros(self.width, dtype=np.float32)  # numpy, then one tensor: ~3 us a sample, half of torch's indexing
            hot[self.labels[self.offsets[row] : self.offsets[row + 1]]] = 1.0
            return torch.from_numpy(hot)
        assert self.values is not None
        return torch.from_numpy(self.values[row].copy())

    def tolist(self, rows: np.ndarray | None = None) -> list[int] | list[list[int]] | list[list[float]]:
        """The targets of ``rows`` (all when ``None``) as plain values: class indices, lists of class indices, or lists of floats."""
        if self.kind == "multilabel":
            assert self.labels is not None and self.offsets is not None
            picked = range(len(self)) if rows is None else rows
            return [self.labels[self.offsets[r] : self.offsets[r + 1]].tolist() for r in picked]
        if self.kind == "regression":
            assert self.values is not None
            return (self.values if rows is None else self.values[rows]).tolist()
        return (self.index if rows is None else self.index[rows]).tolist()

    def freeze(self) -> TargetTable:
        """``self``, with its arrays made read-only."""
        for array in (self.index, self.labels, self.offsets, self.values):
            if array is not None:
                array.flags.writeable = False
        return self
