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
