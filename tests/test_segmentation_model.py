"""Segmentation on the experiment side: ToyCNN's fully convolutional variant (per-pixel loss without the ignored pixels, the epoch's
mean IoU), NoOpModel on mask batches, the segmentation demo (masks are the shapes drawn), and train.py's A/B on it."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import cv2
import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from PIL import Image
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset
from trainkit import overfit_one_batch, trainer

import lightning_lmdb.experiment.demo as demo
from lightning_lmdb.errors import OptionError, SourceError
from lightning_lmdb.experiment.demo import (
    IGNORE_INDEX,
    MARKER_NAME,
    SHAPE_COLOURS,
    SHAPES,
    make_demo_dataset,
    make_segmentation_demo,
    segmentation_sample,
)
from lightning_lmdb.experiment.toy_model import MeanIoU, NoOpModel, ToyCNN

ROOT = Path(__file__).resolve().parents[1]
CLASSES = 3
IGNORE = 255
COLOURS = torch.tensor([[0.9, 0.1, 0.1], [0.1, 0.9, 0.1], [0.1, 0.1, 0.9]])  # the colour of each class's blocks


class MaskDataset(Dataset):
    """``count`` images of 8 x 8 blocks, each block one class's colour plus noise; the mask holds the block's class, with about
    one pixel in ten, and a row and a column, set to ``IGNORE``. Images ``H x W`` need not be multiples of 8."""

    def __init__(self, count: int = 8, seed: int = 0, size: tuple[int, int] = (28, 36), all_ignored: tuple[int, ...] = ()):
        generator = torch.Generator().manual_seed(seed)
        h, w = size
        blocks = torch.randint(0, CLASSES, (count, (h + 7) // 8, (w + 7) // 8), generator=generator)
        self.masks = blocks.repeat_interleave(8, 1).repeat_interleave(8, 2)[:, :h, :w].contiguous()
        noise = 0.1 * torch.randn(count, 3, h, w, generator=generator)
        self.images = COLOURS[self.masks].permute(0, 3, 1, 2) + noise
        ignored = torch.rand(count, h, w, generator=generator) < 0.1
        ignored[:, h // 2, :] = True
        ignored[:, :, w // 3] = True
        self.masks[ignored] = IGNORE
        for index in all_ignored:
            self.masks[index] = IGNORE

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.masks[index]


def fcn(**kwargs) -> ToyCNN:
    options = {"num_classes": CLASSES, "width": 4, "target_kind": "mask", "num_outputs": CLASSES, "ignore_index": IGNORE, **kwargs}
    return ToyCNN(**options)


def hand_miou(predicted: np.ndarray, targets: np.ndarray, classes: int, ignore: int) -> float:
    """Mean IoU by its definition: over the classes with a union, pixels whose target is ``ignore`` left out."""
    valid = targets != ignore
    scores = []
    for c in range(classes):
        inter = np.sum((predicted == c) & (targets == c) & valid)
        union = np.sum(((predicted == c) | (targets == c)) & valid)
        if union:
            scores.append(inter / union)
    return float(np.mean(scores))


# --- the model -------------------------------------------------------------------------------------------------------------------


def test_fcn_outputs_a_logit_per_class_at_the_input_size() -> None:
    model = fcn().eval()
    for h, w in ((28, 36), (17, 9), (64, 64)):
        with torch.no_grad():
            assert model(torch.rand(2, 3, h, w)).shape == (2, CLASSES, h, w)
    assert isinstance(model.head, torch.nn.Conv2d) and model.head.out_channels == CLASSES
    assert not any(isinstance(m, torch.nn.AdaptiveAvgPool2d) for m in model.modules()), "no pooling: per-pixel outputs"


def test_fcn_trains_with_a_trainer_and_logs_loss_and_miou() -> None:
    pl.seed_everything(0)
    model = fcn()
    run = trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=2)
    run.fit(model, DataLoader(MaskDataset(), batch_size=2), DataLoader(MaskDataset(seed=1), batch_size=2))
    assert run.global_step == 3
    assert set(run.callback_metrics) == {"train/loss", "train/miou", "val/loss", "val/miou"}
    assert all(torch.isfinite(value) for value in run.callback_metrics.values())
    assert all(0 <= float(run.callback_metrics[f"{stage}/miou"]) <= 1 for stage in ("train", "val"))
    test = trainer().test(model, DataLoader(MaskDataset(seed=2), batch_size=4), verbose=False)[0]
    assert set(test) == {"test/loss", "test/miou"}


def test_fcn_overfits_one_batch_with_ignored_pixels() -> None:
    pl.seed_everything(0)
    model = fcn(width=8, lr=1e-2, weight_decay=0.0)
    data = MaskDataset(count=8, seed=4)
    overfit_one_batch(model, data)
    with torch.no_grad():
        predicted = model(data.images).argmax(1)
    labelled = data.masks != IGNORE
    assert (predicted[labelled] == data.masks[labelled]).float().mean() >= 0.75, "learnt the masks, not just lowered the loss"


def test_epoch_miou_and_loss_match_a_hand_computation_over_uneven_batches() -> None:
    """Batches of 3, 3, 3, 1 (the last sample all ignored): the mean IoU is of the epoch's summed intersections and unions,
    the loss the mean over the batches (weighted by their images) of each batch's mean over its labelled pixels."""
    pl.seed_everything(0)
    model = fcn()
    data = MaskDataset(count=10, seed=3, all_ignored=(9,))
    result = trainer().validate(model, DataLoader(data, batch_size=3), verbose=False)[0]
    model.eval()
    with torch.no_grad():
        logits = model(data.images)
    expected = hand_miou(logits.argmax(1).numpy(), data.masks.numpy(), CLASSES, IGNORE)
    batches = [(0, 3), (3, 6), (6, 9), (9, 10)]
    per_batch = []
    for start, stop in batches:
        labelled = data.masks[start:stop] != IGNORE
        if labelled.any():
            per_batch.append(float(F.cross_entropy(logits[start:stop], data.masks[start:stop], ignore_index=IGNORE)))
        else:
            per_batch.append(0.0)  # a batch with nothing labelled has a loss of 0, not nan
    loss = sum(value * (stop - start) for value, (start, stop) in zip(per_batch, batches)) / len(data)
    assert result["val/miou"] == pytest.approx(expected, abs=1e-6)
    assert result["val/loss"] == pytest.approx(loss, rel=1e-4)
    per_batch_mean = np.mean([hand_miou(logits[a:b].argmax(1).numpy(), data.masks[a:b].numpy(), CLASSES, IGNORE)
                              for a, b in batches[:3]])
    assert expected != pytest.approx(per_batch_mean, abs=1e-6), "the test tells the epoch's IoU from a mean of batch IoUs"


