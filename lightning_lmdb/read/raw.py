"""``RawImageDataset``: the samples of a source read straight from its image files (the raw side of an A/B); and
``SourceDataset``: the samples of a map-style dataset source read from the dataset itself.

Both share everything but the bytes' origin with :class:`lightning_lmdb.read.dataset.LMDBImageDataset` (see that
module's docstring): the same view, transforms, decoders and typed targets.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image

from lightning_lmdb.build import readers
from lightning_lmdb.codec.decoders import ImageDecodeError, decode, hwc_to_tensor
from lightning_lmdb.codec.storage import DEFAULT_MAX_PIXELS
from lightning_lmdb.errors import BuildError, LightningLMDBError, SourceError
from lightning_lmdb.read.batchdecode import Deferred
from lightning_lmdb.read.dataset import ImageDatasetBase, WithMask, ignore_index_of, stored_targets
from lightning_lmdb.read.decoding import check_decoding
from lightning_lmdb.remote import fastget, objects
from lightning_lmdb.remote import fs as remote_fs
from lightning_lmdb.remote.urls import is_remote, redact
from lightning_lmdb.sources import dataset as datasource
from lightning_lmdb.sources import masks
from lightning_lmdb.sources.base import Labels, SourceFile, SourceOptions, SourceScan, read_file, scan_source
from lightning_lmdb.store import format as fmt
from lightning_lmdb.targets import TargetTable, target_kind, width_of

log = logging.getLogger(__name__)


class RawImageDataset(ImageDatasetBase):
    """The same samples read straight from the image files (the baseline of an A/B).

    The folder is scanned with torchvision's ImageFolder helpers (see :mod:`lightning_lmdb.sources.folder`) and
    each file goes through the same decode function as :class:`LMDBImageDataset`.

    A source with segmentation masks (target kind ``"mask"``) serves ``(image, mask)`` as a mask database does, each mask
    read from its file (:func:`lightning_lmdb.sources.masks.read_mask`: checked to be an index mask of its image's size). Its
    classes, unless the source gives them (``classes=`` / ``num_classes=``), are found by reading every mask once
    (:func:`mask_classes`), as a build finds them.

    Args:
        root: The image folder (ImageFolder layout, or a flat folder of images).
        transform: Applied to the decoded image (a PIL RGB image with ``decoder="pil"``, else a ``uint8`` tensor); with masks, to
            ``(image, mask)`` (see :mod:`lightning_lmdb.read.dataset`).
        target_transform: Applied to the target (with masks: the transformed ``int64`` mask).
        decoder: As :class:`LMDBImageDataset`.
        decode_size: As :class:`LMDBImageDataset`.
        indices: Serve only these samples, in this order.
        exclude: Relative paths to leave out (e.g. the bad files :func:`lightning_lmdb.build.writer.find_bad_files` found).
        manifest: How to read ``root`` when it is a manifest (:class:`~lightning_lmdb.sources.base.SourceOptions`).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        decoder: str = "pil",
        decode_size: int | None = None,
        indices: Sequence[int] | None = None,
        exclude: Collection[str] = (),
        manifest: SourceOptions | None = None,
    ):
        self._from_scan(scan_source(root, manifest), transform, target_transform, decoder, decode_size, indices, exclude)

    @classmethod
    def from_scan(cls, scan: SourceScan, transform: Callable[[Any], Any] | None = None, *, exclude: Collection[str] = (),
                  classes: Sequence[str] | None = None) -> RawImageDataset:
        """The samples of a source scanned already (:func:`lightning_lmdb.sources.base.scan_source`), ``exclude`` left out.

        Args:
            scan: The scan.
            transform: As the constructor's.
            exclude: Relative paths to leave out.
            classes: A mask source's classes when found already (:func:`mask_classes`); ``None``: the scan's, else found here.
        """
        dataset = cls.__new__(cls)
        dataset._from_scan(scan, transform, None, "pil", None, None, exclude, classes)
        return dataset

    def _from_scan(self, scan: SourceScan, transform: Callable[[Any], Any] | None, target_transform: Callable[[Any], Any] | None,
                   decoder: str, decode_size: int | None, indices: Sequence[int] | None, exclude: Collection[str],
                   classes: Sequence[str] | None = None) -> None:
        check_decoding(decoder, decode_size)
        self.root = str(scan.root)
        self._carry_storage_options()
        kept = [f for f in scan.files if f.relpath not in exclude] if exclude else scan.files
        kind = str(scan.target_kind)
        if target_kind(kind).in_record:  # a mask source: the classes each mask holds are known once it is read: on demand (_all_targets)
            self._targets: TargetTable | None = None
            self._masks: fmt.PathTable | None = fmt.PathTable.from_strings(f.mask for f in kept)
            names_of = list(classes) if classes is not None else (scan.classes or mask_classes(scan, exclude))
        else:
            self._targets = TargetTable.pack(kind, [f.target for f in kept], width_of(kind, scan.classes, scan.target_names)).freeze()
            self._masks, names_of = None, scan.classes
        self._paths = fmt.PathTable.from_strings(f.relpath for f in kept)
        names = list(scan.split_names or [])
        self._splits = scan.split_indices(kept)
        super().__init__(list(names_of), {c: k for k, c in enumerate(names_of)}, len(kept), transform, target_transform, indices,
                         decoder, decode_size, (kind, list(scan.target_names), names), getattr(scan, "ignore_index", None))

    @classmethod
    def from_metadata(
        cls,
        root: str | os.PathLike[str],
        meta: fmt.Metadata,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        *,
        decoder: str = "pil",
        decode_size: int | None = None,
        indices: Sequence[int] | None = None,
    ) -> RawImageDataset:
        """The samples a database built from ``root`` holds -- same classes, order and skipped files -- read from the files.

        This is the raw side of an A/B that must differ in storage alone: a database built with
        ``on_error="skip"`` leaves bad files out, and this dataset leaves out exactly the same ones.

        Args:
            root: The image folder the database was built from.
            meta: The database's metadata, read with ``arrays=True`` (e.g. ``database.load_meta(path, arrays=True)``).

        Raises:
            ValueError: ``meta`` was read without the paths.
        """
        masked = target_kind(meta.target_kind).in_record  # a mask database: the mask paths too
        if meta.paths is None or (masked and getattr(meta, "mask_paths", None) is None):
            raise ValueError("from_metadata needs metadata read with arrays=True (the paths" + (" and mask paths)." if masked else ")."))
        dataset = cls.__new__(cls)
        dataset.root = str(root).rstrip("/") if is_remote(root) else str(Path(root).expanduser().resolve())
        dataset._carry_storage_options()
        dataset._targets, dataset._paths, dataset._splits = meta.target_table(), meta.paths, meta.splits
        dataset._masks = getattr(meta, "mask_paths", None) if masked else None
        ImageDatasetBase.__init__(dataset, meta.classes, meta.class_to_idx, meta.count, transform, target_transform, indices, decoder,
                                  decode_size, stored_targets(meta), ignore_index_of(meta))
        return dataset

    def _carry_storage_options(self) -> None:
        """Keep this process's object-storage options with a dataset whose files are objects (``s3://``), so a DataLoader worker
        -- forked or spawned -- reads them with the same options (adopted on its first read: :meth:`_adopt`). In memory only: a
        dataset is never saved, and its ``repr`` does not show them."""
        self._remote_options = remote_fs.registered() if is_remote(self.root) else None
        self._adopted = os.getpid()

    def _adopt(self) -> None:
        """In a process other than the one that made this dataset (a DataLoader worker): take its object-storage options,
        and let its GETs go through ``obstore`` (:func:`lightning_lmdb.remote.fastget.allow`: a worker forks nothing)."""
        if self._adopted != os.getpid():
            remote_fs.adopt(self._remote_options)
            fastget.allow()
            self._adopted = os.getpid()

    def _join(self, relpath: str) -> str:
        """A file's path: ``relpath`` under the root (a URL when the root is one); an absolute path or full URL as it is."""
        if is_remote(relpath):
            return relpath
        return f"{self.root}/{relpath}" if is_remote(self.root) else os.path.join(self.root, relpath)

    def files(self) -> list[str]:
        """Absolute path of every image file of the folder (all samples, not only this view's)."""
        return [self._join(p) for p in self._paths.tolist()]

    def mask_files(self) -> list[str]:
        """Absolute path of every mask file (all samples, not only this view's); ``[]`` without masks."""
        return [] if self._masks is None else [self._join(p) for p in self._masks.tolist()]

    def _all_targets(self) -> TargetTable:
        if self._targets is None:  # a scanned mask source's: the classes each mask holds, every mask read once, on demand
            ids = [masks.labels_present(masks.read_mask(read_file(path), path), self.ignore_index) for path in self.mask_files()]
            self._targets = TargetTable.pack(self.target_kind, ids, len(self.classes)).freeze()
        return self._targets

    def rows_of_split(self, name: str) -> np.ndarray:
        """The samples (positions among all of them) the source put in split ``name`` (see :attr:`split_names`)."""
        return np.flatnonzero(self._splits == self.split_names.index(name)) if name in self.split_names else np.zeros(0, np.int64)

    def _path_table(self) -> fmt.PathTable:
        return self._paths

    def _name(self, row: int) -> str:
        path = self._join(self._paths[row])
        return path if self._masks is None else f"{path} (mask {self._join(self._masks[row])})"

    def _load(self, row: int, marks: list[float] | None = None) -> Image.Image | torch.Tensor | Deferred | WithMask:
        path = self._join(self._paths[row])
        if getattr(self, "_remote_options", None) is not None:  # an object: one GET, with the options of the process that made this dataset
            self._adopt()
        if self._masks is not None:  # the mask file: read with the image, checked against it in _transformed_pair
            mask_path = self._join(self._masks[row])
            if is_remote(path) and is_remote(mask_path):  # two objects: fetched together, not one after the other
                data, mask_data = objects.read_many([(path, None, None, None), (mask_path, None, None, None)])
            else:
                data, mask_data = read_file(path), read_file(mask_path)
            mask = masks.read_mask(mask_data, mask_path)
        else:
            data = read_file(path)
        if marks is not None:
            marks.append(time.perf_counter())
        image = self._deferred(data) or decode(data, self.decoder, decode_size=self._image_decode_size(), name=path)
        return image if self._masks is None else WithMask(image, mask)


