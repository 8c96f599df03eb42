"""Serving segmentation masks: ``(image, mask)`` samples and ``(images, masks)`` batches, transformed together.

The data: images of a few flat colour regions (each pixel takes the largest of a few smooth random fields, one per
colour of :data:`PALETTE`), each with its mask, the region ids :data:`IDS` -- one of them the ignore index, 255. So the
mask is a function of the image's pixels: :func:`ids_of` (the nearest palette colour's id). After any transform that
keeps image and mask aligned, that function still holds pixel for pixel away from region borders.

**Border width** (:data:`BORDER` = 2 output pixels): the image's antialiased bilinear resize blends both sides of a
region edge over about one output pixel either side when it shrinks (its triangle filter spans one output pixel each
way), over one input pixel when it enlarges (here at most ~1.3x: the smallest crops are about the output's size); the
mask's nearest-neighbour resize puts the edge within half an output pixel of the image's; a JPEG's ringing (a source
pixel or two) and a reduced-size decode's DCT scaling (one decoded pixel) are shrunk by the resize. So a pixel is
compared only when the ``(2 * BORDER + 1)``-square around it in the transformed mask is one region and lies inside the
output: what lies just beyond the crop is not in the mask, yet torchvision's own nearest-neighbour
(``InterpolationMode.NEAREST``, which takes the source pixel at an output pixel's top-left corner, up to half an output
pixel from its centre) reaches it in the image. A misaligned mask (a flip or crop not applied to it, a crop in the
wrong coordinates) fails on most interior pixels; an interpolated mask fails on the ids it invents.
"""

from __future__ import annotations

import csv
import dataclasses
from fractions import Fraction
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from lightning_lmdb import LMDBDataModule, build_lmdb
from lightning_lmdb.codec import decoders
from lightning_lmdb.errors import ImageDecodeError
from lightning_lmdb.read import transforms
from lightning_lmdb.read.batchdecode import DeferredImages
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.read.raw import RawImageDataset
from lightning_lmdb.read.transforms import ResizedCrop
from lightning_lmdb.sources import masks
from lightning_lmdb.sources.base import SourceOptions
from lightning_lmdb.store import database

#: The regions' colours (far apart) and their mask ids: the last is the ignore index.
PALETTE = np.array([(220, 40, 40), (40, 190, 40), (40, 40, 220), (220, 220, 40), (235, 235, 235)], dtype=np.int64)
IDS = np.array([0, 1, 2, 3, masks.DEFAULT_IGNORE_INDEX], dtype=np.int64)
#: Output pixels left out on each side of a region border (see the module docstring).
BORDER = 2


def field_regions(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """Region indices (into :data:`PALETTE`) of smooth random fields, one per colour: each pixel takes the largest -- blobs a
    few tens of pixels across with curved, asymmetric borders."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    fields = np.zeros((len(PALETTE), height, width))
    for field in fields:
        for _ in range(3):  # low-frequency waves: 0.5 to 1.5 periods across the image
            fy, fx = rng.uniform(-1.5, 1.5, 2) * 2 * np.pi / np.array([height, width])
            field += np.sin(fy * y + fx * x + rng.uniform(0, 2 * np.pi))
    return fields.argmax(0)


def ids_of(image: torch.Tensor, ids: np.ndarray = IDS) -> torch.Tensor:
    """The mask an image's pixels say: each pixel's nearest palette colour's id (``3 x H x W`` uint8 -> ``H x W`` int64)."""
    pixels = image.to(torch.int64).permute(1, 2, 0)[..., None, :]  # H x W x 1 x 3
    nearest = ((pixels - torch.from_numpy(PALETTE)) ** 2).sum(-1).argmin(-1)
    return torch.from_numpy(ids).long()[nearest]


def interior(mask: torch.Tensor, border: int) -> torch.Tensor:
    """Pixels whose ``(2 * border + 1)``-square neighbourhood holds one mask value and lies inside the image."""
    padded = torch.nn.functional.pad(mask[None, None].double(), (border,) * 4, value=-1.0)
    high = torch.nn.functional.max_pool2d(padded, 2 * border + 1, stride=1)
    low = -torch.nn.functional.max_pool2d(-padded, 2 * border + 1, stride=1)
    return (high == low)[0, 0]


def assert_aligned(image: torch.Tensor, mask: torch.Tensor, border: int = BORDER, least: float = 0.2, ids: np.ndarray = IDS) -> None:
    """The mask is int64 ``H x W`` of the image's size, holds only ``ids``, and equals :func:`ids_of` on the interior pixels
    (at least ``least`` of them: a check that compared nothing would pass)."""
    assert mask.dtype == torch.int64 and mask.shape == image.shape[-2:], (mask.dtype, mask.shape, image.shape)
    assert set(mask.unique().tolist()) <= set(ids.tolist()), f"invented ids: {sorted(set(mask.unique().tolist()) - set(ids.tolist()))}"
    inside = interior(mask, border)
    assert inside.float().mean() >= least, f"only {inside.float().mean():.0%} of the pixels are interior"
    wrong = (ids_of(image, ids) != mask) & inside
    assert not wrong.any(), f"{int(wrong.sum())} of {int(inside.sum())} interior pixels disagree"


def make_pairs(root: Path, count: int = 6, size: tuple[int, int] = (96, 128), fmt: str = "png", seed: int = 0,
               mask_mode: str = "L") -> Path:
    """``count`` generated image + mask pairs under ``root`` and a manifest ``pairs.csv`` (columns path, mask); returns it.

    Sizes vary (odd sides too) around ``size`` (height, width); ``mask_mode``: ``"L"`` or ``"P"`` (a palette PNG).
    """
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(exist_ok=True)
    rows = []
    for i in range(count):
        height, width = size[0] + int(rng.integers(0, 9)), size[1] + int(rng.integers(0, 9))
        regions = field_regions(height, width, rng)
        image = Image.fromarray(PALETTE[regions].astype(np.uint8))
        image_name = f"images/{i}.{fmt}"
        image.save(root / image_name, **({"quality": 95} if fmt == "jpg" else {}))
        mask = Image.fromarray(IDS[regions].astype(np.uint8), mode="L")
        if mask_mode == "P":
            mask = mask.convert("P")  # its indices are the grey values
        mask.save(root / f"masks/{i}.png")
        rows.append((image_name, f"masks/{i}.png"))
    manifest = root / "pairs.csv"
    with open(manifest, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "mask"])
        writer.writerows(rows)
    return manifest


