"""The checks ``LMDBDataModule.__init__`` makes of its arguments, and its choice types (each a ``Literal``, its values derived from it).

The build options are :class:`~lightning_lmdb.options.BuildOptions`'s (declared, defaulted and checked there), ``decoder`` is
:func:`~lightning_lmdb.decoders.check_decoder`'s and ``shuffle`` :func:`~lightning_lmdb.sampler.check_shuffle`'s: the checks here
call those, adding the Hydra key.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torchvision.datasets.folder import IMG_EXTENSIONS

from lightning_lmdb import sources, transforms
from lightning_lmdb.decoders import check_decoder
from lightning_lmdb.errors import OptionError, SourceError
from lightning_lmdb.sampler import check_shuffle

Backend = Literal["lmdb", "raw"]
#: A DataLoader worker start method (``None`` in ``LMDBDataModule`` means the platform default).
StartMethod = Literal["fork", "spawn", "forkserver"]
#: Where the batched JPEG decode runs (``None``: every sample is decoded in the workers).
DecodeDevice = Literal["cuda", "cpu"]

BACKENDS: tuple[str, ...] = get_args(Backend)
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


def check_data(dirs: tuple[Any, Any, Any], val_fraction: Any) -> None:
    """Refuse no folder at all, a ``val_fraction`` out of ``[0, 1)``, or one ``> 0`` together with ``val_dir`` (``dirs[1]``)."""
    number = isinstance(val_fraction, (int, float)) and not isinstance(val_fraction, bool)
    if val_fraction is not None and not (number and 0 <= val_fraction < 1):
        raise OptionError(f"val_fraction={val_fraction!r} must be in [0, 1), or None for 0.1 without val_dir and no split with one.")
    if val_fraction and dirs[1] is not None:
        raise OptionError(f"Give either val_dir or val_fraction, not both (val_fraction={val_fraction!r}): pass val_fraction=0 or None"
                          " to validate on val_dir, or leave val_dir out to split train_dir.")
    if all(d is None for d in dirs):
        raise OptionError("No data: pass train_dir (and val_dir / test_dir or val_fraction).")


def check_loader(batch_size: Any, image_size: Any, prefetch_factor: Any, num_workers: Any) -> None:
    """Refuse a count that is not an integer in range."""
    check_count("batch_size", batch_size, 1, "samples per batch")
    check_count("image_size", image_size, 1, "side in pixels of the images the default transforms make")
    check_count("prefetch_factor", prefetch_factor, 1, "batches prefetched per worker")
    if num_workers is not None:
        check_count("num_workers", num_workers, 0, "loader worker processes, 0 loads in this process, None one per core")


def check_folders(dirs: dict[str, Path | None], serve_without_folder: bool, database_path: Callable[[str], Path]) -> None:
    """Refuse a given folder that does not exist or holds no images (with ``serve_without_folder``: unless its database exists)."""
    for split, folder in dirs.items():
        if folder is None:
            continue
        kind = sources.kind_of(folder)
        if kind is None and not (serve_without_folder and database_path(split).exists()):
            raise FileNotFoundError(
                f"{split}_dir {str(folder)!r} does not exist or is not a folder. Pass the folder that holds your images"
                f" (Hydra: data.{split}_dir=/path/to/images)."
                + (" With on_stale='ignore' an existing database is served without it, but there is none at "
                   f"{str(database_path(split))!r}." if serve_without_folder else "")
            )
        if kind is not None and not serve_without_folder and not kind.has_samples(folder):  # on_stale="ignore" promises no scan
            raise SourceError(
                f"No images found in {split}_dir {str(folder)!r}: expected files ending in {', '.join(IMG_EXTENSIONS)} either in "
                f"one subfolder per class (ImageFolder layout) or directly in the folder. Pass the folder that holds your images "
                f"(Hydra: data.{split}_dir=/path/to/images)."
            )


def default_transforms(train_transform: Callable[[Any], Any] | None, eval_transform: Callable[[Any], Any] | None, image_size: int,
                       finish_on_device: bool, mean: tuple[float, ...], std: tuple[float, ...],
                       decode_device: str | None) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """The training and evaluation transforms: those given, else the defaults (normalising in the workers without ``finish_on_device``).

    Raises:
        OptionError: ``decode_device`` with a transform that is not a :class:`~lightning_lmdb.transforms.ResizedCrop`.
    """
    in_workers = not finish_on_device
    train = train_transform if train_transform is not None else transforms.train_transform(image_size, normalize=in_workers, mean=mean,
                                                                                            std=std)
    evaluate = eval_transform if eval_transform is not None else transforms.eval_transform(image_size, normalize=in_workers, mean=mean,
                                                                                           std=std)
    if decode_device is not None and not all(isinstance(t, transforms.ResizedCrop) for t in (train, evaluate)):
        raise OptionError(
            f"decode_device={decode_device!r} applies each sample's crop, flip and resize itself, batch by batch on the device, so "
            "the transforms must be lightning_lmdb.transforms.ResizedCrop (the defaults, train_transform() / eval_transform()). "
            "Leave train_transform/eval_transform out, or decode in the workers (decode_device=None)."
        )
    return train, evaluate
