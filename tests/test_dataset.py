"""Serving: parity with ImageFolder, worker start methods, environments, readahead choice."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from lightning_lmdb import dataset as ds_module
from lightning_lmdb import format as fmt
from lightning_lmdb.codec import STORAGES
from lightning_lmdb.dataset import LMDBImageDataset, RawImageDataset, auto_readahead, close_environments, open_environments
from lightning_lmdb.transforms import eval_transform, train_transform
from lightning_lmdb.writer import build_lmdb


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


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_under_every_start_method(folder_and_dbs, context: str) -> None:
    source, dbs = folder_and_dbs
    dataset = LMDBImageDataset(dbs["encoded"], transform=eval_transform(16))
    dataset[0]  # the main process has read (and holds an environment) before the workers start
    assert dataset.path in open_environments()
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
    close_environments()
    dataset = LMDBImageDataset(dbs["encoded"])
    assert open_environments() == [], "construction must not leave an environment open"
    clone = pickle.loads(pickle.dumps(dataset))
    first = np.asarray(dataset[3][0])
    again = pickle.loads(pickle.dumps(dataset))
    np.testing.assert_array_equal(np.asarray(clone[3][0]), first)
    np.testing.assert_array_equal(np.asarray(again[3][0]), first)
    train, val = dataset.view([0, 1, 2], None), dataset.view([5, 4], None)
    assert train.targets == dataset.targets[:3] and val.paths == [dataset.paths[5], dataset.paths[4]]
    np.testing.assert_array_equal(np.asarray(val[1][0]), np.asarray(dataset[4][0]))
    assert open_environments() == [dataset.path], "every dataset object on one file shares one environment"
    close_environments()


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

    from lightning_lmdb.codec import decode_image

    rng = np.random.default_rng(0)
    for i in range(5):
        img = make_image("RGB", (8, 8), rng).quantize(4)
        img.save(tmp_path / f"p{i}.png", transparency=b"\x00\x10\x20\x30")  # transparency as bytes: Pillow warns on convert
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for i in range(5):
            decode_image((tmp_path / f"p{i}.png").read_bytes())
    messages = [str(w.message) for w in caught if "Transparency" in str(w.message)]
    assert len(messages) == 1, messages
    with Image.open(tmp_path / "p0.png") as img:
        assert img.mode == "P" and isinstance(img.info.get("transparency"), bytes)
