"""Staleness by modification time: a file rewritten with other contents of the same size, or only touched, makes its database
stale (a fingerprint of sizes alone would miss both: the file's mtime is in it)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.build.writer import StaleDatabaseError, build
from lightning_lmdb.read.dataset import LMDBImageDataset


def _bmp(path: Path, value: int) -> None:
    """An uncompressed 8 x 8 image of one grey ``value``: the same file size whatever the value."""
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name in ("a", "b"):
        (tmp_path / "src" / name).mkdir(parents=True)
        for i in range(3):
            _bmp(tmp_path / "src" / name / f"{i}.bmp", 40 * i + 10)
    return tmp_path / "src"


def _rewrite_same_size(path: Path, value: int) -> None:
    """Rewrite ``path`` with ``value``'s pixels, its size unchanged and its mtime moved on by a few seconds (a rewrite within
    the filesystem's timestamp granularity could keep the old one)."""
    before = path.stat()
    _bmp(path, value)
    assert path.stat().st_size == before.st_size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 5_000_000_000))


def _pixels(db: Path) -> list[int]:
    return [int(image.getpixel((0, 0))[0]) for image, _ in LMDBImageDataset(db)]


def test_a_same_size_rewrite_makes_the_database_stale(folder: Path, tmp_path: Path) -> None:
    target = tmp_path / "db.lmdb"
    first = build(folder, target, workers=0, progress=False)
    assert _pixels(first.path) == [10, 50, 90] * 2
    _rewrite_same_size(folder / "b" / "1.bmp", 200)
    with pytest.raises(StaleDatabaseError, match="changed"):
        build(folder, target, workers=0, progress=False, on_stale="error")
    rebuilt = build(folder, target, workers=0, progress=False)
    assert rebuilt.action == "built" and _pixels(rebuilt.path) == [10, 50, 90, 10, 200, 90]


def test_a_touched_file_makes_the_database_stale(folder: Path, tmp_path: Path) -> None:
    target = tmp_path / "db.lmdb"
    build(folder, target, workers=0, progress=False)
    victim = folder / "a" / "2.bmp"
    stat = victim.stat()
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    with pytest.raises(StaleDatabaseError, match="changed"):
        build(folder, target, workers=0, progress=False, on_stale="error")


def test_the_datamodule_rebuilds_after_a_same_size_rewrite(folder: Path, tmp_path: Path) -> None:
    def served() -> list[int]:
        dm = LMDBDataModule(folder, cache_dir=tmp_path / "cache", build_workers=0, num_workers=0, val_fraction=0, batch_size=6,
                            image_size=8, shuffle=False)
        dm.prepare_data()
        dm.setup("fit")
        images, _ = next(iter(dm.train_dataloader()))
        return images[:, 0, 4, 4].tolist()

    assert sorted(served()) == sorted([10, 50, 90] * 2)
    _rewrite_same_size(folder / "a" / "0.bmp", 230)
    assert sorted(served()) == sorted([230, 50, 90, 10, 50, 90]), "the module served the old pixels"


def test_a_same_size_rewrite_of_a_mask_makes_the_database_stale(tmp_path: Path) -> None:
    (tmp_path / "seg").mkdir()
    _bmp(tmp_path / "seg" / "image.bmp", 90)
    mask = tmp_path / "seg" / "mask.png"
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(mask, compress_level=0)  # stored, not compressed: the size is the shape's
    (tmp_path / "seg" / "pairs.csv").write_text("path,mask\nimage.bmp,mask.png\n")
    target = tmp_path / "seg.lmdb"
    build(tmp_path / "seg" / "pairs.csv", target, workers=0, progress=False)
    before = mask.stat()
    Image.fromarray(np.ones((8, 8), np.uint8)).save(mask, compress_level=0)
    assert mask.stat().st_size == before.st_size
    os.utime(mask, ns=(before.st_atime_ns, before.st_mtime_ns + 5_000_000_000))
    with pytest.raises(StaleDatabaseError, match="changed"):
        build(tmp_path / "seg" / "pairs.csv", target, workers=0, progress=False, on_stale="error")
    assert build(tmp_path / "seg" / "pairs.csv", target, workers=0, progress=False).action == "built"
    assert int(LMDBImageDataset(target)[0][1].max()) == 1, "the rebuilt database holds the new mask"
