"""A map-style Dataset as the DataModule's data: ``LMDBDataModule(train_dir=my_dataset)``.

The lmdb backend serves the database built from it (in ``cache_dir``, named by the dataset's class, length and
``manifest.version``), the raw backend the Dataset's own samples through the same decoding: both serve the Dataset's
samples, with the same targets and the same bad samples left out, so an A/B differs in storage alone.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from PIL import Image

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.build.writer import build_lmdb
from lightning_lmdb.errors import BuildError, OptionError, SourceError, StaleDatabaseError
from lightning_lmdb.experiment.datamodule import ExperimentDataModule
from lightning_lmdb.read.raw import SourceDataset
from lightning_lmdb.read.transforms import eval_transform
from lightning_lmdb.sources import base as sources
from lightning_lmdb.sources import dataset as datasource
from lightning_lmdb.store import fsops
from lightning_lmdb.tools import netfs

SIZE = 8


def _pixels(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


class PilClasses(torch.utils.data.Dataset):
    """(PIL image of several modes, int class) with torchvision's ``classes``; counts its reads."""

    classes = ["cat", "dog", "emu"]
    modes = ["RGB", "L", "RGBA", "P", "1", "LA", "I;16", "CMYK"]

    def __init__(self, count: int = 10, offset: int = 0):
        self.count, self.offset, self.reads = count, offset, 0

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        self.reads += 1
        rgb = Image.fromarray(_pixels(i + self.offset, (9 + i % 4, 11, 3)))
        mode = self.modes[i % len(self.modes)]
        return (rgb.quantize(16) if mode == "P" else rgb.convert(mode)), (2 * i) % 3


class ArrayTags(torch.utils.data.Dataset):
    """(uint8 H x W x C or H x W array, list of tag names): multi-label, its classes found only in the samples; counts its reads."""

    shapes = [(10, 9, 3), (9, 12), (12, 10, 1), (11, 9, 4), (9, 9, 2)]
    tags = [["sky", "sea"], ["sea"], [], ["tree", "sky"], ["sky"], ["tree"]]

    def __init__(self, count: int = 12):
        self.count, self.reads = count, 0

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[np.ndarray, list[str]]:
        self.reads += 1
        return _pixels(10 + i, self.shapes[i % len(self.shapes)]), self.tags[i % len(self.tags)]


class WithABadSample(PilClasses):
    """``PilClasses`` whose sample 3 cannot be read."""

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        if i == 3:
            raise OSError("sample 3 is gone")
        return super().__getitem__(i)


def _rgb(image: Any) -> np.ndarray:
    """The RGB pixels a database serves for a sample's image (a PIL image or a uint8 array)."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image[:, :, 0] if image.ndim == 3 and image.shape[2] == 1 else image)
    return np.array(image.convert("RGB"))


def _expected_batch(dataset: Any, indices: list[int], classes: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The Dataset's own samples of ``indices``, transformed and collated as the loaders must serve them."""
    images, targets = [], []
    for i in indices:
        image, target = dataset[i]
        images.append(eval_transform(SIZE)(Image.fromarray(_rgb(image))))
        if isinstance(target, list):  # multi-label names: a multi-hot vector over the classes
            hot = torch.zeros(len(classes))
            hot[[classes.index(t) for t in target]] = 1.0
            targets.append(hot)
        else:
            targets.append(torch.tensor(target))
    return torch.stack(images), torch.stack(targets)


def _module(dataset: Any, cache_dir: Path, backend: str, **kwargs: Any) -> LMDBDataModule:
    settings: dict[str, Any] = {"val_fraction": 0, "shuffle": False, "image_size": SIZE, "batch_size": 4, "num_workers": 0,
                                "build_workers": 0, "decoder": "pil", "train_transform": eval_transform(SIZE),
                                "eval_transform": eval_transform(SIZE), **kwargs}
    return LMDBDataModule(dataset, cache_dir=cache_dir, backend=backend, **settings)


