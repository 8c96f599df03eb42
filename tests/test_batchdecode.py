"""The lean default transforms (ResizedCrop) and the batched device decode, exercised on the CPU (and on a GPU when there is one)."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import cv2
import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from imagegen import JPEG_MAX_ERROR, JPEG_MEAN_ERROR, encode, make_image, photo, quadrants
from lightning.pytorch.trainer.connectors import data_connector
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from lightning_lmdb import LMDBDataModule, LMDBImageDataset, RawImageDataset, build_lmdb
from lightning_lmdb.codec.decoders import decode
from lightning_lmdb.read.batchdecode import Collate, Deferred, DeferredImages, defer
from lightning_lmdb.read.transforms import ResizedCrop, eval_transform, finish_batch, train_transform


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """JPEG photos (some grey, one CMYK, one EXIF-rotated) and PNGs in two classes, and their database."""
    root = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(0)
    exif = Image.Exif()
    exif[0x0112] = 3
    for i in range(16):
        folder = root / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        image = photo(rng, 90 + 7 * i, 70 + 3 * i)
        if i % 4 == 3:
            make_image("RGBA", image.size, rng).save(folder / f"{i:02d}.png")
        elif i == 5:
            image.convert("CMYK").save(folder / f"{i:02d}.jpg", quality=90)
        elif i == 6:
            image.save(folder / f"{i:02d}.jpg", quality=90, exif=exif.tobytes())
        else:
            (image.convert("L") if i == 2 else image).save(folder / f"{i:02d}.jpg", quality=90)
    source = root / "src"
    return source, build_lmdb(source, root / "db.lmdb", workers=0, progress=False)


def test_eval_crop_matches_resize_then_centre_crop() -> None:
    image = decode(encode(photo(np.random.default_rng(1), 300, 200), "JPEG", quality=95), "opencv")
    ours = eval_transform(64)(image).numpy().astype(np.int16)
    reference = v2.Compose([v2.Resize(73, antialias=True), v2.CenterCrop(64)])(image).numpy().astype(np.int16)
    assert ours.shape == (3, 64, 64)
    np.testing.assert_array_equal(ours, reference)


def test_train_crop_follows_random_resized_crop_and_the_seed() -> None:
    crop = train_transform(32)
    assert isinstance(crop, ResizedCrop) and crop.min_input_side == 32 and eval_transform(64).min_input_side == 73
    torch.manual_seed(0)
    params = [crop.params(100, 150) for _ in range(200)]
    for top, left, h, w, flip in params:
        assert 0 <= top and top + h <= 100 and 0 <= left and left + w <= 150 and flip in (0, 1)
        assert 0.08 * 15000 * 0.9 <= h * w <= 15000
    assert 0.3 < np.mean([p[4] for p in params]) < 0.7
    torch.manual_seed(0)
    assert [crop.params(100, 150) for _ in range(200)] == params
    image = torch.randint(0, 255, (3, 100, 150), dtype=torch.uint8)
    assert crop(image).shape == (3, 32, 32) and crop(image).dtype == torch.uint8
    assert train_transform(32, normalize=True)(image).dtype == torch.float32


def test_finish_batch_normalises_uint8() -> None:
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    expected = (images.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    torch.testing.assert_close(finish_batch(images, mean, std), expected)
    with pytest.raises(ValueError, match="uint8 N x 3 x H x W"):
        finish_batch(images.float())


def test_deferred_records_are_the_colour_and_grey_jpegs_only(mixed: tuple[Path, Path]) -> None:
    source, db = mixed
    crop = eval_transform(32)
    for dataset in (LMDBImageDataset(db, crop), RawImageDataset(source, crop)):
        dataset.set_decoding("auto", 36, defer_jpeg=True)
        kinds = {Path(p).name: isinstance(dataset[i][0], Deferred) for i, p in enumerate(dataset.paths)}
        assert kinds["05.jpg"] is False and kinds["06.jpg"] is False, "CMYK and EXIF-rotated JPEGs decode on the CPU"
        assert kinds["02.jpg"] is True and kinds["00.jpg"] is True and kinds["03.png"] is False
    with pytest.raises(ValueError, match="defer_jpeg=True needs a lightning_lmdb.read.transforms.ResizedCrop"):
        LMDBImageDataset(db, v2.ToImage()).set_decoding(defer_jpeg=True)


def opencv_crop(data: bytes, params: tuple[int, int, int, int, int], size: int) -> torch.Tensor:
    """The reference of one deferred sample, by other means: OpenCV's decode (BGR to RGB), a numpy slice, torchvision's resize, a flip."""
    rgb = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    top, left, h, w, flip = params
    crop = torch.from_numpy(np.ascontiguousarray(rgb[top : top + h, left : left + w])).permute(2, 0, 1)
    out = v2.functional.resize(crop, [size, size], antialias=True)
    return out.flip(-1) if flip else out


def test_a_mixed_batch_decodes_on_the_cpu_as_each_sample_would(mixed: tuple[Path, Path]) -> None:
    source, db = mixed
    crop = train_transform(32)
    dataset = LMDBImageDataset(db, crop).set_decoding("auto", None, defer_jpeg=True)
    torch.manual_seed(0)
    samples = [dataset[i] for i in range(len(dataset))]
    images, targets = Collate(crop)(samples)
    assert isinstance(images, DeferredImages) and len(images) == 16 and targets.tolist() == dataset.targets
    batch = images.pin_memory().decode("cpu") if torch.cuda.is_available() else images.decode("cpu")
    assert batch.shape == (16, 3, 32, 32) and batch.dtype == torch.uint8
    deferred = 0
    for i, (image, _) in enumerate(samples):
        if not isinstance(image, Deferred):  # decoded in the worker: placed as it is
            torch.testing.assert_close(batch[i], image, msg=f"sample {i}")
            continue
        deferred += 1
        data = (source / dataset.paths[i]).read_bytes()
        assert bytes(image.data.numpy()) == data, "the record's own bytes"
        with Image.open(io.BytesIO(data)) as img:  # the crop lies inside the image's real size (not only its parsed header's)
            width, height = img.size
        top, left, h, w, flip = image.params
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width and flip in (0, 1), (i, image.params)
        error = (batch[i].int() - opencv_crop(data, image.params, 32).int()).abs()
        assert error.float().mean() < JPEG_MEAN_ERROR and error.max() <= JPEG_MAX_ERROR, (i, error.float().mean(), error.max())
    assert deferred == 10, "the colour and grey JPEGs: 16 images less 4 PNGs, the CMYK and the EXIF-rotated one"
    assert Collate(crop)([(torch.zeros(3, 32, 32, dtype=torch.uint8), 1)] * 2)[0].shape == (2, 3, 32, 32), "plain batches: default"


#: Top left, top right, bottom left, bottom right colours of the :func:`quadrants` JPEG (96 x 64).
COLOURS = np.array([[200, 30, 30], [30, 200, 30], [30, 30, 200], [230, 230, 230]], dtype=np.uint8)


def quadrant_colours(params: tuple[int, int, int, int, int], size: int, width: int = 96, height: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Where each output pixel of a crop of the quadrants image samples from, worked out from the geometry alone.

    Returns:
        (the quadrant colour of each output pixel, ``size x size x 3``; whether it lies far enough from both edges
        between quadrants that neither the resize filter nor JPEG blends colours there).
    """
    top, left, h, w, flip = params
    ys = top + (np.arange(size) + 0.5) * h / size  # the source point each output row and column samples
    xs = left + (np.arange(size) + 0.5) * w / size
    if flip:
        xs = xs[::-1]
    quadrant = 2 * (ys[:, None] >= height / 2) + (xs[None, :] >= width / 2)
    margin = max(h / size, w / size, 1.0) + 2.0  # the resize filter's reach in source pixels, and JPEG's
    clear = (np.abs(ys - height / 2)[:, None] > margin) & (np.abs(xs - width / 2)[None, :] > margin)
    return COLOURS[quadrant], clear


