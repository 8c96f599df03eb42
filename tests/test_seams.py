"""The extension seams: a new source kind is one module registered in ``sources.SOURCE_KINDS``; a new storage mode
is one entry of ``codec.STORAGE_MODES``; a new decoder is one entry of ``decoders.DECODERS``."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from imagegen import read_records
from PIL import Image

from lightning_lmdb import codec, options, sources
from lightning_lmdb.datamodule import LMDBDataModule
from lightning_lmdb.dataset import LMDBImageDataset
from lightning_lmdb.transforms import eval_transform
from lightning_lmdb.verify import verify_lmdb
from lightning_lmdb.writer import build_lmdb

# A whole source kind: a text file listing "relative-path class-index" lines beside the images.
LIST_KIND = '''
from pathlib import Path
from lightning_lmdb.sources import SourceFile, SourceScan

def accepts(path):
    return path.suffix == ".list" and path.is_file()

def scan(source, options=None):
    listing = Path(source).resolve()
    root, files = listing.parent, []
    for line in listing.read_text().splitlines():
        relpath, target = line.rsplit(" ", 1)
        st = (root / relpath).stat()
        files.append(SourceFile(str(root / relpath), relpath, int(target), st.st_size, st.st_mtime_ns))
    return SourceScan(root=root, classes=["a", "b"], class_to_idx={"a": 0, "b": 1}, files=files)

def has_samples(path, options=None):
    return bool(path.read_text().strip())

def classes(path, options=None):
    return ["a", "b"], {"a": 0, "b": 1}
'''


@pytest.fixture
def list_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "listkind.py").write_text(LIST_KIND)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sources, "SOURCE_KINDS", ("listkind", *sources.SOURCE_KINDS))
    yield "listkind"
    sys.modules.pop("listkind", None)


def test_a_source_kind_is_one_module(list_kind: str, tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    for i in range(3):
        Image.new("RGB", (6, 5), (40 * i, 0, 0)).save(images / f"{i}.png")
    listing = images / "train.list"
    listing.write_text("2.png 1\n0.png 0\n1.png 1\n")

    target = build_lmdb(listing, tmp_path / "out.lmdb", storage="encoded", workers=0, progress=False)

    meta, values = read_records(target)
    assert meta["paths"] == ["2.png", "0.png", "1.png"] and meta["targets"] == [1, 0, 1]
    assert values == [(images / name).read_bytes() for name in ("2.png", "0.png", "1.png")]
    assert [LMDBImageDataset(target)[i][1] for i in range(3)] == [1, 0, 1]

    data = LMDBDataModule(train_dir=listing, val_fraction=0, cache_dir=tmp_path / "cache", batch_size=3, num_workers=0,
                          image_size=4, train_transform=eval_transform(4))
    assert data.num_classes == 2
    data.prepare_data()
    data.setup("fit")
    _, labels = next(iter(data.train_dataloader()))
    assert sorted(labels.tolist()) == [0, 1, 1]


def test_an_unknown_source_is_refused_naming_it(tmp_path: Path) -> None:
    stray = tmp_path / "labels.list"
    stray.write_text("")
    with pytest.raises(FileNotFoundError, match="labels.list"):
        sources.scan_source(stray)


def test_a_storage_mode_is_one_registry_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A zlib-compressed pixel mode: one StorageMode, and one RecordCodec for its new record layout."""
    zlib_codec = len(codec.RECORD_CODECS)
    pixels = codec.RECORD_CODECS[codec.PIXELS]
    record = codec.RecordCodec(zlib_codec, "zlib pixels", file_bytes=False,
                               decode=lambda value, decoder, size, name: pixels.decode(zlib.decompress(value), decoder, size, name))
    decoded = codec.STORAGE_MODES["decoded"]

    def encode(data: bytes, image: Image.Image, resize: int | None, quality: int) -> tuple[int, bytes]:
        return zlib_codec, zlib.compress(decoded.encode(data, image, resize, quality)[1])

    monkeypatch.setattr(codec, "RECORD_CODECS", (*codec.RECORD_CODECS, record))
    monkeypatch.setitem(codec.STORAGE_MODES, "zlib", codec.StorageMode("zlib", encode, default_codec=None))
    # What writing the entry into STORAGE_MODES's literal does at import: the valid values follow the registry.
    monkeypatch.setattr(codec, "STORAGES", tuple(codec.STORAGE_MODES))
    monkeypatch.setitem(options.CHOICES, "storage", codec.STORAGES)
    source = tmp_path / "src"
    (source / "cat").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (7, 9, 3), dtype=np.uint8)).save(source / "cat" / f"{i}.png")

    target = build_lmdb(source, tmp_path / "zlib.lmdb", storage="zlib", workers=0, progress=False)

    dataset = LMDBImageDataset(target)
    for i, path in enumerate(sorted((source / "cat").iterdir())):
        image, label = dataset[i]
        assert label == 0 and np.array_equal(np.asarray(image), np.asarray(Image.open(path).convert("RGB")))
    report = verify_lmdb(target, source=source)
    assert report.ok and report.checked == 3, report.problems
