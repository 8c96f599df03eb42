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


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_test_fraction_carves_a_deterministic_disjoint_test_share(tmp_path: Path, backend: str) -> None:
    source = make_jpegs(tmp_path / "src", 20, size=8, classes=2)
    dm = _module(source, tmp_path, val_fraction=0.2, test_fraction=0.25, backend=backend)
    dm.prepare_data()
    dm.setup(None)
    parts = {split: dm.datasets[split].paths for split in ("train", "val", "test")}
    assert {split: len(paths) for split, paths in parts.items()} == {"train": 11, "val": 4, "test": 5}
    assert sorted(sum(parts.values(), [])) == sorted(str(p.relative_to(source)) for p in source.rglob("*.jpg")), "disjoint, complete"
    alone = _module(source, tmp_path, val_fraction=0.2, test_fraction=0.25, backend=backend)
    alone.setup("test")  # what eval.py does: the same share, without fit
    assert alone.datasets["test"].paths == parts["test"] and "train" not in alone.datasets
    without = _module(source, tmp_path, val_fraction=0.2, backend=backend)
    without.setup("fit")
    assert without.datasets["val"].paths == parts["val"], "the validation share does not move"
    assert set(without.datasets["train"].paths) == set(parts["train"]) | set(parts["test"])
    assert without.database_path("train") == dm.database_path("train"), "no database of its own"
    assert len(list(dm.test_dataloader())) == 2


def test_no_test_data_names_the_options(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 8, size=8)
    dm = _module(source, tmp_path, backend="raw")
    dm.setup("test")  # lightning-hydra-template's trainer.test after fit, on a single folder
    with pytest.raises(RuntimeError, match="No test data") as raised:
        dm.test_dataloader()
    message = str(raised.value)
    assert "test_dir=" in message and "test_fraction=" in message and "split column" in message and "setup(" not in message
    given = _module(source, tmp_path, backend="raw", test_fraction=0.25)
    with pytest.raises(RuntimeError, match=r"call setup\('test'\) first"):
        given.test_dataloader()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"test_fraction": 1.0}, r"test_fraction=1\.0 must be in \[0, 1\)"),
    ({"test_fraction": True}, r"test_fraction=True must be in"),
    ({"test_fraction": 0.2, "test_dir": "SRC"}, "either test_dir or test_fraction"),
    ({"test_fraction": 0.5, "val_fraction": 0.5}, "must be below 1"),
])
def test_a_bad_test_fraction_is_refused(tmp_path: Path, kwargs: dict, message: str) -> None:
    source = make_jpegs(tmp_path / "src", 4, size=8)
    kwargs = {k: source if v == "SRC" else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=message):
        _module(source, tmp_path, backend="raw", **kwargs)


def test_the_configs_take_test_fraction(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    configs = Path(__file__).resolve().parents[1] / "configs"
    source = make_jpegs(tmp_path / "src", 8, size=8)
    with initialize_config_dir(str(configs), version_base="1.3"):
        default = compose("train", overrides=[f"data.train_dir={source}", f"paths.data_dir={tmp_path}"])
        given = compose("train", overrides=[f"data.train_dir={source}", f"paths.data_dir={tmp_path}", "data.test_fraction=0.25"])
    assert default.data.test_fraction == 0 and instantiate(default.data).test_fraction == 0.0
    assert instantiate(given.data).test_fraction == 0.25