def mask_classes(scan: SourceScan, exclude: Collection[str] = ()) -> list[str]:
    """The classes a build finds in a mask source (:class:`lightning_lmdb.sources.masks.MaskTargets`): every mask (but ``exclude``'s)
    read once, in this process.

    Raises:
        ImageDecodeError: A mask that is not an index mask (a build refuses it too, or skips it with ``on_error="skip"``: pass
            the bad files as ``exclude``).
        SourceError: A mask holding a class id beyond ``num_classes=``.
    """
    fitting = masks.MaskTargets.of(scan)
    found = []
    for file, data in _mask_bytes([file for file in scan.files if file.relpath not in exclude]):
        ids = masks.labels_present(masks.read_mask(data, file.mask), fitting.ignore_index)
        problem = fitting.check(ids)
        if problem is not None:
            raise SourceError(f"{redact(file.mask) if is_remote(file.mask) else file.mask}: {problem}.")
        found.append(ids)
    return list(fitting.finish(found).classes)


#: How many mask objects :func:`_mask_bytes` fetches together (and holds at once).
_MASKS_AT_ONCE = 256


def _mask_bytes(files: list[SourceFile]) -> Iterator[tuple[SourceFile, bytes]]:
    """Each file with its mask file's bytes, in order: a local mask read alone; mask objects fetched :data:`_MASKS_AT_ONCE` at a time
    (:func:`lightning_lmdb.remote.objects.read_many`), each ``If-Match`` the ETag the scan listed."""
    for start in range(0, len(files), _MASKS_AT_ONCE):
        batch = files[start:start + _MASKS_AT_ONCE]
        if all(is_remote(file.mask) for file in batch):
            yield from zip(batch, objects.read_many([(file.mask, file.mask_etag or None, None, None) for file in batch]), strict=True)
        else:
            yield from ((file, read_file(file.mask)) for file in batch)