def _batches(dm: LMDBDataModule) -> list[tuple[torch.Tensor, torch.Tensor]]:
    dm.prepare_data()
    dm.setup("fit")
    return [(images, targets) for images, targets in dm.train_dataloader()]


def _same(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def _identity(image: Any) -> Any:
    return image


@pytest.mark.parametrize("make", [PilClasses, ArrayTags], ids=["pil-classes", "array-tags"])
def test_both_backends_serve_the_datasets_own_samples(tmp_path: Path, make: type) -> None:
    served = {}
    for backend in ("raw", "lmdb"):  # raw first: it reads every sample itself, no database exists yet
        dm = _module(make(), tmp_path / "cache", backend)
        served[backend] = _batches(dm)
        assert isinstance(dm.datasets["train"], SourceDataset) == (backend == "raw")
    assert _same(served["raw"], served["lmdb"]), "an A/B of storage alone"
    dataset, classes = make(), dm.classes
    expected = [_expected_batch(dataset, list(range(i, min(i + 4, len(dataset)))), classes) for i in range(0, len(dataset), 4)]
    assert _same(served["lmdb"], expected), "the Dataset's own samples and targets"
    assert dm.target_kind == ("class" if make is PilClasses else "multilabel")


@pytest.mark.parametrize("storage", ["auto", "encoded", "decoded"])
@pytest.mark.parametrize("decoder", ["pil", "opencv"])
def test_pixels_are_the_databases_without_a_png_round_trip(tmp_path: Path, storage: str, decoder: str) -> None:
    images = {}
    for backend in ("lmdb", "raw"):
        dm = _module(PilClasses(16), tmp_path / "cache", backend, storage=storage, decoder=decoder, train_transform=_identity)
        dm.prepare_data()
        dm.setup("fit")
        dataset = dm.datasets["train"]
        images[backend] = [np.asarray(dataset[i][0]) for i in range(len(dataset))]
    assert len(images["raw"]) == 16
    for i, (raw, lmdb) in enumerate(zip(images["raw"], images["lmdb"])):
        assert raw.shape == lmdb.shape and np.array_equal(raw, lmdb), (i, PilClasses.modes[i % len(PilClasses.modes)])


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_val_fraction_splits_a_dataset_alike_on_both_backends(tmp_path: Path, backend: str) -> None:
    parts = {}
    for name in ("lmdb", "raw"):
        dm = _module(PilClasses(12), tmp_path / "cache", name, val_fraction=0.25)
        dm.prepare_data()
        dm.setup("fit")
        parts[name] = {split: [dm.datasets[split][i] for i in range(len(dm.datasets[split]))] for split in ("train", "val")}
    train, val = parts[backend]["train"], parts[backend]["val"]
    assert (len(train), len(val)) == (9, 3)
    other = parts["raw" if backend == "lmdb" else "lmdb"]
    for split in ("train", "val"):
        assert all(torch.equal(x, u) and y == v for (x, y), (u, v) in zip(parts[backend][split], other[split]))
    pictures = [x for x, _ in train + val]
    assert all(not torch.equal(a, b) for k, a in enumerate(pictures) for b in pictures[k + 1 :]), "disjoint parts"


def test_the_database_name_is_stable_and_changes_with_the_version(tmp_path: Path) -> None:
    first, second = _module(PilClasses(), tmp_path / "cache", "lmdb"), _module(PilClasses(), tmp_path / "cache", "lmdb")
    assert first.database_path("train") == second.database_path("train"), "two equal dataset objects: one database"
    assert first.database_path("train").name.startswith("PilClasses-")
    versioned = _module(PilClasses(), tmp_path / "cache", "lmdb", source_options={"version": 2})
    assert versioned.database_path("train") != first.database_path("train")
    assert versioned.hparams["train_dir"] == "<Dataset PilClasses of 10 samples, version 2>"
    assert _module(PilClasses(11), tmp_path / "cache", "lmdb").database_path("train") != first.database_path("train"), "its length"
    raw = _module(PilClasses(), tmp_path / "cache", "raw")
    assert raw.database_path("train") == first.database_path("train"), "the raw backend reuses the database when there is one"


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_each_split_serves_its_own_dataset_of_one_class_and_length(tmp_path: Path, backend: str) -> None:
    given = {"train": PilClasses(8), "val": PilClasses(8, offset=100), "test": PilClasses(8, offset=200)}
    dm = _module(given["train"], tmp_path / "cache", backend, val_dir=given["val"], test_dir=given["test"])
    assert len({dm.database_path(split) for split in given}) == 3, "one database each"
    dm.prepare_data()
    dm.setup(None)
    for split, dataset in given.items():
        served = dm.datasets[split]
        expected = _expected_batch(dataset, list(range(len(dataset))), dm.classes)
        assert torch.equal(torch.stack([served[i][0] for i in range(len(served))]), expected[0]), split


def test_only_its_database_is_written_to_cache_dir(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    raw = _module(PilClasses(), cache, "raw")
    _batches(raw)
    assert not cache.exists() or not any(cache.iterdir()), "the raw backend writes nothing"
    dm = _module(PilClasses(), cache, "lmdb")
    _batches(dm)
    database = dm.database_path("train")
    assert database.is_file()
    assert {p for p in cache.iterdir()} - set(fsops.build_files(database)) == {database}


def test_labels_before_setup_read_every_sample_once_and_setup_reuses_them(tmp_path: Path) -> None:
    dataset = ArrayTags()
    dm = _module(dataset, tmp_path / "cache", "raw")
    assert dm.classes == ["sea", "sky", "tree"] and dm.target_kind == "multilabel" and dm.num_classes == 3
    after_labels = dataset.reads
    assert len(dataset) <= after_labels < 2 * len(dataset), "every sample once (and the first one for the kind)"
    assert dm.class_to_idx == {"sea": 0, "sky": 1, "tree": 2} and dataset.reads == after_labels, "found once"
    dm.setup("fit")
    assert dataset.reads == after_labels, "setup serves the samples already read"
    assert dm.classes == ["sea", "sky", "tree"]
    assert sources.labels_of(ArrayTags()) == sources.Labels(["sea", "sky", "tree"], dm.class_to_idx, "multilabel"), "the source kind's"
    # with the classes known (the dataset's classes attribute), one sample tells the kind
    classes = PilClasses()
    dm = _module(classes, tmp_path / "cache2", "lmdb")
    assert (dm.classes, dm.target_kind) == (PilClasses.classes, "class") and classes.reads == 1


@pytest.mark.parametrize("first", ["raw", "lmdb"])
def test_bad_samples_are_left_out_alike(tmp_path: Path, first: str) -> None:
    served = {}
    for backend in (first, "lmdb" if first == "raw" else "raw"):  # the second raw reuses the current database's list
        dm = _module(WithABadSample(), tmp_path / "cache", backend, on_error="skip")
        served[backend] = _batches(dm)
        assert len(dm.datasets["train"]) == 9
    assert _same(served["raw"], served["lmdb"])
    with pytest.raises(BuildError, match=r"(?s)WithABadSample\[3\].*sample 3 is gone.*on_error='skip'"):
        _batches(_module(WithABadSample(), tmp_path / "cache2", "raw"))


def test_hyperparameters_are_plain_and_a_checkpoint_needs_the_dataset_again(tmp_path: Path) -> None:
    dm = _module(PilClasses(), tmp_path / "cache", "lmdb", val_fraction=0.2)
    assert dm.hparams["train_dir"] == "<Dataset PilClasses of 10 samples>" and dm.sources["train"].__class__ is PilClasses
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, callbacks=[checkpoints], enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(_Tiny(3), datamodule=dm)
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    hparams = torch.load(ckpt, weights_only=True)[LMDBDataModule.CHECKPOINT_HYPER_PARAMS_KEY]
    assert hparams == dict(dm.hparams)
    with pytest.raises(OptionError, match=r"train_dir=.*checkpoint records a Dataset.*load_from_checkpoint\(path, train_dir="):
        LMDBDataModule.load_from_checkpoint(ckpt, weights_only=True)
    restored = LMDBDataModule.load_from_checkpoint(ckpt, weights_only=True, train_dir=PilClasses())
    assert restored.database_path("train") == dm.database_path("train") and restored.hparams == dm.hparams


class _Tiny(pl.LightningModule):
    def __init__(self, num_classes: int):
        super().__init__()
        self.layer = torch.nn.Linear(3 * SIZE * SIZE, num_classes)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, targets = batch
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), targets)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_what_a_dataset_source_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(OptionError, match=r"shards=2 does not apply to a Dataset.*data\.shards"):
        _module(PilClasses(), tmp_path / "cache", "lmdb", shards=2)
    with pytest.raises(OptionError, match=r"train_dir: label_column='tags'.*data\.source_options"):
        _module(PilClasses(), tmp_path / "cache", "lmdb", source_options={"label_column": "tags"})
    with pytest.raises(SourceError, match="train_dir is an empty Dataset"):
        _module(PilClasses(0), tmp_path / "cache", "lmdb")
    with pytest.raises(OptionError, match="val_dir is a builtins.object"):
        _module(PilClasses(), tmp_path / "cache", "lmdb", val_dir=object())
    monkeypatch.setattr(netfs, "check_available", lambda: None)  # refused before anything is mounted
    with pytest.raises(OptionError, match=r"netfs_latency_ms=0.5 .* train_dir is a Dataset"):
        ExperimentDataModule(PilClasses(), cache_dir=tmp_path / "cache", netfs_latency_ms=0.5, num_workers=0)
    assert not (tmp_path / "cache").exists()


