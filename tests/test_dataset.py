"""Serving: parity with ImageFolder, worker start methods, environments, readahead choice."""

from __future__ import annotations

import ctypes
import pickle
import shutil
import struct
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from lightning_lmdb.build.writer import build_lmdb
from lightning_lmdb.codec.storage import STORAGES
from lightning_lmdb.read import blockread
from lightning_lmdb.read import dataset as ds_module
from lightning_lmdb.read.dataset import LMDBImageDataset, auto_readahead
from lightning_lmdb.read.raw import RawImageDataset
from lightning_lmdb.read.transforms import eval_transform, train_transform
from lightning_lmdb.store import envs, shards
from lightning_lmdb.store import format as fmt


@pytest.fixture(scope="module")
def folder_and_dbs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    from imagegen import make_folder

    root = tmp_path_factory.mktemp("serve")
    source = make_folder(root / "src")
    dbs = {s: build_lmdb(source, root / f"{s}.lmdb", storage=s, workers=0, progress=False) for s in STORAGES}
    return source, dbs


def backends(source: Path, dbs: dict[str, Path], **kwargs) -> dict[str, object]:
    return {
        "lmdb-encoded": LMDBImageDataset(dbs["encoded"], **kwargs),
        "lmdb-decoded": LMDBImageDataset(dbs["decoded"], **kwargs),
        "raw": RawImageDataset(source, **kwargs),
    }


def test_pixels_and_targets_equal_imagefolder(folder_and_dbs) -> None:
    source, dbs = folder_and_dbs
    reference = ImageFolder(source)
    modes = set()
    for name, dataset in backends(source, dbs).items():
        assert len(dataset) == len(reference), name
        assert dataset.classes == reference.classes and dataset.class_to_idx == reference.class_to_idx
        assert dataset.targets == reference.targets
        for i in range(len(reference)):
            image, target = dataset[i]
            expected, expected_target = reference[i]
            assert image.mode == "RGB" and target == expected_target
            np.testing.assert_array_equal(np.asarray(image), np.asarray(expected), err_msg=f"{name}[{i}]")
    for path, _ in reference.samples:
        from PIL import Image

        with Image.open(path) as img:
            modes.add(img.mode)
    assert modes >= {"RGB", "L", "LA", "P", "RGBA", "CMYK", "I;16"}
    assert any(not p.isascii() for p in LMDBImageDataset(dbs["encoded"]).paths)


def test_identical_tensors_after_the_same_transform(folder_and_dbs) -> None:
    source, dbs = folder_and_dbs
    reference = ImageFolder(source, transform=eval_transform(24))
    datasets = backends(source, dbs, transform=eval_transform(24))
    for i in range(len(reference)):
        expected = reference[i][0]
        for name, dataset in datasets.items():
            torch.testing.assert_close(dataset[i][0], expected, rtol=0, atol=0, msg=f"{name}[{i}]")
    augment = train_transform(16)
    raw, lmdb_ds = RawImageDataset(source, transform=augment), LMDBImageDataset(dbs["encoded"], transform=augment)
    for i in range(5):
        torch.manual_seed(i)
        a = raw[i][0]
        torch.manual_seed(i)
        assert torch.equal(a, lmdb_ds[i][0])


def _labels(loader: DataLoader) -> list[int]:
    return [int(t) for _, targets in loader for t in targets]


# spawn: tests/test_shards.py and tests/test_loader_stats.py run spawned workers too
@pytest.mark.parametrize("context", ["fork", pytest.param("forkserver", marks=pytest.mark.slow)])
def test_dataloader_workers_under_every_start_method(folder_and_dbs, context: str) -> None:
    source, dbs = folder_and_dbs
    dataset = LMDBImageDataset(dbs["encoded"], transform=eval_transform(16))
    dataset[0]  # the main process has read (and holds an environment) before the workers start
    assert dataset.path in envs.open_paths()
    loader = DataLoader(dataset, batch_size=5, num_workers=2, multiprocessing_context=context)
    assert _labels(loader) == dataset.targets
    batch = next(iter(loader))[0]
    torch.testing.assert_close(batch[0], dataset[0][0])


