"""The ``multilabel`` target kind: a set of class indices per sample, ``meta/labels`` + ``meta/label-offsets``, served as a
``float32`` multi-hot tensor ``[C]`` over the classes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_lmdb.targets.base import NO_TARGET, Target, TargetKind, TargetTable, check_offsets

if TYPE_CHECKING:
    from lightning_lmdb.jsonfields import JsonFields


class MultilabelKind(TargetKind):
    """Class indices per sample, stored as each record's labels concatenated plus ``int64`` offsets (count + 1)."""

    name = "multilabel"
    DESCRIPTION = "a set of class indices per sample (a float32 multi-hot tensor over the classes)"
    class_lists = True

    def hold(self, raw: Any) -> Target:
        """A sorted tuple of distinct class indices."""
        items = raw if isinstance(raw, (list, tuple)) else [raw]
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
            raise ValueError("is not a list of class indices")
        return tuple(sorted(set(items)))

    def width(self, classes: Sequence[str], target_names: Sequence[str]) -> int:
        return len(classes)

    def pack(self, targets: Sequence[Any], width: int) -> TargetTable:
        count = len(targets)
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum([len(t) for t in targets], out=offsets[1:])
        labels = np.fromiter((i for t in targets for i in t), dtype=np.int32, count=int(offsets[-1]))
        return TargetTable(self.name, np.full(count, NO_TARGET, dtype=np.int32), width, labels=labels, offsets=offsets)

    def read(self, get: JsonFields, read: Callable[[str], np.ndarray], meta: Any) -> dict[str, np.ndarray]:
        offsets, labels = read("label_offsets"), read("labels")
        check_offsets(get, offsets, labels, "label offsets", "labels")
        if len(labels) and (labels.min() < 0 or labels.max() >= len(meta.classes)):
            get.fail("arrays", f"holds a label outside its {len(meta.classes)} classes")
        return {"labels": labels, "label_offsets": offsets}

    def item(self, table: TargetTable, row: int) -> Any:
        """A ``float32`` multi-hot tensor ``[width]``."""
        import torch  # here: reading a database's metadata (info, verify) does not import torch

        assert table.labels is not None and table.offsets is not None
        hot = np.zeros(table.width, dtype=np.float32)  # numpy, then one tensor: ~3 us a sample, half of torch's indexing
        hot[table.labels[table.offsets[row] : table.offsets[row + 1]]] = 1.0
        return torch.from_numpy(hot)

    def tolist(self, table: TargetTable, rows: np.ndarray | None) -> list[Any]:
        assert table.labels is not None and table.offsets is not None
        picked = range(len(table)) if rows is None else rows
        return [table.labels[table.offsets[r] : table.offsets[r + 1]].tolist() for r in picked]

    def named(self, classes: Sequence[str], target: Any) -> Any:
        """The sorted class names."""
        return sorted(classes[k] if 0 <= k < len(classes) else str(k) for k in target)
