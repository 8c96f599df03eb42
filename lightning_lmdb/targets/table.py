"""Every record's target in numpy arrays (:class:`TargetTable`), and the typed-target fields of a database header
(:func:`read_typed`). What the arrays mean is the kind's (:mod:`lightning_lmdb.targets.base`): the table asks it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_lmdb.errors import DatabaseError
from lightning_lmdb.pathtable import PathTable
from lightning_lmdb.targets.base import Target, kind_names, target_kind

if TYPE_CHECKING:
    from lightning_lmdb.jsonfields import JsonFields


def concat_offsets(parts: Sequence[np.ndarray], starts: Sequence[int] | np.ndarray) -> np.ndarray:
    """Consecutive offset arrays (each per record plus one) as one, part ``i``'s shifted by ``starts[i]``."""
    return np.concatenate([[0]] + [o[1:] + s for o, s in zip(parts, starts, strict=True)]).astype(np.int64)


@dataclass(frozen=True, eq=False)
class TargetTable:
    """Every record's target, typed: numpy arrays, never one Python object per record. Its kind builds each sample's target.

    Attributes:
        kind: The target kind's name (:func:`lightning_lmdb.targets.target_kind`).
        index: ``int32`` per record: the class index (``class``), else ``-1``.
        width: Length of a served target tensor: the number of classes (``multilabel``; ``mask``: its classes), K (``regression``),
            else 0.
        labels: ``multilabel`` (``mask``: the classes its mask holds): each record's class indices, concatenated (``int32``).
        offsets: ``multilabel``, ``mask``: ``int64`` per record plus one; record ``i``'s labels are ``labels[offsets[i]:offsets[i+1]]``
            (a kind of variable length without labels: into ``values``).
        values: ``regression``: ``float32`` ``count x K`` (a kind of yours: as it packs them).
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
        return target_kind(kind).pack(targets, width)

    @classmethod
    def concat(cls, tables: Sequence[TargetTable]) -> TargetTable:
        """The tables of consecutive parts (a sharded database's shards) as one."""
        return target_kind(tables[0].kind).concat(tables)

    def __len__(self) -> int:
        return len(self.index)

    def item(self, row: int) -> Any:
        """Record ``row``'s target as a dataset serves it: an ``int``, or a ``float32`` tensor ``[width]`` (the kind's :meth:`item`).

        Raises:
            TypeError: A ``mask`` table: a mask is read with its record, not from this table (:meth:`tolist` gives the classes
                each mask holds).
        """
        return target_kind(self.kind).item(self, row)

    def tolist(self, rows: np.ndarray | None = None) -> list[Any]:
        """The targets of ``rows`` (all when ``None``) as plain values: class indices, lists of class indices (``multilabel``; the
        classes each mask holds for ``mask``), or lists of floats."""
        return target_kind(self.kind).tolist(self, rows)

    def freeze(self) -> TargetTable:
        """``self``, with its arrays made read-only."""
        for array in (self.index, self.labels, self.offsets, self.values):
            if array is not None:
                array.flags.writeable = False
        return self


def check_offsets(get: JsonFields, offsets: np.ndarray, items: np.ndarray, what: str, whose: str) -> None:
    """Fail (naming the header's ``arrays``: "holds ``what`` that do not index its ``whose``") unless ``offsets`` index ``items``
    (start at 0, end at its length, never decrease)."""
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(items) or np.any(np.diff(offsets) < 0):
        get.fail("arrays", f"holds {what} that do not index its {whose}")


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
    name = get("target_kind", str) if "target_kind" in get.obj else meta.target_kind
    if name not in kind_names():
        raise DatabaseError(f"{str(get.path)!r} holds targets of kind {name!r}, not one of {', '.join(map(repr, kind_names()))} "
                            "registered here: a newer lightning_lmdb built it (upgrade), or it is a target kind of your own: "
                            "register_target_kind() it first (lightning_lmdb.targets), in a module your loader workers import too.")
    kind = target_kind(name)
    names, split_names = (get.list_of(key, str) if key in get.obj else [] for key in ("target_names", "split_names"))
    typed: dict[str, Any] = {"target_kind": name, "target_names": names, "split_names": split_names}
    typed.update(kind.read(get, read, _Known(meta, names)))
    if kind.in_record:
        typed["ignore_index"] = get("ignore_index", int)
        if arrays:
            offsets, blob = read("mask_path_offsets"), read("mask_paths")
            check_offsets(get, offsets, blob, "mask path offsets", "mask paths")
            typed["mask_paths"] = PathTable(blob, offsets)
    if split_names:
        splits = read("splits")
        if len(splits) and int(splits.max()) >= len(split_names):
            get.fail("arrays", f"holds a split index outside its {len(split_names)} split names")
        typed["splits"] = splits
    for array in (v for v in typed.values() if isinstance(v, np.ndarray)):
        array.flags.writeable = False
    return typed


class _Known:
    """The metadata read so far, with the header's ``target_names`` (what :meth:`TargetKind.read` checks against)."""

    def __init__(self, meta: Any, target_names: list[str]):
        self.count, self.classes, self.target_names = meta.count, meta.classes, target_names