@pytest.fixture
def pairs(tmp_path: Path) -> Path:
    return make_pairs(tmp_path / "seg")


# --- the transforms ------------------------------------------------------------------------------------------------------


def test_generated_pairs_hold_before_any_transform(pairs: Path) -> None:
    """The function holds on the files themselves, every pixel (no border): the test data is what the checks assume."""
    raw = RawImageDataset(pairs, decoder="opencv")
    assert raw.target_kind == "mask" and raw.ignore_index == masks.DEFAULT_IGNORE_INDEX
    for i in range(len(raw)):
        image, mask = raw[i]
        assert_aligned(image, mask, border=0, least=1.0)


@pytest.mark.parametrize("decoder", ["pil", "opencv"])
def test_train_transform_keeps_every_random_crop_and_flip_aligned(pairs: Path, decoder: str) -> None:
    raw = RawImageDataset(pairs, decoder=decoder)
    crop = transforms.train_transform(32)
    flips = 0
    for seed in range(30):
        torch.manual_seed(seed)
        view = raw.view(None, crop)
        for i in range(len(view)):
            image, mask = view[i]
            assert image.shape == (3, 32, 32) and image.dtype == torch.uint8
            assert_aligned(image, mask)
        torch.manual_seed(seed)
        flips += crop.params(100, 100)[4]
    assert 5 < flips < 25, "the flip is drawn: about half the seeds flip"


def test_a_flip_or_crop_left_off_the_mask_is_caught(pairs: Path) -> None:
    """The check has teeth: the right image with the mask flipped, or cropped elsewhere, fails it."""
    raw = RawImageDataset(pairs, decoder="opencv")
    image, values = raw._load(0)
    crop = ResizedCrop(32, train=True, hflip=0.0)
    params = (10, 20, 60, 80, 0)
    out = crop.apply(image, params)
    mask = crop.apply_mask(torch.from_numpy(values.astype(np.int64)), params)
    assert_aligned(out, mask)
    with pytest.raises(AssertionError, match="interior pixels disagree"):
        assert_aligned(out, mask.flip(-1))
    with pytest.raises(AssertionError, match="interior pixels disagree"):
        assert_aligned(out, crop.apply_mask(torch.from_numpy(values.astype(np.int64)), (0, 0, 60, 80, 0)))


