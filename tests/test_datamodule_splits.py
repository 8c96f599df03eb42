"""LMDBDataModule's splits as lightning-hydra-template uses them: the training split's classes map every split, a test share
carved from ``train_dir``, and loaders Lightning can rebuild (``overfit_batches``)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from imagegen import make_jpegs

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.sampler import ResumableDataLoader, ResumableSampler
from lightning_lmdb.transforms import eval_transform


class Recorder(pl.LightningModule):
    """Records every training batch's images; learns nothing."""

    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, num_classes)
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        images, targets = batch
        self.seen.append(images.clone())
        return torch.nn.functional.cross_entropy(self.layer(images.float().flatten(1)), targets)

    def validation_step(self, batch, batch_idx):
        images, targets = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(images.float().flatten(1)), targets))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _module(source: Path, tmp_path: Path, **kwargs) -> LMDBDataModule:
    settings = {"cache_dir": tmp_path / "cache", "batch_size": 4, "num_workers": 0, "build_workers": 0, "finish_on_device": False,
                "train_transform": eval_transform(8, normalize=False), "eval_transform": eval_transform(8, normalize=False)}
    return LMDBDataModule(source, **{**settings, **kwargs})


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_overfit_batches_rebuilds_the_training_loader_in_order(tmp_path: Path, backend: str) -> None:
    """lightning-hydra-template's ``debug=overfit``: Lightning rebuilds the loaders with a SequentialSampler of its own."""
    dm = _module(make_jpegs(tmp_path / "src", 24, size=8, classes=3), tmp_path, val_fraction=0.25, backend=backend)
    model = Recorder()
    trainer = pl.Trainer(accelerator="cpu", overfit_batches=3, max_epochs=2, logger=False, enable_progress_bar=False,
                         default_root_dir=tmp_path)
    trainer.fit(model, datamodule=dm)  # the checkpoint at the end saves the rebuilt loader's state
    assert trainer.state.finished and len(model.seen) == 6
    train = dm.datasets["train"]
    first = torch.stack([train[i][0] for i in range(12)])  # the first 3 batches, in order: the same every epoch
    assert torch.equal(torch.cat(model.seen[:3]), first) and torch.equal(torch.cat(model.seen[3:]), first)


def test_a_loader_over_another_sampler_has_no_position(tmp_path: Path) -> None:
    data = list(range(10))
    saved = ResumableDataLoader(data, sampler=ResumableSampler(data, seed=1), batch_size=3)
    next(iter(saved))
    position = saved.state_dict()
    plain = ResumableDataLoader(data, sampler=torch.utils.data.SequentialSampler(data), batch_size=3)
    assert plain.state_dict() == {} and [b.tolist() for b in plain][0] == [0, 1, 2]
    plain.load_state_dict({})
    with pytest.warns(UserWarning, match="not applied.*SequentialSampler"):
        plain.load_state_dict(position)
    assert [b.tolist() for b in plain][0] == [0, 1, 2]