def test_mean_iou_by_hand_and_accumulated() -> None:
    targets = torch.tensor([[0, 1, 255], [1, 1, 2]])
    predicted = torch.tensor([[0, 1, 1], [2, 1, 2]])
    metric = MeanIoU(num_classes=4, ignore_index=255)
    metric.update(predicted, targets)
    # class 0: 1/1; class 1: (0,1),(1,1) of (0,1),(1,0),(1,1) = 2/3 (the ignored (0,2) counts in neither); class 2: 1/2;
    # class 3: absent from both, left out of the mean
    assert float(metric.compute()) == pytest.approx((1 + 2 / 3 + 1 / 2) / 3)
    metric.reset()
    metric.update(predicted[:1], targets[:1])
    metric.update(predicted[1:], targets[1:])
    assert float(metric.compute()) == pytest.approx((1 + 2 / 3 + 1 / 2) / 3), "summed over updates, not averaged"
    metric.reset()
    metric.update(torch.tensor([[3, 0]]), torch.tensor([[255, 255]]))
    assert torch.isnan(metric.compute()), "every pixel ignored: no class present"


def test_noop_model_runs_on_mask_batches() -> None:
    model = NoOpModel(num_classes=CLASSES, target_kind="mask", num_outputs=CLASSES, ignore_index=IGNORE)
    before = model.w.detach().clone()
    data = MaskDataset()
    run = trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    run.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
    assert run.global_step == 2 and torch.equal(model.w.detach(), before)
    assert model.hparams.target_kind == "mask" and model.hparams.ignore_index == IGNORE


def test_ignore_index_is_a_hyperparameter_of_mask_models_only(tmp_path: Path) -> None:
    assert "ignore_index" not in ToyCNN(num_classes=3).hparams, "a classifier's hyperparameters are as before"
    model = fcn(ignore_index=7)
    assert model.hparams.ignore_index == 7
    run = trainer(max_steps=1, limit_val_batches=0)
    data = MaskDataset()
    data.masks[data.masks == IGNORE] = 7
    run.fit(model, DataLoader(data, batch_size=4))
    run.save_checkpoint(tmp_path / "mask.ckpt")
    loaded = ToyCNN.load_from_checkpoint(tmp_path / "mask.ckpt")
    assert loaded.target_kind == "mask" and loaded.ignore_index == 7 and loaded.num_outputs == CLASSES
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True))


def test_mask_batches_that_do_not_fit_the_model_are_option_errors() -> None:
    images, masks = next(iter(DataLoader(MaskDataset(), batch_size=2)))
    with pytest.raises(OptionError, match=r"target_kind='mask'.*shape \[2\]"):
        fcn().training_step((images, torch.zeros(2, dtype=torch.int64)), 0)
    with pytest.raises(OptionError, match=r"target_kind='class'.*shape \[2, 28, 36\]"):
        ToyCNN(num_classes=CLASSES, width=4).training_step((images, masks), 0)
    masks[0, 0, 0] = 5
    with pytest.raises(OptionError, match=r"mask values \[5\].*ignore_index=datamodule.ignore_index"):
        fcn().training_step((images, masks), 0)
    with pytest.raises(SourceError, match="no classes"):
        fcn(num_classes=0, num_outputs=0)


