"""The checks ``LMDBDataModule.__init__`` makes of its arguments, and its choice types (each a ``Literal``, its values derived from it).

The build options are :class:`~lightning_lmdb.options.BuildOptions`'s (declared, defaulted and checked there), ``decoder`` is
:func:`~lightning_lmdb.codec.decoders.check_decoder`'s and ``shuffle`` :func:`~lightning_lmdb.read.sampler.check_shuffle`'s: the checks here
call those, adding the Hydra key.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torchvision.datasets.folder import IMG_EXTENSIONS

from lightning_lmdb.codec.decoders import check_decoder
from lightning_lmdb.deprecated import deprecated_names, warn_renamed
from lightning_lmdb.errors import DatabaseError, OptionError, SourceError
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.read import transforms
from lightning_lmdb.read.sampler import check_shuffle
from lightning_lmdb.remote.urls import is_remote, redact
from lightning_lmdb.sources import base as sources
from lightning_lmdb.sources import dataset as datasource
from lightning_lmdb.sources.base import SourceOptions
from lightning_lmdb.store import database, published

#: The DataModule's splits, in the order of its ``train_dir``, ``val_dir`` and ``test_dir`` arguments.
SPLITS = ("train", "val", "test")
#: Which backend serves the data (a name; the backend classes are :class:`lightning_lmdb.datamodule.backends.ServingBackend`'s).
BackendName = Literal["lmdb", "raw"]
#: A DataLoader worker start method (``None`` in ``LMDBDataModule`` means the platform default).
StartMethod = Literal["fork", "spawn", "forkserver"]
#: Where the batched JPEG decode runs (``None``: every sample is decoded in the workers).
DecodeDevice = Literal["cuda", "cpu"]

BACKENDS: tuple[str, ...] = get_args(BackendName)
START_METHODS: tuple[str, ...] = get_args(StartMethod)
DECODE_DEVICES: tuple[str, ...] = get_args(DecodeDevice)
#: The batch hooks ``LMDBDataModule`` chains to a LightningModule's own (Lightning would call only one of the two).
CHAINED_HOOKS = ("on_before_batch_transfer", "on_after_batch_transfer")


def silence_the_both_hooks_warning() -> None:
    """Lightning's "it will use the implementation from LightningDataModule" is not true here: both hooks run (see ``_chain``)."""
    for hook in CHAINED_HOOKS:
        warnings.filterwarnings("ignore", message=f"You have overridden `{hook}` in both `LightningModule` and `LightningDataModule`")


def hydra_key(name: str) -> str:
    """Where a Hydra user changes the DataModule's argument ``name``."""
    return f"Hydra: data.{name}=..."


