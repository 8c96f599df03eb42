"""Detection test data written by hand: images whose pixels encode their own coordinates, and their boxes.

``Scenes`` is a map-style Dataset (a sample's target the JSON form of :class:`lightning_lmdb.targets.Boxes`); ``write_scenes``
writes the same images and a ``boxes.json`` beside them, the source of the "boxjson" source kind below (a stand-in for the
file-format kinds: it makes a ``SourceScan`` of ``Boxes`` as they do). A real module, so spawned workers import it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from lightning_lmdb.sources.base import SourceFile, SourceOptions, SourceScan
from lightning_lmdb.targets import Boxes

W, H = 80, 64
CLASSES = ["cat", "dog", "bird"]
#: Per image: XYXY boxes in its pixels, all at least 4 pixels inside it (the resize's edge pixels are not a plain gradient).
BOXES = [[[6, 5, 30, 40], [40, 12, 70, 50]], [[10, 10, 60, 55]], [[5, 30, 20, 58], [25, 4, 74, 20.5], [45, 35, 66, 52]], []]
LABELS = [[0, 2], [1], [2, 0, 1], []]
CROWD = [[0, 1], [0], [0, 0, 1], []]


def gradient() -> Image.Image:
    """``W x H``: red ``3 x + 2`` at column ``x``, green ``3 y + 20`` at row ``y`` (:func:`source_point` reads them back)."""
    pixels = np.zeros((H, W, 3), np.uint8)
    pixels[..., 0] = (3 * np.arange(W) + 2)[None, :]
    pixels[..., 1] = (3 * np.arange(H) + 20)[:, None]
    pixels[..., 2] = 128
    return Image.fromarray(pixels)


def encoded(fmt: str) -> bytes:
    buffer = io.BytesIO()
    if fmt == "jpeg":
        gradient().save(buffer, "JPEG", quality=98, subsampling=0)
    else:
        gradient().save(buffer, "PNG")
    return buffer.getvalue()


def target(i: int) -> dict[str, Any]:
    return {"boxes": BOXES[i], "labels": LABELS[i], "iscrowd": CROWD[i], "image_id": 100 + i}


class Scenes:
    """``len(BOXES)`` gradient images (PNG or JPEG bytes) and their boxes, as a Dataset of ``(bytes, boxes JSON)``."""

    classes = CLASSES

    def __init__(self, fmt: str = "png"):
        self.fmt = fmt

    def __len__(self) -> int:
        return len(BOXES)

    def __getitem__(self, i: int) -> tuple[bytes, dict[str, Any]]:
        return encoded(self.fmt), target(i)


def colour_at(image: torch.Tensor, x: float, y: float) -> torch.Tensor:
    """The bilinear colour of ``image`` (``3 x h x w``) at the continuous point ``(x, y)`` (pixel ``(c, r)`` centred on ``c + 1/2``)."""
    img = image.float()
    u, v = x - 0.5, y - 0.5
    i0, j0 = int(np.floor(u)), int(np.floor(v))
    fu, fv = u - i0, v - j0

    def px(i: int, j: int) -> torch.Tensor:
        return img[:, min(max(j, 0), img.shape[1] - 1), min(max(i, 0), img.shape[2] - 1)]

    return px(i0, j0) * (1 - fu) * (1 - fv) + px(i0 + 1, j0) * fu * (1 - fv) + px(i0, j0 + 1) * (1 - fu) * fv + px(i0 + 1, j0 + 1) * fu * fv


def source_point(image: torch.Tensor, x: float, y: float) -> tuple[float, float]:
    """Where in the source image the served ``image``'s point ``(x, y)`` came from (continuous source pixels), by its colour."""
    c = colour_at(image, x, y)
    return (float(c[0]) - 2) / 3 + 0.5, (float(c[1]) - 20) / 3 + 0.5


def corner_error(image: torch.Tensor, served: torch.Tensor, source: list[list[float]]) -> float:
    """The largest distance (source pixels) between a served box's corners, read back through the served image's colours, and
    the source box's (a flip swaps x1 and x2: each pair compared sorted)."""
    assert len(served) == len(source), f"{len(served)} boxes served, {len(source)} in the source"
    worst = 0.0
    for (a1, b1, a2, b2), (x1, y1, x2, y2) in zip(served.tolist(), source, strict=True):
        p, q = source_point(image, a1, b1), source_point(image, a2, b2)
        xs, ys = sorted([p[0], q[0]]), sorted([p[1], q[1]])
        worst = max(worst, abs(xs[0] - x1), abs(xs[1] - x2), abs(ys[0] - y1), abs(ys[1] - y2))
    return worst


# --- the "boxjson" source kind: a boxes.json beside the images ---------------------------------------------------------------

NAME = "boxjson"
DESCRIPTION = "a boxes.json of {classes, images: [{file, boxes, labels}]} beside its images (tests)"


def write_scenes(folder: Path, fmt: str = "png") -> Path:
    """The images of :class:`Scenes` as files in ``folder`` and their ``boxes.json`` (returned)."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(len(BOXES)):
        name = f"{i}.{'jpg' if fmt == 'jpeg' else 'png'}"
        (folder / name).write_bytes(encoded(fmt))
        entries.append({"file": name, **target(i), "image_size": [H, W]})
    listing = folder / "boxes.json"
    listing.write_text(json.dumps({"classes": CLASSES, "images": entries, "degenerate_dropped": 2}))
    return listing


def accepts(source: Any) -> bool:
    return isinstance(source, Path) and source.name == "boxes.json" and source.is_file()


def scan(source: Path, options: SourceOptions | None = None) -> SourceScan:
    listing = source.resolve()
    data = json.loads(listing.read_text())
    files = []
    for entry in data["images"]:
        path = listing.parent / entry["file"]
        st = path.stat()
        files.append(SourceFile(str(path), entry["file"], Boxes.from_json(entry), st.st_size, st.st_mtime_ns))  # type: ignore[arg-type]
    classes = data["classes"]
    return SourceScan(root=listing.parent, classes=classes, class_to_idx={c: k for k, c in enumerate(classes)}, files=files,
                      target_kind="boxes", target_meta={"degenerate_dropped": data["degenerate_dropped"]})


def has_samples(source: Path, options: SourceOptions | None = None) -> bool:
    return bool(json.loads(source.read_text())["images"])


def classes(source: Path, options: SourceOptions | None = None) -> tuple[list[str], dict[str, int]]:
    names = json.loads(source.read_text())["classes"]
    return names, {c: k for k, c in enumerate(names)}
