"""Shared by the benchmark scripts: generated image folders (no photo corpus can be downloaded here).

* :func:`make_jpeg_folder`: photo-like JPEGs (smooth gradients plus noise), 160-320 px: the build and
  read benchmarks.
* :func:`make_photo_folder`: an ImageNet-like folder: 256-500 px JPEGs of 30-110 KB at quality 90,
  with a 1/f-like spectrum (octaves of smooth noise plus fine grain), so that JPEG sizes and decode
  costs resemble photographs'. Not photographs: real ImageNet JPEGs average ~110 KB at ~400x350.
* :func:`make_png_folder`: icon-like PNGs of 48-256 px in mixed modes (RGBA, RGB, grey, grey + alpha,
  palette, palette with transparency): flat shapes, gradients and mild noise.
* :func:`make_icon_folder`: small icons, 16-256 px sides (most 24-64 px), in the same modes: flat shapes of
  a few colours, antialiased, some outlined or with a drop shadow, a soft shading; no noise. A median PNG
  of about 2 KB (1.96 KB for 3,000 icons, seed 0).

Each folder is generated once (in parallel) and reused: a ``.complete`` marker is written last.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter


def make_jpeg_folder(root: Path, count: int, *, classes: int = 10, min_side: int = 160, max_side: int = 320, seed: int = 0) -> Path:
    """Write ``count`` photo-like JPEGs (smooth gradients plus noise, quality 90) in ImageFolder layout.

    Reuses the folder when it already holds ``count`` images (a ``.complete`` marker is written last).
    """
    marker = root / ".complete"
    if marker.exists() and marker.read_text() == str(count):
        return root
    rng = np.random.default_rng(seed)
    for i in range(count):
        width, height = (int(v) for v in rng.integers(min_side, max_side + 1, 2))
        yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
        base = rng.uniform(0, 255, 3) + np.stack([xx / width * 120, yy / height * 120, (xx + yy) / (width + height) * 80], -1)
        pixels = np.clip(base + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)
        path = root / f"class_{i % classes:02d}" / f"img_{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path, quality=90)
    marker.write_text(str(count))
    return root


def photo_pixels(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """An ``H x W x 3`` photo-like image: octaves of smooth noise (amplitude falling with frequency) plus grain."""
    import cv2

    acc = np.zeros((height, width, 3), np.float32)
    for octave, amplitude in ((4, 60), (8, 40), (16, 28), (32, 20), (64, 14), (128, 9)):
        small = rng.normal(0, 1, (max(2, height * octave // 512), max(2, width * octave // 512), 3)).astype(np.float32)
        small[..., 1:] = 0.6 * small[..., :1] + 0.4 * small[..., 1:]  # correlated channels, as in photos
        acc += amplitude * cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
    acc += rng.normal(0, rng.uniform(6, 16), (height, width, 3)).astype(np.float32)
    acc += rng.uniform(60, 190, 3).astype(np.float32)
    return np.clip(acc, 0, 255).astype(np.uint8)


#: The modes of :func:`make_png_folder`, in rotation (``"PA"``: palette with transparency).
PNG_MODES = ("RGBA", "RGBA", "RGB", "L", "LA", "P", "PA")


def icon_image(rng: np.random.Generator, side: int, mode: str) -> Image.Image:
    """An icon-like image: a few flat shapes with alpha, a gradient and mild noise, in ``mode`` (see :data:`PNG_MODES`)."""
    img = Image.new("RGBA", (side, side), (0, 0, 0, 0))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 7))):
        colour = (*(int(v) for v in rng.integers(0, 256, 3)), int(rng.integers(160, 256)))
        x0, y0 = (int(v) for v in rng.integers(0, side * 3 // 4, 2))
        x1, y1 = x0 + int(rng.integers(side // 6, side // 2 + 2)), y0 + int(rng.integers(side // 6, side // 2 + 2))
        (draw.ellipse, draw.rectangle, draw.rounded_rectangle)[int(rng.integers(0, 3))]((x0, y0, x1, y1), fill=colour)
    yy, xx = np.mgrid[0:side, 0:side]
    pixels = np.asarray(img).astype(np.float32)
    pixels[..., :3] += xx[..., None] / side * rng.uniform(-40, 40, 3) + rng.normal(0, rng.uniform(0, 6), (side, side, 3))
    return _in_mode(Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGBA"), mode, rng, (16, 256))


def _in_mode(img: Image.Image, mode: str, rng: np.random.Generator, colours: tuple[int, int]) -> Image.Image:
    """An RGBA icon in ``mode`` (see :data:`PNG_MODES`); palettes of ``colours`` (low, high) colours, drawn from ``rng``."""
    if mode == "P":
        return img.convert("RGB").quantize(int(rng.integers(*colours)))
    if mode == "PA":
        return img.quantize(int(rng.integers(*colours)))
    return img if mode == "RGBA" else img.convert(mode)


def icon_side(rng: np.random.Generator) -> int:
    """The side of an icon: 24-64 px for 60 % of icons, 16-23 px for 10 %, 65-256 px (log-uniform) for the rest."""
    draw = rng.random()
    if draw < 0.6:
        return int(rng.integers(24, 65))
    if draw < 0.7:
        return int(rng.integers(16, 24))
    return round(float(np.exp(rng.uniform(np.log(65), np.log(256)))))


def flat_icon(rng: np.random.Generator, side: int, mode: str, supersample: int = 4) -> Image.Image:
    """A small flat icon, ``side`` x ``side`` px, in ``mode`` (see :data:`PNG_MODES`).

    Half on a plate; 8-20 shapes of 3-5 colours, some outlined, drawn ``supersample`` times larger and shrunk
    (antialiased edges); half with a drop shadow; a soft diagonal shading. No noise.
    """
    big = side * supersample
    palette = [(*(int(v) for v in rng.integers(0, 256, 3)), 255) for _ in range(int(rng.integers(3, 6)))]
    img = Image.new("RGBA", (big, big), (0, 0, 0, 0))
    draw = ImageDraw.Draw(img)
    width = max(1, big // 24)
    if rng.random() < 0.5:
        draw.rounded_rectangle((0, 0, big - 1, big - 1), radius=int(rng.integers(0, big // 4)), fill=palette[0])
    for _ in range(int(rng.integers(8, 21))):
        fill, outline = (palette[int(i)] for i in rng.integers(0, len(palette), 2))
        outline = outline if rng.random() < 0.4 else None
        x0, y0 = (int(v) for v in rng.integers(0, big * 3 // 4, 2))
        x1, y1 = x0 + int(rng.integers(big // 8, big // 2 + 2)), y0 + int(rng.integers(big // 8, big // 2 + 2))
        shape = int(rng.integers(0, 5))
        if shape == 3:
            draw.polygon([(x0, y1), ((x0 + x1) // 2, y0), (x1, y1)], fill=fill, outline=outline, width=width)
        elif shape == 4:
            draw.line([(x0, y0), (x1, y1)], fill=fill, width=2 * width)
        else:
            (draw.ellipse, draw.rectangle, draw.rounded_rectangle)[shape]((x0, y0, x1, y1), fill=fill, outline=outline, width=width)
    if rng.random() < 0.5:  # a drop shadow: the icon's alpha, blurred, half as opaque, offset
        shadow = Image.new("RGBA", (big, big), (0, 0, 0, 0))
        blurred = img.getchannel("A").filter(ImageFilter.GaussianBlur(big / 30)).point(lambda a: a // 2)
        shadow.paste((0, 0, 0, 255), (big // 30, big // 30), blurred)
        img = Image.alpha_composite(shadow, img)
    pixels = np.asarray(img.resize((side, side), Image.Resampling.LANCZOS)).astype(np.float32)
    yy, xx = np.mgrid[0:side, 0:side]
    pixels[..., :3] += ((yy + xx)[..., None] / (2 * side) - 0.5) * rng.uniform(-60, 60, 3)
    return _in_mode(Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGBA"), mode, rng, (32, 129))


def _write_photo(task: tuple[Path, int, int]) -> None:
    root, i, seed = task
    rng = np.random.default_rng((seed, i))
    width, height = (int(v) for v in rng.integers(256, 501, 2))
    path = root / f"n{i % 100:08d}" / f"img_{i:07d}.JPEG"
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(photo_pixels(rng, width, height)).save(path, quality=90)


def _write_png(image_of: Callable[[np.random.Generator, str], Image.Image], task: tuple[Path, int, int]) -> None:
    """Write icon ``i`` of a folder: its mode by rotation through :data:`PNG_MODES`, its image from ``image_of(rng, mode)``."""
    root, i, seed = task
    rng = np.random.default_rng((seed, i))
    mode = PNG_MODES[i % len(PNG_MODES)]
    path = root / f"set_{i % 20:02d}" / f"icon_{i:06d}_{mode.lower()}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    image_of(rng, mode).save(path)


def _icon(rng: np.random.Generator, mode: str) -> Image.Image:
    return icon_image(rng, int(rng.integers(48, 257)), mode)


def _flat(rng: np.random.Generator, mode: str) -> Image.Image:
    return flat_icon(rng, icon_side(rng), mode)


def _generate(root: Path, count: int, seed: int, write: Callable[[tuple[Path, int, int]], None]) -> Path:
    marker = root / ".complete"
    if marker.exists() and marker.read_text() == str(count):
        return root
    tasks = [(root, i, seed) for i in range(count)]
    with multiprocessing.get_context("fork").Pool(len(os.sched_getaffinity(0))) as pool:
        for _ in pool.imap_unordered(write, tasks, chunksize=64):
            pass
    marker.write_text(str(count))
    return root


def make_photo_folder(root: Path, count: int, *, seed: int = 0) -> Path:
    """``count`` ImageNet-like JPEGs (256-500 px, 30-110 KB) in 100 class folders; generated once, then reused."""
    return _generate(root, count, seed, _write_photo)


def make_png_folder(root: Path, count: int, *, seed: int = 0) -> Path:
    """``count`` icon-like PNGs (48-256 px) in the modes of :data:`PNG_MODES`, 20 class folders; generated once, then reused."""
    return _generate(root, count, seed, functools.partial(_write_png, _icon))


def make_icon_folder(root: Path, count: int, *, seed: int = 0) -> Path:
    """``count`` small flat icons in the modes of :data:`PNG_MODES`, 20 class folders; generated once, then reused.

    Sides of 16-256 px, most 24-64 (:func:`icon_side`); PNGs of about 2 KB median (:func:`flat_icon`).
    """
    return _generate(root, count, seed, functools.partial(_write_png, _flat))


def median_file_bytes(root: Path) -> float:
    """The median size of the image files under ``root``."""
    return statistics.median(os.path.getsize(path) for path in _image_files(root))


def _image_files(root: Path) -> list[str]:
    """The files under ``root``, hidden ones (the ``.complete`` marker) left out."""
    return [os.path.join(dirpath, name) for dirpath, _, names in os.walk(root) for name in names if not name.startswith(".")]


def folder_bytes(root: Path) -> tuple[int, int]:
    """(apparent bytes, allocated bytes on disk) of the image files under ``root``."""
    stats = [os.stat(path) for path in _image_files(root)]
    return sum(st.st_size for st in stats), sum(st.st_blocks * 512 for st in stats)
