"""The ``class`` target kind: a class index per sample, ``meta/targets`` (``int32``), served as an ``int`` (as ``ImageFolder``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_lmdb.targets.base import TargetKind


class ClassKind(TargetKind):
    """A class index per sample: the defaults of :class:`~lightning_lmdb.targets.base.TargetKind`, compared by class name."""

    name = "class"
    DESCRIPTION = "a class index per sample (an int, as ImageFolder serves it)"
    typed = False

    def named(self, classes: Sequence[str], target: Any) -> Any:
        """The class name (the index itself when it is outside the classes)."""
        return classes[target] if 0 <= target < len(classes) else target
