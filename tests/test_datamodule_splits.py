"""LMDBDataModule's splits as lightning-hydra-template uses them: the training split's classes map every split, a test share
carved from ``train_dir``, and loaders Lightning can rebuild (``overfit_batches``)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from imagegen import make_jpegs

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.read.sampler import ResumableDataLoader, ResumableSampler
from lightning_lmdb.read.transforms import eval_transform


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


# --- the training split's classes map every split (lightning-hydra-template: a test folder missing a class) ---

TRAIN_CLASSES = ("animals", "food", "places", "sky")


def _named_folder(root: Path, classes: tuple[str, ...], per_class: int = 3) -> Path:
    """``per_class`` tiny JPEGs in a folder per class, each image's first pixel saying its class (``40 * index in TRAIN_CLASSES``)."""
    from PIL import Image

    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (8, 8), (40 * TRAIN_CLASSES.index(name), 10 * i, 0)).save(root / name / f"{i}.png")
    return root


def as_tensor(image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


class TemplateModel(pl.LightningModule):
    """lightning-hydra-template's shape: the output size from ``dm.num_classes``; records the test targets it is given."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, num_classes)
        self.test_targets: list[int] = []
        self.test_colours: list[int] = []

    def training_step(self, batch, batch_idx):
        images, targets = batch
        return torch.nn.functional.cross_entropy(self.layer(images.float().flatten(1)), targets)

    def test_step(self, batch, batch_idx):
        images, targets = batch
        self.test_targets += targets.tolist()
        self.test_colours += images[:, 0, 0, 0].tolist()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_template_flow_maps_a_test_folder_missing_a_class_through_the_training_classes(tmp_path: Path, backend: str) -> None:
    train_dir = _named_folder(tmp_path / "train", TRAIN_CLASSES)
    test_dir = _named_folder(tmp_path / "test", ("animals", "places", "sky"))  # no "food": "places" is 1 in the folder alone
    transform = {"train_transform": as_tensor, "eval_transform": as_tensor}  # the pixels as they are: the first says the class
    dm = _module(train_dir, tmp_path, test_dir=test_dir, backend=backend, val_fraction=0, **transform)
    model = TemplateModel(dm.num_classes)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, datamodule=dm)
    trainer.test(model, datamodule=dm)  # the template's train.py: test after fit
    assert len(model.test_targets) == 9
    assert model.test_targets == [colour // 40 for colour in model.test_colours], "each test sample has training's target"
    assert sorted(set(model.test_targets)) == [0, 2, 3]
    test = dm.datasets["test"]
    assert test.targets == [TRAIN_CLASSES.index(Path(p).parent.name) for p in test.paths]
    assert (dm.classes, dm.num_classes) == (list(TRAIN_CLASSES), 4)
    assert test.classes == list(TRAIN_CLASSES) and test.class_to_idx == dm.class_to_idx
    if backend == "lmdb":  # the test database records the mapping, under a name of its own
        assert dm.database_path("test") != dm.database_path("test", dm.build_options)
        assert dm.database_path("test").exists() and not dm.database_path("test", dm.build_options).exists()
        from lightning_lmdb import LMDBImageDataset

        assert LMDBImageDataset(dm.database_path("test")).classes == list(TRAIN_CLASSES)

    evaluate = _module(train_dir, tmp_path, test_dir=test_dir, backend=backend, val_fraction=0, **transform)
    evaluate.prepare_data()
    evaluate.setup("test")  # the template's eval.py
    assert (evaluate.classes, evaluate.num_classes) == (list(TRAIN_CLASSES), 4)
    assert evaluate.datasets["test"].targets == test.targets
    evaluate.setup("fit")
    assert (evaluate.classes, evaluate.class_to_idx, evaluate.num_classes) == (list(TRAIN_CLASSES), dm.class_to_idx, 4)


def test_num_classes_after_setup_test_is_the_training_splits(tmp_path: Path) -> None:
    """Also where the test split keeps its own targets (a regression's names, here a flat test folder): training's count."""
    train_dir = _named_folder(tmp_path / "train", TRAIN_CLASSES, per_class=1)
    flat = tmp_path / "flat"
    flat.mkdir()
    for image in (tmp_path / "train" / "sky").iterdir():
        (flat / image.name).write_bytes(image.read_bytes())
    dm = _module(train_dir, tmp_path, test_dir=flat, backend="raw")
    dm.setup("test")
    assert dm.datasets["test"].classes == [] and (dm.num_classes, dm.target_kind) == (4, "class")


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_a_test_class_the_training_split_lacks_is_named(tmp_path: Path, backend: str) -> None:
    train_dir = _named_folder(tmp_path / "train", ("animals", "food", "places"), per_class=1)
    test_dir = _named_folder(tmp_path / "test", ("animals", "sky"), per_class=1)
    dm = _module(train_dir, tmp_path, test_dir=test_dir, backend=backend)
    lacks = r"test_dir '.*test' has the class\(es\) 'sky', which train_dir .* lacks.*source_options="
    with pytest.raises(ValueError, match=lacks) as raised:
        dm.prepare_data()
    from lightning_lmdb.errors import LightningLMDBError

    assert isinstance(raised.value, LightningLMDBError) and not (tmp_path / "cache").exists(), "refused before any build"
    same = _module(train_dir, tmp_path, val_dir=_named_folder(tmp_path / "val", ("animals", "food", "places"), per_class=1),
                   backend=backend)
    assert same.database_path("val") == same.database_path("val", same.build_options), "the same mapping: the same database"


def test_manifests_and_given_databases_are_mapped_or_refused(tmp_path: Path) -> None:
    from lightning_lmdb.build.writer import build_lmdb

    images = _named_folder(tmp_path / "images", TRAIN_CLASSES, per_class=1)
    rows = [(f"{name}/0.png", name) for name in TRAIN_CLASSES]
    (images / "train.csv").write_text("path,label\n" + "".join(f"{p},{label}\n" for p, label in rows))
    (images / "test.csv").write_text("path,label\n" + "".join(f"{p},{label}\n" for p, label in rows if label != "food"))
    dm = _module(images / "train.csv", tmp_path, test_dir=images / "test.csv", backend="raw", val_fraction=0)
    dm.setup("test")
    assert dm.datasets["test"].targets == [0, 2, 3] and dm.num_classes == 4
    database = build_lmdb(_named_folder(tmp_path / "test", ("animals", "places"), per_class=1), tmp_path / "test.lmdb", workers=0,
                          progress=False)
    given = _module(images / "train.csv", tmp_path, test_dir=database, val_fraction=0)
    with pytest.raises(ValueError, match=r"'places' is 1 there, 2 in training.*--classes animals,food,places,sky"):
        given.setup("test")

    class Folder(torch.utils.data.Dataset):  # e.g. torchvision's ImageFolder of the test folder: its targets index its own classes
        classes = ["animals", "places"]

        def __len__(self) -> int:
            return 2

        def __getitem__(self, i: int):
            from PIL import Image

            return Image.new("RGB", (8, 8)), i

    dataset = _module(images / "train.csv", tmp_path, test_dir=Folder(), val_fraction=0, backend="raw")
    with pytest.raises(ValueError, match=r"test_dir '<Dataset .*Folder of 2 samples>' gives its classes other targets.*'places' is 1"):
        dataset.setup("test")


def test_a_folder_scan_maps_its_class_folders_through_given_classes(tmp_path: Path) -> None:
    from lightning_lmdb.errors import SourceError
    from lightning_lmdb.sources.base import SourceOptions, labels_of, scan_source

    source = _named_folder(tmp_path / "test", ("animals", "places"), per_class=2)
    options = SourceOptions(classes=TRAIN_CLASSES)
    scan = scan_source(source, options)
    assert scan.classes == list(TRAIN_CLASSES) and [f.target for f in scan.files] == [0, 0, 2, 2]
    assert [f.relpath for f in scan.files] == [f.relpath for f in scan_source(source).files], "ImageFolder's order"
    assert scan.fingerprint() != scan_source(source).fingerprint(), "other targets, another fingerprint"
    assert labels_of(source, options).class_to_idx == {name: k for k, name in enumerate(TRAIN_CLASSES)}
    with pytest.raises(SourceError, match=r"class folder\(s\) 'places', which are not among the classes"):
        scan_source(source, SourceOptions(classes=("animals", "food")))
    with pytest.raises(SourceError, match="has none"):
        scan_source(source / "places", options)
