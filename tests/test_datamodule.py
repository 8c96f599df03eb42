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
