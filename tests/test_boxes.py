"""The "boxes" target kind (object detection): stored typed, served as torchvision's detection targets, moved with the image.

The images encode their own coordinates (``boxkit.gradient``): a served box's corners are read back through the served
image's colours and compared with the source box's, so every geometry (the default letterbox transforms, reduced-size JPEG
decoding, ``resize=`` storage, loader workers) is checked against the pixels it produced.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import boxkit
import numpy as np
import pytest
import torch
from torchvision import tv_tensors

from lightning_lmdb.build.writer import build_lmdb
from lightning_lmdb.codec.decoders import reduced_from
from lightning_lmdb.datamodule.module import LMDBDataModule
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.read.raw import RawImageDataset
from lightning_lmdb.read.transforms import LetterboxResize, ResizedCrop, eval_transform, train_transform, whole_image
from lightning_lmdb.sources import base as sources
from lightning_lmdb.store.database import load_meta
from lightning_lmdb.targets import Boxes, BoxesKind, pad_collate, target_kind
from lightning_lmdb.tools.verify import describe_lmdb, verify_lmdb

#: How far (source pixels) a served corner may land from the source box's: within one pixel, with room enough that a box one
#: pixel off fails (measured: at most ~0.3 from a full decode, ~0.6 from a half-size JPEG decode; a box one pixel off, >= 0.85).
TOLERANCE = 0.75
SIZE = 32


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a Dataset without a version, fork with threads
        yield


@pytest.fixture
def boxjson_kind() -> Any:
    sources.register_source_kind(boxkit, before="manifest")
    yield boxkit
    sources.unregister_source_kind(boxkit)


def _build(tmp_path: Path, fmt: str = "png", **options: Any) -> Path:
    return build_lmdb(boxkit.Scenes(fmt), tmp_path / f"{fmt}.lmdb", workers=0, progress=False, manifest={"version": 1}, **options)


def _plain(target: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in target.items()}


def test_a_dataset_of_boxes_builds_typed_and_serves_torchvisions_targets(tmp_path: Path) -> None:
    path = _build(tmp_path)
    meta = load_meta(path)
    assert meta.target_kind == "boxes" and meta.version == 3 and meta.classes == boxkit.CLASSES
    assert meta.label_offsets.tolist() == [0, 2, 3, 6, 6] and meta.labels.tolist() == [0, 2, 1, 2, 0, 1]
    assert meta.target_arrays["boxes"].dtype == np.float32 and meta.target_arrays["boxes"].shape == (6, 4)
    assert meta.target_arrays["image_sizes"].tolist() == [[boxkit.H, boxkit.W]] * 4  # filled in from each image
    assert meta.target_arrays["image_ids"].tolist() == [100, 101, 102, 103]
    image, target = LMDBImageDataset(path)[2]
    assert image.size == (boxkit.W, boxkit.H)
    assert isinstance(target["boxes"], tv_tensors.BoundingBoxes) and target["boxes"].format == tv_tensors.BoundingBoxFormat.XYXY
    assert tuple(target["boxes"].canvas_size) == (boxkit.H, boxkit.W)
    assert target["labels"].dtype == torch.int64 and target["iscrowd"].dtype == torch.int64
    assert _plain(target) == {"boxes": boxkit.BOXES[2], "labels": boxkit.LABELS[2], "iscrowd": boxkit.CROWD[2], "image_id": 102}
    empty = LMDBImageDataset(path)[3][1]
    assert empty["boxes"].shape == (0, 4) and empty["labels"].shape == (0,)
    assert verify_lmdb(path).ok


def test_the_raw_backend_serves_the_same_samples_from_the_files(boxjson_kind: Any, tmp_path: Path) -> None:
    listing = boxkit.write_scenes(tmp_path / "scenes")
    path = build_lmdb(listing, tmp_path / "db.lmdb", workers=0, progress=False)
    raw = RawImageDataset.from_scan(sources.scan_source(listing))
    lmdb_ds = LMDBImageDataset(path)
    assert raw.classes == lmdb_ds.classes == boxkit.CLASSES and raw.target_kind == "boxes"
    for i in range(len(boxkit.BOXES)):
        assert _plain(raw[i][1]) == _plain(lmdb_ds[i][1])
    for transform in (whole_image(train_transform(SIZE)), whole_image(eval_transform(SIZE))):
        for ds in (raw.view(None, transform), lmdb_ds.view(None, transform)):
            for i in range(len(boxkit.BOXES)):
                image, target = ds[i]
                assert boxkit.corner_error(image, target["boxes"], boxkit.BOXES[i]) <= TOLERANCE


def test_verify_compares_every_box_with_its_source_and_info_counts_them(boxjson_kind: Any, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    listing = boxkit.write_scenes(tmp_path / "scenes")
    path = build_lmdb(listing, tmp_path / "db.lmdb", workers=0, progress=False)
    assert verify_lmdb(path, source=listing).ok
    info = describe_lmdb(path)["boxes"]
    assert info == {"total": 6, "per_image": {"min": 0, "median": 1.5, "max": 3}, "images_without_boxes": 1, "degenerate_dropped": 2,
                    "iscrowd": 2}
    from lightning_lmdb.tools.cli import main

    main(["info", str(path)])
    assert "'total': 6" in capsys.readouterr().out
    data = json.loads(listing.read_text())
    data["images"][1]["boxes"][0][2] += 1  # one box one pixel wider: relabelled since the build
    listing.write_text(json.dumps(data))
    report = verify_lmdb(path, source=listing)
    assert not report.ok and "record 1 (1.png): target" in " ".join(map(str, report.problems))


def _geometry_db(tmp_path: Path, case: str) -> tuple[Path, dict[str, Any]]:
    """A database of one geometry case and the dataset options that serve it."""
    if case == "png":
        return _build(tmp_path, "png", storage="auto"), {}
    if case == "jpeg-reduced":  # 80 x 64 JPEGs, decode_size 16: decoded at half size (a shorter side of at least 4 x 16)
        return _build(tmp_path, "jpeg", storage="encoded"), {"decode_size": SIZE // 2}
    assert case == "resize"  # stored with the shorter side 40 (5/8): the boxes stay in source pixels, scaled when served
    return _build(tmp_path, "png", storage="auto", resize=40), {}


_DECODED: list[Any] = []


class _Spy(LetterboxResize):
    """The letterbox, noting each decode it gets: ``(its reduction factor, its size)``."""

    def _drawn(self, image: Any) -> Any:
        reduced = reduced_from(image)
        _DECODED.append((1 if reduced is None else reduced.factor, image.size))
        return super()._drawn(image)


@pytest.mark.parametrize("case", ["png", "jpeg-reduced", "resize"])
@pytest.mark.parametrize("train", [True, False])
def test_every_served_corner_lands_on_its_source_pixels(tmp_path: Path, case: str, train: bool) -> None:
    torch.manual_seed(0)
    path, options = _geometry_db(tmp_path, case)
    default = train_transform(SIZE) if train else eval_transform(SIZE)
    ds = LMDBImageDataset(path, transform=whole_image(default), decoder="pil", **options)
    if case == "jpeg-reduced":
        spied = LMDBImageDataset(path, transform=_Spy(SIZE, train=train), decoder="pil", **options)
        spied[0]
        assert _DECODED[-1] == (2, (boxkit.W // 2, boxkit.H // 2)), "the JPEG was decoded at half size"
    if case == "resize":
        assert LMDBImageDataset(path)[0][0].size == (50, 40)
    flips = set()
    for _ in range(4 if train else 1):
        for i in range(len(boxkit.BOXES)):
            image, target = ds[i]
            assert image.shape == (3, SIZE, SIZE) and image.dtype == torch.uint8
            assert tuple(target["boxes"].canvas_size) == (SIZE, SIZE) and target["labels"].tolist() == boxkit.LABELS[i]
            assert boxkit.corner_error(image, target["boxes"], boxkit.BOXES[i]) <= TOLERANCE
            for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)) if boxkit.BOXES[i] else ():
                shifted = [[x1 + dx, y1 + dy, x2 + dx, y2 + dy] for x1, y1, x2, y2 in boxkit.BOXES[i]]
                assert boxkit.corner_error(image, target["boxes"], shifted) > TOLERANCE, "a box one pixel off must fail the check"
                flips.add(bool(target["boxes"][0, 0] > boxkit.BOXES[i][0][0] * SIZE / boxkit.W + 1))
    assert not train or flips == {True, False}, "training flips some samples and not others"


def _loader_error(tmp_path: Path, workers: int, context: str | None = None, case: str = "jpeg-reduced",
                  backend: str = "lmdb", decode_device: str | None = None) -> tuple[float, int]:
    """The largest corner error over a training and a validation epoch of a DataModule (its default transforms), and the
    samples seen."""
    torch.manual_seed(0)
    fmt = "png" if case != "jpeg-reduced" else "jpeg"
    data = LMDBDataModule(train_dir=boxkit.Scenes(fmt), val_dir=boxkit.Scenes(fmt), source_options={"version": 1}, backend=backend,
                          cache_dir=tmp_path / "cache", image_size=SIZE, batch_size=3, num_workers=workers,
                          multiprocessing_context=context, persistent_workers=False, decoder="pil",
                          storage="encoded" if fmt == "jpeg" else "auto", resize=40 if case == "resize" else None,
                          decode_size=SIZE // 2 if fmt == "jpeg" and decode_device is None else "auto", decode_device=decode_device)
    data.prepare_data()
    data.setup("fit")
    assert data.target_kind == "boxes" and data.classes == boxkit.CLASSES and data.num_classes == 3
    assert isinstance(data.datasets["train"].transform, LetterboxResize) and data.datasets["train"].transform.train
    assert isinstance(data.datasets["val"].transform, LetterboxResize) and not data.datasets["val"].transform.train
    worst, seen = 0.0, 0
    for loader in (data.train_dataloader(), data.val_dataloader()):
        for batch in loader:
            assert not decode_device or type(batch[0]).__name__ == "DeferredImages", "the JPEGs were left to the batched decode"
            images, targets = data.on_before_batch_transfer(batch, 0) if decode_device else batch
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIZE, SIZE) and isinstance(targets, list)
            for image, target in zip(images, targets, strict=True):
                i = target["image_id"] - 100
                assert target["labels"].tolist() == boxkit.LABELS[i]
                worst = max(worst, boxkit.corner_error(image, target["boxes"], boxkit.BOXES[i]))
                seen += 1
    return worst, seen


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("case", ["jpeg-reduced", "resize"])
def test_the_datamodules_loaders_serve_exact_boxes_with_and_without_workers(tmp_path: Path, workers: int, case: str) -> None:
    worst, seen = _loader_error(tmp_path, workers, "fork" if workers else None, case)
    assert seen == 2 * len(boxkit.BOXES) and worst <= TOLERANCE


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_the_batched_decode_moves_the_boxes_as_it_crops_the_images(tmp_path: Path, device: str) -> None:
    """``decode_device``: the workers ship JPEG bytes and each sample's letterbox parameters; the boxes are moved in the workers
    by the same parameters the batched decode then applies (on the CPU, and with nvJPEG where a GPU is lent)."""
    worst, seen = _loader_error(tmp_path, 0, None, "jpeg-reduced", decode_device=device)
    assert seen == 2 * len(boxkit.BOXES) and worst <= TOLERANCE


def test_the_raw_backend_of_a_dataset_serves_the_same_boxes(tmp_path: Path) -> None:
    worst, seen = _loader_error(tmp_path, 0, None, "png", backend="raw")
    assert seen == 2 * len(boxkit.BOXES) and worst <= TOLERANCE


@pytest.mark.slow
def test_spawned_workers_serve_exact_boxes(tmp_path: Path) -> None:
    worst, seen = _loader_error(tmp_path, 1, "spawn")
    assert seen == 2 * len(boxkit.BOXES) and worst <= TOLERANCE


def _target(boxes: list[list[float]], canvas: tuple[int, int] = (boxkit.H, boxkit.W)) -> dict[str, Any]:
    return {"boxes": tv_tensors.BoundingBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), format="XYXY", canvas_size=canvas),
            "labels": torch.arange(len(boxes)), "iscrowd": torch.tensor([0, 1, 0][: len(boxes)])}


def test_boxes_are_clipped_to_the_output_and_those_left_too_small_dropped_with_their_labels() -> None:
    crop = ResizedCrop(SIZE, train=True)
    params = (0, 0, 40, 40, 0)  # the top left 40 x 40 of the 80 x 64 image, resized to 32 x 32 (scale 0.8)
    out = BoxesKind().geometry(_target([[10, 5, 50, 20], [39.5, 5, 60, 20], [5, 35, 20, 60]]), crop, params, (boxkit.H, boxkit.W))
    # [10, 5, 50, 20] -> [8, 4, 40, 16] -> x clipped to 32; [39.5, ...] -> x from 31.6: 0.4 wide, dropped (with label 1 and its
    # crowd flag); [5, 35, 20, 60] -> [4, 28, 16, 48] -> y clipped to 32
    assert out["boxes"].tolist() == [[8.0, 4.0, 32.0, 16.0], [4.0, 28.0, 16.0, 32.0]]
    assert out["labels"].tolist() == [0, 2] and out["iscrowd"].tolist() == [0, 0] and tuple(out["boxes"].canvas_size) == (SIZE, SIZE)
    assert BoxesKind(min_size=0.1).geometry(_target([[39.5, 5, 60, 20]]), crop, params, (boxkit.H, boxkit.W))["labels"].tolist() == [0]


def test_a_flip_swaps_x1_and_x2() -> None:
    flip = LetterboxResize(SIZE, train=True, scale=(1.0, 1.0), hflip=1.0)
    params = flip.params(boxkit.H, boxkit.W)
    assert params == (0, 0, boxkit.H, boxkit.W, 1, boxkit.W) and flip.output_bounds(params) == (26, 32)
    out = BoxesKind().geometry(_target([[6, 5, 30, 40]]), flip, params, (boxkit.H, boxkit.W))
    # x scaled by 32 / 80: 2.4 .. 12, mirrored in the 32 wide picture: 20 .. 29.6 (x1 < x2 still); y by 26 / 64
    assert out["boxes"][0].tolist() == pytest.approx([20.0, 5 * 26 / 64, 29.6, 40 * 26 / 64])
    image = flip.apply(torch.from_numpy(np.asarray(boxkit.gradient())).permute(2, 0, 1).contiguous(), params)
    assert boxkit.corner_error(image, out["boxes"], [[6, 5, 30, 40]]) <= TOLERANCE
    assert int(image[:, 26:].sum()) == 0, "the padding below the picture is zero"


def test_a_resize_build_scales_the_boxes_to_the_stored_image() -> None:
    kind = target_kind("boxes")
    scaled = kind.at_size(_target([[8, 4, 40, 32]]), (40, 50))
    assert scaled["boxes"].tolist() == [[5.0, 2.5, 25.0, 20.0]] and tuple(scaled["boxes"].canvas_size) == (40, 50)


def test_a_batch_is_a_list_of_dicts_and_pad_collate_pads_it(tmp_path: Path) -> None:
    ds = LMDBImageDataset(_build(tmp_path), transform=LetterboxResize(SIZE, train=False))
    targets = target_kind("boxes").collate([ds[i][1] for i in range(4)])
    assert isinstance(targets, list) and [len(t["labels"]) for t in targets] == [2, 1, 3, 0]
    padded = pad_collate(targets)
    assert padded["boxes"].shape == (4, 3, 4) and padded["labels"].shape == (4, 3) and padded["mask"].shape == (4, 3)
    assert padded["mask"].sum(1).tolist() == [2, 1, 3, 0] and padded["labels"][1].tolist() == [1, -1, -1]
    assert padded["iscrowd"][2].tolist() == [0, 0, 1] and torch.equal(padded["boxes"][2], targets[2]["boxes"].as_subclass(torch.Tensor))
    assert pad_collate(targets, max_boxes=5)["boxes"].shape == (4, 5, 4) and pad_collate([])["boxes"].shape == (0, 1, 4)


def test_a_workers_batch_of_targets_arrives_by_value_as_the_same_dicts(tmp_path: Path) -> None:
    # a DataLoader worker pickles its batch with torch's reducers: the targets' tensors go by value, not one shared segment each
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reducers)

    ds = LMDBImageDataset(_build(tmp_path), transform=LetterboxResize(SIZE, train=False))
    sent = target_kind("boxes").collate([ds[i][1] for i in range(4)])
    sent[0]["image_id"] = 7
    data = ForkingPickler.dumps(sent)
    assert b"rebuild_storage" not in bytes(data)  # no tensor went by shared memory
    got = pickle.loads(data)
    assert type(got) is list and len(got) == 4 and got[0]["image_id"] == 7
    for a, b in zip(got, sent, strict=True):
        assert a.keys() == b.keys()
        assert type(a["boxes"]) is type(b["boxes"]) and tuple(a["boxes"].canvas_size) == tuple(b["boxes"].canvas_size)
        assert a["boxes"].format == b["boxes"].format and torch.equal(a["boxes"], b["boxes"]) and torch.equal(a["labels"], b["labels"])
        assert a["labels"].dtype == torch.int64 and torch.equal(a["iscrowd"], b["iscrowd"])


def test_a_bad_box_is_refused_naming_the_sample(tmp_path: Path) -> None:
    class Bad(boxkit.Scenes):
        def __getitem__(self, i: int) -> Any:
            image, target = super().__getitem__(i)
            return image, {**target, "boxes": [[30, 5, 6, 40]] + target["boxes"][1:]} if i == 1 else target

    with pytest.raises(Exception, match=r"Bad\[1\].*box 0 \[30.0, 5.0, 6.0, 40.0\], not x1 <= x2"):
        build_lmdb(Bad(), tmp_path / "bad.lmdb", workers=0, progress=False, manifest={"version": 1})
    assert not (tmp_path / "bad.lmdb").exists()
    with pytest.raises(ValueError, match="is not"):
        target_kind("boxes").hold({"labels": [1]})
    assert target_kind("boxes").hold(Boxes(((1, 2, 3, 4),), (0,))) == Boxes(((1, 2, 3, 4),), (0,))


def test_a_batch_gives_a_finite_loss_in_a_torchvision_detector(tmp_path: Path) -> None:
    """The DataModule's finish with mean 0 and std 1: float images in [0, 1], as torchvision's detectors take them (they
    normalise themselves); their labels count the background as 0, so the classes are shifted by one."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    data = LMDBDataModule(train_dir=boxkit.Scenes(), source_options={"version": 1}, cache_dir=tmp_path / "cache", image_size=64,
                          batch_size=4, num_workers=0, val_fraction=0, mean=(0, 0, 0), std=(1, 1, 1), shuffle=False)
    data.prepare_data()
    data.setup("fit")
    images, targets = data.finish(next(iter(data.train_dataloader())))
    assert images.dtype == torch.float32 and 0 <= float(images.min()) and float(images.max()) <= 1 and float(images.max()) > 0.5
    torch.manual_seed(0)
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=data.num_classes + 1,
                                                  min_size=64, max_size=64)
    model.train()
    losses = model(list(images), [{"boxes": t["boxes"], "labels": t["labels"] + 1} for t in targets])
    assert set(losses) >= {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"}
    assert all(torch.isfinite(v) for v in losses.values())


def test_a_sharded_build_joins_the_boxes_of_its_shards(boxjson_kind: Any, tmp_path: Path) -> None:
    listing = boxkit.write_scenes(tmp_path / "scenes")
    sharded = build_lmdb(listing, tmp_path / "sharded", workers=0, progress=False, shards=2)
    one = build_lmdb(listing, tmp_path / "one.lmdb", workers=0, progress=False)
    assert [_plain(LMDBImageDataset(sharded)[i][1]) for i in range(4)] == [_plain(LMDBImageDataset(one)[i][1]) for i in range(4)]
    assert describe_lmdb(sharded)["boxes"] == describe_lmdb(one)["boxes"] and verify_lmdb(sharded, source=listing).ok


def test_a_transforms_v2_pipeline_of_yours_gets_image_and_target_together(tmp_path: Path) -> None:
    from torchvision.transforms import v2

    mine = v2.Compose([v2.ToImage(), v2.RandomHorizontalFlip(p=1.0), v2.Resize((48, 60)), v2.SanitizeBoundingBoxes()])
    ds = LMDBImageDataset(_build(tmp_path), transform=mine)
    for i in range(3):
        image, target = ds[i]
        assert image.shape == (3, 48, 60) and target["labels"].tolist() == boxkit.LABELS[i]
        assert boxkit.corner_error(image, target["boxes"], boxkit.BOXES[i]) <= TOLERANCE
    normalised = whole_image(train_transform(SIZE, normalize=True))
    image, target = LMDBImageDataset(_build(tmp_path / "n"), transform=normalised)[0]
    assert isinstance(normalised.transforms[0], LetterboxResize) and image.dtype == torch.float32 and len(target["labels"]) == 2
