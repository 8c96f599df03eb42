"""OmegaConf resolvers for Hydra configs: the class count of the data, for a model's output size.

``${data.num_classes}`` is no config key (the count is a property of the DataModule, known from the data), so a model
config writes::

    output_size: ${lmdb_num_classes:${data}}             # the whole data config: its manifest options apply
    output_size: ${lmdb_num_classes:${data.train_dir}}   # or a folder, manifest or database path alone

``lmdb_num_classes`` returns what ``LMDBDataModule(...).num_classes`` returns for that data (:func:`num_classes`): a
database's metadata when ``train_dir`` is one, else the source's classes read as cheaply as its kind allows (class folders,
a manifest's label column). ``train.py`` registers it (importing :mod:`lightning_lmdb.experiment` does); another Hydra
project (e.g. lightning-hydra-template) adds one line before composing its config::

    import lightning_lmdb.experiment; lightning_lmdb.experiment.register_resolvers()
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from lightning_lmdb.errors import OptionError

#: The resolvers :func:`register_resolvers` registers, by name.
RESOLVER_NAMES = ("lmdb_num_classes",)
#: ``LMDBDataModule`` arguments that are objects, never in a data config the resolver reads.
_NOT_READ = ("self", "train_transform", "eval_transform")


def num_classes(data: Any) -> int:
    """The number of classes ``LMDBDataModule`` reports for ``data``, without building or loading anything it need not.

    Args:
        data: A data config (a mapping with ``train_dir`` and any other ``LMDBDataModule`` arguments: ``manifest``,
            ``cache_dir``, ...; other keys, e.g. ``_target_``, are ignored), or ``train_dir`` alone (a path).

    Raises:
        OptionError: No ``train_dir``.
    """
    from lightning_lmdb.datamodule.module import LMDBDataModule  # here: registering the resolver imports no torch

    if isinstance(data, Mapping):
        accepted = set(inspect.signature(LMDBDataModule.__init__).parameters) - set(_NOT_READ)
        settings = {key: _plain(value) for key, value in data.items() if key in accepted}
    else:
        settings = {"train_dir": _plain(data)}
    if settings.get("train_dir") is None:
        raise OptionError("lmdb_num_classes: the data config has no train_dir (data.train_dir=null); set data.train_dir=/path/to/images, "
                          "or write the class count in the model config.")
    settings["num_workers"] = 0  # no loader is made; a machine's core count must not matter here
    return LMDBDataModule(**settings).num_classes


def _plain(value: Any) -> Any:
    """An OmegaConf node as plain Python values (interpolations resolved); anything else as it is."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def register_resolvers() -> None:
    """Register :data:`RESOLVER_NAMES` with OmegaConf (again: a no-op), so a Hydra config can write
    ``${lmdb_num_classes:${data}}``."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("lmdb_num_classes"):
        OmegaConf.register_new_resolver("lmdb_num_classes", num_classes)
