"""The storage codec: the one place where source bytes become record values and records become pixels.

* :func:`encode_record` (the builder): validate a source file by decoding it fully, and return the
  value stored for it -- the file's bytes (``storage="encoded"``) or its RGB pixels (``"decoded"``).
* :func:`decode_record` (the datasets, ``verify``, ``bench``): a stored value back to an RGB image.
* :func:`decode_image`: what both do with encoded bytes, so every path yields the pixels
  torchvision's ``ImageFolder`` yields: PIL, then ``convert("RGB")`` exactly like
  ``torchvision.datasets.folder.pil_loader`` (grayscale, LA, palette with transparency, RGBA, CMYK
  and 16-bit images included; never BGR).

A new storage mode touches this module only (and :data:`STORAGES`).

``decoded`` record layout: a 12-byte header (``<III``: height, width, channels) followed by RGB
``uint8`` pixels in row-major ``H x W x C`` order.
"""

from __future__ import annotations

import io
import struct
import warnings

import numpy as np
from PIL import Image

#: The storage modes of a database.
STORAGES = ("encoded", "decoded")
_PIXEL_HEADER = struct.Struct("<III")


class RecordError(ValueError):
    """A stored record value that does not parse (the database is damaged)."""

#: Default pixel limit: Pillow's own warning threshold (~89.5 megapixels).
DEFAULT_MAX_PIXELS: int = 89_478_485

# Pillow's DecompressionBombWarning duplicates our own pixel check (``max_pixels``), so it is silenced
# once, here. Not with ``warnings.catch_warnings()`` around each decode: entering it resets Python's
# once-per-location registry, and every other warning (e.g. Pillow's "Palette images with
# Transparency") was then printed once per image instead of once per process.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


class ImageDecodeError(ValueError):
    """Bytes that are not a decodable image, or an image over the pixel limit.

    Attributes:
        name: The image (usually its path).
        reason: What is wrong with it and what to do, without the name.
    """

    def __init__(self, name: str, reason: str):
        super().__init__(f"{name}: {reason}")
        self.name, self.reason = name, reason


def decode_image(data: bytes | memoryview, *, max_pixels: int | None = DEFAULT_MAX_PIXELS, name: str = "<bytes>") -> Image.Image:
    """Decode encoded image bytes to a fully loaded RGB PIL image.

    The pixel count is checked from the header before any pixel is decoded, so a decompression bomb
    (a tiny file that expands to gigabytes) is refused cheaply.

    Args:
        data: The encoded file contents.
        max_pixels: Refuse images with more pixels than this; ``None`` for no limit of ours (Pillow's
            hard limit of twice its warning threshold still applies).
        name: How to name the image in errors (usually its path).

    Returns:
        An RGB image.

    Raises:
        ImageDecodeError: Not an image, truncated or corrupt, or over ``max_pixels``.
    """
    if not len(data):
        raise ImageDecodeError(name, "the file is empty. Remove it or replace it with the image.")
    try:
        img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise ImageDecodeError(name, str(exc)) from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageDecodeError(name, "not an image in a format Pillow can read. Remove or replace the file.") from exc
    with img:
        width, height = img.size
        if max_pixels is not None and width * height > max_pixels:
            raise ImageDecodeError(
                name,
                f"{width}x{height} = {width * height:,} pixels exceeds the limit of {max_pixels:,} "
                "(a possible decompression bomb). Raise max_pixels if the image is genuine."
            )
        try:
            return img.convert("RGB")
        except (OSError, SyntaxError, ValueError, EOFError) as exc:
            raise ImageDecodeError(name, f"corrupt or truncated image ({exc}). Remove or replace the file.") from exc


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


def encode_record(data: bytes, storage: str, *, max_pixels: int | None = DEFAULT_MAX_PIXELS, name: str = "<bytes>") -> bytes:
    """Validate a source file's bytes (a full decode) and return the value stored for it.

    Args:
        data: The file's bytes.
        storage: ``"encoded"`` (the bytes themselves) or ``"decoded"`` (RGB pixels).
        max_pixels: Refuse larger images (decompression bombs); ``None`` for no limit.
        name: How to name the file in errors.

    Raises:
        ImageDecodeError: Not a decodable image, or over ``max_pixels``.
    """
    image = decode_image(data, max_pixels=max_pixels, name=name)
    return encode_pixels(np.asarray(image)) if storage == "decoded" else data


def decode_record(value: bytes | memoryview, storage: str, *, name: str = "<record>") -> Image.Image:
    """Turn a stored record value into an RGB PIL image.

    Args:
        value: The record value as stored by the builder.
        storage: ``"encoded"`` (original file bytes) or ``"decoded"`` (pixel header + RGB pixels).
        name: How to name the record in errors.
    """
    if storage == "decoded":
        return Image.fromarray(decode_pixels(value))
    return decode_image(value, max_pixels=None, name=name)
