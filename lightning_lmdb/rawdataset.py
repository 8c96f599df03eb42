"""``RawImageDataset``: the samples of a source read straight from its image files (the raw side of an A/B).

It shares everything but the bytes' origin with :class:`lightning_lmdb.dataset.LMDBImageDataset` (see that
module's docstring): the same view, transforms, decoders and typed targets.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from lightning_lmdb import format as fmt
from lightning_lmdb.batchdecode import Deferred
from lightning_lmdb.dataset import _ImageDataset, kind_of
from lightning_lmdb.decoders import decode
from lightning_lmdb.decoding import check_decoding
from lightning_lmdb.sources import ManifestOptions, SourceScan, read_file, scan_source
from lightning_lmdb.targets import TargetTable


class RawImageDataset(_ImageDataset):
    """The same samples read straight from the image files (the baseline of an A/B).

    The folder is scanned with torchvision's ImageFolder helpers (see :mod:`lightning_lmdb.folder`) and
    each file goes through the same decode function as :class:`LMDBImageDataset`.

    Args:
        root: The image folder (ImageFolder layout, or a flat folder of images).
        transform: Applied to the decoded image (a PIL RGB image with ``decoder="pil"``, else a ``uint8`` tensor).
        target_transform: Applied to the target.
        decoder: As :class:`LMDBImageDataset`.
        decode_size: As :class:`LMDBImageDataset`.
        indices: Serve only these samples, in this order.
        exclude: Relative paths to leave out (e.g. the bad files :func:`lightning_lmdb.writer.find_bad_files` found).
        manifest: How to read ``root`` when it is a manifest (:class:`~lightning_lmdb.sources.ManifestOptions`).
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
        manifest: ManifestOptions | None = None,
    ):
        self._from_scan(scan_source(root, manifest), transform, target_transform, decoder, decode_size, indices, exclude)

    @classmethod
    def from_scan(cls, scan: SourceScan, transform: Callable[[Any], Any] | None = None, *,
                  exclude: Collection[str] = ()) -> RawImageDataset:
        """The samples of a source scanned already (:func:`lightning_lmdb.sources.scan_source`), ``exclude`` left out."""
        dataset = cls.__new__(cls)
        dataset._from_scan(scan, transform, None, "pil", None, None, exclude)
        return dataset

    def _from_scan(self, scan: SourceScan, transform: Callable[[Any], Any] | None, target_transform: Callable[[Any], Any] | None,
                   decoder: str, decode_size: int | None, indices: Sequence[int] | None, exclude: Collection[str]) -> None:
        check_decoding(decoder, decode_size)
        self.root = str(scan.root)
        kept = [f for f in scan.files if f.relpath not in exclude] if exclude else scan.files
        width = len(scan.classes) if scan.target_kind == "multilabel" else len(scan.target_names)
        self._targets = TargetTable.pack(str(scan.target_kind), [f.target for f in kept], width).freeze()
        self._paths = fmt.PathTable.from_strings(f.relpath for f in kept)
        names = list(scan.split_names or [])
        self._splits = np.array([names.index(f.split) for f in kept], dtype=np.uint8) if names else None
        super().__init__(scan.classes, scan.class_to_idx, len(kept), transform, target_transform, indices, decoder, decode_size,
                         (str(scan.target_kind), list(scan.target_names), names))

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
        if meta.paths is None:
            raise ValueError("from_metadata needs metadata read with arrays=True (the paths).")
        dataset = cls.__new__(cls)
        dataset.root = str(Path(root).expanduser().resolve())
        dataset._targets, dataset._paths, dataset._splits = meta.target_table(), meta.paths, meta.splits
        _ImageDataset.__init__(dataset, meta.classes, meta.class_to_idx, meta.count, transform, target_transform, indices, decoder,
                               decode_size, kind_of(meta))
        return dataset

    def files(self) -> list[str]:
        """Absolute path of every image file of the folder (all samples, not only this view's)."""
        return [os.path.join(self.root, p) for p in self._paths.tolist()]

    def _all_targets(self) -> TargetTable:
        return self._targets

    def rows_of_split(self, name: str) -> np.ndarray:
        """The samples (positions among all of them) the source put in split ``name`` (see :attr:`split_names`)."""
        return np.flatnonzero(self._splits == self.split_names.index(name)) if name in self.split_names else np.zeros(0, np.int64)

    def _path_table(self) -> fmt.PathTable:
        return self._paths

    def _load(self, row: int, marks: list[float] | None = None) -> Image.Image | torch.Tensor | Deferred:
        path = os.path.join(self.root, self._paths[row])
        data = read_file(path)
        if marks is not None:
            marks.append(time.perf_counter())
        return self._deferred(data) or decode(data, self.decoder, decode_size=self.decode_size, name=path)
