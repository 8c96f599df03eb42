"""The ``none`` target kind: no label; ``meta/targets`` holds ``-1`` (``NO_TARGET``), served as ``-1`` (as a flat folder)."""

from __future__ import annotations

from typing import Any

from lightning_lmdb.targets.base import NO_TARGET, Target, TargetKind


class NoneKind(TargetKind):
    """No target: every sample's is ``NO_TARGET`` (``-1``)."""

    name = "none"
    DESCRIPTION = "no target (-1 for every sample, as a flat folder)"
    typed = False

    def hold(self, raw: Any) -> Target:
        """``NO_TARGET`` for ``None`` or ``-1``."""
        if raw is None or raw == NO_TARGET:
            return NO_TARGET
        raise ValueError("is a value, not None")