def test_batched_decode_puts_each_crop_where_its_params_say() -> None:
    data = encode(Image.fromarray(quadrants(COLOURS)), "JPEG", quality=95)
    crop = train_transform(16)
    torch.manual_seed(0)
    params = [(0, 0, 32, 48, 0), (32, 48, 32, 48, 0), (0, 24, 32, 48, 0), (0, 24, 32, 48, 1), (16, 0, 32, 48, 0),
              *(crop.params(64, 96) for _ in range(8))]
    jpeg = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    samples: list[tuple[object, int]] = [(Deferred(jpeg, p), i) for i, p in enumerate(params)]
    black = torch.zeros(3, 16, 16, dtype=torch.uint8)
    samples.insert(2, (black, -1))  # decoded in a worker, between deferred ones
    batch = Collate(crop)(samples)[0].decode("cpu")
    assert batch.shape == (len(samples), 3, 16, 16)
    assert torch.equal(batch[2], black), "a worker-decoded image keeps its place"
    for i, (sample, _) in enumerate(samples):
        if i == 2:
            continue
        expected, clear = quadrant_colours(sample.params, 16)
        got = batch[i].permute(1, 2, 0).numpy().astype(np.int16)
        assert clear.sum() > 0, sample.params
        error = np.abs(got - expected)[clear]
        assert error.max() <= 8, (i, sample.params, error.max())