def test_default_model_configs_take_what_train_py_passes_for_masks() -> None:
    """train.py calls ``instantiate(cfg.model, num_classes=C, target_kind="mask", num_outputs=C, ignore_index=...)``: the default
    model is then the fully convolutional one, with no ``model=`` override."""
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        default = compose("train", overrides=["model.width=4"])
        noop = compose("train", overrides=["model=noop"])
    typed = {"target_kind": "mask", "num_outputs": 4, "ignore_index": 255}
    model = instantiate(default.model, num_classes=4, **typed)
    assert isinstance(model, ToyCNN) and model.target_kind == "mask" and model.ignore_index == 255
    with torch.no_grad():
        assert model.eval()(torch.rand(1, 3, 20, 24)).shape == (1, 4, 20, 24)
    assert isinstance(instantiate(noop.model, num_classes=4, **typed), NoOpModel)


# --- the segmentation demo -------------------------------------------------------------------------------------------------------

SMALL = {"count": 12, "size": 48}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def seg_demo(tmp_path_factory) -> Path:
    return make_segmentation_demo(tmp_path_factory.mktemp("seg") / "data", **SMALL)


def _rows(manifest: Path) -> list[dict[str, str]]:
    with open(manifest, encoding="utf-8", newline="") as file:
        return list(csv.DictReader(file))


def test_demo_writes_images_masks_and_a_manifest(seg_demo: Path) -> None:
    root = seg_demo.parent
    assert seg_demo.name == "train.csv" and (root / MARKER_NAME).is_file()
    rows = _rows(seg_demo)
    assert len(rows) == SMALL["count"] and list(rows[0]) == ["path", "mask", "split"]
    assert {row["split"] for row in rows} == {"train", "val"}
    listed = {row["path"] for row in rows} | {row["mask"] for row in rows}
    on_disk = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} - {"train.csv", MARKER_NAME}
    assert listed == on_disk
    modes, formats = set(), set()
    for index, row in enumerate(rows):
        rgb, values = segmentation_sample(index, SMALL["size"])
        with Image.open(root / row["mask"]) as mask, Image.open(root / row["path"]) as image:
            assert mask.format == "PNG" and mask.mode in ("L", "P") and mask.size == image.size
            modes.add(mask.mode)
            formats.add(image.format)
            assert np.array_equal(np.asarray(mask), values), f"{row['mask']}: the index values, not the palette's colours"
            pixels = np.asarray(image.convert("RGB")).astype(np.int16)
        if image.format == "PNG":
            assert np.array_equal(pixels, rgb)
        else:  # JPEG drops most of the pixel noise: compare the local means
            blurred = [cv2.blur(a.astype(np.float32), (7, 7)) for a in (pixels, rgb)]
            assert np.abs(blurred[0] - blurred[1]).mean() < 3
    assert modes == {"L", "P"} and formats == {"PNG", "JPEG"}


def _check_shape(name: str, region: np.ndarray) -> None:
    """``region`` (cropped to its bounding box) is a square, a disc or an upward triangle, told apart by its symmetries."""
    full = bool(region.all())
    widths = region.sum(1)
    if name == "square":
        assert full
    elif name == "circle":
        assert not full and np.array_equal(region, region.T)
        assert np.array_equal(region, region[::-1]) and np.array_equal(region, region[:, ::-1])
    else:
        assert not full and np.array_equal(region, region[:, ::-1]) and not np.array_equal(region, region[::-1])
        assert np.all(np.diff(widths) >= 0) and widths[0] < widths[-1], "widening from the apex to the base"


