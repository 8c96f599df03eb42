"""The DataModule: :class:`~lightning_lmdb.datamodule.module.LMDBDataModule` and what serves it.

Contract: the constructor's arguments become options (``options``) and one
:class:`~lightning_lmdb.datamodule.plan.DataPlan` (sources, given databases, build options, paths); a serving
backend (``backends``: LMDB, raw files, a given database) gets the plan, never the DataModule. ``labels`` checks
the splits' classes agree; ``loaders`` makes the tuned DataLoaders. The top layer of the library:
it may import every other subpackage, and none imports it (only :mod:`lightning_lmdb.experiment`).
``lightning_lmdb.datamodule`` re-exports ``module`` (``LMDBDataModule``, ``choose_shuffle``).
"""

from __future__ import annotations

from typing import Any

from lightning_lmdb.datamodule import module as _module
from lightning_lmdb.datamodule.module import *  # noqa: F403  (the old module's names, at the package's path)


def __getattr__(name: str) -> Any:
    return getattr(_module, name)
