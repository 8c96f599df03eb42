"""``LMDBDataModule``: build the databases once, serve them (or the raw files) with tuned loaders."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, cast, get_args

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, has_file_allowed_extension

from lightning_lmdb import blockread, cache, envs, netfs, shards, transforms
from lightning_lmdb.batchdecode import Collate, DeferredImages
from lightning_lmdb.codec import DEFAULT_MAX_PIXELS, DEFAULT_QUALITY
from lightning_lmdb.dataset import LMDBImageDataset, RawImageDataset, _ImageDataset, available_memory
from lightning_lmdb.decoders import DECODERS, Decoder
from lightning_lmdb.errors import CacheDirError, OptionError, SourceError
from lightning_lmdb.folder import scan_folder
from lightning_lmdb.format import DatabaseError
from lightning_lmdb.options import BuildOptions, OnError, OnStale, Storage
from lightning_lmdb.sampler import ResumableDataLoader, ResumableSampler, Shuffle
from lightning_lmdb.staging import stage, staged_path
from lightning_lmdb.transforms import ResizedCrop
from lightning_lmdb.writer import available_cores, build_lmdb, build_shards, find_bad_files

log = logging.getLogger(__name__)

Backend = Literal["lmdb", "raw"]
#: A DataLoader worker start method (``None`` in ``LMDBDataModule`` means the platform default).
StartMethod = Literal["fork", "spawn", "forkserver"]
#: Where the batched JPEG decode runs (``None``: every sample is decoded in the workers).
DecodeDevice = Literal["cuda", "cpu"]

BACKENDS: tuple[str, ...] = get_args(Backend)
START_METHODS: tuple[str, ...] = get_args(StartMethod)
DECODE_DEVICES: tuple[str, ...] = get_args(DecodeDevice)
#: The batch hooks this module chains to a LightningModule's own (Lightning would call only one of the two).
CHAINED_HOOKS = ("on_before_batch_transfer", "on_after_batch_transfer")


def _silence_the_both_hooks_warning() -> None:
    """Lightning's "it will use the implementation from LightningDataModule" is not true here: both hooks run (see ``_chain``)."""
    for hook in CHAINED_HOOKS:
        warnings.filterwarnings("ignore", message=f"You have overridden `{hook}` in both `LightningModule` and `LightningDataModule`")
SPLITS = ("train", "val", "test")
#: The validation share held out of ``train_dir`` when ``val_fraction`` is ``None`` and no ``val_dir`` is given.
DEFAULT_VAL_FRACTION = 0.1


def _on_disk(path: str | os.PathLike[str]) -> str:
    """``path`` on the disk, for a path through a latency mount (a cold-cache epoch evicts the disk's pages)."""
    return str(netfs.disk_path(path))


def choose_shuffle(database_bytes: int, available: int) -> Shuffle:
    """The training order ``shuffle=None`` picks: ``"block"`` when the data (``database_bytes``) does not fit in
    ``available`` bytes of memory (an exact shuffle would then read it a page fault at a time), else ``True``."""
    return "block" if database_bytes >= available else True


#: Why a folder cannot be written, per errno.
_NOT_WRITABLE = {errno.EROFS: "a read-only file system", errno.EACCES: "permission denied", errno.EPERM: "permission denied"}


def _has_images(folder: Path) -> bool:
    """Whether ``folder`` holds at least one file named like an image, anywhere below it; stops at the first one found.

    Cheap on a large folder (one listing of the folder and of its first class folder); a folder that
    :func:`~lightning_lmdb.folder.scan_folder` accepts always has one.
    """
    return any(has_file_allowed_extension(name, IMG_EXTENSIONS) for _, _, files in os.walk(folder, followlinks=True) for name in files)


@contextlib.contextmanager
def _writing_to(folder: Path, option: str) -> Iterator[None]:
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


