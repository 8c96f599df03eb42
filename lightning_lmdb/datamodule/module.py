"""``LMDBDataModule``: build the databases once, serve them (or the raw files) with tuned loaders."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset

from lightning_lmdb.build.writer import available_cores
from lightning_lmdb.codec.decoders import Decoder
from lightning_lmdb.datamodule import backends
from lightning_lmdb.datamodule.labels import TargetsMixin
from lightning_lmdb.datamodule.loaders import DeviceBatchesMixin, LoadersMixin
from lightning_lmdb.datamodule.options import (
    SPLITS,  # noqa: F401 (re-exported: it was defined here)
    BackendName,
    DecodeDevice,
    StartMethod,
    as_source_options,
    build_options,
    check_choices,
    check_data,
    check_folders,
    check_loader,
    decode_size_for,
    default_transforms,
    given_databases,
    plain_source,
    remote_databases,
    silence_the_both_hooks_warning,
    source_splits,
    split_sources,
)
from lightning_lmdb.datamodule.plan import DataPlan, database_name, given_source  # noqa: F401 (database_name re-exported: defined here before)
from lightning_lmdb.deprecated import deprecated_names, warn_renamed
from lightning_lmdb.errors import CacheDirError, OptionError  # noqa: F401 (CacheDirError: the backends raise it)
from lightning_lmdb.options import BuildOptions, OnError, OnStale, Storage, Validate
from lightning_lmdb.read import transforms
from lightning_lmdb.read.dataset import ImageDatasetBase, LMDBImageDataset, available_memory
from lightning_lmdb.read.sampler import ResumableDataLoader, Shuffle
from lightning_lmdb.remote import fs as remote_fs
from lightning_lmdb.remote.redaction import redacted_namespace
from lightning_lmdb.remote.urls import is_remote, refuse_user_info
from lightning_lmdb.sources.base import SourceOptions
from lightning_lmdb.store import envs
from lightning_lmdb.tools.staging import remote_staged_path

#: The validation share held out of ``train_dir`` when ``val_fraction`` is ``None`` and no ``val_dir`` is given.
DEFAULT_VAL_FRACTION = 0.1


def choose_shuffle(database_bytes: int, available: int) -> Shuffle:
    """The training order ``shuffle=None`` picks: ``"block"`` when the data (``database_bytes``) does not fit in
    ``available`` bytes of memory (an exact shuffle would then read it a page fault at a time), else ``True``."""
    return "block" if database_bytes >= available else True


def default_cache_dir() -> Path:
    """``$LIGHTNING_LMDB_CACHE``, else ``$XDG_CACHE_HOME/lightning_lmdb``, else ``~/.cache/lightning_lmdb``."""
    if os.environ.get("LIGHTNING_LMDB_CACHE"):
        return Path(os.environ["LIGHTNING_LMDB_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "lightning_lmdb"


class LMDBDataModule(TargetsMixin, LoadersMixin, DeviceBatchesMixin, pl.LightningDataModule):
    """Image folders (or manifests, or Datasets) served to Lightning from LMDB files (``backend="lmdb"``) or from the source.

    Every setting but ``backend`` is shared, so ``raw`` vs ``lmdb`` is an A/B of storage alone.

    Every choice is typed as a ``Literal``, so LightningCLI (jsonargparse) rejects a bad value at parse time;
    ``__init__`` checks them again for callers that do not check types (Hydra's ``instantiate``, plain Python).
    The arguments are saved as hyper-parameters (``self.hparams``, and in checkpoints, not in the logger's
    ``hparams.yaml``, where they would clash with the model's, e.g. ``batch_size``) as plain values --
    paths as strings, a Dataset as a description (``"<Dataset MyDS of 120 samples, version 2>"``), the transforms left
    out -- so checkpoints load with ``torch.load(..., weights_only=True)`` and ``LMDBDataModule.load_from_checkpoint``
    rebuilds the module (with the default transforms unless given; a Dataset must be passed again, e.g. ``train_dir=ds``).

    Args:
        train_dir: Training images: a folder (ImageFolder layout or flat), a manifest (.csv/.tsv/.jsonl, or a folder with
            metadata.csv/.jsonl), a database (a file or sharded folder built by ``lightning-lmdb build``: served as it is,
            never rebuilt, nothing written to ``cache_dir`` for it; the raw backend reads the files it was built from), or
            a map-style Dataset (:mod:`lightning_lmdb.sources.dataset`; kept as it is, its database named by its identity: class,
            length, a ``Subset``'s indices, a few samples' bytes and ``source_options={"version": ...}``: change the version when
            its data changes; the raw backend serves the Dataset
            itself, through the same decoding). Before ``setup``, a Dataset's ``classes`` / ``target_kind`` cost one sample
            read, or (classes found only in its samples) every sample read once, kept for ``setup``
            (:meth:`backends.ServingBackend.dataset_labels`).
        val_dir: Validation images (as ``train_dir``); or leave ``None`` and hold out ``val_fraction`` of ``train_dir``.
        test_dir: Test images (as ``train_dir``; also used by ``predict_dataloader``); or leave ``None`` and hold out
            ``test_fraction`` of ``train_dir``.
        val_fraction: Share of ``train_dir`` held out for validation. ``None`` (the default) chooses:
            ``0.1`` without ``val_dir``, no split with one. ``0`` disables the split; a value ``> 0`` together
            with ``val_dir`` is an error.
        test_fraction: Share of ``train_dir`` held out for testing (``0``, the default: none). Carved like ``val_fraction``, from
            the same seeded permutation (:class:`~lightning_lmdb.read.views.Split`): deterministic, disjoint from the training
            and validation samples, and the validation samples stay those of ``val_fraction`` alone. A value ``> 0``
            together with ``test_dir`` is an error; a source with a split column ignores it, as it ignores ``val_fraction``.
            It selects samples of the training database: no database is named or built differently for it.
        split_seed: Seed of that split and of the training order (epoch e shuffles with split_seed + e; the same on
            every rank and run, so a resumed run continues the same order).
        backend: ``"lmdb"`` or ``"raw"``.
        cache_dir: Where the databases go; default :func:`default_cache_dir`. Each folder gets
            ``<name>-<hash of its path, storage, resize and quality, shards>.lmdb`` (:meth:`BuildOptions.cache_key`).
        storage: ``"auto"`` (the default: per image, lossy files and 16-bit PNGs keep their bytes, every other image is
            stored as zstd-compressed RGB pixels), ``"encoded"`` (original bytes) or ``"decoded"`` (RGB pixels, no decode at read
            time); see :class:`~lightning_lmdb.options.BuildOptions`.
        shards: ``None``: each database is one file. ``K``: a sharded database, a folder of ``K`` shard files and a
            manifest (:mod:`lightning_lmdb.store.shards`), built by ``K`` processes (``build_workers`` at a time) and, with
            ``shared_filesystem``, spread over the job's nodes. The same samples either way.
        resize: Pre-resized storage: the builder shrinks images whose shorter side is larger than this (aspect
            kept, never upscaled) and stores them re-encoded (JPEG at ``quality`` for lossy sources; zstd pixels for lossless
            ones with ``auto``, PNG with ``encoded``) or as pixels (``decoded``); ``None`` keeps the originals. It changes the
            pixels the model sees, within the bound the README states.
        quality: JPEG quality of the images ``resize`` re-encodes.
        decoder: How records become pixels: ``"auto"`` (the fastest that keeps the parity policy, per record),
            ``"pil"`` (``ImageFolder``'s exact pixels), ``"torchcodec"`` or ``"opencv"`` (see
            :mod:`lightning_lmdb.codec.decoders`). The raw backend uses the same one.
        decode_size: The shorter side each split's transform needs, so JPEGs much larger are decoded at 1/2, 1/4
            or 1/8 scale: ``"auto"`` takes it from the default transforms (``image_size`` for training, the
            evaluation resize for the rest; ``image_size`` for a transform of yours), an integer sets it,
            ``None`` decodes every image whole.
        decode_device: ``"cuda"``: JPEGs are decoded batch by batch on the GPU in the training process (the
            workers only draw each sample's crop); ``"cpu"``: the same batched path on the CPU (for tests);
            ``None`` (default): every sample is decoded in the workers. Needs the default transforms.
        finish_on_device: Workers send ``uint8`` batches and ``on_after_batch_transfer`` converts them to float and
            normalises (``mean``, ``std``) on the training device. ``False``: the default transforms do it in
            the workers. Float batches of your own transforms always pass through untouched.
        mean: Per-channel mean of the normalisation.
        std: Per-channel standard deviation of the normalisation.
        build_workers: Builder processes (``None``: one per core).
        on_error: Builder policy for bad files: ``"raise"`` or ``"skip"``.
        on_stale: When a folder changed since its database was built: ``"rebuild"``, ``"error"`` or
            ``"ignore"`` (no scan at all: the fastest start on network storage). A given database is served as it is.
        source_options: How to read the sources (:class:`~lightning_lmdb.sources.base.SourceOptions`, or a mapping of its fields,
            e.g. ``{"label_column": "tags", "label_sep": "|"}`` for a manifest, or ``{"masks_dir": ...}`` for a folder:
            segmentation, batches ``(images, masks)``, see :attr:`ignore_index`); saved in the hyper-parameters as the dict of the
            fields set (Hydra: ``data.source_options``).
        manifest: The deprecated name of ``source_options`` (it warns when it sets an option; an old checkpoint's
            hyper-parameters still load through it). Removed in the next release.
        max_pixels: Builder's decompression-bomb limit.
        validate: How the builder checks files kept as their bytes: ``"reduced"`` (JPEGs decoded at 1/8 scale), ``"full"``
            or ``"header"`` (no decode: a bad file fails when read); see :class:`~lightning_lmdb.options.BuildOptions`.
        readahead: LMDB readahead; ``None`` chooses by file size against available memory.
        image_size: Side of the default transforms' output (and of ``decode_size="auto"``).
        train_transform: Transform of training images (default: :func:`transforms.train_transform`, a random resized
            crop and flip to ``image_size``, uint8); with masks, of ``(image, mask)`` (see :mod:`lightning_lmdb.read.transforms`).
        eval_transform: Transform of validation/test images (default: :func:`transforms.eval_transform`, the centre
            square resized to ``image_size``, uint8).
        batch_size: Samples per batch, per device (under DDP each of N processes loads batches of this size: N times it per step).
        num_workers: DataLoader worker processes (``None``: one per core, at most 8).
        pin_memory: Pin batches for faster GPU copies (``None``: when CUDA is available).
        prefetch_factor: Batches prefetched per worker (used only when ``num_workers > 0``).
        persistent_workers: Keep workers alive between epochs (used only when ``num_workers > 0``).
        drop_last: Drop the last incomplete training batch.
        shuffle: Order of the training samples: ``True`` (an exact shuffle), ``False`` (in order), ``"block"``
            (a block shuffle: contiguous blocks of about 4 MiB of records in random order, mixed within windows
            of 16 blocks, each block read in one large read; see :mod:`lightning_lmdb.read.sampler` and
            :mod:`lightning_lmdb.read.blockread`), or ``None`` (the default) to choose at ``setup``
            (:func:`choose_shuffle`): ``"block"`` when the training data -- the database file, or for the raw
            backend the database it would serve, else the image files -- is at least the memory available,
            else ``True`` (under DDP rank 0's choice holds for all ranks). ``"block"`` turns readahead off for
            the training data unless ``readahead`` is given. The raw backend block-shuffles the file list the
            same way (no block reads). Lightning's distributed sampler is never substituted for it.
        multiprocessing_context: Start method of the loader workers: ``"fork"``, ``"spawn"``, ``"forkserver"``
            or ``None`` (platform default).
        shared_filesystem: The nodes of a multi-node job share ``cache_dir``. ``prepare_data`` still runs on each
            node's local rank 0, but each node builds only its part: shard ``i`` is built by node ``i % num_nodes``
            (with ``shards``), or node 0 builds the single file; Lightning's barrier after ``prepare_data`` makes
            every rank wait for all of them, and the node that completes the last shard writes the manifest.
            ``False``: each node builds everything into its own ``cache_dir``. The builders' file locks keep
            concurrent builds of one database to one build either way.
        local_cache_dir: A folder on each node's local disk: ``prepare_data`` copies each database there after
            building it (``setup`` does, with ``shared_filesystem`` on several nodes: after the barrier; once per
            node; checked block by block against the source, resumed after a kill, skipped
            when the copy is current: :mod:`lightning_lmdb.tools.staging`) and the loaders read the copy, not the
            shared or network storage of ``cache_dir``. ``None``: read the databases where they are built.
        storage_options: Options of the object storage the ``s3://...`` sources and databases are on (``fsspec`` / ``s3fs``
            keyword arguments: ``endpoint_url`` for MinIO, ``key`` / ``secret``, ``anon``; see docs/object-storage.md).
            ``None``: the provider's standard environment and config files. Kept in memory only: never saved in the
            hyper-parameters (``hparams.yaml``, checkpoints), logged or printed.

    Raises:
        ValueError: A choice that is not one of its valid values, or an out-of-range number (named, with the
            valid values), or ``val_fraction > 0`` together with ``val_dir``, or a given folder without images
            (checked at ``prepare_data`` instead with ``on_stale="ignore"``, which promises no scan), or a bad ``manifest`` option.
        FileNotFoundError: A given folder does not exist, or a given file is neither a manifest nor a database.
        DatabaseError: A given database cannot be opened (incomplete, damaged, foreign).
        CacheDirError: (``prepare_data``) ``cache_dir`` or ``local_cache_dir`` cannot be written.
    """

    def __init__(
        self,
        train_dir: str | os.PathLike[str] | Dataset | None = None,
        val_dir: str | os.PathLike[str] | Dataset | None = None,
        test_dir: str | os.PathLike[str] | Dataset | None = None,
        *,
        val_fraction: float | None = None,
        test_fraction: float = 0.0,
        split_seed: int = 0,
        backend: BackendName = "lmdb",
        cache_dir: str | os.PathLike[str] | None = None,
        storage: Storage = BuildOptions.storage,
        shards: int | None = BuildOptions.shards,
        resize: int | None = BuildOptions.resize,
        quality: int = BuildOptions.quality,
        decoder: Decoder = "auto",
        decode_size: int | Literal["auto"] | None = "auto",
        decode_device: DecodeDevice | None = None,
        finish_on_device: bool = True,
        mean: Sequence[float] = transforms.IMAGENET_MEAN,
        std: Sequence[float] = transforms.IMAGENET_STD,
        build_workers: int | None = BuildOptions.workers,
        on_error: OnError = BuildOptions.on_error,
        on_stale: OnStale = BuildOptions.on_stale,
        source_options: SourceOptions | Mapping[str, Any] | None = None,
        manifest: SourceOptions | Mapping[str, Any] | None = None,
        max_pixels: int | None = BuildOptions.max_pixels,
        readahead: bool | None = None,
        image_size: int = 224,
        train_transform: Callable[[Any], Any] | None = None,
        eval_transform: Callable[[Any], Any] | None = None,
        batch_size: int = 64,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        prefetch_factor: int = 2,
        persistent_workers: bool = True,
        drop_last: bool = False,
        shuffle: Shuffle | None = None,
        multiprocessing_context: StartMethod | None = None,
        shared_filesystem: bool = False,
        local_cache_dir: str | os.PathLike[str] | None = None,
        validate: Validate = BuildOptions.validate,
        storage_options: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        #: The object-storage options (in memory only: never a hyper-parameter, see ``storage_options`` above).
        self.storage_options: dict[str, Any] = dict(storage_options or {})
        for name, given in (("train_dir", train_dir), ("val_dir", val_dir), ("test_dir", test_dir), ("cache_dir", cache_dir),
                            ("local_cache_dir", local_cache_dir)):
            if is_remote(given):
                refuse_user_info(given, name)  # type: ignore[arg-type]
                remote_fs.use_options(given, self.storage_options)  # type: ignore[arg-type]
        check_choices(backend=backend, multiprocessing_context=multiprocessing_context, decoder=decoder, decode_device=decode_device,
                      shuffle=shuffle, decode_size=decode_size, finish_on_device=finish_on_device)
        check_data((train_dir, val_dir, test_dir), val_fraction, test_fraction)
        check_loader(batch_size, image_size, prefetch_factor, num_workers)
        options_given = as_source_options(source_options, manifest)  # manifest: the deprecated name (an old checkpoint's)
        source_options, manifest = options_given.as_dict() or None, None  # plain values, like every hyper-parameter
        data = (train_dir, val_dir, test_dir)
        given_sources = split_sources(data, shards, options_given)  # a Dataset is kept as it is, never os.fspath'd
        local_dir = None if local_cache_dir is None else Path(os.fspath(local_cache_dir)).expanduser()
        #: The splits given a published database (``s3://...`` holding a marker): ``prepare_data`` stages it to
        #: ``local_cache_dir``, where the split serves it from (split -> URL).
        self.remote_databases: dict[str, str] = remote_databases(given_sources, local_dir)
        for split, url in self.remote_databases.items():
            given_sources[split] = remote_staged_path(url, local_dir)  # type: ignore[arg-type]
        # hyper-parameters are plain values: a Path (or a Dataset) would not load with torch.load(weights_only=True)
        train_dir, val_dir, test_dir = (plain_source(d, options_given) for d in data)
        cache_dir, local_cache_dir = (None if d is None else os.fspath(d) for d in (cache_dir, local_cache_dir))
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        # checkpoints only, as the model's are logged; storage_options may hold secrets: never saved
        self.save_hyperparameters(ignore=["train_transform", "eval_transform", "storage_options"], logger=False)
        #: Each split's source: a folder, manifest or database (resolved), or a Dataset, or ``None`` (formerly ``dirs``).
        self.sources: dict[str, Path | Any] = given_sources
        if val_fraction is None:
            val_fraction = DEFAULT_VAL_FRACTION if val_dir is None and train_dir is not None else 0.0
        self.val_fraction: float = float(val_fraction)
        self.test_fraction: float = float(test_fraction)
        self.split_seed, self.backend = split_seed, backend
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.build_options = build_options(storage=storage, workers=build_workers, on_error=on_error, on_stale=on_stale,
                                           max_pixels=max_pixels, resize=resize, quality=quality, shards=shards, manifest=options_given,
                                           validate=validate)
        self.decoder, self.decode_size, self.decode_device = decoder, decode_size, decode_device
        self.finish_on_device, self.mean, self.std = finish_on_device, mean, std
        self.local_cache_dir = None if local_cache_dir is None else Path(local_cache_dir).expanduser()
        #: The splits given a database (served as it is) rather than a source.
        self.given_databases = given_databases(self.sources, on_stale, self.local_cache_dir, self.remote_databases)
        self.readahead = readahead
        self.shared_filesystem = shared_filesystem  # prepare_data_per_node stays True: each node builds its part
        #: What the backend serves, decided here once: it is given this plan, never the module.
        self.plan = DataPlan(sources=self.sources, given_as=dict(zip(self.sources, (train_dir, val_dir, test_dir))),
                             given_databases=self.given_databases, build_options=self.build_options, cache_dir=self.cache_dir,
                             local_cache_dir=self.local_cache_dir, backend=backend, readahead=readahead,
                             shared_filesystem=shared_filesystem, remote_databases=self.remote_databases)
        hooks = backends.Hooks(source_path=self.source_path, served_database_path=self.served_database_path, timed=self._timed,
                               after_reading_all=self._after_reading_all, node=self._node)
        self._backend: backends.ServingBackend = backends.BACKEND_CLASSES[backend](self.plan, hooks)
        check_folders(self.sources, on_stale == "ignore" and backend == "lmdb", self.database_path, self.build_options.manifest,
                      self.given_databases)
        self.image_size = image_size
        self.train_transform, self.eval_transform = default_transforms(train_transform, eval_transform, image_size, finish_on_device,
                                                                       mean, std, decode_device)
        #: Whether each transform is the default (a kind that keeps the image whole, boxes, is then served a letterbox instead).
        self._default_transforms = (train_transform is None, eval_transform is None)
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.num_workers = min(8, available_cores()) if num_workers is None else num_workers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.prefetch_factor, self.persistent_workers = prefetch_factor, persistent_workers
        self.multiprocessing_context = multiprocessing_context
        self.datasets: dict[str, ImageDatasetBase] = {}
        #: The training order chosen at ``setup("fit")`` (``shuffle``, or what ``None`` picked); ``None`` before.
        self.train_shuffle: Shuffle | None = None
        self._train_loader: ResumableDataLoader | None = None
        self._pending_train_state: dict[str, Any] | None = None

    @property
    def dirs(self) -> dict[str, Path | Any]:
        """Deprecated: :attr:`sources` (each split's source; not only folders). Removed in the next release."""
        warn_renamed(f"{type(self).__name__}.dirs", f"{type(self).__name__}.sources")
        return self.sources

    # --- paths -----------------------------------------------------------------------------------

    def database_path(self, split: str, options: BuildOptions | None = None) -> Path:
        """Where the database of ``split``'s source lives (every rank and run computes the same: :func:`database_name`); a given
        database itself.

        Args:
            split: ``"train"``, ``"val"`` or ``"test"``.
            options: Where it would live if built with these options instead of this module's.
        """
        return self._backend.database_path(split, options)

    def source_path(self, split: str) -> Path | Any:
        """The source of ``split`` as this module reads it: the folder, manifest or Dataset, or the folder a given database was built
        from."""
        return self.plan.source_path(split)

    def served_database_path(self, split: str) -> Path:
        """The database of ``split`` as the loaders read it (unless staged to ``local_cache_dir``)."""
        return self.database_path(split)

    def database_paths(self) -> list[Path]:
        """The databases this module serves (empty for the raw backend)."""
        return self._backend.database_paths()

    # --- hooks of subclasses (lightning_lmdb.experiment.datamodule.ExperimentDataModule) ----------

    def _timed(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A context around one step of ``prepare_data`` / ``setup`` (``name``: ``prepare_s``, ``stage_s`` or ``setup_s``)."""
        return contextlib.nullcontext()

    def _after_reading_all(self, files: list[Path]) -> None:
        """Called after the raw backend read each of ``files`` once to validate them, as a build would."""

    def _node(self) -> tuple[int, int]:
        """``(node rank, number of nodes)`` of the trainer's job (``(0, 1)`` without a trainer)."""
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return int(getattr(trainer, "node_rank", 0)), int(getattr(trainer, "num_nodes", 1))

    def _before_epoch(self) -> Callable[[], None] | None:
        """What the training sampler calls before each epoch's first index (``None``: nothing)."""
        return None

    # --- Lightning hooks -------------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Build each missing or stale database (LMDB backend) and stage it to ``local_cache_dir``. Writes to disk only; sets no state.

        Raises:
            SourceError: A val or test split with a class the training split lacks (:meth:`split_options`), before any build.
        """
        self._backend.prepare()

    def setup(self, stage: str | None = None) -> None:
        """Create the datasets ``stage`` needs (``fit``, ``validate``, ``test`` or ``predict``)."""
        silence_the_both_hooks_warning()
        self._keep_secrets_out_of_saved_configs()
        self._backend.check_splits()  # a class the training split lacks is refused before anything is served
        self._backend.after_barrier()
        for split in (s for s, folder in self.sources.items() if folder is not None):  # mount first: not part of setup_s
            self._backend.served_path(split)
        with self._timed("setup_s"):
            self._create_datasets(stage)
            envs.close_all()  # the main process holds no environment once set up

    def _keep_secrets_out_of_saved_configs(self) -> None:
        """``LightningCLI``'s ``SaveConfigCallback`` writes the parsed arguments (``--data.storage_options`` included) to
        ``config.yaml`` in its ``setup``, which the trainer calls after this DataModule's: with ``storage_options`` given,
        its config's ``storage_options`` values become ``"***"`` first. This DataModule keeps the real ones; a run
        resumed from that config takes the credentials from the environment (or ones passed again)."""
        trainer = self.trainer
        if not self.storage_options or trainer is None:
            return
        try:
            from lightning.pytorch.cli import SaveConfigCallback
        except ImportError:  # pragma: no cover -- ships with lightning
            return
        for callback in trainer.callbacks:
            if isinstance(callback, SaveConfigCallback) and not callback.already_saved:
                callback.config = redacted_namespace(callback.config)

    def _create_datasets(self, stage: str | None) -> None:
        fit = stage in (None, "fit")
        # predict serves the test folder, or the validation data when there is none
        evaluate = stage in (None, "fit", "validate") or (stage == "predict" and self.sources["test"] is None)
        test = stage in (None, "test", "predict")
        if self.sources["train"] is not None and (fit or (evaluate and self.val_fraction) or (test and self.sources["test"] is None)):
            full = self._backend.open("train")
            train_transform, eval_transform = self._transforms_for(full)
            transforms = {"train": train_transform, "val": eval_transform, "test": eval_transform}
            parts = source_splits(full)
            if parts is not None:  # the source's split column decides; val_fraction does not apply
                train = full.view(parts["train"], train_transform)
                for split, wanted in (("val", evaluate), ("test", test)):
                    if wanted and self.sources[split] is None and len(parts[split]):
                        self.datasets[split] = full.view(parts[split], eval_transform)
            elif self.val_fraction or self.test_fraction:  # seeded parts: pickled as (seed, fractions, part), recomputed in each worker
                carved = full.parts(self.split_seed, self.val_fraction, self.test_fraction, transforms)
                train = carved["train"]
                for split, wanted in (("val", fit or evaluate), ("test", test)):
                    if wanted and split in carved:
                        self.datasets[split] = carved[split]
            else:
                train = full.view(None, train_transform)
            if fit:
                self.train_shuffle = self._choose_shuffle(full)
                if self.train_shuffle == "block" and isinstance(train, LMDBImageDataset):
                    if self.readahead is None:  # this view only: validation keeps the automatic choice
                        train.readahead = False
                    train.read_blocks(True)
                self.datasets["train"] = train
        if evaluate and self.sources["val"] is not None:
            opened = self._backend.open("val")
            self.datasets["val"] = opened.view(None, self._transforms_for(opened)[1])
        if stage in (None, "test", "predict") and self.sources["test"] is not None:
            opened = self._backend.open("test")
            self.datasets["test"] = opened.view(None, self._transforms_for(opened)[1])
        for dataset in self.datasets.values():
            dataset.set_decoding(self.decoder, decode_size_for(self.decode_size, dataset.transform, self.image_size),
                                 defer_jpeg=self.decode_device is not None)

    def _transforms_for(self, dataset: ImageDatasetBase) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """The training and evaluation transforms of ``dataset``: a default one as :func:`transforms.whole_image` (a letterbox
        with scale jitter and flip) when its target kind keeps the image whole (boxes), else as they are."""
        found = (self.train_transform, self.eval_transform)
        kind = getattr(dataset, "target_entry", None)
        if kind is None or not kind.keeps_whole:
            return found
        return tuple(transforms.whole_image(t) if default else t  # type: ignore[return-value]
                     for t, default in zip(found, self._default_transforms, strict=True))

    def _choose_shuffle(self, full: ImageDatasetBase) -> Shuffle:
        """``shuffle``, or (``None``) :func:`choose_shuffle` of the training data's size -- rank 0's, under DDP."""
        if self.shuffle is not None:
            return self.shuffle
        choice = choose_shuffle(self._backend.data_bytes("train", full), available_memory())
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:  # memory differs between ranks: they must agree on the order
            choice = trainer.strategy.broadcast(choice, src=0)
        return choice

    def cached_files(self) -> list[str]:
        """The files a cold-cache epoch evicts: the databases, or every raw image file."""
        return self._backend.cached_files(self.datasets)


#: Names kept for one release: old name -> (the object, its new name).
__getattr__ = deprecated_names(__name__, {"given_folder": (given_source, "given_source")})
