"""Shared by the benchmark scripts: a generated folder of photo-like JPEGs (no downloads)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image


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


def folder_bytes(root: Path) -> tuple[int, int]:
    """(apparent bytes, allocated bytes on disk) of the image files under ``root``."""
    apparent = allocated = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.startswith("."):
                continue
            st = os.stat(os.path.join(dirpath, name))
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated
