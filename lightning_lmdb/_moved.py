"""Old module paths of the flat layout, kept working by one import hook.

Until version 0.2 every module sat directly in ``lightning_lmdb/``. Each moved module's old path still imports, as
the **same module object** as its new path (patching ``lightning_lmdb.format.read_meta`` patches the running code),
and warns with a ``DeprecationWarning`` naming the new path -- except the paths that docs/README.md lists as stable,
which never warn. :func:`install` (run by ``import lightning_lmdb``) puts the hook on :data:`sys.meta_path`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: Old module path -> new module path.
MOVED: dict[str, str] = {
    f"lightning_lmdb.{old}": f"lightning_lmdb.{new}"
    for old, new in {
        "decoders": "codec.decoders",
        "zstd": "codec.zstd",
        "imageinfo": "codec.imageinfo",
        "folder": "sources.folder",
        "manifest": "sources.manifest",
        "manifestfile": "sources.manifestfile",
        "masks": "sources.masks",
        "datasource": "sources.dataset",
        "format": "store.format",
        "database": "store.database",
        "envs": "store.envs",
        "shards": "store.shards",
        "fsops": "store.fsops",
        "writer": "build.writer",
        "filebuild": "build.onefile",
        "shardbuild": "build.sharded",
        "readers": "build.readers",
        "dataset": "read.dataset",
        "rawdataset": "read.raw",
        "views": "read.views",
        "blockread": "read.blockread",
        "sampler": "read.sampler",
        "decoding": "read.decoding",
        "batchdecode": "read.batchdecode",
        "transforms": "read.transforms",
        "loadstats": "read.loadstats",
        "cli": "tools.cli",
        "verify": "tools.verify",
        "bench": "tools.bench",
        "netfs": "tools.netfs",
        "cache": "tools.pagecache",
        "staging": "tools.staging",
        "backends": "datamodule.backends",
        "dm_options": "datamodule.options",
        "dm_loaders": "datamodule.loaders",
        "dm_plan": "datamodule.plan",
        "dm_targets": "datamodule.labels",
    }.items()
}

#: Old paths that docs/README.md lists as stable import paths: they keep working and never warn.
STABLE: frozenset[str] = frozenset(
    f"lightning_lmdb.{name}"
    for name in ("sampler", "blockread", "transforms", "decoders", "batchdecode", "netfs", "database", "staging", "cli")
)


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module already at its new path."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set it to the old path's spec: the module stays its new self
        if self.old not in STABLE:
            warnings.warn(f"{self.old} moved to {self.new}; import it from there (the old path goes in 0.3)", DeprecationWarning,
                          stacklevel=2)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED`, nothing else."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(fullname, new))


def install() -> None:
    """Put the old paths' hook on :data:`sys.meta_path` (once per process)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
