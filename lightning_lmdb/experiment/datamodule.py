"""``ExperimentDataModule``: ``LMDBDataModule`` with the A/B experiment's knobs (cold page cache, emulated network storage, timings)."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lightning_lmdb.datamodule.backends import on_disk
from lightning_lmdb.datamodule.module import LMDBDataModule
from lightning_lmdb.errors import OptionError
from lightning_lmdb.store import envs
from lightning_lmdb.tools import netfs
from lightning_lmdb.tools import pagecache as cache


class ExperimentDataModule(LMDBDataModule):
    """:class:`~lightning_lmdb.LMDBDataModule` for the experiment (``train.py``'s ``data`` config): its arguments, and these.

    Args:
        *args: :class:`~lightning_lmdb.LMDBDataModule`'s folders (or manifests, or databases).
        cold_cache: Evict the dataset's files (the raw files, or the LMDB files after closing this
            process's environments) from the page cache before each training epoch, with
            ``posix_fadvise`` (no root needed): emulates a dataset larger than RAM or on network
            storage. Forces ``persistent_workers=False`` (a live worker's memory map would keep the
            LMDB pages cached).
        netfs_latency_ms: Emulated network storage: every file request (lookup, open, read, ...) of the folders and
            the databases waits this many milliseconds (``0.5`` is a typical NFS round trip). The build and the raw
            backend read the folders (a manifest's folder), and the LMDB backend its database file, through read-only latency mounts
            (:mod:`lightning_lmdb.tools.netfs`, needs FUSE) at stable points in ``<cache_dir>.netfs/`` (a database's
            cache key hashes the real folder, so nothing is rebuilt because of them); they are unmounted when the
            process exits. With ``cold_cache`` the mounts keep no file contents cached either. ``None``: off. A Dataset source
            has no files to mount: it is refused with it.
        **kwargs: :class:`~lightning_lmdb.LMDBDataModule`'s settings.

    Attributes:
        timings: Seconds spent in ``prepare_data`` (``prepare_s``: the builds, or a stale check's scan of each
            folder; ``stage_s``: copying the databases to ``local_cache_dir``) and ``setup`` (``setup_s``: the raw
            backend's scan, the LMDB backend's opening of its databases), for the last call of each; mounting is not
            counted.
    """

    def __init__(self, *args: Any, cold_cache: bool = False, netfs_latency_ms: float | None = None, **kwargs: Any):
        if netfs_latency_ms is not None:
            if isinstance(netfs_latency_ms, bool) or not isinstance(netfs_latency_ms, (int, float)) or netfs_latency_ms < 0:
                raise OptionError(f"netfs_latency_ms={netfs_latency_ms!r} must be a number of milliseconds >= 0 (e.g. 0.5), or None "
                                  "to read the files directly.")
            netfs.check_available()  # says what to install
        self.cold_cache, self.netfs_latency_ms = cold_cache, netfs_latency_ms
        self.timings: dict[str, float] = {}
        # not super(): LMDBDataModule saves its own (plain) arguments as hyper-parameters, these are added below
        LMDBDataModule.__init__(self, *args, **kwargs)
        datasets = [f"{split}_dir" for split, source in self.sources.items() if source is not None and not isinstance(source, Path)]
        if netfs_latency_ms is not None and datasets:
            raise OptionError(f"netfs_latency_ms={netfs_latency_ms} emulates network storage by mounting folders, and "
                              f"{', '.join(datasets)} {'is a Dataset' if len(datasets) == 1 else 'are Datasets'}, not a folder: leave "
                              "netfs_latency_ms unset (Hydra: data.netfs_latency_ms=null), or write the images to a folder and pass that.")
        self.save_hyperparameters({**self.hparams, "cold_cache": cold_cache, "netfs_latency_ms": netfs_latency_ms}, logger=False)
        if cold_cache and self.persistent_workers and self.num_workers > 0:
            rank_zero_warn("cold_cache=True turns persistent_workers off: live workers would keep the data cached.")
            self.persistent_workers = False

    def source_path(self, split: str) -> Path | Any:
        """The source of ``split`` as this module reads it: through a latency mount with ``netfs_latency_ms`` (a manifest file through
        one of its folder, so that the images beside it are read through it too)."""
        source = super().source_path(split)
        if not isinstance(source, Path):  # a Dataset (never with netfs_latency_ms)
            return source
        if source.is_file():
            return self._through_netfs(source.parent, source.parent.name) / source.name
        return self._through_netfs(source, source.name) if source.is_dir() else source

    def served_database_path(self, split: str) -> Path:
        """The database of ``split`` as the loaders read it: through the latency mount of ``cache_dir`` with ``netfs_latency_ms``."""
        database = self.database_path(split)
        if self.netfs_latency_ms is None:
            return database
        return self._through_netfs(database.parent.resolve(), "databases") / database.name

    def _through_netfs(self, folder: Path, name: str) -> Path:
        """``folder`` served at its stable mount point (mounted on first use; the same server for every module in this process)."""
        if self.netfs_latency_ms is None:
            return folder
        world = getattr(self.trainer, "world_size", 1) if self.trainer is not None else 1
        if world > 1:  # every rank would mount at the same stable points, each replacing the others' mounts
            raise OptionError(f"netfs_latency_ms={self.netfs_latency_ms} emulates network storage for one process, and this run has "
                              f"{world}; run it with devices=1 (Hydra: trainer.devices=1), or mount the folders yourself with "
                              "`lightning-lmdb netfs` and pass the mount points as the folders.")
        key = hashlib.sha256(str(folder).encode("utf-8", "surrogatepass")).hexdigest()[:10]
        root = self.cache_dir.absolute()
        mount = netfs.shared_mount(folder, root.parent / f"{root.name}.netfs" / f"{name}-{key}", latency_ms=float(self.netfs_latency_ms),
                                   cache_contents=not self.cold_cache)
        return mount.path

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        """Add the seconds of the step to ``timings[name]`` (a step may run twice: e.g. a build before ``setup`` to learn a
        segmentation set's classes, then Lightning's ``prepare_data``, which finds it up to date)."""
        started = time.perf_counter()
        yield
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - started

    def _after_reading_all(self, files: list[Path]) -> None:
        """With ``cold_cache``: the raw backend's validation read every file, so make them cold again."""
        if self.cold_cache:
            cache.evict([on_disk(f) for f in files], sync=False)

    def _before_epoch(self) -> Callable[[], None] | None:
        return self._evict if self.cold_cache else None

    def _evict(self) -> None:
        """Before a cold-cache epoch: close this process's environments and evict the data from the page cache.

        Iteration starts in the main process after the epoch's fresh workers have started but before any
        index reaches them, so no worker has opened an environment yet.
        """
        envs.close_all()
        cache.evict(self.cached_files(), sync=True)