def test_demo_masks_are_the_shapes_drawn_on_the_images(seg_demo: Path) -> None:
    """Re-read from the PNGs: each shape (a component of the non-background pixels) holds one shape id whose pixels have that
    shape's geometry and one of that shape's colours in the image; the ignore value lies only on the outlines of shapes."""
    root = seg_demo.parent
    counted = {name: 0 for name in SHAPES}
    bands = 0
    for row in _rows(seg_demo):
        values = np.asarray(Image.open(root / row["mask"]))
        assert set(np.unique(values)) <= {0, 1, 2, 3, IGNORE_INDEX}
        pixels = np.asarray(Image.open(root / row["path"]).convert("RGB")).astype(np.float64)
        count, labels = cv2.connectedComponents((values != 0).astype(np.uint8), connectivity=8)
        assert count >= 2, "every image has a shape"
        for component in range(1, count):
            inside = labels == component
            ids = set(np.unique(values[inside])) - {IGNORE_INDEX}
            assert len(ids) == 1, f"{row['mask']}: one shape per component, and no band on its own"
            shape = int(ids.pop())
            region = values == shape
            region &= inside
            ys, xs = np.nonzero(region)
            _check_shape(SHAPES[shape - 1], region[ys.min():ys.max() + 1, xs.min():xs.max() + 1])
            counted[SHAPES[shape - 1]] += 1
            if np.any(values[inside] == IGNORE_INDEX):
                bands += 1
                band = inside & (values == IGNORE_INDEX)
                near = cv2.dilate(region.astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool)  # within 4 pixels
                assert not np.any(band & ~near), "a thin band on the shape's outline (wider only at a triangle's apex)"
            if row["path"].endswith(".png"):  # lossless: the shape's pixels are one of its shape's colours plus the noise
                mean = pixels[region].mean(0)
                assert min(np.abs(mean - colour).max() for colour in SHAPE_COLOURS[shape - 1]) < 6, (row["path"], SHAPES[shape - 1], mean)
    assert all(counted.values()), counted
    assert bands, "some shapes have an ignored outline"


def test_demo_is_deterministic_and_idempotent(seg_demo: Path, tmp_path: Path, monkeypatch) -> None:
    root = seg_demo.parent
    again = make_segmentation_demo(tmp_path / "again", **SMALL)
    assert _files(again.parent) == _files(root)
    other = make_segmentation_demo(tmp_path / "other", **SMALL, seed=1)
    assert _files(other.parent).keys() == _files(root).keys() and _files(other.parent) != _files(root)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    monkeypatch.setattr(demo, "_generate_segmentation", lambda *a: pytest.fail("regenerated"))
    assert make_segmentation_demo(root, **SMALL) == seg_demo
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_demo_refuses_another_demo_and_bad_arguments(seg_demo: Path, tmp_path: Path) -> None:
    with pytest.raises(FileExistsError, match="HINT"):
        make_segmentation_demo(seg_demo.parent, count=13, size=48)
    classes = make_demo_dataset(tmp_path / "classes", num_classes=2, images_per_class=2)
    with pytest.raises(FileExistsError, match="made with"):
        make_segmentation_demo(classes, **SMALL)
    with pytest.raises(FileExistsError, match="made with"):
        make_demo_dataset(seg_demo.parent, num_classes=2, images_per_class=2)
    with pytest.raises(OptionError, match="count=0"):
        make_segmentation_demo(tmp_path / "x", count=0)
    with pytest.raises(OptionError, match="size=16"):
        make_segmentation_demo(tmp_path / "x", size=16)
    assert not (tmp_path / "x").exists()


def test_demo_command_line_prints_the_manifest(tmp_path: Path, capsys) -> None:
    demo.main(["--segmentation", str(tmp_path / "seg"), "--count", "3", "--size", "32"])
    printed = Path(capsys.readouterr().out.strip())
    assert printed == tmp_path / "seg" / "train.csv" and len(_rows(printed)) == 3
    with pytest.raises(SystemExit) as exit_:
        demo.main(["--segmentation", str(tmp_path / "bad"), "--count", "0"])
    assert exit_.value.code == 2 and "count=0" in capsys.readouterr().err


# --- train.py on the segmentation demo -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_train_py_trains_on_the_segmentation_demo_and_its_ab(tmp_path: Path) -> None:
    manifest = make_segmentation_demo(tmp_path / "seg", count=20, size=32)
    cmd = [sys.executable, "train.py", "-m", "data=raw,lmdb", f"data.train_dir={manifest}", f"data.cache_dir={tmp_path / 'cache'}",
           "trainer.max_epochs=1", f"paths.data_dir={tmp_path / 'demo'}", f"hydra.sweep.dir={tmp_path / 'runs'}", "data.image_size=32",
           "loader=debug", "data.build_workers=0", "trainer.enable_progress_bar=false", "model.width=8", "ab.repeats=1"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = sorted((tmp_path / "runs").rglob("perf_summary.json"))
    assert {json.loads(p.read_text())["backend"] for p in summaries} == {"raw", "lmdb"}, "both sides of the A/B ran and reported"
    assert {json.loads(p.read_text())["meta"]["model"] for p in summaries} == {"ToyCNN"}
    metrics = [p.read_text() for p in sorted((tmp_path / "runs").rglob("metrics.csv"))]
    assert len(metrics) == 2 and all("train/miou" in text and "val/miou" in text for text in metrics), "the segmentation model ran"
    assert not any("train/acc" in text for text in metrics)
    assert (tmp_path / "runs" / "comparison.txt").exists()
    assert not (tmp_path / "demo").exists(), "no classification demo generated"
