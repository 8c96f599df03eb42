"""The DataModule's default fast path against ``ImageFolder`` at sizes where reduced-size JPEG decoding applies.

``LMDBDataModule`` with its defaults (``decoder="auto"``, ``decode_size="auto"``, the evaluation transform)
decodes a JPEG much larger than the transform needs at 1/2, 1/4 or 1/8 scale in the DCT domain, then resizes
(:mod:`lightning_lmdb.codec.decoders`). ``ImageFolder`` decodes every pixel with PIL and resizes from there. The
other tests use images of at most 48 px, where no reduction applies; here the images are 256 to 640 px.

**Tolerance.** A PNG takes the same route in both (a full decode, then an antialiased bilinear resize: torch's
``uint8`` kernel against PIL's), so it must match to 1 level (of 255), their rounding. A reduced JPEG passes
through a different low-pass filter (the scaled IDCT, then a resize of at least 2x) than a full decode plus one
resize: on these photo-like images (smooth noise at three scales plus fine grain, ``imagegen.photo``) the
difference measured a mean of 0.2 to 0.6 per image, a 99th percentile of 1 to 2 levels and a maximum of 3. The
bounds -- a mean of at most 1.2 per image (the figure the decoders' docstring states for this path) and a 99th
percentile of at most 4 (twice what was measured, for other libjpeg builds) -- do not admit a misplaced image (a
shift by one output pixel gives a mean of 8 to 20 here, a stretch by 3 source pixels 3.8: see the last tests).
Subtler errors, such as a reduction without the 2x margin (a mean of up to 1.6 here), are caught by checking the
decoded sizes against the documented scale rule: the test spies on every decode.

The sides of the JPEGs are multiples of 8: for other sizes, and for the training crop, see the tests at the end.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from imagegen import photo
from torchvision import transforms as T
from torchvision.datasets import ImageFolder

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.codec import decoders
from lightning_lmdb.codec import storage as codec
from lightning_lmdb.codec.imageinfo import read_info
from lightning_lmdb.read.transforms import eval_transform, train_transform

#: (class, file, (width, height), PIL mode): JPEGs from 256 px up, portrait and landscape, one grey; two PNGs.
FILES = [
    ("bird", "a.jpg", (512, 384), "RGB"),
    ("bird", "b.jpg", (256, 256), "RGB"),
    ("bird", "c.png", (320, 288), "RGB"),
    ("cat", "d.jpg", (384, 512), "RGB"),
    ("cat", "e.jpg", (640, 480), "RGB"),
    ("cat", "f.jpg", (448, 320), "L"),
    ("dog", "g.jpg", (576, 448), "RGB"),
    ("dog", "h.png", (264, 296), "RGB"),
]
MAX_MEAN_DIFF = 1.2  # per JPEG, of 255 (see the module docstring)
MAX_P99_DIFF = 4  # over the JPEGs' pixels


def _make_folder(root: Path, files: list[tuple[str, str, tuple[int, int], str]], seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for class_name, name, (width, height), mode in files:
        path = root / class_name / name
        path.parent.mkdir(parents=True, exist_ok=True)
        image = photo(rng, width, height).convert(mode)
        image.save(path, **({"quality": 90} if path.suffix == ".jpg" else {}))
    return root


def _expected_reduction(width: int, height: int, jpeg: bool, side: int) -> int:
    """The documented scale: the largest k of 8, 4, 2 with the shorter side at least 2 * k * side, for a JPEG."""
    return next((k for k in (8, 4, 2) if jpeg and min(width, height) >= 2 * k * side), 1)


def _spy_on_decodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[int, int], tuple[int, ...]]]:
    """Record ``((height, width) in the file, decoded shape)`` of every record the datasets decode, in order."""
    calls: list[tuple[tuple[int, int], tuple[int, ...]]] = []
    decode: Callable[..., Any] = codec.decode

    def spy(data: Any, *args: Any, **kwargs: Any) -> Any:
        image = decode(data, *args, **kwargs)
        info = read_info(data)
        calls.append(((info.height, info.width), tuple(image.shape)))
        return image

    monkeypatch.setattr(codec, "decode", spy)
    return calls


def _served(root: Path, cache: Path, image_size: int) -> tuple[LMDBDataModule, torch.Tensor, torch.Tensor]:
    """The test split of a default ``LMDBDataModule`` over ``root``: (module, uint8 images, targets) in order."""
    dm = LMDBDataModule(test_dir=root, cache_dir=cache, image_size=image_size, batch_size=3, num_workers=0, build_workers=0)
    dm.prepare_data()
    dm.setup("test")
    images, targets = zip(*dm.test_dataloader(), strict=True)
    return dm, torch.cat(images), torch.cat(targets)


def _image_folder(root: Path, image_size: int) -> tuple[ImageFolder, torch.Tensor]:
    """``ImageFolder`` with the classic evaluation pipeline in PIL: ``Resize(size * 256 / 224)``, ``CenterCrop(size)``."""
    reference = ImageFolder(str(root), transform=T.Compose([T.Resize(round(image_size * 256 / 224)), T.CenterCrop(image_size),
                                                            T.PILToTensor()]))
    return reference, torch.stack([reference[i][0] for i in range(len(reference))])


def _diffs(ours: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    return (ours.to(torch.int16) - theirs.to(torch.int16)).abs().float()


@pytest.mark.parametrize("image_size", [16, 32, 64])  # the evaluation resize's side: 18, 37, 73 px; JPEGs reduced by 8, 4 and 2
def test_default_fast_path_matches_image_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, image_size: int) -> None:
    root = _make_folder(tmp_path / "src", FILES)
    decodes = _spy_on_decodes(monkeypatch)
    dm, images, targets = _served(root, tmp_path / "cache", image_size)
    reference, expected = _image_folder(root, image_size)

    assert dm.classes == reference.classes and dm.class_to_idx == reference.class_to_idx
    assert dm.datasets["test"].paths == [str(Path(path).relative_to(root).as_posix()) for path, _ in reference.samples]
    assert targets.tolist() == reference.targets
    assert images.dtype == torch.uint8 and images.shape == expected.shape == (len(FILES), 3, image_size, image_size)

    # reduced-size decoding ran, at the documented scale: a fast path silently off (or mis-scaled) fails here
    side = round(image_size * 256 / 224)
    jpegs = [f for f in sorted(FILES) if f[1].endswith(".jpg")]  # the default storage keeps the PNGs as zstd pixels
    assert len(decodes) == len(jpegs), "every JPEG is decoded once, through codec.decode"
    reductions = []
    for (_, name, _, _), ((height, width), shape) in zip(jpegs, decodes, strict=True):
        k = _expected_reduction(width, height, name.endswith(".jpg"), side)
        assert shape == (3, math.ceil(height / k), math.ceil(width / k)), f"{name}: decoded {shape}, expected 1/{k} of {height}x{width}"
        reductions.append(k)
    assert max(reductions) > 1, "no JPEG was decoded at reduced size"

    diffs = _diffs(images, expected)
    for i, (_, name, _, _) in enumerate(sorted(FILES)):
        if name.endswith(".png"):  # decoded whole by both: only the resize kernels' rounding differs
            assert diffs[i].max() <= 1, f"{name}: max diff {diffs[i].max():.0f}"
        else:
            assert diffs[i].mean() <= MAX_MEAN_DIFF, f"{name} (1/{reductions[i]} scale): mean diff {diffs[i].mean():.2f}"
    jpegs = torch.stack([diffs[i] for i, (_, name, _, _) in enumerate(sorted(FILES)) if name.endswith(".jpg")])
    assert torch.quantile(jpegs.flatten(), 0.99) <= MAX_P99_DIFF


def test_decode_size_none_is_image_folder_to_the_rounding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: with ``decode_size=None`` every JPEG is decoded whole and the pixels match to 1 level (resize rounding)."""
    root = _make_folder(tmp_path / "src", FILES)
    decodes = _spy_on_decodes(monkeypatch)
    dm = LMDBDataModule(test_dir=root, cache_dir=tmp_path / "cache", image_size=32, batch_size=3, num_workers=0, build_workers=0,
                        decode_size=None)
    dm.prepare_data()
    dm.setup("test")
    images = torch.cat([batch[0] for batch in dm.test_dataloader()])
    assert [shape[1:] for _, shape in decodes] == [size for size, _ in decodes], "decoded whole"
    assert _diffs(images, _image_folder(root, 32)[1]).max() <= 1