def test_a_database_built_from_a_dataset_is_served_in_place_and_the_raw_backend_asks_for_the_dataset(tmp_path: Path) -> None:
    database = build_lmdb(PilClasses(), tmp_path / "dbs" / "pil.lmdb", workers=0, progress=False)
    served = _batches(_module(database, tmp_path / "cache", "lmdb"))
    assert _same(served, _batches(_module(PilClasses(), tmp_path / "cache", "raw"))), "the dataset's samples"
    assert not (tmp_path / "cache").exists(), "nothing built for a given database"
    with pytest.raises(SourceError, match=r"built from dataset PilClasses: pass that dataset as train_dir"):
        _batches(_module(database, tmp_path / "cache", "raw"))


@pytest.mark.slow
def test_two_workers_serve_the_same_batches_on_both_backends(tmp_path: Path) -> None:
    served = {backend: _batches(_module(ArrayTags(24), tmp_path / "cache", backend, num_workers=2, persistent_workers=False))
              for backend in ("raw", "lmdb")}
    assert len(served["raw"]) == 6 and _same(served["raw"], served["lmdb"])


def test_k_fold_subsets_of_one_dataset_each_serve_their_own_samples_from_one_cache_dir(tmp_path: Path) -> None:
    """Two folds of one length, no version: one database each (the second was served the first fold's images)."""
    full = PilClasses(16)
    folds = [torch.utils.data.Subset(full, range(0, 8)), torch.utils.data.Subset(full, range(8, 16))]
    modules = [_module(fold, tmp_path / "cache", "lmdb") for fold in folds]
    for k, (fold, dm) in enumerate(zip(folds, modules)):
        images, targets = (torch.cat(part) for part in zip(*_batches(dm)))
        expected = _expected_batch(fold, list(range(len(fold))), dm.classes)
        assert torch.equal(images, expected[0]) and torch.equal(targets, expected[1]), f"fold {k} served its own samples"
    assert modules[0].database_path("train") != modules[1].database_path("train")
    database = build_lmdb(folds[0], tmp_path / "fold.lmdb", workers=0, progress=False)
    with pytest.raises(StaleDatabaseError):  # another fold at one path: its database is not current for it
        build_lmdb(folds[1], database, workers=0, progress=False, on_stale="error")


