"""The one place where bytes become pixels.

Both the builder (validation) and both serving backends (LMDB and raw files) decode through
:func:`decode_image`, so every path yields the pixels torchvision's ``ImageFolder`` yields: PIL, then
``convert("RGB")`` exactly like ``torchvision.datasets.folder.pil_loader`` (grayscale, LA, palette with
transparency, RGBA, CMYK and 16-bit images included; never BGR).
"""

from __future__ import annotations

import io
import warnings

from PIL import Image

from lightning_lmdb.format import decode_pixels

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


def record_to_image(value: bytes | memoryview, storage: str, *, name: str = "<record>") -> Image.Image:
    """Turn a stored record value into an RGB PIL image.

    Args:
        value: The record value as stored by the builder.
        storage: ``"encoded"`` (original file bytes) or ``"decoded"`` (pixel header + RGB pixels).
        name: How to name the record in errors.
    """
    if storage == "decoded":
        return Image.fromarray(decode_pixels(value))
    return decode_image(value, max_pixels=None, name=name)