def test_eval_transform_keeps_masks_aligned_and_normalize_passes_the_mask_through(pairs: Path) -> None:
    raw = RawImageDataset(pairs, decoder="pil")
    for i in range(len(raw)):
        image, mask = raw.view(None, transforms.eval_transform(32))[i]
        assert image.shape == (3, 32, 32)
        assert_aligned(image, mask)
        mean, std = torch.tensor(transforms.IMAGENET_MEAN).view(3, 1, 1), torch.tensor(transforms.IMAGENET_STD).view(3, 1, 1)
        floats, same = raw.view(None, transforms.eval_transform(32, normalize=True))[i]
        assert floats.dtype == torch.float32 and type(same) is torch.Tensor and torch.equal(same, mask)
        torch.testing.assert_close(((floats * std + mean) * 255).round().to(torch.uint8), image, atol=1, rtol=0)


@pytest.mark.parametrize("decoder", ["pil", "opencv"])
def test_a_users_v2_pipeline_gets_image_and_tv_tensors_mask(pairs: Path, decoder: str) -> None:
    seen = []

    def spy(image, mask):
        seen.append(type(mask))
        return image, mask

    pipeline = v2.Compose([v2.RandomResizedCrop(32, antialias=True), v2.RandomHorizontalFlip(), spy, v2.ToImage()])
    raw = RawImageDataset(pairs, pipeline, decoder=decoder)
    for seed in range(10):
        torch.manual_seed(seed)
        for i in range(len(raw)):
            image, mask = raw[i]
            assert type(mask) is torch.Tensor, "the dataset serves a plain tensor"
            assert_aligned(image.as_subclass(torch.Tensor), mask)
    assert set(seen) == {tv_tensors.Mask}


def test_a_transform_that_returns_no_pair_is_refused_with_the_fix(pairs: Path) -> None:
    raw = RawImageDataset(pairs, lambda image: image, decoder="opencv")  # a transform for images alone
    with pytest.raises(TypeError, match=r"takes and returns \(image, mask\)"):
        raw[0]


@pytest.fixture
def jpeg_pairs(tmp_path: Path) -> Path:
    """JPEG images of at least 264 x 350 pixels: with decode_size=32 they decode at 1/4 scale."""
    return make_pairs(tmp_path / "jpeg", count=4, size=(264, 350), fmt="jpg", seed=3)


@pytest.mark.parametrize("decoder", ["pil", "opencv"])
@pytest.mark.parametrize("train", [True, False])
def test_reduced_size_jpeg_decoding_keeps_the_full_size_mask_aligned(jpeg_pairs: Path, decoder: str, train: bool) -> None:
    crop = transforms.train_transform(32) if train else transforms.eval_transform(32, resize_ratio=1.0)
    raw = RawImageDataset(jpeg_pairs, crop, decoder=decoder, decode_size=crop.min_input_side)
    loaded = raw._load(0)
    reduced = decoders.reduced_from(loaded.image)
    assert reduced is not None and reduced.factor == 4, "the image is decoded at 1/4 scale"
    assert loaded.mask.shape == (reduced.height, reduced.width), "the mask stays at full size"
    for seed in range(20 if train else 1):
        torch.manual_seed(seed)
        for i in range(len(raw)):
            image, mask = raw[i]
            assert image.shape == (3, 32, 32)
            assert_aligned(image, mask)


def test_a_users_transform_gets_a_whole_decode_of_a_mask_sets_images(jpeg_pairs: Path) -> None:
    """Only the project's transforms know a reduced-size decode: another one gets the image whole, the size of its mask."""
    sizes = []

    def size_check(image, mask):
        sizes.append((tuple(image.shape[-2:]), tuple(mask.shape)))
        return image, mask

    raw = RawImageDataset(jpeg_pairs, size_check, decoder="opencv", decode_size=32)
    for i in range(len(raw)):
        raw[i]
    assert sizes and all(image == mask and image[0] >= 264 for image, mask in sizes)


# --- both backends, the loaders and the DataModule -----------------------------------------------------------------------


def test_the_database_and_the_files_serve_the_same_pairs(pairs: Path, tmp_path: Path) -> None:
    db = build_lmdb(pairs, tmp_path / "seg.lmdb", workers=0, progress=False)
    meta = database.load_meta(db, arrays=True)
    served = LMDBImageDataset(db, transforms.eval_transform(32), decoder="opencv")
    files = RawImageDataset.from_metadata(pairs.parent, meta, transforms.eval_transform(32), decoder="opencv")
    scanned = RawImageDataset(pairs, transforms.eval_transform(32), decoder="opencv")
    for dataset in (served, files, scanned):
        assert dataset.target_kind == "mask" and dataset.ignore_index == 255 and dataset.classes == ["0", "1", "2", "3"]
    assert served.targets == files.targets == scanned.targets, "each mask's classes, the ignore index left out"
    assert all(set(t) <= {0, 1, 2, 3} for t in served.targets) and any(len(t) == 4 for t in served.targets)
    stats = served.enable_loader_stats()
    for i in range(len(served)):
        image, mask = served[i]
        assert_aligned(image, mask)
        for other in (files, scanned):
            same_image, same_mask = other[i]
            assert torch.equal(image, same_image) and torch.equal(mask, same_mask)
    assert sum(p.samples for p in stats.processes()) == len(served), "loader statistics count the pairs served"
    blocks = LMDBImageDataset(db, transforms.eval_transform(32), decoder="opencv", readahead=False).read_blocks(True, 2)
    assert all(torch.equal(blocks[i][1], served[i][1]) for i in range(len(served))), "block reads serve the same masks"