def _png_samples(count: int) -> list[tuple[bytes, int]]:
    """A list (a dataset too) of (PNG bytes, class) samples, each its own picture."""
    samples = []
    for i in range(count):
        buffer = io.BytesIO()
        Image.fromarray(_pixels(i, (4, 5, 3))).save(buffer, format="PNG")
        samples.append((buffer.getvalue(), i % 2))
    return samples


def test_a_subsets_indices_enter_its_identity_recursively_and_the_parts_of_a_concat_dataset() -> None:
    full = _png_samples(8)  # 6 indices, 4 samples hashed at positions 0, 1, 3, 5: these differ only at position 2 and 4
    subset, other = torch.utils.data.Subset(full, [0, 1, 2, 3, 4, 5]), torch.utils.data.Subset(full, [0, 1, 4, 3, 2, 5])
    assert datasource.identity(subset, 1) != datasource.identity(other, 1), "the indices, not the samples hashed"
    assert datasource.identity(subset, 1) == datasource.identity(torch.utils.data.Subset(full, range(6)), 1), "indices as a range"
    nested = [torch.utils.data.Subset(torch.utils.data.Subset(full, inner), range(6)) for inner in ([0, 1, 2, 3, 4, 5], [0, 1, 4, 3, 2, 5])]
    assert datasource.identity(nested[0], 1) != datasource.identity(nested[1], 1), "a Subset of a Subset"
    concat = [torch.utils.data.ConcatDataset([torch.utils.data.Subset(full, a), torch.utils.data.Subset(full, b)])
              for a, b in (([0, 1, 2], [3, 4, 5]), ([0, 1, 4], [3, 2, 5]))]
    assert datasource.identity(concat[0], 1) != datasource.identity(concat[1], 1), "a ConcatDataset's parts"
    edited = list(full)
    edited[2] = _png_samples(9)[8]  # 8 samples: positions 0, 2, 4 and 7 hashed
    assert datasource.identity(edited, 1) != datasource.identity(full, 1), "a sample hashed: the same length, other bytes"


