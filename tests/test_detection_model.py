"""The toy detector of ``train.py`` (``ToyCNN(target_kind="boxes")``): its loss, decoding and metric, and the detection demo."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from trainkit import _Losses, trainer

from lightning_lmdb.errors import OptionError
from lightning_lmdb.experiment import detection
from lightning_lmdb.experiment.demo import (
    DETECTION_ANNOTATIONS,
    DETECTION_CATEGORY_IDS,
    DETECTION_CLASSES,
    DETECTION_COLOURS,
    MARKER_NAME,
    detection_sample,
    make_detection_demo,
)
from lightning_lmdb.experiment.target_losses import target_loss

ROOT = Path(__file__).resolve().parents[1]
SIZE = 32
CLASSES = 3
COLOURS = ((230, 40, 40), (40, 220, 40), (40, 40, 230))


def toy(**kwargs):
    from lightning_lmdb.experiment.toy_model import ToyCNN

    return ToyCNN(num_classes=CLASSES, width=8, target_kind="boxes", num_outputs=CLASSES, **kwargs)


def target(boxes, labels, size: int = SIZE, **flags) -> dict:
    """One image's target as the ``boxes`` kind serves it."""
    found = {"boxes": tv_tensors.BoundingBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), format="XYXY",
                                               canvas_size=(size, size)),
             "labels": torch.tensor(labels, dtype=torch.int64)}
    found.update({name: torch.tensor(value, dtype=torch.uint8) for name, value in flags.items()})
    return found


