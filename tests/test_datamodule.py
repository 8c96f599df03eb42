"""LMDBDataModule from plain Python, under DDP, and through every Hydra data config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from imagegen import make_jpegs
from omegaconf import OmegaConf

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.dataset import LMDBImageDataset, RawImageDataset, open_environments
from lightning_lmdb.transforms import eval_transform

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class TinyClassifier(pl.LightningModule):
    def __init__(self, num_classes: int, size: int = 8):
        super().__init__()
        self.layer = torch.nn.Linear(3 * size * size, num_classes)

    def training_step(self, batch, batch_idx):
        images, targets = batch
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), targets)

    def validation_step(self, batch, batch_idx):
        images, targets = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), targets))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_plain_python_fit_with_validation_split(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 40, size=16, classes=3)
    dm = LMDBDataModule(source, val_fraction=0.25, cache_dir=tmp_path / "cache", batch_size=8, num_workers=2,
                        train_transform=eval_transform(8), eval_transform=eval_transform(8), build_workers=0)
    before = dict(vars(dm))
    dm.prepare_data()
    assert vars(dm) == before, "prepare_data must not set state"
    assert dm.database_path("train").exists()
    dm.setup("fit")
    assert open_environments() == [], "the main process holds no environment after setup"
    train, val = dm.datasets["train"], dm.datasets["val"]
    assert isinstance(train, LMDBImageDataset) and len(train) == 30 and len(val) == 10
    assert sorted(train.paths + val.paths) == sorted(LMDBImageDataset(dm.database_path("train")).paths)
    assert dm.num_classes == 3
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(TinyClassifier(3), datamodule=dm)
    assert trainer.state.finished and "val_loss" in trainer.callback_metrics
    assert LMDBDataModule(source, val_fraction=0.25, cache_dir=tmp_path / "cache").database_path("train") == dm.database_path("train")


def test_raw_and_lmdb_backends_serve_identical_batches(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 12, size=16)
    batches = {}
    for backend in ("lmdb", "raw"):
        dm = LMDBDataModule(source, test_dir=source, backend=backend, cache_dir=tmp_path / "cache", batch_size=5,
                            num_workers=0, eval_transform=eval_transform(8), build_workers=0)
        dm.prepare_data()
        dm.setup("test")
        assert isinstance(dm.datasets["test"], RawImageDataset if backend == "raw" else LMDBImageDataset)
        batches[backend] = list(dm.test_dataloader())
    assert not (tmp_path / "cache").exists() or len(list((tmp_path / "cache").glob("*.lmdb"))) == 1
    for (xa, ya), (xb, yb) in zip(batches["lmdb"], batches["raw"], strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_loader_settings(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 8, size=16)
    common = {"cache_dir": tmp_path / "c", "backend": "raw", "batch_size": 3, "drop_last": True}
    dm = LMDBDataModule(source, val_dir=source, num_workers=0, **common)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.num_workers == 0 and loader.prefetch_factor is None and not loader.persistent_workers
    assert loader.drop_last and not dm.val_dataloader().drop_last
    dm = LMDBDataModule(source, val_dir=source, num_workers=2, prefetch_factor=3, multiprocessing_context="spawn", **common)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert (loader.prefetch_factor, loader.persistent_workers) == (3, True)
    with pytest.raises(RuntimeError, match="No test data"):
        dm.test_dataloader()
    with pytest.raises(ValueError, match="backend='nfs'"):
        LMDBDataModule(source, backend="nfs")
    assert LMDBDataModule(source, shared_filesystem=True).prepare_data_per_node is False


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_ddp_each_sample_once_per_epoch(tmp_path: Path, backend: str) -> None:
    source = make_jpegs(tmp_path / "src", 40, size=16, classes=3)
    out = tmp_path / "seen"
    out.mkdir()
    script = Path(__file__).parent / "scripts" / "ddp_epoch_coverage.py"
    result = subprocess.run([sys.executable, str(script), str(source), str(tmp_path / "cache"), str(out), backend],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    orders = []
    for epoch in range(2):
        ranks = [json.loads((out / f"rank{r}_epoch{epoch}.json").read_text()) for r in range(2)]
        assert len(ranks[0]) == len(ranks[1]) == 20, "the distributed sampler splits the data evenly"
        assert sorted(ranks[0] + ranks[1]) == list(range(40)), f"epoch {epoch}: every sample exactly once"
        orders.append(ranks[0])
    assert orders[0] != orders[1], "shuffling changes between epochs"


@pytest.mark.parametrize("data", ["lmdb", "raw"])
@pytest.mark.parametrize("transforms", ["default", "eval_only"])
@pytest.mark.parametrize("loader", ["default", "fast", "debug"])
def test_every_data_config_composes_and_instantiates(tmp_path: Path, data: str, transforms: str, loader: str) -> None:
    source = make_jpegs(tmp_path / "src", 6, size=16)
    overrides = [f"data={data}", f"transforms={transforms}", f"loader={loader}", f"data.train_dir={source}", f"paths.data_dir={tmp_path}"]
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    dm = instantiate(cfg.data)
    assert isinstance(dm, LMDBDataModule) and dm.backend == data
    assert dm.cache_dir == tmp_path / "lmdb"
    assert dm.batch_size == cfg.data.batch_size and dm.num_workers == cfg.data.num_workers
    dm.prepare_data()
    dm.setup("fit")
    images, targets = next(iter(dm.train_dataloader()))
    assert images.shape[1:] == (3, cfg.data.image_size, cfg.data.image_size) and images.dtype == torch.float32


def test_lmdb_and_raw_configs_differ_only_in_backend() -> None:
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        lmdb_cfg = OmegaConf.to_container(compose("train", overrides=["data=lmdb"]).data)
        raw_cfg = OmegaConf.to_container(compose("train", overrides=["data=raw"]).data)
    assert (lmdb_cfg.pop("backend"), raw_cfg.pop("backend")) == ("lmdb", "raw")
    assert lmdb_cfg == raw_cfg


def test_a_missing_folder_is_named_at_construction(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"train_dir '.*no_such_dir' does not exist.*data\.train_dir"):
        LMDBDataModule(tmp_path / "no_such_dir", cache_dir=tmp_path / "cache")
    source = make_jpegs(tmp_path / "src", 6, size=8)
    with pytest.raises(FileNotFoundError, match="test_dir"):
        LMDBDataModule(source, test_dir=tmp_path / "nope", cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match="there is none at"):
        LMDBDataModule(tmp_path / "gone", cache_dir=tmp_path / "cache", on_stale="ignore")
    # with on_stale="ignore" an existing database is served without its folder
    dm = LMDBDataModule(source, cache_dir=tmp_path / "cache", build_workers=0, on_stale="ignore", num_workers=0)
    dm.prepare_data()
    moved = source.rename(tmp_path / "moved")
    dm2 = LMDBDataModule(source, cache_dir=tmp_path / "cache", on_stale="ignore", num_workers=0)
    dm2.prepare_data()
    dm2.setup("fit")
    assert len(dm2.datasets["train"]) == 6 and dm2.num_classes == 2
    assert moved.is_dir()


def test_predict_in_a_fresh_module_falls_back_to_the_validation_split(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 20, size=8)
    dm = LMDBDataModule(source, val_fraction=0.2, cache_dir=tmp_path / "cache", build_workers=0, num_workers=0, batch_size=4,
                        eval_transform=eval_transform(8))
    dm.prepare_data()
    dm.setup("predict")
    assert len(dm.predict_dataloader().dataset) == 4
    fresh = LMDBDataModule(source, cache_dir=tmp_path / "cache", build_workers=0, num_workers=0)
    fresh.setup("test")
    with pytest.raises(RuntimeError, match="No test data: pass test_dir"):
        fresh.test_dataloader()


@pytest.mark.parametrize("database_first", [True, False], ids=["database-exists", "no-database"])
def test_raw_backend_serves_exactly_the_samples_of_a_skip_build(tmp_path: Path, database_first: bool) -> None:
    from imagegen import truncated_jpeg

    source = make_jpegs(tmp_path / "src", 24, size=8, classes=2)
    (source / "c0" / "zz_broken.jpg").write_bytes(truncated_jpeg())
    (source / "c1" / "aa_empty.jpg").write_bytes(b"")
    kwargs = dict(val_fraction=0.25, cache_dir=tmp_path / "cache", build_workers=0, num_workers=0, on_error="skip",
                  train_transform=eval_transform(8), eval_transform=eval_transform(8), shuffle=False, batch_size=64)
    lmdb_dm, raw_dm = LMDBDataModule(source, backend="lmdb", **kwargs), LMDBDataModule(source, backend="raw", **kwargs)
    if database_first:
        lmdb_dm.prepare_data()
    raw_dm.prepare_data()
    assert lmdb_dm.database_path("train").exists() == database_first, "the raw backend's prepare_data builds nothing"
    raw_dm.setup("fit")
    lmdb_dm.prepare_data()
    lmdb_dm.setup("fit")
    for split in ("train", "val"):
        raw, lmdb_ds = raw_dm.datasets[split], lmdb_dm.datasets[split]
        assert isinstance(raw, RawImageDataset)
        assert raw.paths == lmdb_ds.paths and raw.targets == lmdb_ds.targets
        assert len(raw) == len(lmdb_ds)
    assert len(raw_dm.datasets["train"]) + len(raw_dm.datasets["val"]) == 24
    for (x_raw, y_raw), (x_lmdb, y_lmdb) in zip(raw_dm.train_dataloader(), lmdb_dm.train_dataloader()):
        assert torch.equal(x_raw, x_lmdb) and torch.equal(y_raw, y_lmdb)
