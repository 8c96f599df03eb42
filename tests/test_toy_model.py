"""The A/B's models on every target kind: ToyCNN's loss and metric follow the kind, NoOpModel runs on all of them."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from trainkit import overfit_one_batch, trainer

from lightning_lmdb.errors import OptionError, SourceError
from lightning_lmdb.experiment.toy_model import NoOpModel, ToyCNN, _images

CLASSES = 3
VALUES = 2  # K of the regression targets
SIZE = 16
METRIC = {"class": "acc", "multilabel": "f1", "regression": "mae"}
OUTPUTS = {"class": CLASSES, "multilabel": CLASSES, "regression": VALUES}


class TinyDataset(Dataset):
    """``count`` random images (uint8 pixels as floats in [0, 1]) with targets of ``kind``, served as a labelled dataset serves them."""

    def __init__(self, kind: str, count: int = 8, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (count, 3, SIZE, SIZE), dtype=torch.uint8, generator=generator).float() / 255
        if kind == "class":
            self.targets: list[int | torch.Tensor] = torch.randint(0, CLASSES, (count,), generator=generator).tolist()
        elif kind == "multilabel":
            self.targets = list((torch.rand(count, CLASSES, generator=generator) < 0.5).float())
        elif kind == "regression":
            self.targets = list(torch.randn(count, VALUES, generator=generator))
        else:
            self.targets = [-1] * count

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int | torch.Tensor]:
        return self.images[index], self.targets[index]


def toy(kind: str, **kwargs) -> ToyCNN:
    return ToyCNN(num_classes=CLASSES, width=4, target_kind=kind, num_outputs=OUTPUTS[kind], **kwargs)


@pytest.mark.parametrize("kind", ["class", "multilabel", "regression"])
def test_batches_of_each_kind_have_the_served_dtype_and_shape(kind: str) -> None:
    _, targets = next(iter(DataLoader(TinyDataset(kind), batch_size=4)))
    expected = {"class": (torch.int64, (4,)), "multilabel": (torch.float32, (4, CLASSES)), "regression": (torch.float32, (4, VALUES))}
    assert (targets.dtype, tuple(targets.shape)) == expected[kind]


@pytest.mark.parametrize("kind", ["class", "multilabel", "regression"])
def test_toy_cnn_trains_on_each_kind_and_logs_its_metric(kind: str) -> None:
    pl.seed_everything(0)
    model = toy(kind)
    run = trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=2)
    run.fit(model, DataLoader(TinyDataset(kind), batch_size=2), DataLoader(TinyDataset(kind, seed=1), batch_size=2))
    assert run.global_step == 3
    logged = set(run.callback_metrics)
    metric = METRIC[kind]
    assert logged == {f"{stage}/{name}" for stage in ("train", "val") for name in ("loss", metric)}
    assert all(torch.isfinite(value) for value in run.callback_metrics.values())
    test = trainer().test(model, DataLoader(TinyDataset(kind, seed=2), batch_size=4), verbose=False)[0]
    assert set(test) == {"test/loss", f"test/{metric}"}


@pytest.mark.parametrize("kind", ["class", "multilabel", "regression"])
def test_epoch_metric_matches_the_whole_validation_set(kind: str) -> None:
    """The logged metric is of the epoch's samples together (for F1, not a mean of per-batch scores), computed as documented."""
    pl.seed_everything(0)
    model = toy(kind)
    data = TinyDataset(kind, count=10, seed=3)
    result = trainer().validate(model, DataLoader(data, batch_size=3), verbose=False)[0]  # batches of 3, 3, 3, 1
    model.eval()
    with torch.no_grad():
        outputs = model(data.images)
    if kind == "class":
        expected = (outputs.argmax(1) == torch.tensor(data.targets)).float().mean()
        loss = torch.nn.functional.cross_entropy(outputs, torch.tensor(data.targets))
    elif kind == "multilabel":
        targets = torch.stack(data.targets).bool()
        predicted = outputs > 0
        tp, fp, fn = (predicted & targets).sum(), (predicted & ~targets).sum(), (~predicted & targets).sum()
        expected = 2 * tp / (2 * tp + fp + fn)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(outputs, targets.float())
    else:
        targets = torch.stack(data.targets)
        expected = (outputs - targets).abs().mean()
        loss = torch.nn.functional.mse_loss(outputs, targets)
    assert result[f"val/{METRIC[kind]}"] == pytest.approx(float(expected), abs=1e-5)
    assert result["val/loss"] == pytest.approx(float(loss), rel=1e-4)


