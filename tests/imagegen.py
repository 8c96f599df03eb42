"""Tiny image folders for tests (every image mode, non-ASCII names, bad files), and reading a database back."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from lightning_lmdb.store import envs
from lightning_lmdb.store import format as fmt

#: (file name stem, PIL mode, extension) of the mixed-mode images in each class folder.
MODE_FILES = [
    ("rgb", "RGB", ".jpg"),
    ("gray", "L", ".jpg"),
    ("gray_png", "L", ".png"),
    ("la", "LA", ".png"),
    ("palette_trns", "P", ".png"),
    ("rgba", "RGBA", ".png"),
    ("cmyk", "CMYK", ".jpg"),
    ("sixteen", "I;16", ".png"),
    ("bilevel", "1", ".bmp"),
    ("webp", "RGB", ".webp"),
]


def make_image(mode: str, size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """A random image of ``mode`` and ``size`` (width, height)."""
    width, height = size
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65535, (height, width), dtype=np.uint16))
    if mode == "P":
        img = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).quantize(16)
        img.info["transparency"] = 0
        return img
    if mode == "1":
        return Image.fromarray(rng.integers(0, 2, (height, width), dtype=np.uint8) * 255).convert("1")
    rgb = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
    if mode == "RGBA":
        rgba = rgb.convert("RGBA")
        rgba.putalpha(Image.fromarray(rng.integers(0, 255, (height, width), dtype=np.uint8)))
        return rgba
    return rgb.convert(mode)


def save_image(img: Image.Image, path: Path) -> None:
    """Save ``img`` to ``path`` (format from the extension; palette transparency kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kwargs = {"transparency": img.info["transparency"]} if img.mode == "P" and "transparency" in img.info else {}
    img.save(path, **kwargs)


def make_folder(root: Path, classes: tuple[str, ...] = ("cat", "dog", "ñandú"), per_class: int = 12, seed: int = 0) -> Path:
    """An ImageFolder-layout folder: all modes of ``MODE_FILES`` in each class, non-ASCII names, a non-image file.

    Returns:
        ``root``.
    """
    rng = np.random.default_rng(seed)
    for class_name in classes:
        for i in range(per_class):
            stem, mode, ext = MODE_FILES[i % len(MODE_FILES)]
            name = f"{stem}_{i:03d}{ext}" if i % 3 else f"éè_猫_{stem}_{i:03d}{ext}"
            size = (int(rng.integers(8, 40)), int(rng.integers(8, 40)))
            save_image(make_image(mode, size, rng), root / class_name / name)
    (root / classes[0] / "notes.txt").write_text("not an image, ignored by ImageFolder")
    return root


def make_jpegs(root: Path, count: int, size: int = 32, seed: int = 0, classes: int = 2) -> Path:
    """``count`` small RGB JPEGs spread over ``classes`` class folders."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        img = Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8))
        save_image(img, root / f"c{i % classes}" / f"img_{i:05d}.jpg")
    return root


def encode(img: Image.Image, fmt: str, **options) -> bytes:
    """``img`` saved as ``fmt`` (``"PNG"``, ``"JPEG"``, ``"WEBP"``, ...) into bytes."""
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def photo(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A photo-like RGB image: smooth noise at several scales plus fine grain (JPEG sizes and spectra like a photo's)."""
    acc = np.zeros((height, width, 3), np.float32)
    for cells, amplitude in ((4, 60), (16, 28), (64, 14)):
        small = rng.normal(0, 1, (cells, cells, 3)).astype(np.float32)
        acc += amplitude * np.asarray(Image.fromarray(small[..., 0]).resize((width, height), Image.BICUBIC))[..., None]
        acc += amplitude * 0.4 * np.asarray(Image.fromarray(small[..., 1]).resize((width, height), Image.BICUBIC))[..., None]
    acc += rng.normal(0, 8, (height, width, 3)).astype(np.float32) + rng.uniform(60, 190, 3).astype(np.float32)
    return Image.fromarray(np.clip(acc, 0, 255).astype(np.uint8))


def image_cases(seed: int = 0) -> dict[str, bytes]:
    """Encoded images of every format and mode the decoders distinguish, by name (``"png RGBA"``, ``"jpeg CMYK"``, ...)."""
    rng = np.random.default_rng(seed)
    size = (53, 37)
    rgb = make_image("RGB", size, rng)
    rgba = make_image("RGBA", size, rng)
    palette = rgb.quantize(16)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    return {
        "png RGB": encode(rgb, "PNG"),
        "png RGBA": encode(rgba, "PNG"),
        "png L": encode(rgb.convert("L"), "PNG"),
        "png LA": encode(rgba.convert("LA"), "PNG"),
        "png P": encode(palette, "PNG"),
        "png P transparency": encode(palette, "PNG", transparency=0),
        "png P 2-bit": encode(rgb.quantize(4), "PNG", bits=2),
        "png 1-bit": encode(rgb.convert("1"), "PNG"),
        "png I;16": encode(make_image("I;16", size, rng), "PNG"),
        "webp lossy": encode(rgb, "WEBP", quality=80),
        "webp lossless": encode(rgb, "WEBP", lossless=True),
        "webp lossy alpha": encode(rgba, "WEBP", quality=80),
        "webp lossless alpha": encode(rgba, "WEBP", lossless=True),
        "jpeg RGB": encode(rgb, "JPEG", quality=90),
        "jpeg RGB 4:4:4": encode(rgb, "JPEG", quality=90, subsampling=0),
        "jpeg progressive": encode(rgb, "JPEG", quality=90, progressive=True),
        "jpeg L": encode(rgb.convert("L"), "JPEG", quality=90),
        "jpeg CMYK": encode(rgb.convert("CMYK"), "JPEG", quality=90),
        "jpeg EXIF orientation 6": encode(rgb, "JPEG", quality=90, exif=exif.tobytes()),
        "gif": encode(rgb.quantize(32), "GIF"),
        "bmp": encode(rgb, "BMP"),
        "tiff": encode(rgb, "TIFF"),
    }


def bomb_png() -> bytes:
    """A ~12 KB PNG that decodes to 100 megapixels (over Pillow's and our default limit)."""
    buffer = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(buffer, format="PNG")
    return buffer.getvalue()


def truncated_jpeg(rng_seed: int = 1) -> bytes:
    """The first half of a valid JPEG: the header reads, the pixels do not."""
    buffer = io.BytesIO()
    rng = np.random.default_rng(rng_seed)
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buffer, format="JPEG")
    data = buffer.getvalue()
    return data[: len(data) // 2]


def meta_dict(meta: fmt.Metadata) -> dict:
    """Metadata (read with ``arrays=True``) as one plain dict: the header plus targets, paths and hex checksums."""
    assert meta.paths is not None and meta.checksums is not None
    return {**meta.header(), "targets": meta.targets.tolist(), "paths": meta.paths.tolist(),
            "checksums": [row.tobytes().hex() for row in meta.checksums]}


def read_records(path: Path) -> tuple[dict, list[bytes]]:
    """(metadata as one plain dict, every record value in key order) of a finished database."""
    with envs.reading(path) as opened:
        meta = meta_dict(fmt.read_meta(opened.env, path, arrays=True))
        with opened.env.begin(db=opened.records) as txn:
            values = [bytes(v) for _, v in txn.cursor()]
    return meta, values


def downgrade_to_v1(path: Path) -> Path:
    """Rewrite a finished database's metadata in format version 1, as lightning_lmdb 0.1 wrote it (no build id)."""
    import lmdb

    with envs.reading(path) as opened:
        meta = meta_dict(fmt.read_meta(opened.env, path, arrays=True))
    envs.close(path)
    meta.update(version=1)
    del meta["build_id"]
    env = lmdb.open(str(path), subdir=False, max_dbs=3, lock=False)
    with env.begin(write=True) as txn:
        for key in [fmt.META_DIGEST_KEY, fmt.BUILD_ID_KEY, *(key for key, *_ in fmt.ARRAYS.values())]:
            txn.delete(key)
        txn.put(fmt.META_KEY, fmt.dump_json(meta))
    env.close()
    return path


# --- images of known content: what every decoder must give, computed without a decoder ---------------------

#: The size (width, height) of :func:`known_images` (not square: a transposed decode shows).
KNOWN_SIZE = (64, 48)
#: A JPEG of :func:`known_images` (quality 95, smooth content) stays this close to the known pixels with any decoder.
JPEG_MEAN_ERROR, JPEG_MAX_ERROR = 2.0, 12


@dataclass(frozen=True)
class Known:
    """An encoded image and the RGB pixels its content was made from.

    Attributes:
        data: The encoded file.
        rgb: ``H x W x 3`` ``uint8``: what ``convert("RGB")`` gives (alpha dropped, grey replicated, palette looked up).
        lossless: The format keeps pixels exactly (else: within :data:`JPEG_MEAN_ERROR` / :data:`JPEG_MAX_ERROR`).
    """

    data: bytes
    rgb: np.ndarray
    lossless: bool


def gradient(width: int = KNOWN_SIZE[0], height: int = KNOWN_SIZE[1]) -> np.ndarray:
    """``H x W x 3`` ``uint8``: red ``4x``, green ``5y``, blue ``255 - 2x - y`` (smooth; each pixel's value known). At most 64 x 51."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([4 * x, 5 * y, 255 - 2 * x - y], axis=-1).astype(np.uint8)


def known_images() -> dict[str, Known]:
    """Images of every mode the decoders convert (RGBA, grey, grey + alpha, palette, 1-bit), each with its expected RGB pixels."""
    rgb = gradient()
    height, width = rgb.shape[:2]
    y, x = np.mgrid[0:height, 0:width]
    alpha = (64 + 3 * x).astype(np.uint8)  # never 0: lossy alpha coders may change the colour of invisible pixels
    grey = (2 * x + 2 * y).astype(np.uint8)
    palette = np.array([[16 * i, 255 - 16 * i, 37 * i % 256] for i in range(16)], dtype=np.uint8)
    indices = ((x // 8 + y // 8) % 16).astype(np.uint8)
    checks = (x // 8 + y // 8) % 2 == 1
    rgba = Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    grey_alpha = Image.fromarray(np.dstack([grey, alpha]), "LA")
    indexed = Image.fromarray(indices, "P")
    indexed.putpalette(palette.tobytes())
    grey_rgb, palette_rgb = np.repeat(grey[..., None], 3, axis=-1), palette[indices]
    lossless = {
        "png RGB": (encode(Image.fromarray(rgb), "PNG"), rgb),
        "png RGBA": (encode(rgba, "PNG"), rgb),
        "png L": (encode(Image.fromarray(grey), "PNG"), grey_rgb),
        "png LA": (encode(grey_alpha, "PNG"), grey_rgb),
        "png P": (encode(indexed, "PNG"), palette_rgb),
        "png P transparency": (encode(indexed, "PNG", transparency=0), palette_rgb),
        "png 1-bit": (encode(Image.fromarray(checks), "PNG"), np.repeat(checks[..., None], 3, axis=-1).astype(np.uint8) * 255),
        "webp lossless": (encode(Image.fromarray(rgb), "WEBP", lossless=True), rgb),
        "webp lossless alpha": (encode(rgba, "WEBP", lossless=True, exact=True), rgb),
        "gif": (encode(indexed, "GIF"), palette_rgb),
        "bmp": (encode(Image.fromarray(rgb), "BMP"), rgb),
        "tiff": (encode(Image.fromarray(rgb), "TIFF"), rgb),
    }
    lossy = {
        "jpeg RGB": (encode(Image.fromarray(rgb), "JPEG", quality=95), rgb),
        "jpeg RGB 4:4:4": (encode(Image.fromarray(rgb), "JPEG", quality=95, subsampling=0), rgb),
        "jpeg progressive": (encode(Image.fromarray(rgb), "JPEG", quality=95, progressive=True), rgb),
        "jpeg L": (encode(Image.fromarray(grey), "JPEG", quality=95), grey_rgb),
    }
    return {name: Known(data, expected, name in lossless) for name, (data, expected) in {**lossless, **lossy}.items()}


def quadrants(colours: np.ndarray, width: int = 96, height: int = 64) -> np.ndarray:
    """``H x W x 3`` ``uint8`` in four solid quadrants: ``colours`` top left, top right, bottom left, bottom right.

    The defaults put the edges on JPEG's 16-pixel blocks, so a JPEG keeps each quadrant's colour within a level or two.
    """
    out = np.empty((height, width, 3), dtype=np.uint8)
    top, left = height // 2, width // 2
    out[:top, :left], out[:top, left:], out[top:, :left], out[top:, left:] = colours
    return out


class SleepyTransform:
    """``transform`` after sleeping ``seconds``: a known delay in the transform stage of every sample (picklable for spawn workers)."""

    def __init__(self, transform: Callable[[Any], Any], seconds: float) -> None:
        self.transform, self.seconds = transform, seconds

    def __call__(self, image: Any) -> Any:
        time.sleep(self.seconds)
        return self.transform(image)