def test_persistent_workers_over_two_epochs(folder_and_dbs) -> None:
    source, dbs = folder_and_dbs
    dataset = LMDBImageDataset(dbs["decoded"], transform=eval_transform(16))
    loader = DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True, shuffle=True)
    first, second = _labels(loader), _labels(loader)
    assert sorted(first) == sorted(second) == sorted(dataset.targets)


def test_pickles_before_and_after_use_and_views_share_one_environment(folder_and_dbs) -> None:
    source, dbs = folder_and_dbs
    envs.close_all()
    dataset = LMDBImageDataset(dbs["encoded"])
    assert envs.open_paths() == [], "construction must not leave an environment open"
    clone = pickle.loads(pickle.dumps(dataset))
    first = np.asarray(dataset[3][0])
    again = pickle.loads(pickle.dumps(dataset))
    np.testing.assert_array_equal(np.asarray(clone[3][0]), first)
    np.testing.assert_array_equal(np.asarray(again[3][0]), first)
    train, val = dataset.view([0, 1, 2], None), dataset.view([5, 4], None)
    assert train.targets == dataset.targets[:3] and val.paths == [dataset.paths[5], dataset.paths[4]]
    np.testing.assert_array_equal(np.asarray(val[1][0]), np.asarray(dataset[4][0]))
    assert envs.open_paths() == [dataset.path], "every dataset object on one file shares one environment"
    envs.close_all()


def test_integrity_checked_at_open(folder_and_dbs, tmp_path: Path) -> None:
    _, dbs = folder_and_dbs
    cut = tmp_path / "cut.lmdb"
    cut.write_bytes(dbs["encoded"].read_bytes()[: dbs["encoded"].stat().st_size // 2])
    with pytest.raises(fmt.DatabaseError, match="truncated"):
        LMDBImageDataset(cut)
    fmt.partial_path(tmp_path / "half.lmdb").write_bytes(b"")
    with pytest.raises(fmt.DatabaseError, match="incomplete build"):
        LMDBImageDataset(tmp_path / "half.lmdb")


def test_readahead_follows_available_memory(folder_and_dbs, monkeypatch: pytest.MonkeyPatch) -> None:
    _, dbs = folder_and_dbs
    assert auto_readahead(dbs["encoded"]) is True
    assert LMDBImageDataset(dbs["encoded"]).readahead is True
    monkeypatch.setattr(ds_module, "available_memory", lambda: 1024)
    assert LMDBImageDataset(dbs["encoded"]).readahead is False
    assert LMDBImageDataset(dbs["encoded"], readahead=True).readahead is True


def test_a_decode_warning_is_printed_once_not_once_per_image(tmp_path: Path) -> None:
    import warnings

    from imagegen import make_image
    from PIL import Image

    from lightning_lmdb.codec.decoders import decode_pil

    rng = np.random.default_rng(0)
    for i in range(5):
        img = make_image("RGB", (8, 8), rng).quantize(4)
        img.save(tmp_path / f"p{i}.png", transparency=b"\x00\x10\x20\x30")  # transparency as bytes: Pillow warns on convert
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for i in range(5):
            decode_pil((tmp_path / f"p{i}.png").read_bytes())
    messages = [str(w.message) for w in caught if "Transparency" in str(w.message)]
    assert len(messages) == 1, messages
    with Image.open(tmp_path / "p0.png") as img:
        assert img.mode == "P" and isinstance(img.info.get("transparency"), bytes)


def _flip_bit(path: Path, offset: int, bit: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 1 << bit]))


