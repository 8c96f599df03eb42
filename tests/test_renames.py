"""Names renamed in issue 31, kept for one release: each old name still works, is the new object, and warns naming the new name;
the new names never warn. (``ManifestOptions`` and ``manifest=``: tests/test_manifest_options.py; ``backends.Backend``:
tests/test_backend_plan.py.)"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import pytest
from imagegen import make_folder

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.datamodule import module as datamodule
from lightning_lmdb.datamodule import options as dm_options
from lightning_lmdb.datamodule import plan as dm_plan
from lightning_lmdb.errors import OptionError
from lightning_lmdb.read import dataset
from lightning_lmdb.read.raw import RawImageDataset


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("lightning_lmdb.datamodule.options", "Backend", "BackendName"),
        ("lightning_lmdb.read.dataset", "kind_of", "stored_targets"),
        ("lightning_lmdb.read.dataset", "_ImageDataset", "ImageDatasetBase"),
        ("lightning_lmdb.datamodule.plan", "given_folder", "given_source"),
        ("lightning_lmdb.datamodule.module", "given_folder", "given_source"),
    ],
)
def test_an_old_module_name_warns_naming_the_new_one_and_is_the_same_object(module: str, old: str, new: str) -> None:
    found = importlib.import_module(module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        current = getattr(found, new)
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{old} is deprecated, use .*\b{new}\b"):
        assert getattr(found, old) is current
    assert not hasattr(found, "no_such_name"), "any other missing name is an AttributeError"


def test_the_old_names_still_do_their_work(tmp_path: Path) -> None:
    assert dm_options.BACKENDS == ("lmdb", "raw")
    with pytest.warns(DeprecationWarning):
        assert dm_options.Backend.__args__ == ("lmdb", "raw")  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning):
        given_folder = dm_plan.given_folder
    source = tmp_path / "images"
    assert given_folder({"train": source, "val": None}, "train") == source
    with pytest.raises(OptionError, match="No val_dir was given"):
        given_folder({"train": source, "val": None}, "val")
    assert issubclass(dataset.LMDBImageDataset, dataset.ImageDatasetBase)
    with pytest.warns(DeprecationWarning):
        from lightning_lmdb.read.dataset import _ImageDataset
    assert issubclass(RawImageDataset, _ImageDataset)
    with pytest.warns(DeprecationWarning):
        assert datamodule.given_folder is dm_plan.given_source


def test_the_datamodules_dirs_is_sources_with_a_warning(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src", classes=("a", "b"), per_class=2)
    dm = LMDBDataModule(source, cache_dir=tmp_path / "cache", num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dm.sources == {"train": source.resolve(), "val": None, "test": None} and dm.plan.sources == dm.sources
    with pytest.warns(DeprecationWarning, match=r"LMDBDataModule\.dirs is deprecated, use LMDBDataModule\.sources"):
        assert dm.dirs is dm.sources