def test_a_mask_file_no_longer_the_size_of_its_image_is_named(pairs: Path) -> None:
    raw = RawImageDataset(pairs, transforms.eval_transform(32), decoder="opencv")
    Image.new("L", (20, 10)).save(pairs.parent / "masks/2.png")
    with pytest.raises(ImageDecodeError, match=r"images/2\.png \(mask .*masks/2\.png\): its mask is 20x10 but its image is"):
        raw[2]


def test_target_transform_applies_to_the_transformed_mask(pairs: Path) -> None:
    raw = RawImageDataset(pairs, transforms.eval_transform(32), lambda mask: torch.where(mask == 255, -100, mask), decoder="opencv")
    image, mask = raw[0]
    plain = RawImageDataset(pairs, transforms.eval_transform(32), decoder="opencv")[0][1]
    assert (plain == 255).any() and torch.equal(mask, torch.where(plain == 255, -100, plain))


def test_sixteen_bit_masks_and_their_ignore_index_survive_the_transforms(tmp_path: Path) -> None:
    """uint16 mask values (beyond a byte) and a custom ignore_index: kept through the crop, and what an evaluation crop
    larger than its image pads the mask with."""
    rng = np.random.default_rng(5)
    ids = np.array([0, 300, 1000, 2000, 65535])
    (tmp_path / "images").mkdir()
    regions = field_regions(90, 120, rng)
    Image.fromarray(PALETTE[regions].astype(np.uint8)).save(tmp_path / "images/a.png")
    Image.fromarray(ids[regions].astype(np.uint16)).save(tmp_path / "images/a_mask.png")
    (tmp_path / "list.csv").write_text("path,mask\nimages/a.png,images/a_mask.png\n")
    options = SourceOptions(ignore_index=65535, num_classes=2001)
    raw = RawImageDataset(tmp_path / "list.csv", decoder="opencv", manifest=options)
    assert raw.ignore_index == 65535 and len(raw.classes) == 2001
    image, mask = raw[0]
    assert mask.dtype == torch.int64 and set(mask.unique().tolist()) == set(ids.tolist())
    torch.manual_seed(0)
    for _ in range(10):
        image, mask = raw.view(None, transforms.train_transform(32))[0]
        assert_aligned(image, mask, ids=ids)
    image, mask = raw.view(None, ResizedCrop(32, train=False, resize_ratio=0.5))[0]
    padded = (image == 0).all(0)
    assert padded.any() and (mask[padded] == 65535).all() and not (mask[~padded] == 65535).all()
    normalised = v2.Compose([ResizedCrop(32, train=False, resize_ratio=0.5), v2.ToDtype(torch.float32, scale=True)])
    floats, same = raw.view(None, normalised)[0]
    assert floats.dtype == torch.float32 and torch.equal(same, mask), "the defaults with normalize=True pad with it too"