@pytest.mark.parametrize("kind", ["class", "multilabel", "regression"])
def test_toy_cnn_overfits_one_batch(kind: str) -> None:
    pl.seed_everything(0)
    model = ToyCNN(num_classes=CLASSES, width=8, lr=1e-2, weight_decay=0.0, target_kind=kind, num_outputs=OUTPUTS[kind])
    data = TinyDataset(kind, count=8, seed=4)
    overfit_one_batch(model, data)
    with torch.no_grad():
        outputs = model(data.images)
    if kind == "class":  # learnt the batch, not just lowered the loss
        assert (outputs.argmax(1) == torch.tensor(data.targets)).float().mean() >= 0.75
    elif kind == "multilabel":
        assert ((outputs > 0) == torch.stack(data.targets).bool()).float().mean() >= 0.75
    else:
        targets = torch.stack(data.targets)
        assert (outputs - targets).abs().mean() < (targets - targets.mean(0)).abs().mean()


@pytest.mark.parametrize("kind", ["class", "multilabel", "regression", "none"])
def test_noop_model_runs_on_each_kind(kind: str) -> None:
    model = NoOpModel(num_classes=CLASSES, target_kind=kind, num_outputs=OUTPUTS.get(kind, 0))
    before = model.w.detach().clone()
    data = TinyDataset(kind)
    run = trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    run.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
    assert run.global_step == 2 and torch.equal(model.w.detach(), before)
    assert model.hparams.target_kind == kind
    images, targets = next(iter(DataLoader(data, batch_size=4)))
    assert _images((images, targets)) is images
    assert _images({"image": images, "target": targets}) is images


def test_num_classes_alone_builds_the_classifier_as_before() -> None:
    model = ToyCNN(num_classes=3)
    assert model.target_kind == "class" and model.head.out_features == 3
    assert dict(model.hparams) == {"num_classes": 3, "width": 32, "lr": 3e-3, "weight_decay": 1e-4, "target_kind": "class",
                                   "num_outputs": None}
    assert not any("f1" in name for name in model.state_dict())
    assert NoOpModel(2).hparams.num_classes == 2


def test_checkpoint_of_each_kind_loads_back(tmp_path) -> None:
    for kind in ("class", "multilabel", "regression"):
        model = toy(kind)
        run = trainer(max_steps=1, limit_val_batches=0)
        run.fit(model, DataLoader(TinyDataset(kind), batch_size=4))
        path = tmp_path / f"{kind}.ckpt"
        run.save_checkpoint(path)
        loaded = ToyCNN.load_from_checkpoint(path)
        assert loaded.target_kind == kind and loaded.head.out_features == OUTPUTS[kind]
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True))


def test_old_checkpoint_hyperparameters_load_as_a_classifier(tmp_path) -> None:
    """A checkpoint saved before target kinds (hyperparameters without ``target_kind``/``num_outputs``) is still a classifier."""
    model = ToyCNN(num_classes=4, width=4)
    checkpoint = {"state_dict": model.state_dict(), "hyper_parameters": {"num_classes": 4, "width": 4, "lr": 3e-3, "weight_decay": 1e-4},
                  "pytorch-lightning_version": pl.__version__}
    torch.save(checkpoint, tmp_path / "old.ckpt")
    loaded = ToyCNN.load_from_checkpoint(tmp_path / "old.ckpt")
    assert loaded.target_kind == "class" and loaded.head.out_features == 4


def test_unlabelled_data_is_refused_with_the_fix() -> None:
    with pytest.raises(SourceError, match="no labels") as error:
        ToyCNN(num_classes=0, target_kind="none")
    assert "label column" in str(error.value) and "subfolder per class" in str(error.value)
    with pytest.raises(SourceError, match="no classes"):
        ToyCNN(num_classes=0)
    with pytest.raises(SourceError, match="no classes"):
        ToyCNN(target_kind="multilabel", num_outputs=0)
    with pytest.raises(OptionError, match="num_outputs=0"):
        ToyCNN(num_classes=3, target_kind="regression", num_outputs=0)


@pytest.mark.parametrize("model", [ToyCNN, NoOpModel])
def test_bad_target_kind_is_an_option_error_naming_it(model: type) -> None:
    with pytest.raises(OptionError, match="'multiclass'"):
        model(num_classes=3, target_kind="multiclass")


@pytest.mark.parametrize(("kind", "data_kind"), [("class", "multilabel"), ("multilabel", "class"), ("regression", "multilabel")])
def test_targets_of_another_kind_are_an_option_error(kind: str, data_kind: str) -> None:
    """A model built for other data fails on its first batch with the shapes, not with a silently wrong loss."""
    model = toy(kind)
    images, targets = next(iter(DataLoader(TinyDataset(data_kind), batch_size=4)))
    with pytest.raises(OptionError, match=f"target_kind='{kind}'.*shape"):
        model.training_step((images, targets), 0)