def test_the_identity_is_the_same_in_another_process() -> None:
    code = ("import io, json, sys, numpy as np; from PIL import Image; from lightning_lmdb import datasource\n"
            "def png(i):\n b = io.BytesIO(); Image.fromarray(np.full((4, 5, 3), i, np.uint8)).save(b, format='PNG'); return b.getvalue()\n"
            "print(datasource.identity([(png(i), i % 2) for i in range(7)], 'v1'))")
    found = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONWARNINGS": "ignore"}).stdout for seed in ("1", "2")}
    assert len(found) == 1 and json.loads(found.pop())["samples"] is not None


class RandomCrops(PilClasses):
    """``PilClasses`` whose images come out of a random transform: other pixels each read."""

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        image, target = super().__getitem__(i)
        return Image.fromarray(np.asarray(image.convert("RGB")) ^ np.uint8(np.random.randint(1, 256))), target


def test_a_dataset_that_reads_differently_twice_warns_and_is_known_without_its_samples() -> None:
    with pytest.warns(UserWarning, match=r"RandomCrops returned other bytes when dataset\[0\] was read again \(random transforms"):
        known = json.loads(datasource.identity(RandomCrops(), 3))
    assert known["samples"] is None and known["structure"]["length"] == 10 and known["version"] == 3
    with pytest.warns(UserWarning, match="returned other bytes"):
        assert datasource.identity(RandomCrops(), 3) == json.dumps(known, sort_keys=True), "class, length, indices and version"
    assert json.loads(datasource.identity(PilClasses(), 3))["samples"] is not None


def test_a_dataset_without_a_version_warns_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasource, "_UNVERSIONED_WARNED", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            _batches(_module(PilClasses(), tmp_path / "cache", "lmdb"))
        _batches(_module(PilClasses(), tmp_path / "cache", "lmdb", source_options={"version": 1}))
    said = [str(w.message) for w in caught if "has no version" in str(w.message)]
    assert len(said) == 1 and "PilClasses" in said[0] and "edit of the same length" in said[0] and "version=" in said[0], said