# --- a map-style dataset source, served from the dataset itself ----------------------------------------------------------


class SampleReads(NamedTuple):
    """What reading every sample of a dataset once, as a build does (:func:`read_samples`), found.

    Attributes:
        keys: The dataset indices of the samples a build keeps, in order (``int64``).
        targets: Their targets (the build's: same kind and classes).
        classes: The class names in index order (``[]`` for ``regression`` / ``none``).
        target_names: The K names of a regression target.
        bad: The samples a build with ``on_error="skip"`` leaves out (path: the index as text), with the reason.
    """

    keys: np.ndarray
    targets: TargetTable
    classes: list[str]
    target_names: list[str]
    bad: list[fmt.Skipped]

    @property
    def labels(self) -> Labels:
        """The classes and target kind."""
        return Labels(list(self.classes), {c: k for k, c in enumerate(self.classes)}, self.targets.kind, list(self.target_names))


def read_samples(scan: SourceScan, *, max_pixels: int | None = DEFAULT_MAX_PIXELS, workers: int | None = 0,
                 on_error: str = "skip") -> SampleReads:
    """Read and check every sample of a dataset's scan (:func:`lightning_lmdb.sources.dataset.scan`) once, as a build does:
    the same reads (:func:`lightning_lmdb.build.readers.read_sample`, in the builder's reader pool), bad samples and targets
    (:class:`~lightning_lmdb.sources.dataset.RecordTargets`: the same kind and classes), without storing anything.

    Args:
        scan: The dataset's scan.
        max_pixels: The builder's decompression-bomb limit.
        workers: Reader processes (``None``: one per core; ``0``: in this process).
        on_error: ``"skip"`` leaves bad samples out (:attr:`SampleReads.bad`); ``"raise"`` raises at the first one, as a build would.

    Raises:
        BuildError: A bad sample with ``on_error="raise"``, or no good sample at all.
    """
    dataset = datasource.dataset_of(scan)
    tasks: list[readers._Task] = [(i, f.relpath, "check", max_pixels, None, 0) for i, f in enumerate(scan.files)]
    fitting = datasource.RecordTargets.of(scan)
    keys: list[int] = []
    raws: list[Any] = []
    bad: list[fmt.Skipped] = []
    with readers._read_files(tasks, readers.available_cores() if workers is None else workers, dataset) as results:
        for index, value, entry in results:
            reason = entry if value is None else fitting.check(entry)
            if reason is None:
                keys.append(index)
                raws.append(entry)
            elif on_error == "raise":
                raise BuildError(f"{scan.files[index].path}: {reason}\nFix the sample, or pass on_error='skip' to leave bad samples out "
                                 "(Hydra: data.on_error=skip).")
            else:
                bad.append(fmt.Skipped(scan.files[index].relpath, reason))
    if not keys:
        raise BuildError(f"Every sample of {str(scan.root)!r} is bad; nothing to serve. The reasons: "
                         + "; ".join(f"[{s.path}] {s.reason}" for s in bad[:5]) + (" ..." if len(bad) > 5 else ""))
    found = datasource.RecordTargets.of(scan).finish(raws)
    table = TargetTable.pack(found.kind, found.targets, width_of(found.kind, found.classes, found.target_names)).freeze()
    return SampleReads(np.array(keys, dtype=np.int64), table, list(found.classes), list(found.target_names), bad)


