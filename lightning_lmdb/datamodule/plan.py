"""What ``LMDBDataModule``'s constructor decides once, handed to its backend: a :class:`DataPlan`.

The plan is a frozen value: each split's source, the splits given a database, the build options, where the databases go and
how the samples are served. A backend (:mod:`lightning_lmdb.datamodule.backends`) is made from a plan alone and never sees the DataModule;
the database paths every rank and run agree on (:func:`database_name`) are computed here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_lmdb.deprecated import deprecated_names
from lightning_lmdb.errors import OptionError
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.remote.urls import is_remote, redact
from lightning_lmdb.sources import dataset as datasource
from lightning_lmdb.store import database


def database_name(folder: Path | Any, options: BuildOptions, split: str = "") -> str:
    """The file name of ``folder``'s database: its name and a hash of its path and of :meth:`BuildOptions.cache_key`.

    For a map-style Dataset: its class name and a hash of its :func:`~lightning_lmdb.sources.dataset.identity` (class, length, a
    ``Subset``'s indices, a few samples' bytes, ``manifest.version``), the ``split`` it is given for (two datasets of one class
    and length, e.g. ``MyDS("val")`` and ``MyDS("test")``, are two databases) and the cache key: the same in every process and
    run, never of the object's ``id`` or ``repr``.
    """
    if isinstance(folder, Path):
        text, name = f"{folder}", folder.name
    elif is_remote(folder):  # a prefix or manifest of object storage: its URL (redacted; never the storage options)
        text = redact(folder.rstrip("/"))
        name = re.sub(r"[^\w.-]", "_", text.rsplit("/", 1)[-1])
    else:
        qualname = type(folder).__qualname__
        text = f"{datasource.identity(folder, options.manifest.version)}\0{split}"
        name = re.sub(r"[^\w.-]", "_", qualname.rsplit(".", 1)[-1])
    key = hashlib.sha256(f"{text}{options.cache_key()}".encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{name}-{key}.lmdb"


def recorded_root(given: Path) -> Path:
    """The source folder a given database records it was built from (its paths are relative to it; a URL stays its string)."""
    root = database.load_meta(given).source.root
    return root if is_remote(root) else Path(root)  # type: ignore[return-value]


def given_source(sources: Mapping[str, Path | Any], split: str) -> Path | Any:
    """The data given for ``split`` (a folder, a manifest, a database, or a Dataset); an :class:`OptionError` when none was."""
    source = sources[split]
    if source is None:
        raise OptionError(f"No {split}_dir was given.")
    return source


@dataclass(frozen=True, eq=False)
class DataPlan:
    """The data a DataModule serves and how, made once from its arguments (checked and resolved).

    Attributes:
        sources: Each split's source: a folder, manifest or database (resolved), or a Dataset, or ``None``.
        given_as: Each split's source as the user gave it (the hyper-parameter: a string, a Dataset's description, ``None``),
            for messages.
        given_databases: The splits given a database (served as it is, never built) rather than a source.
        build_options: The module's build options (and source options, ``build_options.manifest``); a val or test split may
            map them through the training split's classes (the backend's ``split_options``).
        cache_dir: Where the databases are built.
        local_cache_dir: Where each node stages a copy of them (``None``: none).
        backend: ``"lmdb"`` or ``"raw"``.
        readahead: LMDB readahead (``None``: chosen by file size).
        shared_filesystem: The nodes of a multi-node job share ``cache_dir`` (each builds its part).
        remote_databases: The splits given a published database (split -> its URL); their source is where each node stages
            it (in ``local_cache_dir``).
    """

    sources: Mapping[str, Path | Any]
    given_as: Mapping[str, str | None]
    given_databases: frozenset[str]
    build_options: BuildOptions
    cache_dir: Path
    local_cache_dir: Path | None = None
    backend: str = "lmdb"
    readahead: bool | None = None
    shared_filesystem: bool = False
    remote_databases: Mapping[str, str] = field(default_factory=dict)

    def splits(self) -> list[str]:
        """The splits given a source or a database, in the order train, val, test."""
        return [split for split, given in self.sources.items() if given is not None]

    def given(self, split: str) -> Path | Any:
        """The data given for ``split`` (:func:`given_source`)."""
        return given_source(self.sources, split)

    def database_path(self, split: str, options: BuildOptions) -> Path:
        """Where the database of ``split``'s source, built with ``options``, lives (:func:`database_name`); a given database
        itself."""
        if split in self.given_databases:
            return self.given(split)
        return self.cache_dir / database_name(self.given(split), options, split)

    def source_path(self, split: str) -> Path | Any:
        """The source of ``split``: the folder, manifest or Dataset, or the folder a given database was built from."""
        given = self.given(split)
        return recorded_root(given) if split in self.given_databases else given


#: Names kept for one release: old name -> (the object, its new name).
__getattr__ = deprecated_names(__name__, {"given_folder": (given_source, "given_source")})
