"""The storage codec: the one place where source bytes become record values and records become pixels.

* :func:`encode_record` (the builder): validate a source file by decoding it fully with PIL (exactly
  ``ImageFolder``'s RGB conversion), and return the value stored for it -- the file's bytes
  (``storage="encoded"``) or its RGB pixels (``"decoded"``); with ``resize=S``, the image shrunk so its
  shorter side is at most ``S`` (aspect kept, never upscaled, OpenCV ``INTER_AREA``), stored re-encoded
  (JPEG at ``quality`` for lossy sources -- JPEG, lossy WebP --, PNG for lossless ones) or as pixels.
  An image already that small is stored as it is. The PNG is written for decoding speed: without
  per-row filters (zlib level 6, ``Z_FILTERED``), which decoded 1.4x faster than OpenCV's default
  (filtered) PNG on resized icons, for 11 % more bytes -- unless it is over
  :data:`UNFILTERED_PNG_MAX_GROWTH` times the size of the filtered one (photo-like content, where the
  filters are what compresses), when the filtered PNG is kept. Both are lossless: the pixels are the same.
* :func:`decode_record` (the datasets, ``verify``, ``bench``): a stored value back to an RGB image,
  through :mod:`lightning_lmdb.decoders` (PIL image for ``decoder="pil"``, else a ``uint8`` tensor).

**Adding a storage mode** is one :class:`StorageMode` entry in :data:`STORAGE_MODES` (its ``encode``, its
``decode`` and whether its records are image files' bytes); the option's valid values, the metadata
check, the builder, the datasets, ``verify`` and ``bench`` all read the registry. A new decoder is one
entry of :data:`lightning_lmdb.decoders.DECODERS`.

``decoded`` record layout: a 12-byte header (``<III``: height, width, channels) followed by RGB
``uint8`` pixels in row-major ``H x W x C`` order.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from lightning_lmdb.decoders import DEFAULT_MAX_PIXELS, ImageDecodeError, decode, decode_pil, hwc_to_tensor
from lightning_lmdb.errors import RecordError
from lightning_lmdb.imageinfo import read_info

if TYPE_CHECKING:  # torch is imported where a tensor is made (decoders.hwc_to_tensor): info and verify do without it
    import torch

__all__ = ["STORAGES", "STORAGE_MODES", "DEFAULT_MAX_PIXELS", "ImageDecodeError", "RecordError", "StorageMode", "decode_record",
           "encode_record", "encode_pixels", "decode_pixels", "resize_pixels", "storage_mode"]

#: JPEG quality of re-encoded lossy sources in a ``resize=`` build.
DEFAULT_QUALITY = 90
#: A resized lossless image is stored as an unfiltered PNG unless that is this much larger than OpenCV's filtered one.
UNFILTERED_PNG_MAX_GROWTH = 1.25
_PIXEL_HEADER = struct.Struct("<III")

def encode_pixels(pixels: np.ndarray) -> bytes:
    """Serialise an ``H x W x C`` ``uint8`` array as a ``decoded`` record value."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3:
        raise ValueError(f"Expected an H x W x C uint8 array, got shape {pixels.shape} dtype {pixels.dtype}.")
    height, width, channels = pixels.shape
    return _PIXEL_HEADER.pack(height, width, channels) + np.ascontiguousarray(pixels).tobytes()


def decode_pixels(value: bytes | memoryview) -> np.ndarray:
    """Parse a ``decoded`` record value into an ``H x W x C`` ``uint8`` array (a copy).

    Raises:
        RecordError: The value's length does not match its header.
    """
    if len(value) < _PIXEL_HEADER.size:
        raise RecordError(
            f"Decoded record holds {len(value)} bytes, less than its {_PIXEL_HEADER.size}-byte header: the database is damaged."
        )
    height, width, channels = _PIXEL_HEADER.unpack_from(value)
    expected = _PIXEL_HEADER.size + height * width * channels
    if len(value) != expected:
        raise RecordError(f"Decoded record holds {len(value)} bytes, its header promises {expected}: the database is damaged.")
    return np.frombuffer(value, dtype=np.uint8, offset=_PIXEL_HEADER.size).reshape(height, width, channels).copy()


def resize_pixels(pixels: np.ndarray, side: int) -> np.ndarray:
    """Shrink ``H x W x 3`` pixels so the shorter side is ``side`` (aspect kept; returned as is when already that small)."""
    height, width = pixels.shape[:2]
    short = min(height, width)
    if short <= side:
        return pixels
    import cv2

    size = (max(1, round(width * side / short)), max(1, round(height * side / short)))
    return cv2.resize(pixels, size, interpolation=cv2.INTER_AREA)


def _encode_image(pixels: np.ndarray, lossy: bool, quality: int) -> bytes:
    import cv2

    bgr = cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
    if lossy:
        return _imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    unfiltered = _imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, 6, cv2.IMWRITE_PNG_FILTER, cv2.IMWRITE_PNG_FILTER_NONE,
                                          cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_FILTERED])
    filtered = _imencode(".png", bgr, [])
    return unfiltered if len(unfiltered) <= UNFILTERED_PNG_MAX_GROWTH * len(filtered) else filtered