def assert_batch_aligned(images: torch.Tensor, masks_: torch.Tensor, size: int) -> None:
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, size, size)
    assert masks_.dtype == torch.int64 and masks_.shape == (len(images), size, size)
    for image, mask in zip(images, masks_, strict=True):
        assert_aligned(image, mask)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_worker_processes_serve_aligned_batches(pairs: Path, tmp_path: Path, backend: str) -> None:
    """``(images, masks)`` batches through two DataLoader workers (each drawing its own crops), on both backends."""
    db = build_lmdb(pairs, tmp_path / "seg.lmdb", workers=0, progress=False)
    if backend == "lmdb":
        dataset = LMDBImageDataset(db, transforms.train_transform(32), decoder="auto")
    else:
        dataset = RawImageDataset.from_metadata(pairs.parent, database.load_meta(db, arrays=True), transforms.train_transform(32),
                                                decoder="auto")
    seen = 0
    for epoch in range(3):
        torch.manual_seed(epoch)
        for images, masks_ in DataLoader(dataset, batch_size=4, num_workers=2, shuffle=True):
            assert_batch_aligned(images, masks_, 32)
            seen += (masks_ == 255).any().item()
    assert seen, "the ignore value reaches the batches"


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_datamodule_serves_segmentation(pairs: Path, tmp_path: Path, backend: str) -> None:
    cache = tmp_path / "cache"
    dm = LMDBDataModule(pairs, backend=backend, cache_dir=cache, image_size=32, batch_size=3, num_workers=0, build_workers=0,
                        val_fraction=0.34)
    assert dm.target_kind == "mask" and dm.ignore_index == 255
    assert not cache.exists(), "the kind and the ignore index cost no build"
    assert dm.num_classes == 4 and dm.classes == ["0", "1", "2", "3"]
    assert cache.exists() == (backend == "lmdb"), "the LMDB backend builds to learn the classes; the raw backend reads the masks"
    dm.prepare_data()
    dm.setup("fit")
    assert dm.num_classes == 4 and dm.ignore_index == 255 and dm.target_kind == "mask"
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        for images, masks_ in loader:
            assert_batch_aligned(images, masks_, 32)
            floats, same = dm.finish((images, masks_))
            assert floats.dtype == torch.float32 and same is masks_, "the finish normalises the images only"


def test_datamodule_classes_from_the_options_cost_no_build(pairs: Path, tmp_path: Path) -> None:
    dm = LMDBDataModule(pairs, cache_dir=tmp_path / "cache", source_options={"num_classes": 6, "ignore_index": 254}, num_workers=0)
    assert dm.num_classes == 6 and dm.ignore_index == 254 and not (tmp_path / "cache").exists()


def test_other_kinds_have_no_ignore_index(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / "src" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "src" / name / "x.png")
    dm = LMDBDataModule(tmp_path / "src", cache_dir=tmp_path / "cache", num_workers=0)
    assert dm.target_kind == "class" and dm.ignore_index is None and RawImageDataset(tmp_path / "src").ignore_index is None


_CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])


@pytest.mark.parametrize("decode_device", ["cpu", _CUDA])
@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_decode_device_keeps_masks_aligned(jpeg_pairs: Path, tmp_path: Path, backend: str, decode_device: str) -> None:
    """The batched decode: workers draw each JPEG's crop and apply it to its mask; the batch's images, decoded and cropped
    later (nvJPEG on the GPU), line up with those masks."""
    dm = LMDBDataModule(jpeg_pairs, backend=backend, cache_dir=tmp_path / "cache", image_size=32, batch_size=2, num_workers=0,
                        build_workers=0, val_fraction=0.5, decode_device=decode_device)
    dm.prepare_data()
    dm.setup("fit")
    for epoch in range(8):  # 16 training crops: some flipped, all but surely
        torch.manual_seed(epoch)
        for loader in (dm.train_dataloader(), dm.val_dataloader()):
            for batch in loader:
                assert isinstance(batch[0], DeferredImages) and len(batch[0].deferred_at) == len(batch[0]), "the JPEGs are deferred"
                images, masks_ = dm.on_before_batch_transfer(batch, 0)
                assert images.device.type == decode_device
                assert_batch_aligned(images.cpu(), masks_, 32)


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_an_images_folder_with_masks_dir_serves_pairs(pairs: Path, tmp_path: Path, backend: str) -> None:
    """``source_options={"masks_dir": ...}`` (Hydra ``data.source_options.masks_dir``) pairs an image folder with its masks."""
    dm = LMDBDataModule(pairs.parent / "images", backend=backend, cache_dir=tmp_path / "cache", image_size=32, batch_size=6,
                        num_workers=0, build_workers=0, val_fraction=0, source_options={"masks_dir": str(pairs.parent / "masks")})
    assert dm.target_kind == "mask" and dm.num_classes == 4
    dm.prepare_data()
    dm.setup("fit")
    images, masks_ = next(iter(dm.train_dataloader()))
    assert len(images) == 6
    assert_batch_aligned(images, masks_, 32)


class _PixelProbe(pl.LightningModule):
    """A 1x1 convolution trained with per-pixel cross-entropy: records what each training batch is."""

    def __init__(self, num_classes: int, ignore_index: int):
        super().__init__()
        self.head = torch.nn.Conv2d(3, num_classes, 1)
        self.ignore_index = ignore_index
        self.seen: list[tuple[torch.dtype, tuple[int, ...], torch.dtype, tuple[int, ...]]] = []

    def training_step(self, batch, batch_idx):
        images, masks_ = batch
        self.seen.append((images.dtype, tuple(images.shape), masks_.dtype, tuple(masks_.shape)))
        return torch.nn.functional.cross_entropy(self.head(images), masks_, ignore_index=self.ignore_index)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("decode_device", [None, "cpu"])