def _check_count(name: str, value: Any, minimum: int, meaning: str) -> None:
    """Refuse ``value`` unless it is an integer ``>= minimum`` (``bool`` is not one); ``meaning`` says what it counts."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionError(f"{name}={value!r} must be an integer >= {minimum} ({meaning}; Hydra: data.{name}=...).")


def default_cache_dir() -> Path:
    """``$LIGHTNING_LMDB_CACHE``, else ``$XDG_CACHE_HOME/lightning_lmdb``, else ``~/.cache/lightning_lmdb``."""
    if os.environ.get("LIGHTNING_LMDB_CACHE"):
        return Path(os.environ["LIGHTNING_LMDB_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "lightning_lmdb"


class LMDBDataModule(pl.LightningDataModule):
    """Image folders served to Lightning from LMDB files (``backend="lmdb"``) or from the files (``"raw"``).

    Every setting but ``backend`` is shared, so ``raw`` vs ``lmdb`` is an A/B of storage alone.

    Every choice is typed as a ``Literal``, so LightningCLI (jsonargparse) rejects a bad value at parse time;
    ``__init__`` checks them again for callers that do not check types (Hydra's ``instantiate``, plain Python).
    The arguments are saved as hyper-parameters (``self.hparams``, and in checkpoints) as plain values --
    paths as strings, the transforms left out -- so checkpoints load with ``torch.load(..., weights_only=True)``
    and ``LMDBDataModule.load_from_checkpoint`` rebuilds the module (with the default transforms unless given).

    Args:
        train_dir: Training images (ImageFolder layout or a flat folder).
        val_dir: Validation images; or leave ``None`` and hold out ``val_fraction`` of ``train_dir``.
        test_dir: Test images (also used by ``predict_dataloader``).
        val_fraction: Share of ``train_dir`` held out for validation. ``None`` (the default) chooses:
            ``0.1`` without ``val_dir``, no split with one. ``0`` disables the split; a value ``> 0`` together
            with ``val_dir`` is an error.
        split_seed: Seed of that split and of the training order (epoch e shuffles with split_seed + e; the same on
            every rank and run, so a resumed run continues the same order).
        backend: ``"lmdb"`` or ``"raw"``.
        cache_dir: Where the databases go; default :func:`default_cache_dir`. Each folder gets
            ``<name>-<hash of its path, storage and resize>.lmdb``.
        storage: ``"encoded"`` (original bytes) or ``"decoded"`` (RGB pixels, no decode at read time).
        shards: ``None``: each database is one file. ``K``: a sharded database, a folder of ``K`` shard files and a
            manifest (:mod:`lightning_lmdb.shards`), built by ``K`` processes (``build_workers`` at a time) and, with
            ``shared_filesystem``, spread over the job's nodes. The same samples either way.
        resize: Pre-resized storage: the builder shrinks images whose shorter side is larger than this (aspect
            kept, never upscaled) and stores them re-encoded (``encoded``) or as pixels (``decoded``); ``None``
            keeps the originals. It changes the pixels the model sees, within the bound the README states.
        quality: JPEG quality of the images ``resize`` re-encodes.
        decoder: How records become pixels: ``"auto"`` (the fastest that keeps the parity policy, per record),
            ``"pil"`` (``ImageFolder``'s exact pixels), ``"torchcodec"`` or ``"opencv"`` (see
            :mod:`lightning_lmdb.decoders`). The raw backend uses the same one.
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
            ``"ignore"`` (no scan at all: the fastest start on network storage).
        max_pixels: Builder's decompression-bomb limit.
        readahead: LMDB readahead; ``None`` chooses by file size against available memory.
        image_size: Side of the default transforms' output (and of ``decode_size="auto"``).
        train_transform: Transform of training images (default: :func:`transforms.train_transform`, a random resized
            crop and flip to ``image_size``, uint8).
        eval_transform: Transform of validation/test images (default: :func:`transforms.eval_transform`, the centre
            square resized to ``image_size``, uint8).
        batch_size: Samples per batch.
        num_workers: DataLoader worker processes (``None``: one per core, at most 8).
        pin_memory: Pin batches for faster GPU copies (``None``: when CUDA is available).
        prefetch_factor: Batches prefetched per worker (used only when ``num_workers > 0``).
        persistent_workers: Keep workers alive between epochs (used only when ``num_workers > 0``).
        drop_last: Drop the last incomplete training batch.
        shuffle: Order of the training samples: ``True`` (an exact shuffle), ``False`` (in order), ``"block"``
            (a block shuffle: contiguous blocks of about 4 MiB of records in random order, mixed within windows
            of 16 blocks, each block read in one large read; see :mod:`lightning_lmdb.sampler` and
            :mod:`lightning_lmdb.blockread`), or ``None`` (the default) to choose at ``setup``
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
        cold_cache: Evict the dataset's files (the raw files, or the LMDB files after closing this
            process's environments) from the page cache before each training epoch, with
            ``posix_fadvise`` (no root needed): emulates a dataset larger than RAM or on network
            storage. Forces ``persistent_workers=False`` (a live worker's memory map would keep the
            LMDB pages cached).
        netfs_latency_ms: Emulated network storage: every file request (lookup, open, read, ...) of the folders and
            the databases waits this many milliseconds (``0.5`` is a typical NFS round trip). The build and the raw
            backend read the folders, and the LMDB backend its database file, through read-only latency mounts
            (:mod:`lightning_lmdb.netfs`, needs FUSE) at stable points in ``<cache_dir>.netfs/`` (a database's
            cache key hashes the real folder, so nothing is rebuilt because of them); they are unmounted when the
            process exits. With ``cold_cache`` the mounts keep no file contents cached either. ``None``: off.
        local_cache_dir: A folder on each node's local disk: ``prepare_data`` copies each database there after
            building it (``setup`` does, with ``shared_filesystem`` on several nodes: after the barrier; once per
            node; checked block by block against the source, resumed after a kill, skipped
            when the copy is current: :mod:`lightning_lmdb.staging`) and the loaders read the copy, not the
            shared or network storage of ``cache_dir``. ``None``: read the databases where they are built.

    Attributes:
        timings: Seconds spent in ``prepare_data`` (``prepare_s``: the builds, or a stale check's scan of each
            folder; ``stage_s``: copying the databases to ``local_cache_dir``) and ``setup`` (``setup_s``: the raw
            backend's scan, the LMDB backend's opening of its databases), for the last call of each; mounting is not
            counted.

    Raises:
        ValueError: A choice that is not one of its valid values, or an out-of-range number (named, with the
            valid values), or ``val_fraction > 0`` together with ``val_dir``, or a given folder without images
            (checked at ``prepare_data`` instead with ``on_stale="ignore"``, which promises no scan).
        FileNotFoundError: A given folder does not exist.
        CacheDirError: (``prepare_data``) ``cache_dir`` or ``local_cache_dir`` cannot be written.
    """

    def __init__(
        self,
        train_dir: str | os.PathLike[str] | None = None,
        val_dir: str | os.PathLike[str] | None = None,
        test_dir: str | os.PathLike[str] | None = None,
        *,
        val_fraction: float | None = None,
        split_seed: int = 0,
        backend: Backend = "lmdb",
        cache_dir: str | os.PathLike[str] | None = None,
        storage: Storage = "encoded",
        shards: int | None = None,
        resize: int | None = None,
        quality: int = DEFAULT_QUALITY,
        decoder: Decoder = "auto",
        decode_size: int | Literal["auto"] | None = "auto",
        decode_device: DecodeDevice | None = None,
        finish_on_device: bool = True,
        mean: Sequence[float] = transforms.IMAGENET_MEAN,
        std: Sequence[float] = transforms.IMAGENET_STD,
        build_workers: int | None = None,
        on_error: OnError = "raise",
        on_stale: OnStale = "rebuild",
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
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
        shuffle: bool | Literal["block"] | None = None,
        multiprocessing_context: StartMethod | None = None,
        shared_filesystem: bool = False,
        cold_cache: bool = False,
        netfs_latency_ms: float | None = None,
        local_cache_dir: str | os.PathLike[str] | None = None,
    ):
        super().__init__()
        choices: tuple[tuple[str, Any, tuple[str | None, ...]], ...] = (
            ("backend", backend, BACKENDS),
            ("multiprocessing_context", multiprocessing_context, (*START_METHODS, None)),
            ("decoder", decoder, DECODERS),
            ("decode_device", decode_device, (*DECODE_DEVICES, None)),
        )
        for name, value, valid in choices:
            if value not in valid:
                raise OptionError(f"{name}={value!r} is not one of {', '.join(map(repr, valid))}.")
        if not (shuffle is None or isinstance(shuffle, bool) or (isinstance(shuffle, str) and shuffle == "block")):
            raise OptionError(f"shuffle={shuffle!r} is not one of True, False, 'block', None (None: 'block' when the training "
                             "data does not fit in memory, else True).")
        number = isinstance(val_fraction, (int, float)) and not isinstance(val_fraction, bool)
        if val_fraction is not None and not (number and 0 <= val_fraction < 1):
            raise OptionError(f"val_fraction={val_fraction!r} must be in [0, 1), or None for 0.1 without val_dir and no split with one.")
        if val_fraction and val_dir is not None:
            raise OptionError(f"Give either val_dir or val_fraction, not both (val_fraction={val_fraction!r}): pass val_fraction=0 or None"
                             " to validate on val_dir, or leave val_dir out to split train_dir.")
        if train_dir is None and val_dir is None and test_dir is None:
            raise OptionError("No data: pass train_dir (and val_dir / test_dir or val_fraction).")
        _check_count("batch_size", batch_size, 1, "samples per batch")
        _check_count("image_size", image_size, 1, "side in pixels of the images the default transforms make")
        _check_count("prefetch_factor", prefetch_factor, 1, "batches prefetched per worker")
        if num_workers is not None:
            _check_count("num_workers", num_workers, 0, "loader worker processes, 0 loads in this process, None one per core")
        # hyper-parameters are plain values: a Path would not load with torch.load(weights_only=True)
        train_dir, val_dir, test_dir, cache_dir, local_cache_dir = (
            None if d is None else os.fspath(d) for d in (train_dir, val_dir, test_dir, cache_dir, local_cache_dir))
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self.save_hyperparameters(ignore=["train_transform", "eval_transform"])
        given_dirs = (train_dir, val_dir, test_dir)
        self.dirs = {name: None if d is None else Path(d).expanduser().resolve() for name, d in zip(SPLITS, given_dirs, strict=True)}
        if val_fraction is None:
            val_fraction = DEFAULT_VAL_FRACTION if val_dir is None and train_dir is not None else 0.0
        self.val_fraction: float = float(val_fraction)
        self.split_seed, self.backend = split_seed, backend
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.build_options = BuildOptions(storage=storage, workers=build_workers, on_error=on_error, on_stale=on_stale,
                                          max_pixels=max_pixels, resize=resize, quality=quality, shards=shards)
        if decode_size != "auto" and decode_size is not None and (isinstance(decode_size, bool) or not isinstance(decode_size, int)
                                                                  or decode_size < 1):
            raise OptionError(f"decode_size={decode_size!r} must be 'auto', a positive integer or None (decode every image whole).")
        if decode_device == "cuda" and not torch.cuda.is_available():
            raise OptionError("decode_device='cuda' needs a CUDA GPU, and torch sees none. Leave decode_device=None to decode in the "
                             "workers (Hydra: data.decode_device=null).")
        self.decoder, self.decode_size, self.decode_device = decoder, decode_size, decode_device
        self.finish_on_device, self.mean, self.std = finish_on_device, mean, std
        serve_without_folder = on_stale == "ignore" and backend == "lmdb"
        for split, folder in self.dirs.items():
            if folder is not None and not folder.is_dir() and not (serve_without_folder and self.database_path(split).exists()):
                raise FileNotFoundError(
                    f"{split}_dir {str(folder)!r} does not exist or is not a folder. Pass the folder that holds your images"
                    f" (Hydra: data.{split}_dir=/path/to/images)."
                    + (" With on_stale='ignore' an existing database is served without it, but there is none at "
                       f"{str(self.database_path(split))!r}." if serve_without_folder else "")
                )
            if folder is not None and not serve_without_folder and not _has_images(folder):  # on_stale="ignore" promises no scan
                raise SourceError(
                    f"No images found in {split}_dir {str(folder)!r}: expected files ending in {', '.join(IMG_EXTENSIONS)} either in "
                    f"one subfolder per class (ImageFolder layout) or directly in the folder. Pass the folder that holds your images "
                    f"(Hydra: data.{split}_dir=/path/to/images)."
                )
        self.readahead = readahead
        self.image_size = image_size
        if decode_device is not None and not finish_on_device:
            raise OptionError(f"decode_device={decode_device!r} makes uint8 batches on the device, which finish_on_device=True normalises "
                             "there; pass finish_on_device=True (Hydra: data.finish_on_device=true).")
        in_workers = not finish_on_device
        self.train_transform = (train_transform if train_transform is not None else
                                transforms.train_transform(image_size, normalize=in_workers, mean=mean, std=std))
        self.eval_transform = (eval_transform if eval_transform is not None else
                               transforms.eval_transform(image_size, normalize=in_workers, mean=mean, std=std))
        if decode_device is not None and not all(isinstance(t, ResizedCrop) for t in (self.train_transform, self.eval_transform)):
            raise OptionError(
                f"decode_device={decode_device!r} applies each sample's crop, flip and resize itself, batch by batch on the device, so "
                "the transforms must be lightning_lmdb.transforms.ResizedCrop (the defaults, train_transform() / eval_transform()). "
                "Leave train_transform/eval_transform out, or decode in the workers (decode_device=None)."
            )
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.num_workers = min(8, available_cores()) if num_workers is None else num_workers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.prefetch_factor, self.persistent_workers = prefetch_factor, persistent_workers
        self.multiprocessing_context = multiprocessing_context
        self.shared_filesystem = shared_filesystem  # prepare_data_per_node stays True: each node builds its part
        self.cold_cache = cold_cache
        if cold_cache and persistent_workers and self.num_workers > 0:
            rank_zero_warn("cold_cache=True turns persistent_workers off: live workers would keep the data cached.")
            self.persistent_workers = False
        if netfs_latency_ms is not None:
            if isinstance(netfs_latency_ms, bool) or not isinstance(netfs_latency_ms, (int, float)) or netfs_latency_ms < 0:
                raise OptionError(f"netfs_latency_ms={netfs_latency_ms!r} must be a number of milliseconds >= 0 (e.g. 0.5), or None "
                                 "to read the files directly.")
            netfs.check_available()  # says what to install
        self.netfs_latency_ms = netfs_latency_ms
        self.local_cache_dir = None if local_cache_dir is None else Path(local_cache_dir).expanduser()
        self.timings: dict[str, float] = {}
        self.datasets: dict[str, _ImageDataset] = {}
        #: The training order chosen at ``setup("fit")`` (``shuffle``, or what ``None`` picked); ``None`` before.
        self.train_shuffle: Shuffle | None = None
        self._raw_data: dict[str, tuple[int, int]] = {}  # split -> (bytes, records) of what the raw backend serves
        self._train_loader: ResumableDataLoader | None = None
        self._pending_train_state: dict[str, Any] | None = None

    # --- paths -----------------------------------------------------------------------------------

    def database_path(self, split: str) -> Path:
        """Where the database of ``split``'s folder lives (deterministic: every rank computes the same)."""
        folder = self.dirs[split]
        if folder is None:
            raise OptionError(f"No {split}_dir was given.")
        options = self.build_options
        text = f"{folder}\0{options.storage}" + (f"\0resize={options.resize}\0quality={options.quality}" if options.resize else "")
        text += f"\0shards={options.shards}" if options.shards is not None else ""
        key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        return self.cache_dir / f"{folder.name}-{key}.lmdb"

    def source_path(self, split: str) -> Path:
        """The folder of ``split`` as this module reads it: through its latency mount with ``netfs_latency_ms``."""
        folder = self.dirs[split]
        if folder is None:
            raise OptionError(f"No {split}_dir was given.")
        return self._through_netfs(folder, folder.name) if folder.is_dir() else folder

    def served_database_path(self, split: str) -> Path:
        """The database of ``split`` as the loaders read it: through the latency mount of ``cache_dir`` with ``netfs_latency_ms``."""
        database = self.database_path(split)
        if self.netfs_latency_ms is None:
            return database
        return self._through_netfs(database.parent.resolve(), "databases") / database.name

    def _reading_path(self, split: str) -> Path:
        """The database file the loaders of ``split`` read: its staged local copy, or :meth:`served_database_path`."""
        if self.local_cache_dir is not None:
            return staged_path(self.database_path(split), self.local_cache_dir)
        return self.served_database_path(split)

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

    def database_paths(self) -> list[Path]:
        """The databases this module serves (empty for the raw backend)."""
        return [self.database_path(s) for s, d in self.dirs.items() if d is not None] if self.backend == "lmdb" else []

    # --- Lightning hooks -------------------------------------------------------------------------

    def prepare_data(self) -> None:
        """Build each missing or stale database (LMDB backend). Writes to disk only; sets no state."""
        if self.backend != "lmdb":
            return
        sources = {split: self.source_path(split) for split, folder in self.dirs.items() if folder is not None}
        started = time.perf_counter()
        node, nodes = self._node()
        for split, source in sources.items():
            target, options = self.database_path(split), self.build_options
            with _writing_to(self.cache_dir, "cache_dir"):
                if not (self.shared_filesystem and nodes > 1):
                    build_lmdb(source, target, options)
                elif options.shards is not None:  # this node's shards; the node completing the last one writes the manifest
                    mine = list(range(node, options.shards, nodes))
                    if mine:
                        build_shards(source, target, options, mine)
                elif node == 0:  # one file: node 0 builds it, the others wait at Lightning's barrier after prepare_data
                    build_lmdb(source, target, options)
        self.timings["prepare_s"] = time.perf_counter() - started
        if not (self.shared_filesystem and nodes > 1):  # else in setup: another node may still be building them here
            self._stage_databases()

    def _stage_databases(self) -> None:
        """Copy each database to ``local_cache_dir`` (if set); a copy that is current is kept (one copy per node: staging locks)."""
        if self.local_cache_dir is None or self.backend != "lmdb":
            return
        served = [self.served_database_path(split) for split, folder in self.dirs.items() if folder is not None]  # mounted first
        started = time.perf_counter()
        for database in served:
            with _writing_to(self.local_cache_dir, "local_cache_dir"):
                report = stage(database, self.local_cache_dir)
            rank_zero_info(f"LMDBDataModule: {report.path} {report.action} ({report.bytes_copied / 1e6:.0f} MB in "
                           f"{report.seconds:.1f} s)")
        self.timings["stage_s"] = time.perf_counter() - started

    def _node(self) -> tuple[int, int]:
        """``(node rank, number of nodes)`` of the trainer's job (``(0, 1)`` without a trainer)."""
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return int(getattr(trainer, "node_rank", 0)), int(getattr(trainer, "num_nodes", 1))

    def setup(self, stage: str | None = None) -> None:
        """Create the datasets ``stage`` needs (``fit``, ``validate``, ``test`` or ``predict``)."""
        _silence_the_both_hooks_warning()
        if self.shared_filesystem and self._node()[1] > 1:  # after Lightning's barrier: every node's databases are complete
            self._stage_databases()
        for split in (s for s, folder in self.dirs.items() if folder is not None):  # mount first: not part of setup_s
            (self._reading_path if self.backend == "lmdb" else self.source_path)(split)
        started = time.perf_counter()
        fit = stage in (None, "fit")
        # predict serves the test folder, or the validation data when there is none
        evaluate = stage in (None, "fit", "validate") or (stage == "predict" and self.dirs["test"] is None)
        if self.dirs["train"] is not None and (fit or (evaluate and self.val_fraction)):
            full = self._open("train")
            if self.val_fraction:  # a seeded split: pickled as (seed, fraction, part), recomputed in each worker
                train, val = full.split(self.val_fraction, self.split_seed, (self.train_transform, self.eval_transform))
                self.datasets["val"] = val
            else:
                train = full.view(None, self.train_transform)
            if fit:
                self.train_shuffle = self._choose_shuffle(full)
                if self.train_shuffle == "block" and isinstance(train, LMDBImageDataset):
                    if self.readahead is None:  # this view only: validation keeps the automatic choice
                        train.readahead = False
                    train.read_blocks(True)
                self.datasets["train"] = train
        if evaluate and self.dirs["val"] is not None:
            self.datasets["val"] = self._open("val").view(None, self.eval_transform)
        if stage in (None, "test", "predict") and self.dirs["test"] is not None:
            self.datasets["test"] = self._open("test").view(None, self.eval_transform)
        for dataset in self.datasets.values():
            dataset.set_decoding(self.decoder, self._decode_size(dataset.transform), defer_jpeg=self.decode_device is not None)
        envs.close_all()  # the main process holds no environment once set up
        self.timings["setup_s"] = time.perf_counter() - started

    def _choose_shuffle(self, full: _ImageDataset) -> Shuffle:
        """``shuffle``, or (``None``) :func:`choose_shuffle` of the training data's size -- rank 0's, under DDP."""
        if self.shuffle is not None:
            return self.shuffle
        if isinstance(full, LMDBImageDataset):
            size = shards.database_bytes(full.path)
        else:
            size = self._raw_data.get("train", (0, 0))[0]
        choice = choose_shuffle(size, available_memory())
        trainer = self.trainer
        if trainer is not None and trainer.world_size > 1:  # memory differs between ranks: they must agree on the order
            choice = trainer.strategy.broadcast(choice, src=0)
        return choice

    def _train_block_size(self, dataset: _ImageDataset) -> int | None:
        """Records per block of a block-shuffled training order: the database's blocks, also for the raw backend."""
        if hasattr(dataset, "block_size"):
            return dataset.block_size
        if "train" in self._raw_data:
            return blockread.block_size_for(*self._raw_data["train"])
        return None

    def _decode_size(self, transform: Any) -> int | None:
        """The ``decode_size`` of a split: what its transform needs with ``"auto"``, else the setting."""
        if self.decode_size != "auto":
            return self.decode_size
        return getattr(transform, "min_input_side", self.image_size)

    def _open(self, split: str) -> _ImageDataset:
        if self.backend == "lmdb":
            return LMDBImageDataset(self._reading_path(split), readahead=self.readahead)
        return self._open_raw(split)

    def _open_raw(self, split: str) -> RawImageDataset:
        """The files the LMDB backend would serve: the database's sample list when it is current, else validated like a build.

        With ``on_error="skip"`` a build leaves bad files out; the raw backend must leave out the same ones
        so that an A/B differs in storage alone. It never builds: it reuses an up-to-date database's list,
        or (none, and ``on_error="skip"``) reads and decodes every file once here, as the builder would.
        """
        folder = self.source_path(split)
        database = self.database_path(split)
        scan = scan_folder(folder)
        if database.exists():
            try:
                meta = shards.load_meta(database, arrays=True)
            except (FileNotFoundError, DatabaseError):
                meta = None
            current = meta is not None and meta.source.fingerprint == scan.fingerprint()
            if current and meta.options.get("max_pixels") == self.build_options.max_pixels:
                # the database's size: a block-shuffled order (and shuffle=None's choice) as the lmdb backend's
                self._raw_data[split] = (shards.database_bytes(database), meta.count)
                return RawImageDataset.from_metadata(folder, meta)
        self._raw_data[split] = (scan.total_bytes, len(scan.files))
        if self.build_options.on_error != "skip":
            return RawImageDataset(folder)
        bad = find_bad_files(scan, max_pixels=self.build_options.max_pixels, workers=self.build_options.workers)
        if bad:
            log.warning("The raw backend leaves out %d bad files of %s, as a build would:\n%s", len(bad), folder,
                        "\n".join(f"  {s.path}: {s.reason}" for s in bad))
        if self.cold_cache:  # validation read every file: make them cold again
            cache.evict([_on_disk(f.path) for f in scan.files], sync=False)
        return RawImageDataset(folder, exclude={s.path for s in bad})

    @property
    def classes(self) -> list[str]:
        """Class names in target order: from the datasets once set up, else from the class folders (``[]`` for a flat folder)."""
        return list(self._class_table()[0])

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to target: from the datasets once set up, else from the class folders (``{}`` for a flat folder)."""
        return dict(self._class_table()[1])

    @property
    def num_classes(self) -> int:
        """Number of classes: from the datasets once set up, else from the class folders (0 for a flat folder)."""
        return len(self._class_table()[0])

    def _class_table(self) -> tuple[list[str], dict[str, int]]:
        for dataset in self.datasets.values():
            return dataset.classes, dataset.class_to_idx
        split, folder = next((s, d) for s, d in self.dirs.items() if d is not None)
        if not folder.is_dir() and self.backend == "lmdb":  # on_stale="ignore" serves an existing database without its folder
            meta = shards.load_meta(self.database_path(split))
            return meta.classes, meta.class_to_idx
        try:
            return find_classes(folder)
        except FileNotFoundError:  # a flat folder
            return [], {}

    def cached_files(self) -> list[str]:
        """The files a cold-cache epoch evicts: the databases, or every raw image file."""
        if self.backend == "lmdb":
            return [_on_disk(f) for s, d in self.dirs.items() if d is not None for f in shards.database_files(self._reading_path(s))]
        raw = {d.root: d for d in self.datasets.values() if isinstance(d, RawImageDataset)}
        return [_on_disk(path) for dataset in raw.values() for path in dataset.files()]

    def _loader(self, split: str, train: bool) -> DataLoader:
        if split not in self.datasets:
            how = {"train": "pass train_dir", "val": "pass val_dir or val_fraction", "test": "pass test_dir"}[split]
            raise RuntimeError(f"No {split} data: {how} (Hydra: data.{split}_dir=...) and call setup() first.")
        workers = self.num_workers > 0
        settings: dict[str, Any] = dict(
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            prefetch_factor=self.prefetch_factor if workers else None,
            persistent_workers=self.persistent_workers and workers,
            multiprocessing_context=self.multiprocessing_context if workers else None,
        )
        dataset = self.datasets[split]
        if self.decode_device is not None:
            settings["collate_fn"] = Collate(cast(ResizedCrop, dataset.transform))
        if not train:
            return DataLoader(dataset, shuffle=False, **settings)
        shuffle = self.train_shuffle if self.train_shuffle is not None else (True if self.shuffle is None else self.shuffle)
        sampler = ResumableSampler(dataset, shuffle=shuffle, seed=self.split_seed, drop_last=self.drop_last,
                                   before_epoch=self._evict if self.cold_cache else None,
                                   block_size=self._train_block_size(dataset) if shuffle == "block" else None)
        return ResumableDataLoader(dataset, sampler, progress=self._batches_processed, drop_last=self.drop_last, **settings)

    def _evict(self) -> None:
        """Before a cold-cache epoch: close this process's environments and evict the data from the page cache.

        Iteration starts in the main process after the epoch's fresh workers have started but before any
        index reaches them, so no worker has opened an environment yet.
        """
        envs.close_all()
        cache.evict(self.cached_files(), sync=True)

    def _batches_processed(self) -> int | None:
        """Training batches of the current epoch the trainer has processed (None outside ``fit``)."""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != TrainerFn.FITTING:
            return None
        return trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def train_dataloader(self) -> ResumableDataLoader:
        """Shuffled training batches, from a loader that saves its position in checkpoints (see :mod:`lightning_lmdb.sampler`)."""
        loader = cast(ResumableDataLoader, self._loader("train", train=True))
        if self._pending_train_state is not None:
            loader.load_state_dict(self._pending_train_state)
            self._pending_train_state = None
        self._train_loader = loader
        return loader

    def state_dict(self) -> dict[str, Any]:
        """The training loader's position (saved in Lightning checkpoints with the DataModule)."""
        return {"train_loader": self._train_loader.state_dict()} if self._train_loader is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the training loader's position (called by Lightning when fitting from a checkpoint).

        Applied to the current training loader, or to the next one created. Lightning also restores the
        loader's own state; both are the same position. Going through the DataModule as well keeps the
        position when ``trainer.estimated_stepping_batches`` was touched before the restore (which makes
        Lightning create the loader early and skip its own restore).
        """
        state = state_dict.get("train_loader")
        if state is None:
            return
        if self._train_loader is not None:  # this module's loader of an earlier fit, or the one Lightning created early
            self._train_loader.load_state_dict(state)
        self._pending_train_state = state  # and the next loader created (a reused module's next fit creates a new one)

    # --- batches on the device ----------------------------------------------------------------------

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """With ``decode_device``: decode the batch's deferred JPEGs there in one batched call (they are still host-side bytes).

        A LightningModule's own ``on_before_batch_transfer`` then runs on the result (Lightning calls only one of the two).
        """
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], DeferredImages):
            device = self.decode_device or "cpu"
            if device == "cuda" and self.trainer is not None and self.trainer.strategy.root_device.type == "cuda":
                device = self.trainer.strategy.root_device
            batch = type(batch)((batch[0].decode(device), *batch[1:]))
        return self._chain("on_before_batch_transfer", batch, dataloader_idx)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Finish ``uint8`` image batches on the device (:meth:`finish`), then run the LightningModule's own hook, if any."""
        return self._chain("on_after_batch_transfer", self.finish(batch) if self.finish_on_device else batch, dataloader_idx)

    def finish(self, batch: Any) -> Any:
        """``(uint8 images, targets)`` to ``(normalised float32 images, targets)`` where the images are; anything else unchanged.

        What ``on_after_batch_transfer`` does on the training device; call it yourself when you iterate the loaders outside
        Lightning. Float images (e.g. from transforms of yours that normalise) pass through untouched.
        """
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor) and batch[0].dtype == torch.uint8 \
                and batch[0].ndim == 4:
            return type(batch)((transforms.finish_batch(batch[0], self.mean, self.std), *batch[1:]))
        return batch

    def _chain(self, hook: str, batch: Any, dataloader_idx: int) -> Any:
        """Run the LightningModule's own ``hook`` on ``batch`` when it overrides it (Lightning would skip it for ours)."""
        module = self.trainer.lightning_module if self.trainer is not None else None
        if module is not None and is_overridden(hook, module):
            if not getattr(self, f"_chained_{hook}", False):
                rank_zero_info(f"LMDBDataModule.{hook} runs first, then {type(module).__name__}.{hook} on its result.")
                setattr(self, f"_chained_{hook}", True)
            batch = getattr(module, hook)(batch, dataloader_idx)
        return batch

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """Validation batches in order; ``[]`` (Lightning: no validation) when there is no validation data by choice.

        With ``val_fraction=0`` and no ``val_dir`` every image of ``train_dir`` is trained on and nothing is validated.
        """
        if self.dirs["val"] is None and not self.val_fraction and "val" not in self.datasets:
            warnings.filterwarnings("ignore", message="Total length of `list` across ranks is zero")  # Lightning's "is [] intended?"
            return []
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        """Test batches in order."""
        return self._loader("test", train=False)

    def predict_dataloader(self) -> DataLoader:
        """Test batches (or validation batches when there is no test folder) in order."""
        return self._loader("test" if "test" in self.datasets else "val", train=False)
