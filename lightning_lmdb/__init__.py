"""lightning_lmdb: pack an image folder into one LMDB file and serve it to PyTorch Lightning.

The package follows the pipeline, one subpackage per stage (each ``__init__`` states its contract)::

    errors, jsonfields, pathtable   the base: one error hierarchy, JSON fields, compact path tables
    codec/       bytes <-> pixels: storage modes, record codecs, decoders
    targets/     target kinds: what a sample's target is, stored, served, transformed, collated
    sources/     what a database is built from: folders, manifests, Datasets (source kinds)
    options      BuildOptions
    store/       the on-disk format, opening databases, shards
    build/       build_lmdb: one file or sharded, the reader pool
    read/        the datasets, views, block reads, sampler, decoding, transforms
    tools/       the CLI, verify / info, bench, staging, page cache, latency mount
    datamodule/  LMDBDataModule, its backends, plan, loaders
    experiment/  train.py's A/B (not imported by the library)

A module imports only from its own stage and the stages above it in this list (``tests/test_layers.py``). Public
names are imported lazily, so ``import lightning_lmdb`` stays cheap (builder worker processes and the CLI do not
pay for importing torch until they need it). Old flat module paths (``lightning_lmdb.format`` ...) keep working
through :mod:`lightning_lmdb._moved`.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning_lmdb import _moved

__version__ = "0.1.0"

_EXPORTS = {
    "LightningLMDBError": "lightning_lmdb.errors",
    "build_lmdb": "lightning_lmdb.build.writer",
    "BuildError": "lightning_lmdb.errors",
    "StaleDatabaseError": "lightning_lmdb.errors",
    "DiskFullError": "lightning_lmdb.errors",
    "DatabaseError": "lightning_lmdb.errors",
    "ImageDecodeError": "lightning_lmdb.errors",
    "BuildOptions": "lightning_lmdb.options",
    "verify_lmdb": "lightning_lmdb.tools.verify",
    "describe_lmdb": "lightning_lmdb.tools.verify",
    "LMDBImageDataset": "lightning_lmdb.read.dataset",
    "RawImageDataset": "lightning_lmdb.read.raw",
    "LMDBDataModule": "lightning_lmdb.datamodule.module",
    "CacheDirError": "lightning_lmdb.errors",
    "stage": "lightning_lmdb.tools.staging",
}

__all__ = ["__version__", *_EXPORTS]

_moved.install()


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lightning_lmdb' has no attribute {name!r}")