def test_a_fit_gets_finished_images_and_int64_masks(jpeg_pairs: Path, tmp_path: Path, decode_device: str | None) -> None:
    dm = LMDBDataModule(jpeg_pairs, cache_dir=tmp_path / "cache", image_size=32, batch_size=2, num_workers=0, build_workers=0,
                        val_fraction=0, decode_device=decode_device)
    model = _PixelProbe(dm.num_classes, dm.ignore_index)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, datamodule=dm)
    assert model.seen == [(torch.float32, (2, 3, 32, 32), torch.int64, (2, 32, 32))] * 2


# --- exact geometry: images and masks that encode their own coordinates ------------------------------------------------------
#
# The checks above compare a mask with its image's colours away from region borders: a mask one source pixel off passes them.
# Here each image's pixel at (y, x) is red 2x, green 2y (so a resized image still says, to a quarter pixel, which source point
# each output pixel shows) and its mask's value is y * STRIDE + x (which source pixel each mask pixel came from). The crop each
# sample drew is recorded (:class:`RecordingCrop`), and every mask pixel must be exactly the source pixel under its output
# pixel's centre (:func:`nearest`, computed here from the geometry alone), every image pixel near that centre.

#: A coordinate mask's value at (y, x) is ``y * STRIDE + x`` (16-bit; every image narrower than STRIDE).
STRIDE = 128
#: Every value of a coordinate mask is a class id (none is the ignore index).
COORDINATES = SourceOptions(ignore_index=65535)


def make_coordinate_pairs(root: Path, sizes: list[tuple[int, int]], fmt: str = "png") -> Path:
    """Coordinate images (``fmt``; a JPEG at quality 100 without chroma subsampling) of ``sizes`` (height, width) and their
    coordinate masks (16-bit PNG) under ``root``, and a manifest ``pairs.csv``; returns it."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(exist_ok=True)
    rows = []
    for i, (height, width) in enumerate(sizes):
        assert width <= STRIDE and 2 * max(height, width) <= 256
        y, x = np.mgrid[0:height, 0:width]
        Image.fromarray(np.stack([2 * x, 2 * y, np.full_like(x, 128)], -1).astype(np.uint8)).save(
            root / f"images/{i}.{fmt}", **({"quality": 100, "subsampling": 0} if fmt == "jpg" else {}))
        Image.fromarray((y * STRIDE + x).astype(np.uint16)).save(root / f"masks/{i}.png")
        rows.append((f"images/{i}.{fmt}", f"masks/{i}.png"))
    manifest = root / "pairs.csv"
    with open(manifest, "w", newline="") as handle:
        csv.writer(handle).writerows([("path", "mask"), *rows])
    return manifest


@dataclasses.dataclass(frozen=True)
class RecordingCrop(ResizedCrop):
    """A :class:`ResizedCrop` that records every crop it draws (``(top, left, h, w, flip)``), in order."""

    drawn: list = dataclasses.field(default_factory=list, compare=False, repr=False)

    def params(self, height: int, width: int, align: int = 1) -> tuple[int, int, int, int, int]:
        drawn = super().params(height, width, align)
        self.drawn.append(drawn)
        return drawn


def nearest(start: int, length: int, out: int, resized: int, offset: int = 0) -> list[int]:
    """The source pixel under each of ``out`` output pixels' centres: ``[start, start + length)`` resized to ``resized`` pixels,
    output pixel ``r`` being resized pixel ``r + offset`` (a centre crop's), whose centre ``r + offset + 1/2`` lies at
    ``start + (r + offset + 1/2) * length / resized`` in the source (pixel ``i`` spans ``[i, i + 1)``)."""
    return [start + int((r + offset + Fraction(1, 2)) * Fraction(length, resized)) for r in range(out)]


def centres(start: int, length: int, out: int, resized: int, offset: int = 0) -> torch.Tensor:
    """The source point each output pixel's centre shows, in pixel-centre coordinates (pixel ``i``'s centre is ``i``): what a
    coordinate image's bilinear resize gives there, within its outer pixels' centres (beyond them it gives the outer pixel)."""
    points = (torch.arange(out, dtype=torch.float64) + offset + 0.5) * length / resized - 0.5 + start
    return points.clamp(start, start + length - 1)


def geometry(crop: ResizedCrop, params: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((resized height, resized width), (row offset, column offset))`` of ``crop`` with ``params``: the crop resized to
    ``size x size`` for training; for evaluation torchvision's ``Resize(min_input_side)`` (the shorter side to it, the longer
    ``int(side * long / short)``) and ``CenterCrop(size)`` (``round((n - size) / 2)`` pixels cut before)."""
    h, w = params[2], params[3]
    if crop.train:
        return (crop.size, crop.size), (0, 0)
    side = crop.min_input_side
    resized = (side, int(side * w / h)) if h <= w else (int(side * h / w), side)
    return resized, (round((resized[0] - crop.size) / 2), round((resized[1] - crop.size) / 2))


