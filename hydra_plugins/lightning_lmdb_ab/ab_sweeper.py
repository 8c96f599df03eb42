"""Hydra sweeper plugin ``ABSweeper`` (Hydra loads plugins from the ``hydra_plugins`` package only).

See :mod:`lightning_lmdb.experiment.sweeper` for the job order it produces.
"""

from __future__ import annotations

from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override

from lightning_lmdb.experiment.sweeper import interleave


class ABSweeper(BasicSweeper):
    """A basic sweeper that runs ``ab.repeats`` interleaved rounds of the sweep (configure with ``ab.repeats=R``).

    Args:
        max_batch_size: As Hydra's basic sweeper (jobs launched per batch; ``None``: all at once).
        params: As Hydra's basic sweeper (sweep parameters declared in the config).
    """

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None):
        super().__init__(max_batch_size=max_batch_size, params=params)

    def split_arguments(self, overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:  # type: ignore[override]
        """The jobs of every round, interleaved, each tagged with ``ab.repeat``, in batches of ``max_batch_size``."""
        jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        return interleave(jobs, self.repeats(), max_batch_size)

    def repeats(self) -> int:
        """``ab.repeats`` of the config (1 when absent)."""
        ab: Any = self.config.get("ab") if self.config is not None else None
        repeats = 1 if ab is None else ab.get("repeats", 1)
        if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
            raise ValueError(f"ab.repeats={repeats!r} must be an integer >= 1 (e.g. ab.repeats=3).")
        return repeats