class SourceDataset(ImageDatasetBase):
    """The samples of a map-style dataset source served from the dataset itself: the raw side of an A/B whose source is a
    ``Dataset`` (``LMDBDataModule(train_dir=my_dataset, backend="raw")``).

    Sample ``i`` is ``dataset[keys[i]]``'s image as a database built from ``dataset`` serves it -- pixels (a PIL image, an
    array, a tensor) converted to RGB as the build's lossless PNG of them decodes (no PNG is made), image files (a path,
    bytes) decoded by the same decoder -- and the target the build found for it (:class:`SampleReads`, or the database's).

    Args:
        dataset: The map-style dataset (pickled with this one for ``spawn`` / ``forkserver`` workers).
        keys: The dataset indices served (the samples a build keeps), in order.
        targets: Their targets.
        classes: The class names in index order.
        kind: ``(target kind, target names, split names)``.
        transform, target_transform, decoder, decode_size, indices: As :class:`RawImageDataset`.
    """

    def __init__(
        self,
        dataset: Any,
        keys: Sequence[int] | np.ndarray,
        targets: TargetTable,
        classes: Sequence[str],
        kind: tuple[str, list[str], list[str]],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        *,
        decoder: str = "pil",
        decode_size: int | None = None,
        indices: Sequence[int] | None = None,
    ):
        self.dataset = dataset
        self._keys = np.asarray(keys, dtype=np.int64)
        self._keys.flags.writeable = False
        if len(targets) != len(self._keys):
            raise ValueError(f"{len(targets)} targets for {len(self._keys)} samples.")
        self._targets, self._paths = targets, None
        super().__init__(list(classes), {c: k for k, c in enumerate(classes)}, len(self._keys), transform, target_transform, indices,
                         decoder, decode_size, kind)

    @classmethod
    def from_metadata(cls, dataset: Any, meta: fmt.Metadata, transform: Callable[[Any], Any] | None = None) -> SourceDataset:
        """The samples a database built from ``dataset`` holds -- same order, classes, targets and skipped samples -- read from
        ``dataset`` (``meta`` read with ``arrays=True``: its records' paths are the dataset indices)."""
        if meta.paths is None:
            raise ValueError("from_metadata needs metadata read with arrays=True (the paths).")
        found = cls(dataset, np.array(meta.paths.tolist(), dtype=np.int64), meta.target_table(), meta.classes, stored_targets(meta),
                    transform)
        found._paths = meta.paths
        return found

    @classmethod
    def from_reads(cls, dataset: Any, reads: SampleReads, transform: Callable[[Any], Any] | None = None) -> SourceDataset:
        """The samples :func:`read_samples` kept, read from ``dataset``."""
        return cls(dataset, reads.keys, reads.targets, reads.classes, (reads.targets.kind, list(reads.target_names), []), transform)

    def _all_targets(self) -> TargetTable:
        return self._targets

    def _path_table(self) -> fmt.PathTable:
        if self._paths is None:  # as a database built from the dataset names its records: the index as text
            self._paths = fmt.PathTable.from_strings(map(str, self._keys.tolist()))
        return self._paths

    def rows_of_split(self, name: str) -> np.ndarray:
        """No split: a dataset source assigns none."""
        return np.zeros(0, np.int64)

    def _load(self, row: int, marks: list[float] | None = None) -> Image.Image | torch.Tensor | Deferred:
        key = int(self._keys[row])
        sample = self.dataset[key]
        if marks is not None:
            marks.append(time.perf_counter())
        name = f"{type(self.dataset).__qualname__}[{key}]"
        try:
            found = datasource.sample_image(datasource.sample_parts(sample)[0])
            # pixels: what decoding the build's lossless PNG of them gives (their RGB conversion), without making the PNG
            rgb = found.convert("RGB") if isinstance(found, Image.Image) else None
        except (LightningLMDBError, OSError, ValueError, SyntaxError, EOFError) as exc:  # it read well when it was checked
            raise ImageDecodeError(name, f"it no longer reads as it did ({type(exc).__name__}: {exc}).") from exc
        if rgb is None:  # an image file: decoded as the database's record of it is
            return self._deferred(found) or decode(found, self.decoder, decode_size=self.decode_size, name=name)
        return rgb if self.decoder == "pil" else hwc_to_tensor(np.array(rgb))