def assert_exact_geometry(image: torch.Tensor, mask: torch.Tensor, crop: ResizedCrop, params: tuple[int, ...],
                          tolerance: float = 1.0) -> None:
    """Every mask pixel is the source pixel under its output pixel's centre (exactly), and every image pixel shows that centre
    (within ``tolerance`` source pixels, a quarter of one on average: the resize's edges and rounding, a JPEG's error)."""
    top, left, h, w, flip = params
    (rh, rw), (oy, ox) = geometry(crop, params)
    size = crop.size
    rows, cols = torch.tensor(nearest(top, h, size, rh, oy)), torch.tensor(nearest(left, w, size, rw, ox))
    ys, xs = centres(top, h, size, rh, oy), centres(left, w, size, rw, ox)
    if flip:
        cols, xs = cols.flip(0), xs.flip(0)
    expected = rows[:, None] * STRIDE + cols[None, :]
    assert mask.dtype == torch.int64 and mask.shape == (size, size)
    wrong = mask != expected
    assert not wrong.any(), (f"{int(wrong.sum())} of {size * size} mask pixels are not the source pixel under their centre "
                             f"(crop {params}): rows {(mask // STRIDE)[:, 0].tolist()} vs {rows.tolist()}, "
                             f"columns {(mask % STRIDE)[0].tolist()} vs {cols.tolist()}")
    errors = torch.stack([image[1].double() / 2 - ys[:, None], image[0].double() / 2 - xs[None, :]])
    assert image.shape == (3, size, size) and errors.abs().max() <= tolerance and errors.abs().mean() <= 0.6 * tolerance, (
        f"the image shows other source points than its mask's (crop {params}): error up to {errors.abs().max():.2f}, "
        f"{errors.abs().mean():.2f} on average")