def _imencode(extension: str, bgr: np.ndarray, params: list[int]) -> bytes:
    import cv2

    ok, buffer = cv2.imencode(extension, bgr, params)
    if not ok:  # pragma: no cover - OpenCV reports failure only for unsupported input
        raise ValueError("OpenCV could not encode the resized image.")
    return buffer.tobytes()


def _encode_file(data: bytes, image: Image.Image, resize: int | None, quality: int) -> bytes:
    """``encoded``: the file's own bytes; resized, re-encoded (JPEG for lossy sources, PNG for lossless ones)."""
    if resize is None or min(image.size) <= resize:
        return data
    return _encode_image(resize_pixels(np.asarray(image), resize), read_info(data).lossy, quality)


def _encode_decoded(data: bytes, image: Image.Image, resize: int | None, quality: int) -> bytes:
    """``decoded``: the RGB pixels (resized when asked)."""
    pixels = np.asarray(image)
    return encode_pixels(pixels if resize is None else resize_pixels(pixels, resize))


def _decode_file(value: bytes | memoryview, decoder: str, decode_size: int | None, name: str) -> Image.Image | torch.Tensor:
    return decode(value, decoder, decode_size=decode_size, name=name)


def _decode_decoded(value: bytes | memoryview, decoder: str, decode_size: int | None, name: str) -> Image.Image | torch.Tensor:
    pixels = decode_pixels(value)
    return Image.fromarray(pixels) if decoder == "pil" else hwc_to_tensor(pixels)


@dataclass(frozen=True)
class StorageMode:
    """One storage mode: how the builder turns a source file into a record value, and how a record is read back.

    Attributes:
        name: The ``storage=`` value.
        encode: ``(file bytes, the file decoded to RGB by PIL, resize, quality) -> record value``.
        decode: ``(record value, decoder, decode_size, name) -> RGB image`` (PIL for ``decoder="pil"``, else a
            ``uint8 3 x H x W`` tensor).
        file_bytes: The records are image files' bytes (the original file's, or a re-encoded one with
            ``resize``): batched GPU decoding and reduced-size JPEG decoding apply, and ``verify`` compares an
            unresized record with the file byte for byte (re-encoded ones within a lossy codec's tolerance).
    """

    name: str
    encode: Callable[[bytes, Image.Image, int | None, int], bytes]
    decode: Callable[[bytes | memoryview, str, int | None, str], Image.Image | torch.Tensor]
    file_bytes: bool


#: Every storage mode, by name (the first is the default).
STORAGE_MODES: dict[str, StorageMode] = {
    mode.name: mode
    for mode in (
        StorageMode("encoded", _encode_file, _decode_file, file_bytes=True),
        StorageMode("decoded", _encode_decoded, _decode_decoded, file_bytes=False),
    )
}
#: The valid ``storage=`` values.
STORAGES: tuple[str, ...] = tuple(STORAGE_MODES)


def storage_mode(name: str) -> StorageMode:
    """The :class:`StorageMode` called ``name``.

    Raises:
        RecordError: No such storage mode (a database from a newer version of lightning_lmdb).
    """
    try:
        return STORAGE_MODES[name]
    except KeyError:
        raise RecordError(f"Storage {name!r} is not one of {', '.join(map(repr, STORAGES))}: the database was built by a newer "
                          "lightning_lmdb; upgrade it.") from None


def encode_record(
    data: bytes,
    storage: str,
    *,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    name: str = "<bytes>",
    resize: int | None = None,
    quality: int = DEFAULT_QUALITY,
) -> bytes:
    """Validate a source file's bytes (a full decode) and return the value stored for it.

    Args:
        data: The file's bytes.
        storage: A storage mode of :data:`STORAGE_MODES`.
        max_pixels: Refuse larger images (decompression bombs); ``None`` for no limit.
        name: How to name the file in errors.
        resize: Shrink images whose shorter side is larger than this (``None``: keep the size).
        quality: JPEG quality of re-encoded lossy sources (with ``resize``).

    Raises:
        ImageDecodeError: Not a decodable image, or over ``max_pixels``.
    """
    mode = storage_mode(storage)
    return mode.encode(data, decode_pil(data, max_pixels=max_pixels, name=name), resize, quality)


def decode_record(
    value: bytes | memoryview, storage: str, *, name: str = "<record>", decoder: str = "pil", decode_size: int | None = None
) -> Image.Image | torch.Tensor:
    """Turn a stored record value into an RGB image: a PIL image for ``decoder="pil"``, else a ``uint8`` ``3 x H x W`` tensor.

    Args:
        value: The record value as stored by the builder.
        storage: The database's storage mode (:data:`STORAGE_MODES`).
        name: How to name the record in errors.
        decoder: ``"pil"``, ``"torchcodec"``, ``"opencv"`` or ``"auto"`` (see :mod:`lightning_lmdb.decoders`).
        decode_size: The shorter side the transform needs (reduced-size JPEG decoding; ignored for pixels).
    """
    return storage_mode(storage).decode(value, decoder, decode_size, name)
