"""Typed targets: what a database stores per record beside its image, and what a dataset serves as ``ds[i][1]``.

A source's target kind (:data:`lightning_lmdb.sources.base.TargetKind`) says what a sample's target is:

============== ============================================= ===========================================
kind           stored (:mod:`lightning_lmdb.store.format` arrays)   served
============== ============================================= ===========================================
``class``      ``meta/targets``: ``int32`` class index        ``int`` (as ``ImageFolder``)
``none``       ``meta/targets``: ``-1``                       ``-1`` (as a flat folder)
``multilabel`` ``meta/labels`` (``int32`` class indices of     ``float32`` multi-hot tensor ``[C]`` over
               every record, concatenated) and                the classes
               ``meta/label-offsets`` (``int64``, count + 1)
``regression`` ``meta/values``: ``float32`` ``count x K``     ``float32`` tensor ``[K]``
``mask``       the record holds its mask                      ``int64`` ``H x W`` tensor (the datasets,
               (:mod:`lightning_lmdb.sources.masks`); ``meta/labels``  from the record; not this table)
               and ``meta/label-offsets``: the classes each
               mask holds, as ``multilabel``
============== ============================================= ===========================================

``meta/targets`` is always there (``-1`` for the kinds that are not ``class``), so a per-record class index
is one array read whatever the kind. :class:`TargetTable` holds one database's (or scan's) targets in numpy
arrays -- never one Python object per record -- and builds each sample's target on demand. :func:`read_typed` reads the
typed arrays of a database's metadata (:func:`lightning_lmdb.store.format.read_meta`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_lmdb.pathtable import PathTable
from lightning_lmdb.sources.base import NO_TARGET, TARGET_KINDS, Target

if TYPE_CHECKING:
    import torch

    from lightning_lmdb.jsonfields import JsonFields

#: The kinds whose targets are lists of class indices per record (``meta/labels`` and ``meta/label-offsets``).
LABEL_KINDS = ("multilabel", "mask")


def width_of(kind: str, classes: Sequence[str], target_names: Sequence[str]) -> int:
    """The length of a served target tensor of ``kind`` (:attr:`TargetTable.width`): the classes' count for the label kinds, K
    (the names' count) for regression, else 0."""
    return len(classes) if kind in LABEL_KINDS else len(target_names) if kind == "regression" else 0


def named(kind: str, classes: Sequence[str], target: Any) -> Any:
    """A target of ``kind`` as a value that does not depend on the class indices, to compare a database's targets with a
    source's (whose classes may have changed): the class name (``class``), the sorted names (``multilabel``), the numbers as
    stored, ``float32`` (``regression``); ``None`` for the other kinds (no target, or a mask: compared with its file)."""
    if kind == "class":
        return classes[target] if 0 <= target < len(classes) else target
    if kind == "multilabel":
        return sorted(classes[k] if 0 <= k < len(classes) else str(k) for k in target)
    if kind == "regression":
        return np.asarray(target, dtype=np.float32).tolist()
    return None


@dataclass(frozen=True, eq=False)
class TargetTable:
    """Every record's target, typed.

    Attributes:
        kind: ``"class"``, ``"none"``, ``"multilabel"``, ``"regression"`` or ``"mask"``.
        index: ``int32`` per record: the class index (``class``), else ``-1``.
        width: Length of a served target tensor: the number of classes (``multilabel``; ``mask``: its classes), K (``regression``),
            else 0.
        labels: ``multilabel`` (``mask``: the classes its mask holds): each record's class indices, concatenated (``int32``).
        offsets: ``multilabel``, ``mask``: ``int64`` per record plus one; record ``i``'s labels are ``labels[offsets[i]:offsets[i+1]]``.
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
        """The table of a scan's per-file targets (:data:`lightning_lmdb.sources.base.Target`) of kind ``kind``.

        Args:
            kind: The target kind.
            targets: One target per record, of that kind.
            width: The number of classes (``multilabel``, ``mask``) or of values per record (``regression``).
        """
        count = len(targets)
        if kind in LABEL_KINDS:
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
        if first.kind in LABEL_KINDS:
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
        """Record ``row``'s target as a dataset serves it: an ``int``, or a ``float32`` tensor ``[width]``.

        Raises:
            TypeError: A ``mask`` table: a mask is read with its record, not from this table (:meth:`tolist` gives the classes
                each mask holds).
        """
        if self.kind == "mask":
            raise TypeError("A segmentation database's targets are its masks, stored in the records "
                            "(lightning_lmdb.sources.masks.unpack and "
                            "decode_mask); TargetTable.item does not serve them. TargetTable.tolist() gives the classes each mask holds.")
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
        """The targets of ``rows`` (all when ``None``) as plain values: class indices, lists of class indices (``multilabel``; the
        classes each mask holds for ``mask``), or lists of floats."""
        if self.kind in LABEL_KINDS:
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


def read_typed(get: JsonFields, read: Callable[[str], np.ndarray], meta: Any, *, arrays: bool = False) -> dict[str, Any]:
    """The target kind, typed targets, splits and mask fields of a database header (version 3 fields; absent from older files),
    each checked: the fields to replace in ``meta`` (a :class:`lightning_lmdb.store.format.Metadata` with the shared fields read).

    Args:
        get: The header's fields.
        read: Reads (and checks) one of the metadata arrays by name.
        meta: The metadata read so far (its ``count``, ``classes`` and ``target_kind``).
        arrays: Also read the masks' paths (with the paths and checksums).

    Raises:
        DatabaseError: A field or array that does not fit (named).
    """
    kind = get("target_kind", str) if "target_kind" in get.obj else meta.target_kind
    if kind not in TARGET_KINDS:
        get.fail("target_kind", f"is {kind!r}, not one of {TARGET_KINDS} (a newer lightning_lmdb built it: upgrade)")
    names, split_names = (get.list_of(key, str) if key in get.obj else [] for key in ("target_names", "split_names"))
    typed: dict[str, Any] = {"target_kind": kind, "target_names": names, "split_names": split_names}
    if kind in LABEL_KINDS:
        offsets, labels = read("label_offsets"), read("labels")
        if offsets[0] != 0 or offsets[-1] != len(labels) or np.any(np.diff(offsets) < 0):
            get.fail("arrays", "holds label offsets that do not index its labels")
        if len(labels) and (labels.min() < 0 or labels.max() >= len(meta.classes)):
            get.fail("arrays", f"holds a label outside its {len(meta.classes)} classes")
        typed.update(labels=labels, label_offsets=offsets)
    elif kind == "regression":
        values = read("values")
        if not names or len(values) != meta.count * len(names):
            get.fail("arrays", f"holds {len(values)} regression values for {meta.count} records of {len(names)} values")
        typed["values"] = values
    if kind == "mask":
        typed["ignore_index"] = get("ignore_index", int)
        if arrays:
            offsets, blob = read("mask_path_offsets"), read("mask_paths")
            if offsets[0] != 0 or offsets[-1] != len(blob) or np.any(np.diff(offsets) < 0):
                get.fail("arrays", "holds mask path offsets that do not index its mask paths")
            typed["mask_paths"] = PathTable(blob, offsets)
    if split_names:
        splits = read("splits")
        if len(splits) and int(splits.max()) >= len(split_names):
            get.fail("arrays", f"holds a split index outside its {len(split_names)} split names")
        typed["splits"] = splits
    for array in (v for v in typed.values() if isinstance(v, np.ndarray)):
        array.flags.writeable = False
    return typed
