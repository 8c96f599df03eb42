"""The ``regression`` target kind: K numbers per sample, ``meta/values`` (``float32``, ``count x K``), served as a ``float32``
tensor ``[K]``; the K names are the header's ``target_names``."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_lmdb.targets.base import NO_TARGET, Target, TargetKind, TargetTable

if TYPE_CHECKING:
    from lightning_lmdb.jsonfields import JsonFields


class RegressionKind(TargetKind):
    """K numbers per sample."""

    name = "regression"
    DESCRIPTION = "K numbers per sample (a float32 tensor [K], K named by target_names)"

    def hold(self, raw: Any) -> Target:
        """A tuple of K finite floats."""
        numbers = raw if isinstance(raw, (list, tuple)) else [raw]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in numbers):
            raise ValueError("is not a list of finite numbers")
        return tuple(float(v) for v in numbers)

    def width(self, classes: Sequence[str], target_names: Sequence[str]) -> int:
        return len(target_names)

    def pack(self, targets: Sequence[Any], width: int) -> TargetTable:
        count = len(targets)
        values = np.array(targets, dtype=np.float32).reshape(count, width)
        return TargetTable(self.name, np.full(count, NO_TARGET, dtype=np.int32), width, values=values)

    def read(self, get: JsonFields, read: Callable[[str], np.ndarray], meta: Any) -> dict[str, np.ndarray]:
        values, names = read("values"), meta.target_names
        if not names or len(values) != meta.count * len(names):
            get.fail("arrays", f"holds {len(values)} regression values for {meta.count} records of {len(names)} values")
        return {"values": values}

    def table(self, meta: Any) -> TargetTable:
        width = self.width(meta.classes, meta.target_names)
        values = None if meta.values is None else meta.values.reshape(meta.count, width)
        return TargetTable(self.name, meta.targets, width, values=values)

    def item(self, table: TargetTable, row: int) -> Any:
        """A ``float32`` tensor ``[K]``."""
        import torch

        assert table.values is not None
        return torch.from_numpy(table.values[row].copy())

    def tolist(self, table: TargetTable, rows: np.ndarray | None) -> list[Any]:
        assert table.values is not None
        return (table.values if rows is None else table.values[rows]).tolist()

    def named(self, classes: Sequence[str], target: Any) -> Any:
        """The numbers as stored (``float32``)."""
        return np.asarray(target, dtype=np.float32).tolist()