def test_defer_leaves_non_jpegs_and_bombs_to_the_cpu() -> None:
    crop = eval_transform(16)
    rng = np.random.default_rng(2)
    assert defer(encode(make_image("RGB", (40, 30), rng), "PNG"), crop) is None
    deferred = defer(encode(make_image("RGB", (40, 30), rng), "JPEG"), crop)
    assert deferred is not None and deferred.data.dtype == torch.uint8 and deferred.params == (0, 0, 30, 40, 0)


class _Probe(pl.LightningModule):
    """Records the batches its training step sees, and chains an after-transfer hook of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[torch.dtype, tuple[int, ...], float]] = []
        self.hooked = 0

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.hooked += 1
        assert batch[0].dtype == torch.float32, "the module's own hook sees the finished batch"
        return batch

    def training_step(self, batch, batch_idx):
        images, _ = batch
        self.seen.append((images.dtype, tuple(images.shape), float(images.mean())))
        return self.w.sum() * 0.0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.parametrize("decode_device", [None, "cpu"])
def test_fit_gets_finished_float_batches_and_the_modules_hook_is_chained(mixed: tuple[Path, Path], tmp_path: Path,
                                                                        decode_device: str | None) -> None:
    source, _ = mixed
    dm = LMDBDataModule(source, cache_dir=tmp_path, image_size=32, batch_size=4, num_workers=0, build_workers=0, val_fraction=0,
                        decode_device=decode_device)
    model = _Probe()
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    data_connector.warning_cache.clear()  # Lightning warns once per process: make this fit the first
    with warnings.catch_warnings(record=True) as caught:
        trainer.fit(model, datamodule=dm)
    assert not [w for w in caught if "in both" in str(w.message)], "both hooks run: Lightning's 'it will use' warning is wrong here"
    assert len(model.seen) == 4 and model.hooked == 4
    for dtype, shape, mean in model.seen:
        assert dtype == torch.float32 and shape == (4, 3, 32, 32) and -2.5 < mean < 2.5


def test_decode_device_cuda_is_refused_without_a_gpu_and_custom_transforms_are_refused(mixed: tuple[Path, Path], tmp_path: Path) -> None:
    source, _ = mixed
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="decode_device='cuda' needs a CUDA GPU"):
            LMDBDataModule(source, cache_dir=tmp_path, decode_device="cuda")
    with pytest.raises(ValueError, match="must be lightning_lmdb.read.transforms.ResizedCrop"):
        LMDBDataModule(source, cache_dir=tmp_path, decode_device="cpu", train_transform=v2.ToImage())
    with pytest.raises(ValueError, match="finish_on_device=True"):
        LMDBDataModule(source, cache_dir=tmp_path, decode_device="cpu", finish_on_device=False)


@pytest.mark.slow
def test_deferred_batches_through_worker_processes(mixed: tuple[Path, Path]) -> None:
    source, db = mixed
    crop = eval_transform(32)
    dataset = LMDBImageDataset(db, crop).set_decoding("auto", 36, defer_jpeg=True)
    reference = LMDBImageDataset(db, crop, decoder="pil")  # ImageFolder's decode: another library than the batched path's
    loader = DataLoader(dataset, batch_size=5, num_workers=1, collate_fn=Collate(crop), multiprocessing_context="spawn")
    batches = [images.decode("cpu") if isinstance(images, DeferredImages) else images for images, _ in loader]
    got = torch.cat(batches)
    for i in range(len(dataset)):
        if Path(dataset.paths[i]).name not in ("05.jpg", "06.jpg") and dataset.paths[i].endswith(".jpg"):  # not CMYK, EXIF
            diff = (got[i].int() - reference[i][0].int()).abs().float().mean()
            assert diff <= 1.0, (i, diff)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_batched_decode_matches_the_cpu(mixed: tuple[Path, Path]) -> None:
    _, db = mixed
    crop = train_transform(32)
    dataset = LMDBImageDataset(db, crop).set_decoding("auto", None, defer_jpeg=True)
    torch.manual_seed(0)
    images, _ = Collate(crop)([dataset[i] for i in range(len(dataset))])
    on_gpu, on_cpu = images.decode("cuda"), images.decode("cpu")
    assert on_gpu.device.type == "cuda"
    assert (on_gpu.cpu().int() - on_cpu.int()).abs().float().mean() <= 2.0, "nvJPEG vs libjpeg-turbo, resized on each device"
