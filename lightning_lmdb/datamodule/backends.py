"""What ``LMDBDataModule`` does per backend: build and serve LMDB files (:class:`LMDBBackend`) or the source itself (:class:`RawBackend`:
the image files, or a Dataset source's own samples).

A backend is made from a :class:`~lightning_lmdb.datamodule.plan.DataPlan` (what the constructor decided once) and :class:`Hooks` (the
few steps a DataModule subclass may wrap: paths, timings, the node); it never sees the DataModule. It finds (and keeps) each split's
labels before ``setup`` and its build options (:meth:`ServingBackend.split_options`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from lightning_lmdb.build.writer import build_lmdb, build_shards, find_bad_files
from lightning_lmdb.datamodule.plan import DataPlan, recorded_root  # noqa: F401 (recorded_root: re-exported, it was defined here)
from lightning_lmdb.deprecated import deprecated_names
from lightning_lmdb.errors import CacheDirError, SourceError
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.read import blockread
from lightning_lmdb.read.dataset import ImageDatasetBase, LMDBImageDataset
from lightning_lmdb.read.raw import RawImageDataset, SampleReads, SourceDataset, mask_classes, read_samples
from lightning_lmdb.remote.urls import is_remote
from lightning_lmdb.sources import base as sources
from lightning_lmdb.sources import coco, folder, manifest, voc, yolo
from lightning_lmdb.sources import dataset as datasource
from lightning_lmdb.sources.base import SourceScan, scan_source
from lightning_lmdb.store import database, fsops
from lightning_lmdb.store.format import DatabaseError, Metadata
from lightning_lmdb.targets import target_kind
from lightning_lmdb.tools import netfs
from lightning_lmdb.tools.staging import stage, stage_remote, staged_path

log = logging.getLogger(__name__)

#: Why a folder cannot be written, per errno.
_NOT_WRITABLE = {errno.EROFS: "a read-only file system", errno.EACCES: "permission denied", errno.EPERM: "permission denied"}


def on_disk(path: str | os.PathLike[str]) -> str:
    """``path`` on the disk, for a path through a latency mount (a cold-cache epoch evicts the disk's pages)."""
    return str(netfs.disk_path(path))


@contextlib.contextmanager
def writing_to(folder: Path, option: str) -> Iterator[None]:
    """Turn a refused write in (or on the way to) ``folder`` into a :class:`CacheDirError` naming ``option`` and the fix."""
    try:
        yield
    except OSError as exc:
        name = None if exc.filename is None else Path(os.fsdecode(exc.filename)).absolute()
        where = folder.absolute()
        if isinstance(exc, CacheDirError) or exc.errno not in _NOT_WRITABLE or name is None \
                or not (name.is_relative_to(where) or where.is_relative_to(name)):
            raise
        raise CacheDirError(
            f"{option} {str(folder)!r} is not writable ({_NOT_WRITABLE[exc.errno]}: {str(name)!r}). Choose a writable {option} "
            f"(Hydra: data.{option}=/path/on/a/writable/disk)."
        ) from exc


#: The target kinds whose targets index the classes: a val or test split's are mapped through the training split's classes.
_CLASS_KINDS = ("class", "multilabel", "boxes")
#: The source kinds that map their classes through given ones (``classes=``).
_MAPPABLE = (folder, manifest, coco, yolo, voc)


def _meta_labels(meta: Metadata) -> sources.Labels:
    return sources.Labels(meta.classes, meta.class_to_idx, meta.target_kind, meta.target_names)


def _no_step(name: str) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()


def _nothing_after(files: list[Path]) -> None:
    pass


def _one_node() -> tuple[int, int]:
    return 0, 1


@dataclass(frozen=True)
class Hooks:
    """The steps of a backend that whoever serves it may wrap (``LMDBDataModule`` passes its own overridable methods).

    Attributes:
        source_path: ``split`` -> its source as read (default: the plan's :meth:`~lightning_lmdb.datamodule.plan.DataPlan.source_path`).
        served_database_path: ``split`` -> the database the loaders read, unless staged (default: where it is built).
        timed: A context around one step of ``prepare_data`` / ``setup`` (``prepare_s``, ``stage_s``).
        after_reading_all: Called after the raw backend read each of these files once to validate them, as a build would.
        node: ``(node rank, number of nodes)`` of the job.
    """

    source_path: Callable[[str], Path | Any] | None = None
    served_database_path: Callable[[str], Path] | None = None
    timed: Callable[[str], contextlib.AbstractContextManager[Any]] = _no_step
    after_reading_all: Callable[[list[Path]], None] = _nothing_after
    node: Callable[[], tuple[int, int]] = _one_node


class ServingBackend:
    """Where a DataModule's samples come from: made from its :class:`~lightning_lmdb.datamodule.plan.DataPlan` and :class:`Hooks`."""

    def __init__(self, plan: DataPlan, hooks: Hooks | None = None):
        self.plan = plan
        self.hooks = hooks or Hooks()
        self.reads: dict[str, SampleReads] = {}  # split -> every sample of its Dataset read once (sample_reads)
        self.labels: dict[str, sources.Labels] = {}  # split -> its Dataset's labels before setup (dataset_labels)
        self._split_options: dict[str, BuildOptions] = {}  # split -> its build options, found once (split_options)

    def splits(self) -> list[str]:
        """The splits with a folder."""
        return self.plan.splits()

    def source_path(self, split: str) -> Path | Any:
        """The source of ``split`` as read (through :attr:`Hooks.source_path`)."""
        return (self.hooks.source_path or self.plan.source_path)(split)

    def database_path(self, split: str, options: BuildOptions | None = None) -> Path:
        """Where the database of ``split``'s source lives (built with ``options``, default :meth:`split_options`); a given
        database itself."""
        if split in self.plan.given_databases:
            return self.plan.given(split)
        return self.plan.database_path(split, options or self.split_options(split))

    def served_database_path(self, split: str) -> Path:
        """The database of ``split`` as the loaders read it, unless staged (through :attr:`Hooks.served_database_path`)."""
        return (self.hooks.served_database_path or self.database_path)(split)

    def check_splits(self) -> None:
        """Find each split's build options (:meth:`split_options`): a class the training split lacks is refused before any build."""
        for split in self.splits():
            self.split_options(split)

    def prepare(self) -> None:
        """``prepare_data``'s work (on each node's local rank 0): writes to disk only, sets no state."""
        self.check_splits()

    def after_barrier(self) -> None:
        """``setup``'s first work, once Lightning's barrier after ``prepare_data`` is passed."""

    def served_path(self, split: str) -> Path:
        """The path the loaders of ``split`` read (mounting it on first use)."""
        raise NotImplementedError

    def open(self, split: str) -> ImageDatasetBase:
        """The whole dataset of ``split``, without transforms."""
        raise NotImplementedError

    def database_paths(self) -> list[Path]:
        """The databases served (none for the raw backend)."""
        return []

    def cached_files(self, datasets: dict[str, ImageDatasetBase]) -> list[str]:
        """The files a cold-cache epoch evicts, on the disk (``datasets``: those set up)."""
        raise NotImplementedError

    def data_bytes(self, split: str, dataset: ImageDatasetBase) -> int:
        """Bytes of the data served for ``split`` (what ``shuffle=None`` compares with the memory available)."""
        raise NotImplementedError

    def block_size(self, split: str, dataset: ImageDatasetBase) -> int | None:
        """Records per block of a block-shuffled order of ``split``."""
        return getattr(dataset, "block_size", None)

    # --- labels and build options of each split, before setup --------------------------------------------------------------

    def served_meta(self, split: str | None = None) -> tuple[str, Path | Any, Metadata | None, ModuleType | None]:
        """``split`` (default: the first) and its source, the metadata of the database served for it without reading the source (a
        given database, or with ``on_stale="ignore"`` an existing one whose source is gone), and the source's kind."""
        plan = self.plan
        split, given = next((s, d) for s, d in plan.sources.items() if d is not None and split in (None, s))
        if split in plan.given_databases:
            return split, given, database.load_meta(given), None
        kind = sources.kind_of(given)
        if kind is None and plan.backend == "lmdb":  # on_stale="ignore" serves an existing database without its folder
            return split, given, database.load_meta(self.database_path(split)), None
        return split, given, None, kind

    def split_labels(self, split: str | None = None) -> sources.Labels:
        """The labels of ``split`` (default: the first split) read without its samples: a database's metadata, else its source's
        (:func:`sources.labels_of`; a Dataset's: :meth:`dataset_labels`)."""
        split, given, meta, kind = self.served_meta(split)
        if meta is not None:
            return _meta_labels(meta)
        if kind is datasource:
            return self.dataset_labels(split)
        return sources.labels_of(given, self.plan.build_options.manifest) if kind is not None else sources.Labels([], {}, "none")

    def split_options(self, split: str) -> BuildOptions:
        """The build options of ``split``'s database (and of the raw backend's scan of its source), found once.

        The plan's options, but for a val or test folder or manifest whose own classes would get other targets than the training
        split's (e.g. a test folder lacking one of training's class folders: the folders after it would shift down): there
        ``classes`` is the training split's classes, so both backends serve each sample of class ``"x"`` with training's target
        of ``"x"``, and the database's name changes with the mapping (its cache key holds the classes). A split whose classes get
        training's targets already keeps the plan's options (and its database).

        Raises:
            SourceError: The split has a class the training split lacks; or it is a given database or a Dataset (whose targets are
                its own) that maps its classes to other targets than training (each named, with the fixes).
        """
        if split not in self._split_options:
            self._split_options[split] = self._mapped_options(split)
        return self._split_options[split]

    def _mapped_options(self, split: str) -> BuildOptions:
        plan = self.plan
        options, given = plan.build_options, plan.sources[split]
        kind = None if split in plan.given_databases else sources.kind_of(given)
        if split == "train" or given is None or plan.sources["train"] is None or (kind is None and split not in plan.given_databases):
            return options  # nothing to map, or nothing to map through, or (on_stale="ignore") no source to read
        # a Dataset's classes only when known without reading its samples (its targets are its own: compared, never mapped)
        own = sources.Labels(*datasource.classes(given, options.manifest), "class") if kind is datasource else self.split_labels(split)
        if own.target_kind not in _CLASS_KINDS or not own.classes:
            return options
        train = self.split_labels("train")
        if train.target_kind not in _CLASS_KINDS or not train.classes or own.class_to_idx == train.class_to_idx:
            return options
        where = f"{split}_dir {plan.given_as[split]!r}"
        missing = [name for name in own.classes if name not in train.class_to_idx]
        if missing:
            raise SourceError(
                f"{where} has the class(es) {', '.join(map(repr, missing))}, which train_dir {plan.given_as['train']!r} lacks: "
                f"a model trained on its {len(train.classes)} classes cannot predict them. Add training samples of them to train_dir, "
                f"remove them from {split}_dir, or name every class in target order for all splits: source_options={{'classes': [...]}} "
                "(Hydra: data.source_options.classes=[...])."
            )
        if kind not in _MAPPABLE:  # a database's targets are stored, a Dataset's are its own: they cannot be mapped here
            moved = ", ".join(f"{name!r} is {k} there, {train.class_to_idx[name]} in training"
                              for name, k in own.class_to_idx.items() if train.class_to_idx[name] != k)
            fix = (f"or rebuild it with them (lightning-lmdb build ... --classes {','.join(train.classes)})" if kind is None else
                   f"or make its targets index train_dir's classes {train.classes!r}")
            raise SourceError(
                f"{where} gives its classes other targets than train_dir ({moved}): its samples would be scored against the wrong "
                f"classes. Pass its source (a folder or manifest) instead, which is mapped through train_dir's classes, {fix}."
            )
        return options.replace(classes=tuple(train.classes))

    def current_meta(self, split: str, scan: SourceScan) -> Metadata | None:
        """The metadata (with its arrays) of ``split``'s database in ``cache_dir`` when it is current: built from ``scan``'s source
        as it is now, with the plan's ``max_pixels``; else ``None``."""
        built = self.database_path(split)
        try:
            meta = database.load_meta(built, arrays=True) if built.exists() else None
        except (FileNotFoundError, DatabaseError):
            return None
        current = meta is not None and meta.source.fingerprint == scan.fingerprint()
        return meta if current and meta.options.get("max_pixels") == self.plan.build_options.max_pixels else None

    def sample_reads(self, split: str, scan: SourceScan | None = None) -> SampleReads:
        """Every sample of ``split``'s Dataset read once as a build reads them (:func:`~lightning_lmdb.read.raw.read_samples`, by
        ``build_workers`` reader processes; bad ones left out with ``on_error="skip"``, logged), kept for this backend."""
        if split not in self.reads:
            options = self.plan.build_options
            scan = scan or scan_source(self.source_path(split), options.manifest)
            reads = read_samples(scan, max_pixels=options.max_pixels, workers=options.workers, on_error=options.on_error)
            if reads.bad:
                log.warning("%d bad samples of %s are left out, as a build leaves them out:\n%s", len(reads.bad), scan.root,
                            "\n".join(f"  [{s.path}]: {s.reason}" for s in reads.bad))
            self.reads[split] = reads
        return self.reads[split]

    def mask_labels(self, split: str) -> sources.Labels:
        """The classes of ``split``'s mask source before ``setup``, when only its masks tell them: its current database's (in
        ``cache_dir``), else :meth:`find_mask_labels`'s; found once."""
        if split not in self.labels:
            scan = scan_source(self.source_path(split), self.plan.build_options.manifest)
            meta = self.current_meta(split, scan)
            self.labels[split] = _meta_labels(meta) if meta is not None else self.find_mask_labels(split, scan)
        return self.labels[split]

    def find_mask_labels(self, split: str, scan: SourceScan) -> sources.Labels:
        """The classes of a mask source without a current database: every mask (but a build's bad files) read here."""
        options = self.plan.build_options
        bad = {s.path for s in find_bad_files(scan, max_pixels=options.max_pixels, workers=options.workers)} \
            if options.on_error == "skip" else set()
        classes = mask_classes(scan, bad)
        return sources.Labels(classes, {c: k for k, c in enumerate(classes)}, "mask")

    def dataset_labels(self, split: str) -> sources.Labels:
        """The classes and target kind of ``split``'s Dataset before ``setup``, found once: from one sample
        (:func:`~lightning_lmdb.read.raw.source_labels`) when that tells them, else a current database's, else every
        sample read once (:meth:`sample_reads`, which the raw backend's ``setup`` then serves)."""
        if split not in self.labels:
            source, options = self.source_path(split), self.plan.build_options
            found = datasource.labels(source, options.manifest, read_all=False, max_pixels=options.max_pixels)
            if found is None:
                scan = scan_source(source, options.manifest)
                meta = self.current_meta(split, scan)
                found = _meta_labels(meta) if meta is not None else self.sample_reads(split, scan).labels
            self.labels[split] = found
        return self.labels[split]


class LMDBBackend(ServingBackend):
    """Builds each folder's database in ``prepare_data`` (this node's part of it on a shared file system), stages it, serves it.

    A given database is served as it is: never built, nothing written to ``cache_dir`` for it (it is staged like the others).
    """

    def prepare(self) -> None:
        super().prepare()
        plan = self.plan
        # mounted first: not part of prepare_s
        to_build = {split: self.source_path(split) for split in self.splits() if split not in plan.given_databases}
        node, nodes = self.hooks.node()
        with self.hooks.timed("prepare_s"):
            for split, source in to_build.items():
                target, options = self.database_path(split), self.split_options(split)
                with writing_to(plan.cache_dir, "cache_dir"):
                    if not (plan.shared_filesystem and nodes > 1):
                        build_lmdb(source, target, options)
                    elif options.shards is not None:  # this node's shards; the node completing the last one writes the manifest
                        mine = list(range(node, options.shards, nodes))
                        if mine:
                            build_shards(source, target, options, mine)
                    elif node == 0:  # one file: node 0 builds it, the others wait at Lightning's barrier after prepare_data
                        build_lmdb(source, target, options)
                    if node == 0 and target.exists():
                        self._retire_old_default(split, target)
        if not (plan.shared_filesystem and nodes > 1):  # else after the barrier: another node may still be building them here
            self._stage()

    def _retire_old_default(self, split: str, built: Path) -> None:
        """Delete the copy of ``split``'s database that the old default, ``storage="encoded"``, left in the cache.

        ``storage="auto"`` replaced ``"encoded"`` as the default; its database has a name of its own (the storage is part
        of the cache key), so the one the old default built would otherwise stay beside it, unused, as large
        as the images. It goes once the new one is built (with ``storage="encoded"`` asked for again, it is
        built again).
        """
        if self.plan.build_options.storage != "auto":
            return
        old = self.database_path(split, self.split_options(split).replace(storage="encoded"))
        if old == built or not old.exists():
            return
        for path in (old, *fsops.build_files(old)):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        log.info("Removed %s: the database of the former default storage='encoded', replaced by %s (storage='auto').", old, built)

    def after_barrier(self) -> None:
        if self.plan.shared_filesystem and self.hooks.node()[1] > 1:  # every node's databases are complete now
            self._stage()

    def _stage(self) -> None:
        """Copy each database to ``local_cache_dir`` (if set); a copy that is current is kept (one copy per node: staging locks)."""
        local = self.plan.local_cache_dir
        if local is None:
            return
        remote = self.plan.remote_databases
        served = [remote.get(split) or self.served_database_path(split) for split in self.splits()]  # mounted first
        with self.hooks.timed("stage_s"):
            for database in served:
                with writing_to(local, "local_cache_dir"):
                    report = stage_remote(database, local, progress=True) if isinstance(database, str) else stage(database, local)
                rank_zero_info(f"LMDBDataModule: {report.path} {report.action} ({report.bytes_copied / 1e6:.0f} MB in "
                               f"{report.seconds:.1f} s)")

    def find_mask_labels(self, split: str, scan: SourceScan) -> sources.Labels:
        """The classes of a mask source without a current database: what its database records, built here (``prepare_data``'s
        work, :meth:`prepare`, done once: ``prepare_data`` then finds it current).

        Raises:
            SourceError: The database is still missing (another node of a multi-node job builds it): pass ``num_classes``.
        """
        self.prepare()
        built = self.database_path(split)
        if not built.exists():
            raise SourceError(f"The mask classes of {str(scan.root)!r} are known once its database is built, which another node builds "
                              "(shared_filesystem): pass them before setup(), e.g. source_options={'num_classes': N} (Hydra: "
                              "data.source_options.num_classes=N), or read num_classes after setup().")
        return _meta_labels(database.load_meta(built))

    def served_path(self, split: str) -> Path:
        """The database file the loaders of ``split`` read: its staged local copy, or :meth:`served_database_path`."""
        if self.plan.local_cache_dir is not None:
            return staged_path(self.database_path(split), self.plan.local_cache_dir)
        return self.served_database_path(split)

    def open(self, split: str) -> LMDBImageDataset:
        return LMDBImageDataset(self.served_path(split), readahead=self.plan.readahead)

    def database_paths(self) -> list[Path]:
        return [self.database_path(split) for split in self.splits()]

    def cached_files(self, datasets: dict[str, ImageDatasetBase]) -> list[str]:
        return [on_disk(f) for split in self.splits() for f in database.database_files(self.served_path(split))]

    def data_bytes(self, split: str, dataset: ImageDatasetBase) -> int:
        return database.database_bytes(self.served_path(split))


class RawBackend(ServingBackend):
    """Serves the image files themselves: the same samples as the LMDB backend (``on_error="skip"`` leaves the same bad files out)."""

    def __init__(self, plan: DataPlan, hooks: Hooks | None = None):
        super().__init__(plan, hooks)
        self.sizes: dict[str, tuple[int, int]] = {}  # split -> (bytes, records) of what is served

    def served_path(self, split: str) -> Path:
        return self.source_path(split)

    def open(self, split: str) -> RawImageDataset | SourceDataset:
        """The files the LMDB backend would serve: the database's sample list when it is current, else validated like a build.

        With ``on_error="skip"`` a build leaves bad files out; the raw backend must leave out the same ones
        so that an A/B differs in storage alone. It never builds: it reuses an up-to-date database's list,
        or (none, and ``on_error="skip"``) reads and decodes every file once here, as the builder would.
        A given database's samples are read from the files it was built from, whatever their state.
        A Dataset source's samples are its own (:class:`~lightning_lmdb.read.raw.SourceDataset`), with the targets of a
        current database, else of every sample read once here (:meth:`sample_reads`, whatever ``on_error``: the targets).
        """
        options = self.split_options(split)
        if split in self.plan.given_databases:
            return self._open_given(split)
        folder, built = self.source_path(split), self.database_path(split)
        scan = scan_source(folder, options.manifest)
        dataset = datasource.dataset_of(scan)
        meta = self.current_meta(split, scan)
        if meta is not None:  # the database's size: a block-shuffled order (and shuffle=None's choice) as the lmdb backend's
            self.sizes[split] = (database.database_bytes(built), meta.count)
            return RawImageDataset.from_metadata(scan.root, meta) if dataset is None else SourceDataset.from_metadata(dataset, meta)
        self.sizes[split] = (scan.total_bytes, len(scan.files))
        if dataset is not None:
            return SourceDataset.from_reads(dataset, self.sample_reads(split, scan))
        found = self.labels.get(split)  # a mask source's classes, found before setup (mask_labels)
        classes = found.classes if found is not None and target_kind(str(scan.target_kind)).in_record else None
        if options.on_error != "skip":
            return RawImageDataset.from_scan(scan, classes=classes)
        bad = find_bad_files(scan, max_pixels=options.max_pixels, workers=options.workers)
        if bad:
            log.warning("The raw backend leaves out %d bad files of %s, as a build would:\n%s", len(bad), folder,
                        "\n".join(f"  {s.path}: {s.reason}" for s in bad))
        self.hooks.after_reading_all([f.path for f in scan.files])
        return RawImageDataset.from_scan(scan, exclude={s.path for s in bad}, classes=classes)

    def _open_given(self, split: str) -> RawImageDataset:
        """The samples of the database given for ``split``, read from the files it was built from (its root must still exist)."""
        given = self.plan.sources[split]
        assert given is not None  # a given database
        meta = database.load_meta(given, arrays=True)
        if meta.source.root.startswith("<dataset "):  # datasource.scan's root: the dataset is not in the database
            raise SourceError(f"backend='raw' serves a Dataset source's own samples, but {split}_dir {str(given)!r} was built from "
                              f"{meta.source.root[1:-1]}: pass that dataset as {split}_dir instead (its database is then built in "
                              "cache_dir), or serve the database itself (Hydra: data.backend=lmdb).")
        if not is_remote(meta.source.root) and not Path(meta.source.root).is_dir():
            raise SourceError(
                f"backend='raw' reads the files a database was built from, but {split}_dir {str(given)!r} was built from "
                f"{meta.source.root!r}, which no longer exists. Serve the database itself (Hydra: data=lmdb, or data.backend=lmdb), "
                "or restore the files there."
            )
        self.sizes[split] = (database.database_bytes(given), meta.count)
        return RawImageDataset.from_metadata(self.source_path(split), meta)

    def cached_files(self, datasets: dict[str, ImageDatasetBase]) -> list[str]:
        raw = {d.root: d for d in datasets.values() if isinstance(d, RawImageDataset)}
        return [on_disk(path) for dataset in raw.values() for path in (*dataset.files(), *dataset.mask_files())]

    def data_bytes(self, split: str, dataset: ImageDatasetBase) -> int:
        return self.sizes.get(split, (0, 0))[0]

    def block_size(self, split: str, dataset: ImageDatasetBase) -> int | None:
        if hasattr(dataset, "block_size"):
            return dataset.block_size
        return blockread.block_size_for(*self.sizes[split]) if split in self.sizes else None


#: The backend class of each ``backend`` value.
BACKEND_CLASSES: dict[str, type[ServingBackend]] = {"lmdb": LMDBBackend, "raw": RawBackend}

#: Names kept for one release: old name -> (the object, its new name). ``Backend`` was also the backend's name, a ``Literal``
#: (now :data:`lightning_lmdb.datamodule.options.BackendName`).
__getattr__ = deprecated_names(__name__, {"Backend": (ServingBackend, "ServingBackend")})
