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
"""

from __future__ import annotations

import io
import struct
import warnings

import numpy as np
from PIL import Image

from lightning_lmdb import zstd
from lightning_lmdb.errors import ImageDecodeError, RecordError

__all__ = ["DEFAULT_IGNORE_INDEX", "decode_mask", "encode_mask", "labels_present", "pack", "read_mask", "unpack"]

#: The mask value that marks pixels without a label (Pascal VOC's borders): kept as is, left out of the classes.
DEFAULT_IGNORE_INDEX = 255
_HEADER = struct.Struct("<III")
_LENGTH = struct.Struct("<I")
_INDEX_MODES = {"P": np.uint8, "L": np.uint8, "1": np.uint8, "I;16": np.uint16, "I;16L": np.uint16, "I;16B": np.uint16, "I": np.uint16}
_CONVERT = "convert it to an index PNG (mode L or P, one class id per pixel; 16-bit grey for more than 256 classes)"


def read_mask(data: bytes, name: str, size: tuple[int, int] | None = None) -> np.ndarray:
    """The index values of a mask file: ``H x W``, ``uint8`` (or ``uint16`` for a 16-bit mask).

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
            kind = mask.format
            mask.load()
    except Exception as exc:  # noqa: BLE001 - PIL raises many types for a bad file
        raise ImageDecodeError(name, f"not an image PIL can read as a mask ({exc}). Replace the file.") from None
    if kind in ("JPEG", "MPO"):
        raise ImageDecodeError(name, f"a mask saved as JPEG: lossy compression changed its class ids at the edges; {_CONVERT}, "
                                     "from the original labels.")
    if mask.mode not in _INDEX_MODES:
        raise ImageDecodeError(name, f"a colour-coded ({mask.mode}) mask, not class ids; {_CONVERT}.")
    if size is not None and mask.size != size:
        raise ImageDecodeError(name, f"the mask is {mask.size[0]}x{mask.size[1]} but its image is {size[0]}x{size[1]}; "
                                     "a mask must be the size of its image.")
    values = np.asarray(mask)
    if mask.mode == "1":
        values = values.astype(np.uint8)
    elif mask.mode == "I":
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise ImageDecodeError(name, f"mask values from {values.min()} to {values.max()}: class ids must be 0-65535; {_CONVERT}.")
        values = values.astype(np.uint16)
    return np.ascontiguousarray(values, dtype=_INDEX_MODES[mask.mode])


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
        RecordError: The value is damaged (its header, length or zstd checksum).
    """
    if len(value) < _HEADER.size:
        raise RecordError(f"a mask value of {len(value)} bytes is shorter than its header")
    height, width, itemsize = _HEADER.unpack_from(value)
    if itemsize not in (1, 2):
        raise RecordError(f"a mask value says {itemsize} bytes per value (1 or 2)")
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
