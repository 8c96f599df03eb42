"""A build of more records than one write transaction holds (``commit_every``'s default, 1,000), compared record by record
with its source: every record's pixels and target are those of its file, in ImageFolder's order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from torchvision.datasets import ImageFolder

from lightning_lmdb.build.writer import build
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.store import database

COUNT = 1234


def test_a_build_over_one_commit_serves_every_record_as_its_file(tmp_path: Path) -> None:
    assert COUNT > BuildOptions().commit_every
    rng = np.random.default_rng(0)
    source = tmp_path / "src"
    for name in ("a", "b", "c"):
        (source / name).mkdir(parents=True)
    for i in range(COUNT):  # random 8 x 8 pixels: no two records alike, so a record served in another's place shows
        image = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
        image.save(source / "abc"[i % 3] / (f"{i:04d}.png" if i % 2 else f"{i:04d}.jpg"))
    report = build(source, tmp_path / "db.lmdb", workers=0, progress=False)
    assert report.count == report.records_written == COUNT
    reference = ImageFolder(source)
    meta = database.load_meta(report.path, arrays=True)
    assert [str(source / p) for p in meta.paths.tolist()] == [p for p, _ in reference.samples]
    dataset = LMDBImageDataset(report.path)
    assert len(dataset) == COUNT and dataset.classes == reference.classes
    for i, (path, target) in enumerate(reference.samples):
        image, served_target = dataset[i]
        assert served_target == target, path
        with Image.open(path) as expected:
            assert np.array_equal(np.asarray(image), np.asarray(expected.convert("RGB"))), path