class Squares(Dataset):
    """``count`` noisy images, each with one or two filled squares coloured by class, and their boxes."""

    def __init__(self, count: int = 8, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.items = []
        for _ in range(count):
            image = rng.integers(60, 140, size=(SIZE, SIZE, 3)).astype(np.float32)
            boxes, labels = [], []
            for left in rng.permutation([0, SIZE // 2])[: int(rng.integers(1, 3))]:
                side = int(rng.integers(8, 14))
                x, y = int(left) + int(rng.integers(0, SIZE // 2 - side + 1)), int(rng.integers(0, SIZE - side + 1))
                label = int(rng.integers(CLASSES))
                image[y:y + side, x:x + side] = COLOURS[label]
                boxes.append([x, y, x + side, y + side])
                labels.append(label)
            self.items.append((torch.from_numpy(image).permute(2, 0, 1) / 255, target(boxes, labels)))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


def collate(batch):
    return torch.stack([image for image, _ in batch]), [t for _, t in batch]


class Loader(DataLoader):
    def __init__(self, data: Dataset, **kwargs):
        super().__init__(data, collate_fn=collate, **kwargs)


# --- the loss -----------------------------------------------------------------------------------------------------------------


def test_outputs_are_heatmaps_size_and_offset_at_stride_4() -> None:
    assert toy()(torch.rand(2, 3, SIZE, SIZE)).shape == (2, CLASSES + 4, SIZE // 4, SIZE // 4)


def test_loss_is_finite_and_decreases_on_a_tiny_batch() -> None:
    torch.manual_seed(0)
    model = toy()
    images, targets = collate([Squares(4)[i] for i in range(4)])
    targets[3] = target([], [])  # an image without boxes (a negative)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = detection.detection_loss(model, model(images), targets, "train")
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_encode_puts_a_peak_at_each_box_centre_and_its_size() -> None:
    encoded = detection.encode([target([[4, 8, 12, 24]], [2])], CLASSES, (SIZE // 4, SIZE // 4))
    heatmap = encoded["heatmap"][0]
    assert heatmap[2, 4, 2] == 1 and heatmap[2].max() == 1 and heatmap[:2].max() == 0  # centre (8, 16) px: cell (x 2, y 4)
    assert int((heatmap == 1).sum()) == 1
    assert torch.allclose(encoded["size"], torch.tensor([[2.0, 4.0]]).log())  # 8 x 16 px: 2 x 4 cells
    assert torch.allclose(encoded["offset"], torch.zeros(1, 2))


@pytest.mark.parametrize("flag", ["iscrowd", "difficult"])
def test_crowd_and_difficult_boxes_are_left_out_of_the_loss(flag: str) -> None:
    torch.manual_seed(0)
    model = toy().eval()
    images = torch.rand(2, 3, SIZE, SIZE)
    kept = [[2, 2, 12, 12], [18, 18, 30, 28]]
    with torch.no_grad():
        outputs = model(images)

    def loss(first: dict) -> float:
        return detection.detection_loss(model, outputs, [first, target([[5, 5, 20, 20]], [1])], "train").item()

    without = loss(target(kept, [0, 1], **{flag: [0, 0]}))
    flagged = loss(target([*kept, [14, 0, 28, 10]], [0, 1, 2], **{flag: [0, 0, 1]}))
    moved = loss(target([*kept, [0, 20, 9, 31]], [0, 1, 0], **{flag: [0, 0, 1]}))
    counted = loss(target([*kept, [14, 0, 28, 10]], [0, 1, 2], **{flag: [0, 0, 0]}))
    assert flagged == pytest.approx(without, abs=1e-6) and moved == pytest.approx(without, abs=1e-6)
    assert counted != pytest.approx(without, abs=1e-3)  # the same box, not flagged, counts


def test_decode_turns_the_encoded_targets_back_into_the_boxes() -> None:
    boxes = [[4, 8, 12, 24], [17, 3, 30, 14]]
    encoded = detection.encode([target(boxes, [2, 0])], CLASSES, (SIZE // 4, SIZE // 4))
    outputs = torch.full((1, CLASSES + 4, SIZE // 4, SIZE // 4), -20.0)
    heat = encoded["heatmap"].clamp(1e-6, 1 - 1e-6)
    outputs[:, :CLASSES] = (heat / (1 - heat)).log()
    for size, offset, cy, cx in zip(encoded["size"], encoded["offset"], encoded["cy"], encoded["cx"]):
        outputs[0, CLASSES:CLASSES + 2, cy, cx] = size
        outputs[0, CLASSES + 2:, cy, cx] = (offset.clamp(1e-4, 1 - 1e-4) / (1 - offset.clamp(1e-4, 1 - 1e-4))).log()
    found = detection.decode(outputs, (SIZE, SIZE), k=2)[0]
    order = found["labels"].argsort(descending=True)
    assert found["labels"][order].tolist() == [2, 0]
    assert torch.allclose(found["boxes"][order], torch.tensor(boxes, dtype=torch.float32), atol=0.01)


# --- the metric ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["iscrowd", "difficult"])
def test_the_metric_ignores_crowd_and_difficult_boxes(flag: str) -> None:
    a, b = [2.0, 2.0, 12.0, 12.0], [16.0, 16.0, 30.0, 30.0]

    def map_50(truth: dict, boxes: list, scores: list) -> float:
        metric = detection.make_map()
        labels = torch.zeros(len(boxes), dtype=torch.int64)
        metric.update([{"boxes": torch.tensor(boxes).reshape(-1, 4), "scores": torch.tensor(scores), "labels": labels}],
                      detection.metric_targets([truth], "cpu"))
        return float(metric.compute()["map_50"])

    # B not found: no loss of recall when it is flagged; a miss otherwise
    assert map_50(target([a, b], [0, 0], **{flag: [0, 1]}), [a], [0.9]) == pytest.approx(1.0)
    assert map_50(target([a, b], [0, 0], **{flag: [0, 0]}), [a], [0.9]) < 0.6
    # B found, with the highest score: not a false positive when flagged; one when B is not an object at all
    assert map_50(target([a, b], [0, 0], **{flag: [0, 1]}), [b, a], [0.95, 0.5]) == pytest.approx(1.0)
    assert map_50(target([a], [0], **{flag: [0]}), [b, a], [0.95, 0.5]) < 0.6


def test_toy_cnn_trains_on_boxes_and_logs_map_per_validation_epoch() -> None:
    pl.seed_everything(0)
    model = toy()
    run = trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=2, num_sanity_val_steps=1)
    run.fit(model, Loader(Squares(8), batch_size=4, shuffle=True), Loader(Squares(8, seed=1), batch_size=4))
    metrics = run.callback_metrics
    assert {"train/loss", "val/loss", "val/map_50", "val/map"} <= set(metrics), sorted(metrics)
    assert "train/map_50" not in metrics and "train/map" not in metrics  # the costly metric runs in val and test only
    assert 0 <= float(metrics["val/map"]) <= float(metrics["val/map_50"]) <= 1
    assert not model.map["val_map"].update_count  # reset after each epoch's compute
    tested = run.test(model, Loader(Squares(4, seed=2), batch_size=4), verbose=False)[0]
    assert {"test/map_50", "test/map"} <= set(tested)


def test_toy_cnn_overfits_one_batch_of_boxes() -> None:
    pl.seed_everything(0)
    model = toy(lr=1e-2)
    data = Squares(4, seed=3)
    losses = _Losses()
    trainer(max_steps=40, callbacks=[losses], limit_val_batches=0).fit(model, Loader(data, batch_size=len(data)))
    assert len(losses.losses) == 40 and sum(losses.losses[-5:]) / 5 < 0.5 * losses.losses[0], losses.losses
    model.eval()
    images, targets = collate([data[i] for i in range(len(data))])
    with torch.no_grad():
        found = detection.decode(model(images), (SIZE, SIZE), k=1)
    from torchvision.ops import box_iou

    hits = 0
    for guess, truth in zip(found, targets):
        iou = box_iou(guess["boxes"], truth["boxes"].as_subclass(torch.Tensor))[0]
        hits += int(iou.max() > 0.5 and truth["labels"][iou.argmax()] == guess["labels"][0])
    assert hits >= 3, found


def test_targets_of_another_kind_are_refused_with_the_expected_form() -> None:
    model = toy()
    with pytest.raises(OptionError, match=r"target_kind='boxes'.*not a list of one \{\"boxes\""):
        model.training_step((torch.rand(2, 3, SIZE, SIZE), torch.tensor([0, 1])), 0)


def test_boxes_registers_its_own_head_and_epoch_metric() -> None:
    learned = target_loss("boxes")
    assert learned.head is detection.make_head and learned.epoch_metric is not None and learned.metric_stages == ("val", "test")
    assert target_loss("class").head is None and target_loss("class").metric_stages == ("train", "val", "test")


# --- the demo -----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return make_detection_demo(tmp_path_factory.mktemp("detection") / "demo", count=15, size=72, max_objects=4)


def _load(demo: Path, split: str) -> dict:
    return json.loads((demo / DETECTION_ANNOTATIONS[split]).read_text(encoding="utf-8"))


def test_demo_writes_valid_coco_json_per_split(demo: Path) -> None:
    files = {split: _load(demo, split) for split in DETECTION_ANNOTATIONS}
    assert [image["id"] for image in files["val"]["images"]] == [5, 10, 15]  # every fifth image
    assert len(files["train"]["images"]) == 12
    annotation_ids = []
    for coco in files.values():
        assert set(coco) == {"images", "annotations", "categories"}
        assert [(c["id"], c["name"]) for c in coco["categories"]] == list(zip(DETECTION_CATEGORY_IDS, DETECTION_CLASSES))
        images = {image["id"]: image for image in coco["images"]}
        assert len(images) == len(coco["images"])
        for image in coco["images"]:
            with Image.open(demo / image["file_name"]) as file:
                assert file.format == "JPEG" and file.mode == "RGB" and file.size == (image["width"], image["height"])
        for annotation in coco["annotations"]:
            annotation_ids.append(annotation["id"])
            image = images[annotation["image_id"]]
            x, y, w, h = annotation["bbox"]
            assert annotation["category_id"] in DETECTION_CATEGORY_IDS and annotation["iscrowd"] == 0
            assert w > 0 and h > 0 and x >= 0 and y >= 0 and x + w <= image["width"] and y + h <= image["height"], annotation
            assert 0 < annotation["area"] <= w * h
    assert sorted(annotation_ids) == list(range(1, len(annotation_ids) + 1))
    assert len(annotation_ids) >= 15 and (demo / MARKER_NAME).is_file()


def _near(pixels: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    return np.abs(pixels.astype(np.int32) - np.array(colour)).max(-1) < 60


def _ring(shape: tuple[int, ...], box: list[int], distance: int) -> np.ndarray:
    """The pixels ``distance`` pixels outside ``box`` (``[x, y, w, h]``)."""
    x, y, w, h = box
    ring = np.zeros(shape[:2], dtype=bool)
    ring[max(0, y - distance):y + h + distance, max(0, x - distance):x + w + distance] = True
    ring[max(0, y - distance + 1):y + h + distance - 1, max(0, x - distance + 1):x + w + distance - 1] = False
    return ring


def test_demo_boxes_are_the_tight_boxes_of_their_shapes(demo: Path) -> None:
    """In the JPEG, inside each box the pixels of its class's colour (and no other's) cover a shape's share, and 2 pixels
    outside there are none; in the image before encoding (which the JPEG is, test below) each edge line of the box has some
    and the line just outside none: a box shifted or grown by a pixel fails."""
    for split in DETECTION_ANNOTATIONS:
        coco = _load(demo, split)
        images = {image["id"]: image for image in coco["images"]}
        for annotation in coco["annotations"]:
            with Image.open(demo / images[annotation["image_id"]]["file_name"]) as file:
                pixels = np.asarray(file.convert("RGB"))
            raw, _ = detection_sample(annotation["image_id"] - 1, size=72, max_objects=4)
            colour = DETECTION_COLOURS[DETECTION_CATEGORY_IDS.index(annotation["category_id"])]
            x, y, w, h = annotation["bbox"]
            near, exact = _near(pixels, colour), _near(raw, colour)
            assert near[y:y + h, x:x + w].mean() > 0.4, annotation  # a triangle or a diamond covers half its box, a circle more
            assert not (near & _ring(near.shape, annotation["bbox"], 2)).any(), annotation
            others = [_near(pixels[y:y + h, x:x + w], c).mean() for c in DETECTION_COLOURS if c != colour]
            assert max(others) < 0.05, annotation  # the class's colour, not another's
            inside = exact[y:y + h, x:x + w]
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any(), annotation
            assert not (exact & _ring(exact.shape, annotation["bbox"], 1)).any(), annotation


def test_demo_is_deterministic_and_matches_its_samples(demo: Path, tmp_path: Path) -> None:
    again = make_detection_demo(tmp_path / "again", count=15, size=72, max_objects=4)
    for name in [*DETECTION_ANNOTATIONS.values(), "images/det_0003.jpg"]:
        assert (again / name).read_bytes() == (demo / name).read_bytes()
    assert make_detection_demo(demo, count=15, size=72, max_objects=4) == demo  # complete: reused
    raw, objects = detection_sample(0, size=72, max_objects=4)
    with Image.open(demo / "images/det_0000.jpg") as file:
        assert np.abs(np.asarray(file.convert("RGB")).astype(int) - raw).mean() < 10  # the JPEG of this sample (noise of 6 levels smoothed)
    first = [a for a in _load(demo, "train")["annotations"] if a["image_id"] == 1]
    assert [[x1, y1, x2 - x1, y2 - y1] for _, (x1, y1, x2, y2), _ in objects] == [a["bbox"] for a in first]
    with pytest.raises(FileExistsError):
        make_detection_demo(demo, count=16, size=72, max_objects=4)
    with pytest.raises(OptionError, match="size=32"):
        make_detection_demo(tmp_path / "small", size=32)


def test_train_points_the_data_at_the_detection_demo(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    sys.path.insert(0, str(ROOT))
    try:
        import train
    finally:
        sys.path.remove(str(ROOT))
    overrides = ["demo.kind=detection", "demo.detection.count=6", "demo.detection.size=64", f"paths.data_dir={tmp_path}"]
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    demo = train.use_demo(cfg)
    assert demo == tmp_path / "demo_detection" / "instances_train.json" and cfg.data.train_dir == str(demo)
    assert cfg.data.val_dir == str(tmp_path / "demo_detection" / "instances_val.json")
    assert cfg.data.source_options.root == str(tmp_path / "demo_detection")
    assert not (tmp_path / "demo").exists()


def test_a_missing_coco_backend_is_an_option_error_with_the_fix(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    absent = ("pycocotools", "faster_coco_eval")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in absent else real(name, *a))
    with pytest.raises(OptionError, match=r"needs pycocotools: pip install -e '\.\[train\]'"):
        toy()
