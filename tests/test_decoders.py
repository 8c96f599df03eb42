"""Decoders: the header parser, the parity policy per decoder and format, reduced-size decoding, errors."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import (
    JPEG_MAX_ERROR,
    JPEG_MEAN_ERROR,
    KNOWN_SIZE,
    bomb_png,
    encode,
    image_cases,
    known_images,
    make_image,
    photo,
    truncated_jpeg,
)
from PIL import Image

from lightning_lmdb.codec.decoders import DECODERS, ImageDecodeError, choose, decode, decode_pil, reduction
from lightning_lmdb.codec.imageinfo import read_info
from lightning_lmdb.errors import BuildError
from lightning_lmdb.read.transforms import eval_transform

CASES = image_cases()
#: Images whose RGB pixels are known from how they were made (tests/imagegen.py).
KNOWN = known_images()
TENSOR_DECODERS = ("torchcodec", "opencv", "auto")
#: The parity policy's exact cases: 8-bit PNG in every mode and WebP, equal to PIL with every tensor decoder.
EXACT = [name for name in CASES if name.startswith(("png", "webp")) and name != "png I;16"]
#: JPEGs: within a mean absolute difference of 1 (another libjpeg build may round differently).
JPEG_BOUND = [name for name in CASES if name.startswith("jpeg") and "CMYK" not in name and "EXIF" not in name]


def pil_pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


def hwc(image: torch.Tensor) -> np.ndarray:
    assert image.dtype == torch.uint8 and image.ndim == 3 and image.shape[0] == 3
    return image.permute(1, 2, 0).numpy()


def rgb_pixels(image: Image.Image | torch.Tensor) -> np.ndarray:
    """``H x W x 3`` of a decoder's output: an RGB PIL image (``"pil"``) or a ``uint8`` ``3 x H x W`` tensor."""
    if isinstance(image, Image.Image):
        assert image.mode == "RGB"
        return np.asarray(image)
    assert isinstance(image, torch.Tensor)
    return hwc(image)


def opencv_rgb(data: bytes) -> np.ndarray:
    """OpenCV's own decode, BGR converted to RGB (EXIF orientation ignored, as ImageFolder does): a reference independent of PIL."""
    import cv2

    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    assert bgr is not None and bgr.ndim == 3 and bgr.shape[2] == 3
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


