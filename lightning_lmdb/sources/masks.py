"""Segmentation masks: checked, stored losslessly as their index values, packed with their image in one record.

A mask is a lossless image file of class indices, one per pixel, the size of its image. What is accepted
(:func:`read_mask`), as PIL opens it, with no conversion that could change a value:

* palette (``P``) PNG, GIF, BMP, TIFF: the **indices**, never the palette's colours;
* grey (``L``): the grey values; bilevel (``1``): 0 and 1;
* 16-bit grey (``I;16`` PNG, ``I`` TIFF within 0-65535): ``uint16`` values.

Refused, naming the file and the fix: a JPEG (lossy: its labels are not the ones drawn), a colour-coded
mask (``RGB``, ``RGBA``, ``LA``, ``PA``: "convert it to an index PNG, one class id per pixel"), a mask whose
size differs from its image's, a file that is not an image. The ``ignore_index`` value (255 by default)
is an ordinary value here: it is stored as it is.

Storage:

* a mask value (:func:`encode_mask` / :func:`decode_mask`): a 12-byte header (``<III``: height, width,
  bytes per value, 1 or 2), then one zstd frame of the values, row-major, little-endian;
* the record of a sample with a mask (:func:`pack` / :func:`unpack`): ``<I`` the length of the image's
  value, the image's value (laid out by its record codec, as in any database), then the mask value. The
  record's checksum covers both.

Sources (what the builder and the raw datasets read; :mod:`lightning_lmdb.sources.base`): a manifest's mask column
(:mod:`lightning_lmdb.sources.manifest`) or an images folder paired with ``masks_dir=`` (:mod:`lightning_lmdb.sources.folder`) scan to a
:class:`MaskScan`: each file's ``mask`` set, its target a placeholder, the classes each mask holds
(:func:`labels_present`) coming with the records (``targets_from_records``). :class:`MaskTargets` checks them and makes
the classes: ``classes=`` when given, else ``"0"`` .. ``"N-1"`` with N ``num_classes=``, else the largest class id present
plus one. A mask holding a class id ``>= N`` when N is given is a bad sample (:func:`misfit`).
"""

from __future__ import annotations

import io
import json
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from lightning_lmdb.codec import zstd
from lightning_lmdb.errors import ImageDecodeError, OptionError, RecordError, SourceError
from lightning_lmdb.sources.base import Labels, SourceFile, SourceOptions, SourceScan

if TYPE_CHECKING:
    from pathlib import Path

    from lightning_lmdb.sources.dataset import FoundTargets

__all__ = ["DEFAULT_IGNORE_INDEX", "MaskScan", "MaskTargets", "decode_mask", "encode_mask", "labels_present", "mask_labels", "mask_scan",
           "misfit", "pack", "read_mask", "resize_mask", "unpack"]

#: The mask value that marks pixels without a label (Pascal VOC's borders): kept as is, left out of the classes.
DEFAULT_IGNORE_INDEX = 255
_HEADER = struct.Struct("<III")
_LENGTH = struct.Struct("<I")
_INDEX_MODES = {"P": np.uint8, "L": np.uint8, "1": np.uint8, "I;16": np.uint16, "I;16L": np.uint16, "I;16B": np.uint16, "I": np.uint16}
_CONVERT = "convert it to an index PNG (mode L or P, one class id per pixel; 16-bit grey for more than 256 classes)"