def _damage(path: Path, row: int, where: str) -> type[lmdb.Error]:
    """Flip one bit of the B-tree of database file ``path`` on the way to record ``row``; return the error LMDB will raise.

    ``"leaf"``: the ``P_LEAF`` flag of the record's leaf page (the page is then neither leaf nor branch);
    ``"overflow"``: bit 40 of the record's first overflow page number in its leaf node (a page past the end).
    Both are checked by LMDB before any memory is touched, so the read fails the same way every time, without a signal.
    """
    envs.close_all()
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=False, max_dbs=2)
    try:
        psize = env.stat()["psize"]
        with env.begin(db=env.open_db(fmt.RECORDS_DB, create=False), buffers=True) as txn:
            cursor = txn.cursor()
            key = fmt.record_key(row)
            assert cursor.set_key(key)
            address = np.frombuffer(cursor.key(), np.uint8).__array_interface__["data"][0]  # the key inside its leaf page
            page = address - address % psize
            pgno, _, page_flags = struct.unpack("<QHH", ctypes.string_at(page, 12))
            (node_flags,) = struct.unpack("<H", ctypes.string_at(address - 4, 2))
    finally:
        env.close()
    assert page_flags & 0x02 and node_flags & 0x01, "a leaf page, and the record's value in overflow pages"
    if where == "leaf":
        _flip_bit(path, pgno * psize + 10, 1)  # mp_flags: P_LEAF
        return lmdb.CorruptedError
    _flip_bit(path, pgno * psize + (address - page) + len(key) + 5, 0)  # the overflow page number's bit 40
    return lmdb.PageNotFoundError


@pytest.mark.skipif(not blockread._LAYOUT_KNOWN, reason="locates LMDB nodes by the 64-bit little-endian layout")
@pytest.mark.parametrize("block_reads", [False, True], ids=["plain", "block-reads"])
@pytest.mark.parametrize(("where", "sharded"), [("leaf", False), ("overflow", False), ("leaf", True)])
def test_a_damaged_btree_page_raises_database_error_naming_the_file(tmp_path: Path, where: str, sharded: bool,
                                                                    block_reads: bool) -> None:
    from imagegen import make_jpegs

    source = make_jpegs(tmp_path / "src", 24, size=64)  # ~3 KB noise JPEGs: values in overflow pages
    built = build_lmdb(source, tmp_path / "db.lmdb", workers=0, progress=False, **({"shards": 2} if sharded else {}))
    database = tmp_path / "damaged.lmdb"
    (shutil.copytree if sharded else shutil.copy)(built, database)
    last = shards.parts(database)[-1]  # the file itself, or the second shard
    expected = _damage(Path(last.path), 5, where)
    dataset = LMDBImageDataset(database)  # the metadata is whole: opening works
    if block_reads:
        dataset.read_blocks(block_size=4)
    if sharded:
        assert dataset[0][1] in (0, 1), "the other shard still serves its samples"
    with pytest.raises(fmt.DatabaseError) as caught:
        dataset[last.offset + 5]
    file = last.path
    message = str(caught.value)
    assert isinstance(caught.value.__cause__, expected), "chained to LMDB's own error"
    assert f"{str(file)!r}" in message and "is damaged" in message and f"lightning-lmdb verify {database}" in message
    assert "\n" not in message
    envs.close_all()


@pytest.mark.parametrize("sharded", [False, True], ids=["file", "shard"])
def test_a_replaced_database_or_shard_is_reported_with_both_build_ids(tmp_path: Path, sharded: bool) -> None:
    from imagegen import make_jpegs

    source = make_jpegs(tmp_path / "src", 6)
    options = {"shards": 2} if sharded else {}
    database = build_lmdb(source, tmp_path / "db.lmdb", workers=0, progress=False, **options)
    dataset = LMDBImageDataset(database)
    other = build_lmdb(source, tmp_path / "other.lmdb", workers=0, progress=False, **options)  # the same records, another build
    before, after = shards.parts(database)[0], shards.parts(other)[0]
    assert before.build_id != after.build_id
    envs.close_all()
    shutil.copyfile(after.path, before.path + ".new")
    Path(before.path + ".new").replace(before.path)  # the first file (or shard) replaced, as a rebuild does
    with pytest.raises(fmt.DatabaseError, match="replaced since this dataset was created") as caught:
        dataset[0]
    message = str(caught.value)
    assert f"build {before.build_id}, now {after.build_id}" in message and repr(before.path) in message
    envs.close_all()
