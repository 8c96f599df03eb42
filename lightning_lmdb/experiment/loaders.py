"""The datasets behind a fit's dataloaders, and turning their loader statistics on.

:class:`~lightning_lmdb.experiment.callbacks.PerfMonitor` asks these datasets (``LMDBImageDataset``,
``RawImageDataset``, or any with an ``enable_loader_stats()`` method; also inside a ``Subset`` or
``ConcatDataset``) for their :class:`~lightning_lmdb.read.loadstats.LoaderStats`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from lightning_lmdb.read.loadstats import LoaderStats


def _datasets(dataset: Any) -> Iterator[Any]:
    """``dataset`` and the datasets inside it (``Subset``, ``ConcatDataset``), depth first."""
    yield dataset
    if isinstance(dataset, Subset):
        yield from _datasets(dataset.dataset)
    elif isinstance(dataset, ConcatDataset):
        for inner in dataset.datasets:
            yield from _datasets(inner)


def _loaders(loaders: Any) -> Iterator[Any]:
    """The dataloaders in what ``trainer.train_dataloader`` / ``val_dataloaders`` return (one, or a list/dict of them)."""
    if isinstance(loaders, Mapping):
        for value in loaders.values():
            yield from _loaders(value)
    elif isinstance(loaders, (list, tuple)):
        for value in loaders:
            yield from _loaders(value)
    elif loaders is not None:
        yield loaders


def _enable(dataset: Any) -> LoaderStats | None:
    """Turn ``dataset``'s loader statistics on when it has an ``enable_loader_stats()`` method; its stats, else None."""
    enable = getattr(dataset, "enable_loader_stats", None)
    if not callable(enable):
        return None
    try:
        stats = enable()
    except Exception:  # a user's own hook: never let it stop training
        return None
    return stats if isinstance(stats, LoaderStats) else None


def loader_stats_of(loaders: Any) -> tuple[list[LoaderStats], bool]:
    """The :class:`LoaderStats` of the datasets behind ``loaders``, and whether every loader has ``num_workers=0``.

    A dataset with an ``enable_loader_stats()`` method (``LMDBImageDataset``, ``RawImageDataset``) is asked for
    its stats (turned on if they were off); other datasets have none.
    """
    found: dict[int, LoaderStats] = {}
    in_process = True
    for loader in _loaders(loaders):
        in_process = in_process and not getattr(loader, "num_workers", 0)
        for dataset in _datasets(getattr(loader, "dataset", None)):
            stats = _enable(dataset)
            if stats is not None:
                found.setdefault(id(stats), stats)
    return list(found.values()), in_process


def _fit_datasets(trainer: pl.Trainer, pl_module: pl.LightningModule) -> Iterator[Any]:
    """The datasets a fit may load that exist before its loaders are made (and start their workers).

    Those behind the loaders given to ``fit`` (Lightning keeps them in ``trainer.fit_loop._data_source``),
    and those the DataModule and the LightningModule hold as attributes (also in a dict, list or tuple, or
    behind a ``DataLoader``), with the datasets inside them (``Subset``, ``ConcatDataset``).
    """
    given = getattr(getattr(getattr(trainer, "fit_loop", None), "_data_source", None), "instance", None)
    if given is not None and not isinstance(given, (pl.LightningModule, pl.LightningDataModule)):
        for loader in _loaders(given):
            yield from _datasets(getattr(loader, "dataset", None))
    for holder in (getattr(trainer, "datamodule", None), pl_module):
        for value in vars(holder).values() if holder is not None else ():
            items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (list, tuple)) else (value,)
            for item in items:
                if isinstance(item, DataLoader):
                    item = item.dataset
                if isinstance(item, Dataset):
                    yield from _datasets(item)
