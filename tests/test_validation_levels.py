"""Build validation levels (``validate=``): what each refuses, that none changes a good file's record or decodes a bomb,
that the option reaches the build from every entry point, and that a file ``header`` let through fails when read."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from imagegen import bomb_png, encode, image_cases, photo
from PIL import Image, ImageFile, JpegImagePlugin

from lightning_lmdb import LMDBDataModule, LMDBImageDataset, build_lmdb
from lightning_lmdb.codec import decoders, storage
from lightning_lmdb.codec.storage import VALIDATE_LEVELS, encode_record, validate_file
from lightning_lmdb.errors import ImageDecodeError, OptionError
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.tools.cli import build_options, main, make_parser

REFUSES = {"full": True, "reduced": True, "header": False}  # what each level promises for a damaged JPEG kept as its bytes


@pytest.fixture(scope="module")
def jpeg() -> bytes:
    return encode(photo(np.random.default_rng(3), 160, 120), "JPEG", quality=90)


def _scan_start(data: bytes) -> int:
    sos = data.index(b"\xff\xda")
    return sos + 2 + struct.unpack_from(">H", data, sos + 2)[0]


def _flipped(data: bytes) -> bytes:
    """64 bytes of the entropy-coded data, 10 % in, XORed (no 0xFF made or unmade): PIL refuses the stream."""
    out, start = bytearray(data), _scan_start(data)
    at = start + (len(data) - start) // 10
    for i in range(at, at + 64):
        if out[i] != 0xFF and out[i] ^ 0x55 != 0xFF:
            out[i] ^= 0x55
    return bytes(out)


def _refused(data: bytes, level: str, **options: object) -> bool:
    try:
        encode_record(data, "auto", validate=level, **options)  # type: ignore[arg-type]
    except ImageDecodeError:
        return True
    return False


@pytest.mark.parametrize("level", VALIDATE_LEVELS)
def test_each_level_refuses_what_it_promises(jpeg: bytes, level: str) -> None:
    for cut in (len(jpeg) // 4, len(jpeg) // 2, len(jpeg) - 2):
        assert _refused(jpeg[:cut], level) == REFUSES[level], f"JPEG truncated to {cut} of {len(jpeg)} bytes"
    assert _refused(_flipped(jpeg), level) == REFUSES[level], "entropy data damaged"
    assert _refused(b"", level), "an empty file is refused by its header at every level"
    assert _refused(b"not an image at all", level)
    assert not _refused(jpeg, level)
    png = encode(photo(np.random.default_rng(4), 64, 48), "PNG")
    assert _refused(png[: len(png) // 2], level), "a PNG is stored as pixels (auto): decoded fully at every level"
    webp = encode(photo(np.random.default_rng(4), 64, 48), "WEBP", quality=80)
    assert _refused(webp[: len(webp) // 2], level), "a truncated WebP does not even open"


def test_reduced_decodes_a_kept_jpeg_at_one_eighth_and_lossy_webp_fully(jpeg: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    drafts: list[tuple[int, int]] = []
    real = JpegImagePlugin.JpegImageFile.draft

    def draft(self: JpegImagePlugin.JpegImageFile, mode: str | None, size: tuple[int, int] | None) -> object:
        drafted = real(self, mode, size)
        drafts.append(self.size)  # the size the decode makes
        return drafted

    full: list[int] = []
    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", draft)
    monkeypatch.setattr(storage, "decode_pil", lambda data, **kw: full.append(1) or decoders.decode_pil(data, **kw))
    monkeypatch.setattr(storage, "decode_opened", lambda image, **kw: full.append(1) or decoders.decode_opened(image, **kw))
    encode_record(jpeg, "auto", validate="reduced")
    assert drafts == [(160 // 8, 120 // 8)] and not full, "one 1/8-scale decode, no full one"
    encode_record(encode(photo(np.random.default_rng(5), 64, 48), "WEBP", quality=80), "auto", validate="reduced")
    assert full == [1], "lossy WebP has no reduced decode: a full one"
    drafts.clear()
    encode_record(jpeg, "decoded", validate="reduced")
    assert full == [1, 1] and not drafts, "a record of pixels needs the full decode, and gets only it"


@pytest.mark.parametrize("level", VALIDATE_LEVELS)
def test_no_level_decodes_a_bomb(level: str, jpeg: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a bomb's pixels were decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", never)
    monkeypatch.setattr(Image.Image, "convert", never)
    jpeg_bomb = bytearray(jpeg)
    struct.pack_into(">HH", jpeg_bomb, jpeg.index(b"\xff\xc0") + 5, 50_000, 50_000)
    for data in (bomb_png(), bytes(jpeg_bomb)):
        with pytest.raises(ImageDecodeError, match="exceeds"):
            encode_record(data, "auto", validate=level)
    with pytest.raises(ImageDecodeError, match="exceeds the limit of 1,000"):  # our own limit, from the header
        encode_record(jpeg, "encoded", validate=level, max_pixels=1000)


@pytest.mark.parametrize("storage_name", ["auto", "encoded", "decoded"])
@pytest.mark.parametrize("resize", [None, 24])
def test_a_good_files_record_is_the_same_at_every_level(storage_name: str, resize: int | None) -> None:
    for name, data in image_cases().items():
        records = {level: encode_record(data, storage_name, validate=level, resize=resize) for level in VALIDATE_LEVELS}
        assert records["reduced"] == records["full"] == records["header"], name


def test_a_bad_level_is_refused_naming_it() -> None:
    with pytest.raises(OptionError, match="validate='fast' is not one of 'full', 'reduced', 'header'"):
        BuildOptions(validate="fast")  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="validate='fast'"):
        validate_file(b"x", "fast")  # type: ignore[arg-type]


def test_validate_is_not_in_the_database_name() -> None:
    assert BuildOptions(validate="header").cache_key() == BuildOptions(validate="full").cache_key() == BuildOptions().cache_key()
    assert "validate" not in BuildOptions(validate="header").content()


def _folder(root: Path, jpeg: bytes) -> Path:
    (root / "a").mkdir(parents=True)
    (root / "a" / "good.jpg").write_bytes(jpeg)
    (root / "a" / "named.png").write_bytes(jpeg)  # a JPEG with the wrong extension: read by its contents
    (root / "a" / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (root / "a" / "empty.jpg").write_bytes(b"")
    (root / "a" / "bomb.png").write_bytes(bomb_png())
    return root


def test_the_build_skips_what_each_level_refuses_and_header_files_fail_when_read(tmp_path: Path, jpeg: bytes) -> None:
    src = _folder(tmp_path / "src", jpeg)
    kept = {}
    for level in VALIDATE_LEVELS:
        report = build_lmdb(src, tmp_path / f"{level}.lmdb", on_error="skip", validate=level, workers=0, progress=False)
        kept[level] = sorted(LMDBImageDataset(report).paths)
    assert kept["full"] == kept["reduced"] == ["a/good.jpg", "a/named.png"]
    assert kept["header"] == ["a/good.jpg", "a/named.png", "a/truncated.jpg"]
    good = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
    for decoder in ("pil", "opencv", "torchcodec", "auto"):
        dataset = LMDBImageDataset(tmp_path / "header.lmdb", decoder=decoder)
        rows = {path: i for i, path in enumerate(dataset.paths)}
        for name in ("a/good.jpg", "a/named.png"):
            image = dataset[rows[name]][0]
            pixels = np.asarray(image) if isinstance(image, Image.Image) else image.permute(1, 2, 0).numpy()
            assert np.abs(pixels.astype(np.int16) - good).mean() <= 1, (decoder, name)
        with pytest.raises(ImageDecodeError, match="truncated.jpg"):  # never pixels: an error naming the record
            dataset[rows["a/truncated.jpg"]]


def test_a_database_built_with_full_decodes_is_up_to_date_at_every_level(tmp_path: Path, jpeg: bytes) -> None:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.jpg").write_bytes(jpeg)
    build_lmdb(src, tmp_path / "db.lmdb", validate="full", workers=0, progress=False)
    for level in VALIDATE_LEVELS:
        from lightning_lmdb.build.writer import build

        assert build(src, tmp_path / "db.lmdb", validate=level, workers=0, progress=False).action == "up-to-date", level


def test_the_cli_and_the_datamodule_pass_the_level_to_the_build(tmp_path: Path, jpeg: bytes) -> None:
    assert build_options(make_parser().parse_args(["build", "s", "d"])).validate == "reduced"
    assert build_options(make_parser().parse_args(["build", "s", "d", "--validate", "header"])).validate == "header"
    src = _folder(tmp_path / "src", jpeg)
    (src / "a" / "bomb.png").unlink()
    assert main(["build", str(src), str(tmp_path / "cli.lmdb"), "--validate", "header", "--on-error", "skip", "--workers", "0",
                 "--quiet"]) == 0
    assert "a/truncated.jpg" in LMDBImageDataset(tmp_path / "cli.lmdb").paths
    dm = LMDBDataModule(src, cache_dir=tmp_path / "cache", validate="header", on_error="skip", build_workers=0, val_fraction=0)
    assert dm.build_options.validate == "header"
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.datasets["train"]) == 3, "the truncated JPEG is kept by a header build (and fails when read)"
    with pytest.raises(OptionError, match="validate='nope'.*data.validate"):
        LMDBDataModule(src, cache_dir=tmp_path / "cache", validate="nope")  # type: ignore[arg-type]


def test_a_truncated_jpeg_is_not_sent_to_the_batched_gpu_decoder(jpeg: bytes) -> None:
    from lightning_lmdb.read.batchdecode import defer
    from lightning_lmdb.read.transforms import eval_transform

    crop = eval_transform(16)
    assert defer(jpeg, crop) is not None
    assert defer(jpeg[: len(jpeg) // 2], crop) is None, "decoded in the worker, whose decode raises naming the record"


def test_hydra_sets_the_level() -> None:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(Path(__file__).resolve().parents[1] / "configs"), version_base="1.3"):
        assert compose("train").data.validate == "reduced"
        assert compose("train", overrides=["data.validate=header"]).data.validate == "header"
