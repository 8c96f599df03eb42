"""Extensions written as a user would, outside the library: the "list" source kind (a text file of
``relative-path class-index`` lines beside the images) that records the options of each call.

Registered by the ``list_kind`` fixture (``conftest.py``) and removed after the test. A real module, so a spawned
process can import it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PIL import Image

from lightning_lmdb.sources.base import SourceFile, SourceOptions, SourceScan

NAME = "list"
DESCRIPTION = "a .list file of 'relative-path class-index' lines"
#: ``(call, options)`` of every call since the fixture registered the kind.
CALLS: list[tuple[str, SourceOptions | None]] = []


def write_listing(folder: Path, rows: list[tuple[int, int]]) -> Path:
    """A source of this kind: ``folder/images/<i>.png`` for each image ``i`` of ``rows`` (6 x 5, a distinct red each) and
    ``folder/images/train.list`` with a ``<i>.png <class>`` line per ``(i, class)`` row, in their order; returns the list file."""
    images = folder / "images"
    images.mkdir()
    for i in sorted({i for i, _ in rows}):
        Image.new("RGB", (6, 5), (40 * i, 0, 0)).save(images / f"{i}.png")
    listing = images / "train.list"
    listing.write_text("".join(f"{i}.png {target}\n" for i, target in rows))
    return listing


def accepts(source: Any) -> bool:
    return isinstance(source, Path) and source.suffix == ".list" and source.is_file()


def scan(source: Path, options: SourceOptions | None = None) -> SourceScan:
    CALLS.append(("scan", options))
    listing = source.resolve()
    root, files = listing.parent, []
    for line in listing.read_text().splitlines():
        relpath, target = line.rsplit(" ", 1)
        st = (root / relpath).stat()
        files.append(SourceFile(str(root / relpath), relpath, int(target), st.st_size, st.st_mtime_ns))
    return SourceScan(root=root, classes=["a", "b"], class_to_idx={"a": 0, "b": 1}, files=files)


def has_samples(source: Path, options: SourceOptions | None = None) -> bool:
    CALLS.append(("has_samples", options))
    return bool(source.read_text().strip())


def classes(source: Path, options: SourceOptions | None = None) -> tuple[list[str], dict[str, int]]:
    CALLS.append(("classes", options))
    return ["a", "b"], {"a": 0, "b": 1}


# --- a target kind: keypoints -------------------------------------------------------------------------------------------------
# Variable-length (x, y) points per image, in the image's pixels; moved with the image by the joint crop / resize / flip and
# collated as a list. Registered by the ``keypoints_kind`` fixture (test_seams.py) at run time, not on import: a spawned loader
# worker gets it with the dataset that carries it.

import numpy as np  # noqa: E402
import torch  # noqa: E402

from lightning_lmdb.targets import NO_TARGET, TargetKind, TargetTable  # noqa: E402
from lightning_lmdb.targets.base import check_offsets  # noqa: E402


class KeypointsKind(TargetKind):
    """Points per image: stored as their coordinates, ``x0 y0 x1 y1 ...`` (``meta/values``, ``float32``), and per record the
    offset of its first coordinate (``meta/label-offsets``); served as a ``float32`` ``n x 2`` tensor of ``(x, y)``."""

    name = "keypoints"
    DESCRIPTION = "(x, y) points per image, in its pixels (a float32 n x 2 tensor, moved with the image)"
    has_geometry = True
    variable_length = True

    def hold(self, raw: Any) -> tuple[float, ...]:
        if not isinstance(raw, (list, tuple)) or len(raw) % 2 or not all(isinstance(v, (int, float)) for v in raw):
            raise ValueError("is not a flat list of x, y coordinates")
        return tuple(float(v) for v in raw)

    def pack(self, targets: Any, width: int) -> TargetTable:
        offsets = np.zeros(len(targets) + 1, dtype=np.int64)
        np.cumsum([len(t) for t in targets], out=offsets[1:])
        values = np.fromiter((v for t in targets for v in t), dtype=np.float32, count=int(offsets[-1]))
        return TargetTable(self.name, np.full(len(targets), NO_TARGET, dtype=np.int32), 0, offsets=offsets, values=values)

    def read(self, get: Any, read: Any, meta: Any) -> dict[str, np.ndarray]:
        offsets, values = read("label_offsets"), read("values")
        check_offsets(get, offsets, values, "point offsets", "coordinates")
        if np.any(offsets % 2):
            get.fail("arrays", "holds a point without its y")
        return {"label_offsets": offsets, "values": values}

    def item(self, table: TargetTable, row: int) -> torch.Tensor:
        assert table.offsets is not None and table.values is not None
        return torch.from_numpy(table.values[table.offsets[row] : table.offsets[row + 1]].reshape(-1, 2).copy())

    def tolist(self, table: TargetTable, rows: Any) -> list[Any]:
        assert table.offsets is not None and table.values is not None
        picked = range(len(table)) if rows is None else rows
        return [table.values[table.offsets[r] : table.offsets[r + 1]].tolist() for r in picked]

    def geometry(self, target: torch.Tensor, crop: Any, params: Any, size: Any, **context: Any) -> torch.Tensor:
        return crop.map_points(target, params)

    def named(self, classes: Any, target: Any) -> Any:
        return np.asarray(target, dtype=np.float32).tolist()


class PointImages:
    """A map-style Dataset of ``count`` 8 x 8 images, each black but a white 2 x 2 block at ``x = 2..3, y = 0..1``, whose keypoints
    are the block's centre ``(3, 1)`` and, for odd samples, the image's centre ``(4, 4)`` too (a flat list)."""

    classes: list[str] = []

    def __init__(self, count: int = 6):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[Image.Image, list[float]]:
        pixels = np.zeros((8, 8, 3), dtype=np.uint8)
        pixels[0:2, 2:4] = 255
        return Image.fromarray(pixels), [3.0, 1.0] + ([4.0, 4.0] if index % 2 else [])


def keypoints_loss(model: Any, outputs: torch.Tensor, targets: list[torch.Tensor], stage: str) -> torch.Tensor:
    """The mean squared error of the outputs (``N x 2``) against each image's mean point, in units of the image's side."""
    return torch.nn.functional.mse_loss(outputs, _mean_points(outputs, targets))


def keypoints_metric(model: Any, outputs: torch.Tensor, targets: list[torch.Tensor], stage: str) -> torch.Tensor:
    return (outputs.detach() - _mean_points(outputs, targets)).abs().mean()


def _mean_points(outputs: torch.Tensor, targets: list[torch.Tensor]) -> torch.Tensor:
    side = 4.0  # the DataModule's image_size in the test
    return torch.stack([t.float().mean(0) / side if len(t) else torch.zeros(2) for t in targets]).to(outputs.device)