@pytest.mark.parametrize("name", sorted(CASES))
def test_header_agrees_with_pil(name: str) -> None:
    data = CASES[name]
    info = read_info(data)
    with Image.open(io.BytesIO(data)) as img:
        expected = {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp"}.get(img.format, "other")
        assert info.format == expected
        if expected != "other":
            assert (info.width, info.height) == img.size
    facts = {"png P transparency": ("palette", "transparency"), "png RGBA": ("transparency",), "png P": ("palette",),
             "webp lossy alpha": ("transparency", "lossy"), "jpeg progressive": ("progressive", "lossy")}
    for fact in facts.get(name, ()):
        assert getattr(info, fact), (name, fact)
    assert read_info(CASES["jpeg CMYK"]).channels == 4 and read_info(CASES["jpeg L"]).channels == 1
    assert read_info(CASES["png I;16"]).bit_depth == 16 and read_info(CASES["jpeg EXIF orientation 6"]).orientation == 6
    assert read_info(CASES["webp lossless"]).lossy is False and read_info(CASES["png RGB"]).lossy is False


def test_header_parser_never_raises_on_damaged_input() -> None:
    rng = np.random.default_rng(0)
    for data in CASES.values():
        for cut in (0, 1, 3, 8, 12, 20, 25, 30, len(data) // 2):
            info = read_info(data[:cut])
            assert info.format in ("jpeg", "png", "webp", "other")
        flipped = bytearray(data)
        flipped[4:40] = rng.integers(0, 256, 36, dtype=np.uint8).tobytes()
        read_info(bytes(flipped))
    assert read_info(b"").format == "other" and read_info(rng.bytes(100)).format == "other"


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("name", sorted(KNOWN))
def test_every_decoder_gives_the_known_rgb_pixels(decoder: str, name: str) -> None:
    # the expectation is the content the image was made from (numpy), not another decoder's output
    case = KNOWN[name]
    got = rgb_pixels(decode(case.data, decoder))
    assert got.shape == (KNOWN_SIZE[1], KNOWN_SIZE[0], 3), (decoder, name)
    if case.lossless:
        np.testing.assert_array_equal(got, case.rgb, err_msg=f"{decoder} {name}")
    else:
        error = np.abs(got.astype(np.int16) - case.rgb)
        assert error.mean() < JPEG_MEAN_ERROR and error.max() <= JPEG_MAX_ERROR, (decoder, name, error.mean(), error.max())


@pytest.mark.parametrize("name", [name for name in sorted(CASES) if name != "png I;16"])
def test_pil_decoder_agrees_with_opencv(name: str) -> None:
    # every format and mode of random content, against another library; 16-bit differs by design (the test below)
    data = CASES[name]
    image = decode(data, "pil")
    assert isinstance(image, Image.Image) and image.mode == "RGB"
    got, reference = np.asarray(image).astype(np.int16), opencv_rgb(data).astype(np.int16)
    assert got.shape == reference.shape, name
    if name.startswith(("jpeg", "webp lossy")):  # decoders may differ by rounding (CMYK: OpenCV's is 1 off everywhere)
        error = np.abs(got - reference)
        assert error.mean() < JPEG_MEAN_ERROR and error.max() <= JPEG_MAX_ERROR, (name, error.mean(), error.max())
    else:
        np.testing.assert_array_equal(got, reference, err_msg=name)


@pytest.mark.parametrize("decoder", TENSOR_DECODERS)
@pytest.mark.parametrize("name", EXACT)
def test_png_and_webp_pixels_equal_pil(decoder: str, name: str) -> None:
    np.testing.assert_array_equal(hwc(decode(CASES[name], decoder)), pil_pixels(CASES[name]), err_msg=f"{decoder} {name}")


@pytest.mark.parametrize("decoder", TENSOR_DECODERS)
@pytest.mark.parametrize("name", JPEG_BOUND)
def test_jpeg_pixels_within_the_stated_bound(decoder: str, name: str) -> None:
    got, expected = hwc(decode(CASES[name], decoder)).astype(np.int16), pil_pixels(CASES[name]).astype(np.int16)
    assert got.shape == expected.shape and np.abs(got - expected).mean() <= 1.0, (decoder, name)


def test_auto_keeps_pil_pixels_where_the_fast_decoders_differ() -> None:
    # CMYK JPEG: OpenCV is 1 off in every pixel, so auto uses PIL; GIF, BMP, TIFF: PIL
    for name in ("jpeg CMYK", "gif", "bmp", "tiff"):
        assert choose(read_info(CASES[name]), "auto") == "pil", name
        np.testing.assert_array_equal(hwc(decode(CASES[name], "auto")), pil_pixels(CASES[name]), err_msg=name)
    assert choose(read_info(CASES["jpeg RGB"]), "auto") == "opencv"
    assert choose(read_info(CASES["png P transparency"]), "auto") == "opencv"


def test_exif_orientation_ignored_like_imagefolder_except_by_torchcodec() -> None:
    data = CASES["jpeg EXIF orientation 6"]
    stored = pil_pixels(data)
    for decoder in ("opencv", "auto"):
        got = hwc(decode(data, decoder))
        assert got.shape == stored.shape and np.abs(got.astype(np.int16) - stored).mean() <= 1.0, decoder
    rotated = hwc(decode(data, "torchcodec"))  # the documented exception: TorchCodec applies the orientation
    assert rotated.shape == (stored.shape[1], stored.shape[0], 3)


def test_sixteen_bit_images_are_scaled_by_the_tensor_decoders_and_clipped_by_pil() -> None:
    data = CASES["png I;16"]
    with Image.open(io.BytesIO(data)) as img:
        values = np.asarray(img).astype(np.uint16)
    assert (pil_pixels(data)[..., 0] == np.minimum(values, 255)).all(), "PIL (and ImageFolder) clip to 255"
    for decoder in TENSOR_DECODERS:
        got = hwc(decode(data, decoder))
        assert np.abs(got[..., 0].astype(int) - (values >> 8)).max() <= 1, decoder
        assert (got[..., 0] == got[..., 1]).all() and (got[..., 1] == got[..., 2]).all()


@pytest.mark.parametrize("decoder", DECODERS)
def test_bad_input_raises_image_decode_error_naming_it(decoder: str) -> None:
    for data, reason in ((b"", "empty"), (b"not an image at all", "not an image"), (truncated_jpeg(), "truncated")):
        with pytest.raises(ImageDecodeError, match=f"some/file.jpg: .*{reason}"):
            decode(data, decoder, name="some/file.jpg")
    with pytest.raises(ImageDecodeError, match="exceeds the limit of 1,000,000"):
        decode(bomb_png(), decoder, max_pixels=1_000_000, name="bomb.png")
    with pytest.raises(ValueError, match="decoder='fastest' is not one of"):
        decode(CASES["png RGB"], "fastest")


def test_opencv_refuses_a_bomb_from_its_header_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    import cv2

    calls = []
    monkeypatch.setattr(cv2, "imdecode", lambda *args: calls.append(args))
    with pytest.raises(ImageDecodeError, match="100,000,000 pixels exceeds the limit of 89,478,485"):
        decode(bomb_png(), "opencv", max_pixels=89_478_485)
    assert not calls, "the pixel count is checked from the header, before OpenCV sees the bytes"


def test_reduced_size_decoding_scale_and_bound() -> None:
    rng = np.random.default_rng(3)
    diffs = []
    for width, height in ((500, 300), (400, 420), (330, 256), (1200, 900)):
        data = encode(photo(rng, width, height), "JPEG", quality=90)
        info = read_info(data)
        k = reduction(info, 73)
        assert k == max([1] + [f for f in (2, 4, 8) if min(width, height) >= 2 * f * 73])
        reduced = decode(data, "opencv", decode_size=73)
        assert reduced.shape[1:] == (-(-height // k), -(-width // k))
        np.testing.assert_array_equal(hwc(reduced), np.asarray(decode(data, "pil", decode_size=73)), "OpenCV and PIL draft() agree")
        np.testing.assert_array_equal(hwc(decode(data, "auto", decode_size=73)), hwc(reduced))
        transform = eval_transform(64)
        full = transform(decode(data, "opencv")).numpy().astype(np.int16)
        diffs.append(np.abs(transform(reduced).numpy().astype(np.int16) - full).mean())
    assert max(diffs) <= 2.0, diffs
    png = encode(make_image("RGB", (400, 400), rng), "PNG")
    assert reduction(read_info(png), 73) == 1 and decode(png, "auto", decode_size=73).shape[1:] == (400, 400)
    assert decode(CASES["jpeg RGB"], "torchcodec", decode_size=8).shape[1:] == (37, 53), "TorchCodec has no scaled decode"


def test_importing_the_decoders_leaves_the_warning_filters_alone() -> None:
    import runpy
    import warnings

    import lightning_lmdb.codec.decoders as decoders

    with warnings.catch_warnings():
        before = list(warnings.filters)
        runpy.run_path(decoders.__file__)  # the module's code, run afresh (the imported module is left as it is)
        assert warnings.filters == before


def test_a_decode_silences_only_pillows_own_bomb_warning_with_one_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    from lightning_lmdb.codec.decoders import decode_pil

    buffer = io.BytesIO()
    Image.new("RGB", (20, 20), (1, 2, 3)).save(buffer, format="PNG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300)  # 400 pixels: over Pillow's warning threshold, under its error
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()  # no filters: every warning would show
        for _ in range(3):
            assert decode_pil(buffer.getvalue(), max_pixels=None).size == (20, 20)
        filters = list(warnings.filters)
        warnings.warn("the user's own", Image.DecompressionBombWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["the user's own"]
    assert len(filters) == 1, "one filter, added once, not one per decode"


def _noise_png(side: int = 100) -> bytes:
    return encode(Image.fromarray(np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)), "PNG")


def test_max_pixels_none_lifts_pillows_limit_for_that_image_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 14000 x 14000 PNG with max_pixels=None, scaled down: Pillow's limit lowered to 64 x 64 (it refuses over twice that)."""
    import lightning_lmdb.codec.decoders as decoders

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 64)
    monkeypatch.setattr(decoders, "HARD_MAX_PIXELS", 2 * 64 * 64)
    data = _noise_png()  # 10,000 pixels
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(data))  # what Pillow alone does with it
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 64)
    for decoder in DECODERS:
        got = decode(data, decoder, max_pixels=None, name="big.png")
        np.testing.assert_array_equal(np.asarray(got) if decoder == "pil" else hwc(got), expected, decoder)
        assert Image.MAX_IMAGE_PIXELS == 64 * 64, "Pillow's limit is never changed, not even for a moment seen after"
        with pytest.raises(ImageDecodeError, match="big.png: .*10,000 pixels exceeds the limit of 9,999"):
            decode(data, decoder, max_pixels=9_999, name="big.png")
    assert decode_pil(data, max_pixels=20_000).size == (100, 100), "a limit above Pillow's is ours to keep"
    with pytest.raises(ImageDecodeError, match="not an image"):
        decode_pil(b"not an image at all", max_pixels=None)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_build_with_max_pixels_none_takes_an_image_over_pillows_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        workers: int) -> None:
    from lightning_lmdb.build.writer import build_lmdb
    from lightning_lmdb.read.dataset import LMDBImageDataset

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.png").write_bytes(_noise_png())
    Image.new("RGB", (8, 8)).save(tmp_path / "src" / "small.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 64)  # the reader process (fork) inherits it
    for storage in ("encoded", "auto"):
        out = build_lmdb(tmp_path / "src", tmp_path / f"{storage}.lmdb", storage=storage, max_pixels=None, workers=workers, progress=False)
        assert Image.MAX_IMAGE_PIXELS == 64 * 64
        served = LMDBImageDataset(out)
        assert len(served) == 2 and served[served.paths.index("big.png")][0].size == (100, 100)
    with pytest.raises(BuildError, match=r"big\.png.*exceeds the limit of 9,999"):
        build_lmdb(tmp_path / "src", tmp_path / "limited.lmdb", max_pixels=9_999, workers=workers, progress=False)
