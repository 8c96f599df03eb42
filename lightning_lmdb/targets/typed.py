"""The typed-target fields of a database header (:func:`read_typed`): each kind's arrays, read and checked by its kind
(:mod:`lightning_lmdb.targets.base`) into a :class:`~lightning_lmdb.targets.base.TargetTable`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_lmdb.errors import DatabaseError
from lightning_lmdb.pathtable import PathTable
from lightning_lmdb.targets.base import check_offsets, kind_names, target_kind

if TYPE_CHECKING:
    from lightning_lmdb.jsonfields import JsonFields


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
