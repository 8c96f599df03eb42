"""Tiny image folders for tests (every image mode, non-ASCII names, bad files), and reading a database back."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from lightning_lmdb import format as fmt

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


def read_records(path: Path) -> tuple[dict, list[bytes]]:
    """(metadata as its JSON object, every record value in key order) of a finished database."""
    with fmt.reading(path) as opened:
        meta = fmt.read_meta(opened.env, path).to_json()
        with opened.env.begin(db=opened.records) as txn:
            values = [bytes(v) for _, v in txn.cursor()]
    return meta, values
