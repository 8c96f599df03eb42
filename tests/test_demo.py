"""The demo folder: deterministic, covers every image mode, safe to interrupt and rerun."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from torchvision.datasets import ImageFolder

import lightning_lmdb.experiment.demo as demo
from lightning_lmdb.experiment.demo import MARKER_NAME, make_demo_dataset

SMALL = {"num_classes": 3, "images_per_class": 11}
MODES = {"RGB", "L", "LA", "P", "RGBA", "CMYK", "I;16"}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return make_demo_dataset(tmp_path_factory.mktemp("demo") / "data", **SMALL)


def test_same_seed_same_bytes_other_seed_differs(small, tmp_path):
    again = make_demo_dataset(tmp_path / "again", **SMALL)
    assert _files(again) == _files(small)
    other = make_demo_dataset(tmp_path / "other", **SMALL, seed=1)
    assert _files(other).keys() == _files(small).keys()
    assert _files(other) != _files(small)


def test_covers_modes_formats_and_names(small):
    modes, formats, transparent = set(), set(), False
    for path in small.rglob("*"):
        if path.is_file() and path.name != MARKER_NAME:
            with Image.open(path) as image:
                modes.add(image.mode)
                formats.add(image.format)
                transparent |= image.mode == "P" and "transparency" in image.info
                assert 40 <= min(image.size) and max(image.size) <= 96
    assert modes == MODES
    assert formats == {"JPEG", "PNG"}
    assert transparent
    names = [p.name for p in small.rglob("*") if p.is_file()]
    assert any(not n.isascii() for n in names)
    assert {"café_0001.jpg", "猫_0005.png"} & set(names)


def test_imagefolder_loads_it(small):
    dataset = ImageFolder(str(small))
    assert dataset.classes == ["class_00", "class_01", "class_02"]
    assert len(dataset) == SMALL["num_classes"] * SMALL["images_per_class"]
    image, target = dataset[len(dataset) - 1]
    assert image.mode == "RGB" and target == 2


def test_rerun_is_a_no_op(small, monkeypatch):
    before = {p: p.stat().st_mtime_ns for p in small.rglob("*")}
    monkeypatch.setattr(demo, "_generate", lambda *a: pytest.fail("regenerated"))
    assert make_demo_dataset(small, **SMALL) == small
    assert {p: p.stat().st_mtime_ns for p in small.rglob("*")} == before


def test_interrupted_generation_is_not_complete(tmp_path, monkeypatch):
    root = tmp_path / "data"
    real_save, calls = demo._save, []

    def dying_save(*args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        real_save(*args)

    monkeypatch.setattr(demo, "_save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        make_demo_dataset(root, **SMALL)
    assert not root.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    # A temp dir left by a killed process is ignored and cleaned up, never renamed into place.
    stale = tmp_path / f".data{demo._PARTIAL}999999999"
    (stale / "class_00").mkdir(parents=True)
    (stale / MARKER_NAME).write_text("{}")
    out = make_demo_dataset(root, **SMALL)
    assert not stale.exists()
    assert len([p for p in out.rglob("*") if p.is_file()]) == 3 * 11 + 1


def test_refuses_foreign_or_mismatched_root(tmp_path, small):
    foreign = tmp_path / "foreign"
    (foreign / "class_00").mkdir(parents=True)  # looks like a half-written demo, has no marker
    with pytest.raises(FileExistsError, match="not a complete demo dataset"):
        make_demo_dataset(foreign, **SMALL)
    with pytest.raises(FileExistsError, match="HINT"):
        make_demo_dataset(small, num_classes=4, images_per_class=11)
    with pytest.raises(ValueError, match="num_classes=0"):
        make_demo_dataset(tmp_path / "x", num_classes=0)