def read_mask(data: bytes, name: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """The index values of a mask file: ``H x W``, ``uint8`` (or ``uint16`` for a 16-bit mask).

    The format, mode and size are checked from the header, before any pixel is decoded.

    Args:
        data: The mask file's bytes.
        name: How to name it in errors (its path).
        size: The image's ``(width, height)``: the mask must be that size.

    Raises:
        ImageDecodeError: Not an image, a JPEG, a colour-coded mask, or another size than its image.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mask = Image.open(io.BytesIO(data))
    except Image.UnidentifiedImageError:
        raise ImageDecodeError(name, "not an image in a format Pillow can read, so not a mask. Replace the file.") from None
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for a bad file
        raise ImageDecodeError(name, f"not an image PIL can read as a mask ({exc}). Replace the file.") from None
    if mask.format in ("JPEG", "MPO"):
        raise ImageDecodeError(name, f"a mask saved as JPEG: lossy compression changed its class ids at the edges; {_CONVERT}, "
                                     "from the original labels.")
    if mask.mode not in _INDEX_MODES:
        raise ImageDecodeError(name, f"a colour-coded ({mask.mode}) mask, not class ids; {_CONVERT}.")
    if size is not None and mask.size != size:
        raise ImageDecodeError(name, f"the mask is {mask.size[0]}x{mask.size[1]} but its image is {size[0]}x{size[1]}; "
                                     "a mask must be the size of its image.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mask.load()
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for a truncated or corrupt file
        raise ImageDecodeError(name, f"a corrupt or truncated mask ({exc}). Replace the file.") from None
    if mask.mode not in _INDEX_MODES:  # a mode only the pixels tell (e.g. a GIF frame decoded to RGB)
        raise ImageDecodeError(name, f"a colour-coded ({mask.mode}) mask, not class ids; {_CONVERT}.")
    values = np.asarray(mask)
    if mask.mode == "1":
        values = values.astype(np.uint8)
    elif mask.mode == "I":
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise ImageDecodeError(name, f"mask values from {values.min()} to {values.max()}: class ids must be 0-65535; {_CONVERT}.")
        values = values.astype(np.uint16)
    return np.ascontiguousarray(values, dtype=_INDEX_MODES[mask.mode])


def resize_mask(values: np.ndarray, side: int | None) -> np.ndarray:
    """A mask shrunk as :func:`lightning_lmdb.codec.storage.resize_pixels` shrinks its image (``resize=``), nearest-neighbour.

    Each output pixel takes the value under its centre (``floor((i + 0.5) * H / h)``), the point an area resize of the
    image centres it on: no value is invented, and the mask stays aligned with the image. As is when ``side`` is ``None``
    or the mask is already that small.
    """
    from lightning_lmdb.codec.storage import resized_size

    size = None if side is None else resized_size(values.shape[1], values.shape[0], side)
    if size is None:
        return values
    (width, height), (rows, cols) = size, values.shape
    ys = ((np.arange(height) + 0.5) * rows / height).astype(np.int64)
    xs = ((np.arange(width) + 0.5) * cols / width).astype(np.int64)
    return np.ascontiguousarray(values[ys[:, None], xs[None, :]])


def labels_present(values: np.ndarray, ignore_index: int | None = DEFAULT_IGNORE_INDEX) -> list[int]:
    """The class ids a mask holds, sorted, ``ignore_index`` left out."""
    present = np.flatnonzero(np.bincount(values.reshape(-1))) if values.size else np.zeros(0, np.int64)
    return [int(v) for v in present if v != ignore_index]


def encode_mask(values: np.ndarray, level: int = 3) -> bytes:
    """A mask value: the header and one zstd frame of ``values`` (``H x W`` ``uint8`` or ``uint16``)."""
    if values.ndim != 2 or values.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"Expected an H x W uint8 or uint16 mask, got shape {values.shape} dtype {values.dtype}.")
    height, width = values.shape
    data = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<"))
    return _HEADER.pack(height, width, values.dtype.itemsize) + zstd.compress(data.data, level)


def decode_mask(value: bytes | memoryview) -> np.ndarray:
    """A mask value back to its ``H x W`` array (``uint8`` or ``uint16``, writable).

    Raises:
        RecordError: The value is damaged (its header, length or zstd checksum); the header is checked against the frame's
            declared content size before the mask is allocated.
    """
    if len(value) < _HEADER.size:
        raise RecordError(f"a mask value of {len(value)} bytes is shorter than its header")
    height, width, itemsize = _HEADER.unpack_from(value)
    if itemsize not in (1, 2):
        raise RecordError(f"a mask value says {itemsize} bytes per value (1 or 2)")
    try:  # the header is checked against the frame before it sizes an allocation
        declared = zstd.content_size(memoryview(value)[_HEADER.size :])
    except ValueError as exc:
        raise RecordError(f"a damaged mask value ({exc})") from None
    if declared != height * width * itemsize:
        raise RecordError(f"a mask value's header says {height}x{width} values of {itemsize} bytes, its zstd frame holds {declared} bytes")
    out = np.empty((height, width), dtype=np.uint8 if itemsize == 1 else np.dtype("<u2"))
    try:
        zstd.decompress_into(memoryview(value)[_HEADER.size :], memoryview(out.reshape(-1).view(np.uint8)))
    except (ValueError, *zstd.ERRORS) as exc:
        raise RecordError(f"a damaged mask value ({exc})") from None
    return out if itemsize == 1 else out.astype(np.uint16, copy=False)


def pack(image_value: bytes | memoryview, mask_value: bytes | memoryview) -> bytes:
    """The record of a sample with a mask: the image's value length, the image's value, the mask value."""
    return _LENGTH.pack(len(image_value)) + bytes(image_value) + bytes(mask_value)


def unpack(value: bytes | memoryview) -> tuple[memoryview, memoryview]:
    """``(image value, mask value)`` of a record :func:`pack` made (views, no copy).

    Raises:
        RecordError: The record is too short for the length it starts with.
    """
    view = memoryview(value)
    if len(view) < _LENGTH.size:
        raise RecordError("a record with a mask is shorter than its length field")
    (length,) = _LENGTH.unpack_from(view)
    if _LENGTH.size + length > len(view):
        raise RecordError(f"a record with a mask says its image has {length} bytes, but the record holds {len(view)}")
    return view[_LENGTH.size : _LENGTH.size + length], view[_LENGTH.size + length :]


# --- mask sources and their classes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MaskScan(SourceScan):
    """A scanned source of images with masks: target kind ``"mask"``, every file's ``mask`` set, placeholder targets (the
    classes each mask holds come with its record: ``targets_from_records``).

    Attributes:
        ignore_index: The mask value of unlabelled pixels (stored as is, not a class).
        num_classes: The number of classes when known before the build (``num_classes=``, or the length of ``classes=``);
            ``None``: the largest class id present plus one, known once every mask is read.
    """

    ignore_index: int = DEFAULT_IGNORE_INDEX
    num_classes: int | None = None


def _known_classes(options: SourceOptions) -> tuple[list[str], int | None]:
    """The class names and count known before a build: ``classes=``, else ``"0"`` .. ``"N-1"`` of ``num_classes=``, else none."""
    if options.classes is not None:
        if options.num_classes is not None and options.num_classes != len(options.classes):
            raise OptionError(f"num_classes={options.num_classes} but classes= names {len(options.classes)} classes; give one of them, "
                              "or make them agree.")
        return list(options.classes), len(options.classes)
    if options.num_classes is not None:
        return [str(k) for k in range(options.num_classes)], options.num_classes
    return [], None


def _ignore_index(options: SourceOptions) -> int:
    return DEFAULT_IGNORE_INDEX if options.ignore_index is None else options.ignore_index


def mask_column(manifest: str, columns: list[str], options: SourceOptions) -> str | None:
    """A manifest's mask column (``None``: its targets are not masks); mask options without one are refused.

    Args:
        manifest: How to name the manifest in errors.
        columns: Its columns.
        options: How to read it.

    Raises:
        SourceError: ``target_kind="mask"`` without a mask column, or ``label`` and ``mask`` columns without ``target_kind``.
        OptionError: ``masks_dir``; ``ignore_index`` or ``num_classes`` without a mask column.
    """
    if options.masks_dir is not None:
        raise OptionError(f"masks_dir={options.masks_dir!r} pairs an image folder with its masks folder; the manifest {manifest} lists "
                          "its masks in a column instead: set mask_column= (default 'mask').")
    if options.mask_column is not None:
        if options.mask_column not in columns:
            raise SourceError(f"{manifest} has no column {options.mask_column!r} (mask_column={options.mask_column!r}); its columns "
                              f"are {columns}.")
        return options.mask_column
    if options.target_kind not in (None, "mask") or "mask" not in columns:
        if options.target_kind == "mask":
            raise SourceError(f"{manifest} has no 'mask' column for target_kind='mask'; its columns are {columns}. Name it with "
                              "mask_column= (CLI --mask-column, Hydra data.source_options.mask_column).")
        unused = [f"{name}={getattr(options, name)!r}" for name in ("ignore_index", "num_classes") if getattr(options, name) is not None]
        if unused:
            raise OptionError(f"{', '.join(unused)}: these options read segmentation masks, but {manifest} is read without a mask "
                              "column; set mask_column=, or leave them unset.")
        return None
    if options.target_kind is None and "label" in columns:
        raise SourceError(f"{manifest} has both a 'label' and a 'mask' column: set target_kind='mask' for the segmentation masks (its "
                          "label column is then not read), or target_kind='class' (or another kind) for the labels.")
    return "mask"


def mask_labels(options: SourceOptions) -> Labels:
    """The :class:`~lightning_lmdb.sources.base.Labels` of a mask source before it is read (no classes when they are inferred)."""
    classes, _ = _known_classes(options)
    return Labels(classes, {c: k for k, c in enumerate(classes)}, "mask")


def mask_scan(root: Path, files: list[SourceFile], special: list[tuple[str, str]], options: SourceOptions,
              identity: dict[str, Any]) -> MaskScan:
    """The :class:`MaskScan` of a mask source's files; ``identity`` (how it was read) gets the mask options added.

    Raises:
        OptionError: ``target_kind`` other than ``"mask"``, ``label_sep``, or ``num_classes`` and ``classes`` that disagree.
    """
    wrong = [f"{name}={getattr(options, name)!r}" for name in ("label_column", "label_sep") if getattr(options, name) is not None]
    if options.target_kind not in (None, "mask"):
        wrong.insert(0, f"target_kind={options.target_kind!r}")
    if wrong:
        raise OptionError(f"{', '.join(wrong)}: the targets of {str(root)!r} are its segmentation masks (target_kind 'mask'); "
                          "leave these unset.")
    classes, count = _known_classes(options)
    ignore = _ignore_index(options)
    text = json.dumps({**identity, "kind": "mask", "classes": classes, "num_classes": count, "ignore_index": ignore},
                      sort_keys=True, ensure_ascii=False)
    return MaskScan(root=root, classes=classes, class_to_idx={c: k for k, c in enumerate(classes)}, files=files, special=special,
                    target_kind="mask", identity=text, targets_from_records=True, ignore_index=ignore, num_classes=count)


def misfit(labels: Sequence[int], num_classes: int | None, ignore_index: int | None = DEFAULT_IGNORE_INDEX) -> str | None:
    """Why a mask holding the class ids ``labels`` (sorted, :func:`labels_present`) does not fit ``num_classes``, else ``None``."""
    if num_classes is None or not labels or labels[-1] < num_classes:
        return None
    return (f"holds the class id {labels[-1]}, but there are {num_classes} classes (0..{num_classes - 1}): fix the mask, or raise "
            f"num_classes= (unlabelled pixels hold ignore_index={ignore_index})")


class MaskTargets:
    """The record-target checker of a :class:`MaskScan` (as :class:`~lightning_lmdb.sources.dataset.RecordTargets` is a dataset's):
    each record's target is the sorted list of the class ids its mask holds."""

    def __init__(self, classes: Sequence[str] | None, num_classes: int | None, ignore_index: int | None = DEFAULT_IGNORE_INDEX):
        self.classes = list(classes) if classes else None
        self.num_classes = len(self.classes) if self.classes is not None else num_classes
        self.ignore_index = ignore_index
        self.top = -1  # the largest class id seen

    @classmethod
    def of(cls, scan: SourceScan) -> MaskTargets:
        """The checker of ``scan``'s records (a :class:`MaskScan`)."""
        return cls(scan.classes or None, getattr(scan, "num_classes", None), getattr(scan, "ignore_index", DEFAULT_IGNORE_INDEX))

    def check(self, raw: Any) -> str | None:
        """``None`` when ``raw`` (a record's class ids) fits, remembering its largest; else why not (a bad sample)."""
        if not isinstance(raw, list) or not all(type(v) is int and v >= 0 for v in raw) or raw != sorted(raw):
            return f"its mask's class ids {raw!r} are not a sorted list of class ids"
        problem = misfit(raw, self.num_classes, self.ignore_index)
        if problem is not None:
            return f"its mask {problem}"
        self.top = max(self.top, raw[-1] if raw else -1)
        return None

    def finish(self, raws: Sequence[Any]) -> FoundTargets:
        """The targets of the records whose class ids are ``raws`` (in record order): kind ``"mask"``, each a tuple of class ids.

        Raises:
            ValueError: A target that does not fit.
        """
        from lightning_lmdb.sources.dataset import FoundTargets

        for i, raw in enumerate(raws):
            problem = self.check(raw)
            if problem is not None:
                raise ValueError(f"record {i}: {problem}")
        classes = self.classes if self.classes is not None else [str(k) for k in range(self.num_classes or self.top + 1)]
        return FoundTargets("mask", classes, [], [tuple(raw) for raw in raws])
