"""lightning_lmdb: pack image folders (or manifests, or Datasets) into LMDB files and serve them to PyTorch Lightning.

Public names are imported lazily, so ``import lightning_lmdb`` stays cheap (builder worker processes
and the CLI do not pay for importing torch until they need it).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "LightningLMDBError": "lightning_lmdb.errors",
    "build_lmdb": "lightning_lmdb.writer",
    "BuildError": "lightning_lmdb.errors",
    "StaleDatabaseError": "lightning_lmdb.errors",
    "DiskFullError": "lightning_lmdb.errors",
    "DatabaseError": "lightning_lmdb.errors",
    "ImageDecodeError": "lightning_lmdb.errors",
    "BuildOptions": "lightning_lmdb.options",
    "verify_lmdb": "lightning_lmdb.verify",
    "describe_lmdb": "lightning_lmdb.verify",
    "LMDBImageDataset": "lightning_lmdb.dataset",
    "RawImageDataset": "lightning_lmdb.dataset",
    "LMDBDataModule": "lightning_lmdb.datamodule",
    "CacheDirError": "lightning_lmdb.errors",
    "stage": "lightning_lmdb.staging",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lightning_lmdb' has no attribute {name!r}")
