"""Class order: the class names sorted as Python's ``sorted()`` sorts them (code points, so case-sensitive), as torchvision's
``ImageFolder`` sorts its folders: ``A``, ``B``, ``a``, ``b``, never ``a``, ``A``, ``b``, ``B``. A model trained on one source
and a checkpoint read against another must agree on what index 0 means."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image
from torchvision.datasets import ImageFolder

from lightning_lmdb import build_lmdb
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.read.raw import RawImageDataset
from lightning_lmdb.sources import folder, manifest
from lightning_lmdb.store import database

#: Names whose case-insensitive order differs from their code-point order (and one beyond ASCII).
NAMES = ["b", "B", "a", "A", "é", "Z"]
SORTED = ["A", "B", "Z", "a", "b", "é"]


@pytest.fixture
def images(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    root.mkdir()
    for i in range(len(NAMES)):
        Image.new("RGB", (4, 4), (40 * i, 0, 0)).save(root / f"{i}.png")
    return root


def test_a_manifests_classes_are_in_code_point_order(images: Path, tmp_path: Path) -> None:
    assert sorted(NAMES) == SORTED
    (images / "list.csv").write_text("path,label\n" + "".join(f"{i}.png,{name}\n" for i, name in enumerate(NAMES)), encoding="utf-8")
    scan = manifest.scan(images / "list.csv")
    assert scan.classes == SORTED
    assert [scan.classes[f.target] for f in scan.files] == NAMES, "each file keeps its own label"
    db = build_lmdb(images / "list.csv", tmp_path / "db.lmdb", workers=0, progress=False)
    assert database.load_meta(db).classes == SORTED
    assert [SORTED[target] for _, target in LMDBImageDataset(db)] == NAMES
    assert RawImageDataset(images / "list.csv").classes == SORTED


def test_multi_label_classes_are_in_code_point_order(images: Path) -> None:
    rows = [{"path": f"{i}.png", "label": [name, NAMES[(i + 1) % len(NAMES)]]} for i, name in enumerate(NAMES)]
    (images / "list.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    scan = manifest.scan(images / "list.jsonl")
    assert scan.target_kind == "multilabel" and scan.classes == SORTED
    assert [sorted(scan.classes[k] for k in f.target) for f in scan.files] == [sorted(row["label"]) for row in rows]


def test_class_folders_are_in_imagefolders_order(tmp_path: Path) -> None:
    root = tmp_path / "folders"
    for name in NAMES:
        (root / name).mkdir(parents=True, exist_ok=True)
    if len({p.name for p in root.iterdir()}) < len(NAMES):
        pytest.skip(f"{tmp_path} is on a case-insensitive filesystem: 'a' and 'A' are one folder")
    for name in NAMES:
        Image.new("RGB", (4, 4)).save(root / name / "x.png")
    reference = ImageFolder(root)
    assert reference.classes == SORTED
    scan = folder.scan_folder(root)
    assert scan.classes == SORTED and [(Path(f.relpath).parent.name, f.target) for f in scan.files] == [
        (Path(p).parent.name, t) for p, t in reference.samples]