def test_fast_path_of_a_jpeg_whose_sides_are_not_multiples_of_the_scale(tmp_path: Path) -> None:
    """333 x 301 at 1/4 scale decodes to 84 x 76 pixels that cover 336 x 304 (the last block's padding included).

    Resizing all of them as the whole picture stretched the image by up to 3 source pixels: a mean difference from
    ``ImageFolder`` of 3.8 (of 255) instead of the 0.5 of a 332 x 300 JPEG. The resize now maps onto the exact
    83.25 x 75.25 decoded pixels the picture spans.
    """
    root = _make_folder(tmp_path / "src", [("only", "odd.jpg", (333, 301), "RGB"), ("only", "even.jpg", (332, 300), "RGB")])
    _, images, _ = _served(root, tmp_path / "cache", 32)
    even, odd = _diffs(images, _image_folder(root, 32)[1]).flatten(1).mean(1).tolist()  # sorted by name: even, odd
    assert even <= MAX_MEAN_DIFF, "the control: sides that are multiples of 4"
    assert odd <= MAX_MEAN_DIFF, f"mean diff {odd:.2f}"


@pytest.mark.parametrize("decoder", ["opencv", "pil"])  # OpenCV's IMREAD_REDUCED_4 and PIL's draft(): the same pixels, the same geometry
@pytest.mark.parametrize(("width", "height"), [(333, 301), (301, 334)])
def test_crops_of_a_reduced_decode_are_the_crops_of_the_full_decode(decoder: str, width: int, height: int) -> None:
    """The transforms of a JPEG decoded at 1/4 scale give the crops of its full decode, to the bound.

    A random crop is drawn on the image in the file, its corner moved onto the decode's pixel grid
    (``params(..., align=4)``: at most 3 pixels up and left, its size kept), and mapped onto the decode at its
    exact scale. Drawn on the decode instead, with its size in decoded pixels, it was another crop, and one
    reaching the last row or column was stretched by the padding. Crops of at least half the area: smaller ones
    are enlarged from the fewer pixels of the reduced decode (a documented loss).
    """
    data = io.BytesIO()
    photo(np.random.default_rng(1), width, height).save(data, "JPEG", quality=90)
    full = decoders.pil_to_tensor(decoders.decode(data.getvalue(), "pil"))  # ImageFolder's pixels
    for transform in (train_transform(32, scale=(0.5, 1.0)), eval_transform(32)):
        reduced = decoders.decode(data.getvalue(), decoder, decode_size=transform.min_input_side)
        assert decoders.reduced_from(reduced) == (4, height, width), "decoded at 1/4, carrying the file's size"
        shape = np.asarray(reduced).shape[:2] if decoder == "pil" else tuple(reduced.shape[1:])
        assert shape == (math.ceil(height / 4), math.ceil(width / 4))
        for seed in range(6 if transform.train else 1):
            torch.manual_seed(seed)
            params = transform.params(height, width, align=4)
            assert params[0] % 4 == params[1] % 4 == 0 and params[0] + params[2] <= height and params[1] + params[3] <= width
            torch.manual_seed(seed)
            diff = _diffs(transform(reduced), transform.apply(full, params)).mean()
            assert diff <= MAX_MEAN_DIFF, f"{'train' if transform.train else 'eval'} seed {seed}: mean diff {diff:.2f}"
    with pytest.raises(ValueError, match=r"must start at a multiple of 4, not at \(2, 0\).*align=4"):
        train_transform(32).apply(full, (2, 0, 100, 100, 0), factor=4)