def check_count(name: str, value: Any, minimum: int, meaning: str) -> None:
    """Refuse ``value`` unless it is an integer ``>= minimum`` (``bool`` is not one); ``meaning`` says what it counts."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionError(f"{name}={value!r} must be an integer >= {minimum} ({meaning}; {hydra_key(name)}).")


def check_choices(*, backend: Any, multiprocessing_context: Any, decoder: Any, decode_device: Any, shuffle: Any,
                  decode_size: Any, finish_on_device: bool) -> None:
    """Refuse a choice that is not one of its valid values, naming them and the Hydra key (for callers that do not check types)."""
    choices: tuple[tuple[str, Any, tuple[str | None, ...]], ...] = (
        ("backend", backend, BACKENDS),
        ("multiprocessing_context", multiprocessing_context, (*START_METHODS, None)),
        ("decode_device", decode_device, (*DECODE_DEVICES, None)),
    )
    for name, value, valid in choices:
        if value not in valid:
            raise OptionError(f"{name}={value!r} is not one of {', '.join(map(repr, valid))} ({hydra_key(name)}).")
    check_decoder(decoder, hint=hydra_key("decoder"))
    check_shuffle(shuffle, none_means="'block' when the training data does not fit in memory, else True", hint=hydra_key("shuffle"))
    if decode_size != "auto" and decode_size is not None and (isinstance(decode_size, bool) or not isinstance(decode_size, int)
                                                              or decode_size < 1):
        raise OptionError(f"decode_size={decode_size!r} must be 'auto', a positive integer or None (decode every image whole).")
    if decode_device == "cuda" and not torch.cuda.is_available():
        raise OptionError("decode_device='cuda' needs a CUDA GPU, and torch sees none. Leave decode_device=None to decode in the "
                          "workers (Hydra: data.decode_device=null).")
    if decode_device is not None and not finish_on_device:
        raise OptionError(f"decode_device={decode_device!r} makes uint8 batches on the device, which finish_on_device=True normalises "
                          "there; pass finish_on_device=True (Hydra: data.finish_on_device=true).")


def _fraction(value: Any) -> bool:
    """Whether ``value`` is a number in ``[0, 1)`` (``bool`` is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1


def check_data(dirs: tuple[Any, Any, Any], val_fraction: Any, test_fraction: Any = 0.0) -> None:
    """Refuse no folder at all, a ``val_fraction`` / ``test_fraction`` out of ``[0, 1)`` (or together 1 or more), or one ``> 0``
    together with ``val_dir`` / ``test_dir`` (``dirs[1]`` / ``dirs[2]``), or ``test_fraction`` without ``train_dir``."""
    if val_fraction is not None and not _fraction(val_fraction):
        raise OptionError(f"val_fraction={val_fraction!r} must be in [0, 1), or None for 0.1 without val_dir and no split with one.")
    if not _fraction(test_fraction):
        raise OptionError(f"test_fraction={test_fraction!r} must be in [0, 1) (0: no test share; {hydra_key('test_fraction')}).")
    if val_fraction and dirs[1] is not None:
        raise OptionError(f"Give either val_dir or val_fraction, not both (val_fraction={val_fraction!r}): pass val_fraction=0 or None"
                          " to validate on val_dir, or leave val_dir out to split train_dir.")
    if test_fraction and dirs[2] is not None:
        raise OptionError(f"Give either test_dir or test_fraction, not both (test_fraction={test_fraction!r}): pass test_fraction=0 to "
                          "test on test_dir, or leave test_dir out to hold out a share of train_dir.")
    if test_fraction and dirs[0] is None:
        raise OptionError(f"test_fraction={test_fraction!r} holds out a share of train_dir, and none was given: pass train_dir, or "
                          "test_dir with test_fraction=0.")
    if test_fraction and (val_fraction or 0) + test_fraction >= 1:
        raise OptionError(f"val_fraction={val_fraction!r} and test_fraction={test_fraction!r} hold out all of train_dir: their sum "
                          "must be below 1.")
    if all(d is None for d in dirs):
        raise OptionError("No data: pass train_dir (and val_dir / test_dir or val_fraction).")


def check_loader(batch_size: Any, image_size: Any, prefetch_factor: Any, num_workers: Any) -> None:
    """Refuse a count that is not an integer in range."""
    check_count("batch_size", batch_size, 1, "samples per batch")
    check_count("image_size", image_size, 1, "side in pixels of the images the default transforms make")
    check_count("prefetch_factor", prefetch_factor, 1, "batches prefetched per worker")
    if num_workers is not None:
        check_count("num_workers", num_workers, 0, "loader worker processes, 0 loads in this process, None one per core")


#: LMDB's magic number: 4 bytes at offset 16 of every LMDB data file (its first meta page), in the writer's byte order.
LMDB_MAGIC = 0xBEEFC0DE


def is_database(path: Path | Any) -> bool:
    """Whether ``path`` is a database to serve as it is, not a source to build one from (cheap checks only, nothing is opened).

    A folder is one when :func:`lightning_lmdb.store.database.is_sharded` says so (its manifest, or the shards or locks of its
    build): checked before the folder is taken as an image folder. A regular file is one when it starts as an LMDB file does;
    any other file is a manifest, or refused. A Dataset is no database.
    """
    if not isinstance(path, Path):
        return False
    if path.is_dir():  # shard files, or a manifest.json of ours (an image folder may hold a manifest.json of its own)
        return database.is_sharded(path) and (bool(database.shard_files(path)) or _our_manifest(path / database.MANIFEST_NAME))
    if not path.is_file():  # a FIFO or a device is never opened
        return False
    try:
        with open(path, "rb") as handle:
            head = handle.read(20)
    except OSError:
        return False
    return len(head) == 20 and LMDB_MAGIC in (int.from_bytes(head[16:], "little"), int.from_bytes(head[16:], "big"))


def _our_manifest(path: Path) -> bool:
    """Whether ``path`` is a lightning_lmdb sharded folder's manifest (a small JSON object naming our format)."""
    try:
        with open(path, "rb") as handle:
            obj = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return False
    return isinstance(obj, dict) and obj.get("format") == "lightning_lmdb"


def remote_databases(dirs: Mapping[str, Any], local_cache_dir: Path | None) -> dict[str, str]:
    """The splits given the URL of a published database (one holding a marker: :mod:`lightning_lmdb.store.published`), by split.

    A URL without a marker is a source prefix: not one of these (it is built from).

    Raises:
        OptionError: A published database and no ``local_cache_dir`` to stage it to.
    """
    found = {split: value for split, value in dirs.items() if is_remote(value) and published.has_marker(value)}
    for split, url in found.items():
        if local_cache_dir is None:
            raise OptionError(f"{split}_dir {redact(url)} is a remote database: a remote database must be staged: pass local_cache_dir "
                              f"(Hydra: data.local_cache_dir=/local/disk/folder), or download it first with `lightning-lmdb pull "
                              f"{redact(url)} DB` and pass DB.")
    return found


def given_databases(dirs: dict[str, Path | None], on_stale: str, local_cache_dir: Path | None,
                    remote: Collection[str] = ()) -> frozenset[str]:
    """The splits whose given path is a database (a file, or a sharded folder), each checked to open; they are served as they are.

    The splits in ``remote`` were given a published database (:func:`remote_databases`): their path is where it is staged
    (by ``prepare_data``), not opened here.

    Raises:
        DatabaseError: A given database cannot be opened (incomplete, damaged, foreign), naming the Hydra key.
        OptionError: With ``local_cache_dir``, two different given databases of the same name (their copies would collide).
    """
    found: dict[str, Path] = {split: path for split, path in dirs.items()
                              if split not in remote and isinstance(path, Path) and is_database(path)}
    for split, path in found.items():
        try:
            meta = database.load_meta(path)
        except DatabaseError as exc:
            raise DatabaseError(f"{split}_dir {str(path)!r} is a database that cannot be served: {exc} "
                                f"(Hydra: data.{split}_dir=/path/to/a/database/or/images)") from exc
        rank_zero_info(f"LMDBDataModule: {split}_dir {path} is a database ({meta.count} records): served as it is, never rebuilt "
                       f"(on_stale={on_stale!r} does not apply to it).")
    found.update({split: dirs[split] for split in remote})  # type: ignore[misc]
    names: dict[str, Path] = {}
    for split, path in found.items():
        other = names.setdefault(path.name, path)
        if local_cache_dir is not None and other != path:
            raise OptionError(f"{split}_dir {str(path)!r} and {str(other)!r} are both named {path.name!r}: their copies in local_cache_dir "
                              f"{str(local_cache_dir)!r} would be one file. Rename one of them, or leave local_cache_dir unset "
                              "(Hydra: data.local_cache_dir=null).")
    return frozenset(found)


def as_source_options(source_options: Any, manifest: Any = None) -> SourceOptions:
    """``LMDBDataModule``'s ``source_options`` argument as :class:`SourceOptions` (see :meth:`SourceOptions.of`), or its old name
    ``manifest``: deprecated (it warns when it sets an option; ``None`` or a mapping of ``None`` fields, Hydra's default node, is
    nothing given).

    Raises:
        OptionError: A key that is not an option, or a bad value, naming it and the Hydra key; or both names setting options.
    """
    given = _source_options(source_options, "source_options")
    old = _source_options(manifest, "manifest")
    if old.is_default():
        return given
    warn_renamed("LMDBDataModule(manifest=...)", "source_options=... (Hydra: data.source_options)", stacklevel=4)
    if not given.is_default() and given != old:
        raise OptionError(f"source_options={given.as_dict()!r} and its deprecated name manifest={old.as_dict()!r} are both given: "
                          "pass source_options alone (Hydra: data.source_options.<option>=..., and data.manifest unset).")
    return old


def _source_options(value: Any, name: str) -> SourceOptions:
    if value is not None and not isinstance(value, (SourceOptions, Mapping)):
        raise OptionError(f"{name}={value!r} must be a mapping of source options, e.g. {{'label_column': 'tags'}}, or None "
                          f"(Hydra: data.{name}.label_column=tags).")
    try:
        return SourceOptions.of(value)
    except OptionError as exc:
        raise OptionError(f"{exc} (Hydra: data.{name}.<option>=...)") from exc


def check_folders(dirs: dict[str, Path | None], serve_without_folder: bool, database_path: Callable[[str], Path],
                  manifest: SourceOptions, databases: Collection[str] = ()) -> None:
    """Refuse a given source that does not exist or holds no images (with ``serve_without_folder``: unless its database exists).

    The splits in ``databases`` are given databases, not sources, and a Dataset was checked by :func:`split_sources`: they are
    left alone.
    """
    for split, folder in dirs.items():
        if folder is None or split in databases or not (isinstance(folder, Path) or is_remote(folder)):
            continue
        kind = sources.kind_of(folder)
        if kind is None and not (serve_without_folder and database_path(split).exists()):
            what = "is neither a known source nor a database: " if is_remote(folder) or folder.exists() else ""
            raise FileNotFoundError(
                f"{split}_dir {redact(str(folder))!r} {what}"
                f"{sources.unknown_reason(folder)} Pass the folder that holds your images, a manifest "
                f"listing them or a database built by `lightning-lmdb build` (Hydra: data.{split}_dir=/path/to/images)."
                + (" With on_stale='ignore' an existing database is served without it, but there is none at "
                   f"{str(database_path(split))!r}." if serve_without_folder else "")
            )
        if kind is not None and not serve_without_folder and not kind.has_samples(folder, manifest):  # on_stale="ignore": no scan
            raise SourceError(
                f"No images found in {split}_dir {redact(str(folder))!r}: expected files ending in {', '.join(IMG_EXTENSIONS)} either in "
                f"one subfolder per class (ImageFolder layout) or directly in the folder, or a manifest listing them. Pass the folder "
                f"that holds your images (Hydra: data.{split}_dir=/path/to/images)."
            )


#: How the hyper-parameters record a Dataset given for a split (:func:`plain_source`).
_DESCRIBED = re.compile(r"<Dataset \S+ of \d+ samples(, version .+)?>")


def plain_source(value: Any, manifest: SourceOptions) -> str | None:
    """A split's data (as given) as a plain hyper-parameter: a path as a string; a Dataset (never saved) as a description,
    ``"<Dataset MyDS of 120 samples, version 2>"`` (its class, length and ``manifest.version``)."""
    if value is None or not datasource.accepts(value):
        return None if value is None else os.fspath(value)
    version = "" if manifest.version is None else f", version {manifest.version}"
    return f"<Dataset {type(value).__qualname__} of {len(value)} samples{version}>"


def split_sources(given: Sequence[Any], shards: int | None, manifest: SourceOptions) -> dict[str, Any]:
    """Each split's data as ``LMDBDataModule`` keeps it: a path expanded and resolved, a map-style Dataset as it is (never
    ``os.fspath``'d), or ``None``.

    Raises:
        OptionError: A value that is neither a path nor a Dataset, or a checkpoint's description of a Dataset
            (:func:`plain_source`) in its place; with a Dataset: ``shards``, or a manifest-only option (named, with the Hydra key).
        SourceError: An empty Dataset, or an ``IterableDataset``.
    """
    dirs: dict[str, Any] = {}
    for split, value in zip(SPLITS, given, strict=True):
        key = f"{split}_dir"
        if isinstance(value, str) and _DESCRIBED.fullmatch(value):
            raise OptionError(f"{key}={value!r} is how a checkpoint records a Dataset, which is not saved with it: pass the dataset "
                              f"again, e.g. LMDBDataModule.load_from_checkpoint(path, {key}=my_dataset).")
        if is_remote(value):  # a URL stays a string (a Path would turn s3:// into s3:/)
            dirs[split] = value
            continue
        if value is None or isinstance(value, (str, os.PathLike)):
            # a URL (s3://bucket/train/) stays its string: a Path would make it "s3:/bucket/train"
            dirs[split] = None if value is None else value if is_remote(value) else Path(value).expanduser().resolve()
            continue
        if not datasource.accepts(value):
            raise OptionError(f"{key} is a {type(value).__module__}.{type(value).__qualname__}: pass a folder, a manifest or a database "
                              f"(a path; Hydra: data.{key}=/path/to/images), or a map-style Dataset (with __len__ and __getitem__).")
        name = type(value).__qualname__
        if shards is not None:
            raise OptionError(f"shards={shards} does not apply to a Dataset source ({key} is a {name}): its database is one file. "
                              "Leave shards unset (Hydra: data.shards=null).")
        try:
            datasource.classes(value, manifest)  # refuses a manifest-only option
        except OptionError as exc:
            raise OptionError(f"{key}: {exc} (Hydra: data.source_options.<option>=null)") from exc
        if not datasource.has_samples(value, manifest):
            raise SourceError(f"{key} is an empty Dataset ({name}, len() is 0): nothing to serve. Pass a dataset with samples.")
        dirs[split] = value
    return dirs


def decode_size_for(decode_size: int | str | None, transform: Any, image_size: int) -> int | None:
    """The ``decode_size`` of a split: what its ``transform`` needs with ``"auto"`` (``image_size`` for a transform of yours), else the
    setting."""
    if decode_size != "auto":
        return decode_size  # type: ignore[return-value]
    return getattr(transform, "min_input_side", image_size)


def default_transforms(train_transform: Callable[[Any], Any] | None, eval_transform: Callable[[Any], Any] | None, image_size: int,
                       finish_on_device: bool, mean: tuple[float, ...], std: tuple[float, ...],
                       decode_device: str | None) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """The training and evaluation transforms: those given, else the defaults (normalising in the workers without ``finish_on_device``).

    Raises:
        OptionError: ``decode_device`` with a transform that is not a :class:`~lightning_lmdb.read.transforms.ResizedCrop`.
    """
    in_workers = not finish_on_device
    train = train_transform if train_transform is not None else transforms.train_transform(image_size, normalize=in_workers, mean=mean,
                                                                                            std=std)
    evaluate = eval_transform if eval_transform is not None else transforms.eval_transform(image_size, normalize=in_workers, mean=mean,
                                                                                           std=std)
    if decode_device is not None and not all(isinstance(t, transforms.ResizedCrop) for t in (train, evaluate)):
        raise OptionError(
            f"decode_device={decode_device!r} applies each sample's crop, flip and resize itself, batch by batch on the device, so "
            "the transforms must be lightning_lmdb.read.transforms.ResizedCrop (the defaults, train_transform() / eval_transform()). "
            "Leave train_transform/eval_transform out, or decode in the workers (decode_device=None)."
        )
    return train, evaluate


#: The names a source's split column may give each of the DataModule's splits (Hugging Face writes ``validation``).
SOURCE_SPLIT_NAMES: dict[str, tuple[str, ...]] = {"train": ("train",), "val": ("val", "valid", "validation"), "test": ("test",)}


def source_splits(dataset: Any) -> dict[str, np.ndarray] | None:
    """The rows of ``dataset`` its source put in train, val and test (a manifest's split column); ``None`` without splits.

    Raises:
        SourceError: The source has splits but no row in ``train``.
    """
    names = list(getattr(dataset, "split_names", []))
    if not names:
        return None
    parts = {split: np.sort(np.concatenate([dataset.rows_of_split(n) for n in aliases if n in names] or [np.zeros(0, np.int64)]))
             for split, aliases in SOURCE_SPLIT_NAMES.items()}
    known = {n for aliases in SOURCE_SPLIT_NAMES.values() for n in aliases}
    unknown = [n for n in names if n not in known]
    if unknown:
        warnings.warn(f"Rows of split(s) {', '.join(map(repr, unknown))} are not served: the DataModule serves the splits named "
                      f"{', '.join(sorted(known))}. Rename them in the split column to serve them.", UserWarning, stacklevel=2)
    if not len(parts["train"]):
        raise SourceError(f"The split column of the training source names the splits {names} but no row is in 'train'; the "
                          "DataModule trains on the rows whose split is 'train'. Fix the split column.")
    rank_zero_info(f"LMDBDataModule: the source's split column gives {len(parts['train'])} train, {len(parts['val'])} val and "
                   f"{len(parts['test'])} test samples (val_fraction and test_fraction do not apply).")
    return parts


#: The DataModule's argument for each build option whose name differs.
_DATAMODULE_NAMES = {"workers": "build_workers"}


def build_options(**values: Any) -> BuildOptions:
    """``BuildOptions(**values)``, a bad value's error naming the DataModule's argument and its Hydra key (``build_workers``,
    not ``workers``).

    Raises:
        OptionError: As :class:`BuildOptions`, with the argument and ``data.<argument>``.
    """
    try:
        return BuildOptions(**values)
    except OptionError as exc:
        text = str(exc)
        name = text.split("=", 1)[0]
        argument = _DATAMODULE_NAMES.get(name, name)
        if name.isidentifier() and text.startswith(f"{name}="):
            text = argument + text[len(name):]
        raise OptionError(f"{text} ({hydra_key(argument)})") from None


#: Names kept for one release: old name -> (the object, its new name).
__getattr__ = deprecated_names(__name__, {"Backend": (BackendName, "BackendName")})