@pytest.fixture(scope="module")
def coordinate_sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``png``: four coordinate PNG pairs around 55 x 90 pixels (crops of them both shrink and enlarge to 24 pixels); ``jpg``:
    four coordinate JPEG pairs of at least 100 x 110 (decoded at 1/4 or 1/2 scale for a 12-pixel output). Each built too
    (``<name>.lmdb``)."""
    root = tmp_path_factory.mktemp("coordinates")
    rng = np.random.default_rng(7)
    sets = {"png": make_coordinate_pairs(root / "png", [(int(rng.integers(40, 70)), int(rng.integers(50, 128))) for _ in range(4)]),
            "jpg": make_coordinate_pairs(root / "jpg", [(int(rng.integers(100, 116)), int(rng.integers(110, 128))) for _ in range(4)],
                                         "jpg")}
    for name, manifest in list(sets.items()):
        sets[f"{name}.lmdb"] = build_lmdb(manifest, root / f"{name}.lmdb", workers=0, progress=False, manifest=COORDINATES)
    return sets


def coordinate_dataset(sets: dict[str, Path], name: str, backend: str, crop: ResizedCrop, **options) -> LMDBImageDataset | RawImageDataset:
    if backend == "lmdb":
        return LMDBImageDataset(sets[f"{name}.lmdb"], crop, **options)
    return RawImageDataset(sets[name], crop, manifest=COORDINATES, **options)


def test_coordinate_pairs_say_where_each_pixel_lies(coordinate_sets: dict[str, Path]) -> None:
    for name in ("png", "jpg"):
        for image, mask in RawImageDataset(coordinate_sets[name], decoder="opencv", manifest=COORDINATES):
            y, x = torch.meshgrid(torch.arange(image.shape[1]), torch.arange(image.shape[2]), indexing="ij")
            assert torch.equal(mask, y * STRIDE + x)
            assert (image[0].double() / 2 - x).abs().max() <= (0 if name == "png" else 1) and (image[1] - 2 * y).abs().max() <= 2


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_every_mask_pixel_is_the_source_pixel_under_its_centre(coordinate_sets: dict[str, Path], backend: str, train: bool) -> None:
    """The default transforms on whole decodes: the mask exactly, and the image torchvision's pixels of the same crop."""
    crop = RecordingCrop(24, train=train)
    dataset = coordinate_dataset(coordinate_sets, "png", backend, crop, decoder="opencv")
    whole = RawImageDataset(coordinate_sets["png"], decoder="opencv", manifest=COORDINATES)
    for seed in range(12 if train else 1):
        torch.manual_seed(seed)
        for i in range(len(dataset)):
            image, mask = dataset[i]
            params = crop.drawn[-1]
            assert_exact_geometry(image, mask, crop, params)
            top, left, h, w, flip = params
            source = whole[i][0]
            if train:
                reference = F.resized_crop(source, top, left, h, w, [24, 24], antialias=True)
                reference = reference.flip(-1) if flip else reference
            else:
                reference = F.center_crop(F.resize(source, crop.min_input_side, antialias=True), [24, 24])
            assert torch.equal(image, reference), f"not torchvision's pixels of crop {params}"
    flips = [p[4] for p in crop.drawn]
    assert not train or 0 < sum(flips) < len(flips), "both flipped and unflipped crops were checked"
    assert not train or len({p[2:4] for p in crop.drawn}) > 20 and min(p[3] for p in crop.drawn) < 24 < max(p[3] for p in crop.drawn), (
        "crops of many sizes, enlarged and shrunk")


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_a_reduced_size_decode_keeps_the_exact_geometry(coordinate_sets: dict[str, Path], backend: str, train: bool) -> None:
    """``decode_size``: the JPEG decoded at 1/4 (training) or 1/2 scale (evaluation), the crop drawn on the file's pixels and the
    mask cropped at full size. The image is within a decoded pixel's blur of the mask's points (a DCT-scaled decode averages
    ``factor x factor`` source pixels)."""
    crop = RecordingCrop(12, train=train)
    dataset = coordinate_dataset(coordinate_sets, "jpg", backend, crop, decoder="opencv", decode_size=crop.min_input_side)
    factor = decoders.reduced_from(dataset._load(dataset._row(0)).image).factor
    assert factor == (4 if train else 2)
    for seed in range(12 if train else 1):
        torch.manual_seed(seed)
        for i in range(len(dataset)):
            image, mask = dataset[i]
            top, left = crop.drawn[-1][:2]
            assert top % factor == 0 and left % factor == 0
            assert_exact_geometry(image, mask, crop, crop.drawn[-1], tolerance=0.5 + factor / 2)
    assert not train or 0 < sum(p[4] for p in crop.drawn) < len(crop.drawn)


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_the_batched_decode_keeps_the_exact_geometry(coordinate_sets: dict[str, Path], tmp_path: Path, backend: str) -> None:
    """``decode_device="cpu"``: the workers crop each mask by the crop they send with the JPEG; the batch's images, decoded and
    cropped later by those crops, show the masks' points."""
    dm = LMDBDataModule(coordinate_sets["jpg"], backend=backend, cache_dir=tmp_path / "cache", image_size=12, batch_size=2,
                        num_workers=0, build_workers=0, val_fraction=0.5, decode_device="cpu", source_options=COORDINATES)
    dm.prepare_data()
    dm.setup("fit")
    checked = []
    for epoch in range(6):
        torch.manual_seed(epoch)
        for loader, crop in ((dm.train_dataloader(), ResizedCrop(12)), (dm.val_dataloader(), ResizedCrop(12, train=False))):
            for batch in loader:
                deferred = batch[0]
                assert isinstance(deferred, DeferredImages) and len(deferred.deferred_at) == len(deferred)
                images, masks_ = dm.on_before_batch_transfer(batch, 0)
                for at, params in zip(deferred.deferred_at.tolist(), deferred.params.tolist(), strict=True):
                    assert_exact_geometry(images[at], masks_[at], crop, tuple(params), tolerance=1.5)
                    checked.append((crop.train, params[4]))
    assert {(True, 0), (True, 1), (False, 0)} <= set(checked)


def test_a_reduced_decode_as_many_pixels_wide_as_the_output_is_not_stretched() -> None:
    """A crop 45 source pixels wide at 1/4 scale touches 12 decoded pixels, the output's width: torch's resize copies a side of
    the output's size whatever the scale it is given, which stretched the 11.25 decoded pixels the crop spans over 12."""
    decoded = (8 * torch.arange(32) + 3).to(torch.uint8).expand(3, 24, 32).contiguous()  # red 2x at 1/4 scale: 2 * (4i + 1.5)
    out = ResizedCrop(12, hflip=0.0).apply(decoded, (0, 8, 90, 45, 0), factor=4)
    shown = out[0, 5].double() / 2
    assert (shown - centres(8, 45, 12, 12)).abs().max() <= 0.5, shown.tolist()
