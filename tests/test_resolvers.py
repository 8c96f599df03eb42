"""``${lmdb_num_classes:...}``: the data's class count in a Hydra config (a model's output size), resolved by OmegaConf."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from imagegen import make_jpegs
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError
from PIL import Image

import lightning_lmdb.experiment  # registers the resolvers, as train.py's import does
from lightning_lmdb.build.writer import build_lmdb


def _config(data: dict, output_size: str = "${lmdb_num_classes:${data}}") -> DictConfig:
    data = {"_target_": "lightning_lmdb.LMDBDataModule", "batch_size": 4, **data}  # keys that are no argument are not read
    return OmegaConf.create({"data": data, "model": {"output_size": output_size}})


def test_the_class_count_of_a_folder_from_the_data_config_or_its_path(tmp_path: Path) -> None:
    folder = make_jpegs(tmp_path / "src", 6, size=8, classes=3)
    cfg = _config({"train_dir": str(folder), "cache_dir": str(tmp_path / "cache")})
    assert cfg.model.output_size == 3
    assert _config({"train_dir": str(folder)}, "${lmdb_num_classes:${data.train_dir}}").model.output_size == 3
    assert not (tmp_path / "cache").exists(), "nothing is built to know it"


def test_the_source_options_of_the_data_config_apply(tmp_path: Path) -> None:
    for i in range(4):
        Image.new("RGB", (4, 4), (i, 0, 0)).save(tmp_path / f"{i}.png")
    rows = [f"{i}.png,{'ab'[i % 2]},{'wxyz'[i]}" for i in range(4)]
    (tmp_path / "labels.csv").write_text("path,alpha,brightness\n" + "\n".join(rows) + "\n")
    data = {"train_dir": str(tmp_path / "labels.csv"), "cache_dir": str(tmp_path / "cache"), "source_options": {"label_column": "alpha"}}
    assert _config(data).model.output_size == 2
    cfg = _config({**data, "source_options": {"label_column": "${oc.env:LABEL_COLUMN,brightness}", "classes": None}})
    assert cfg.model.output_size == 4, "interpolations inside the data config are resolved"


def test_a_database_is_counted_from_its_metadata(tmp_path: Path) -> None:
    folder = make_jpegs(tmp_path / "src", 6, size=8, classes=3)
    database = build_lmdb(folder, tmp_path / "train.lmdb", workers=0)
    shutil.rmtree(folder)  # its metadata alone tells
    assert _config({"train_dir": str(database)}).model.output_size == 3


def test_no_train_dir_is_named_with_the_fix() -> None:
    with pytest.raises(InterpolationResolutionError, match=r"no train_dir \(data.train_dir=null\); set data.train_dir="):
        _ = _config({"train_dir": None}).model.output_size


def test_registering_again_is_harmless() -> None:
    lightning_lmdb.experiment.register_resolvers()
    assert OmegaConf.has_resolver("lmdb_num_classes")
