"""Pre-resized storage: the codec's resize, the build option in the metadata, the stale check, the cache key and verify."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from imagegen import encode, make_image, photo, read_records
from PIL import Image

from lightning_lmdb import BuildOptions, LMDBDataModule, build_lmdb, verify_lmdb
from lightning_lmdb.build.writer import build
from lightning_lmdb.codec.decoders import decode_pil
from lightning_lmdb.codec.imageinfo import read_info
from lightning_lmdb.codec.storage import decode_pixels, encode_record


def test_resize_shrinks_the_shorter_side_keeps_aspect_and_never_upscales() -> None:
    rng = np.random.default_rng(0)
    big = encode(photo(rng, 300, 200), "JPEG", quality=90)
    small = encode(photo(rng, 60, 50), "JPEG", quality=90)
    value = encode_record(big, "encoded", resize=80)[1]
    assert read_info(value).format == "jpeg", "a lossy source is re-encoded as JPEG"
    assert decode_pil(value).size == (120, 80)
    assert encode_record(small, "encoded", resize=80)[1] == small, "an image already that small is stored as it is"
    assert decode_pixels(encode_record(big, "decoded", resize=80)[1]).shape == (80, 120, 3)
    rgba = encode(make_image("RGBA", (90, 160), rng), "PNG")
    lossless = encode_record(rgba, "encoded", resize=45)[1]
    assert read_info(lossless).format == "png" and decode_pil(lossless).size == (45, 80), "lossless sources stay lossless"
    expected = np.asarray(decode_pil(rgba).resize((45, 80), Image.BOX))
    assert np.abs(np.asarray(decode_pil(lossless)).astype(int) - expected).mean() < 3, "INTER_AREA, close to a box filter"


def test_bad_resize_options_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="resize=0 must be a positive integer"):
        BuildOptions(resize=0)
    with pytest.raises(ValueError, match="quality=101 must be an integer from 1 to 100"):
        BuildOptions(quality=101)
    assert BuildOptions().content() == {"storage": "auto", "max_pixels": BuildOptions().max_pixels}, "unchanged without resize"
    assert BuildOptions(resize=80).content()["quality"] == 90


def _photos(root: Path, count: int = 6) -> Path:
    rng = np.random.default_rng(1)
    for i in range(count):
        path = root / f"c{i % 2}" / f"p{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        photo(rng, 160 + 10 * i, 120).save(path, quality=90)
    return root


def test_a_resize_build_records_it_and_a_change_of_it_rebuilds(tmp_path: Path) -> None:
    source = _photos(tmp_path / "src")
    target = tmp_path / "small.lmdb"
    assert build(source, target, resize=64, workers=0, progress=False).action == "built"
    meta, values = read_records(target)
    assert meta["options"]["resize"] == 64 and meta["options"]["quality"] == 90
    assert all(min(decode_pil(v).size) == 64 for v in values)
    assert build(source, target, resize=64, workers=0, progress=False).action == "up-to-date"
    assert build(source, target, resize=64, quality=70, workers=0, progress=False).action == "built", "quality shapes the contents"
    assert build(source, target, resize=48, quality=70, workers=0, progress=False).action == "built"
    assert build(source, target, workers=0, progress=False).action == "built", "back to the original size"
    meta, values = read_records(target)
    assert "resize" not in meta["options"] and values[0] == (source / "c0" / "p0.jpg").read_bytes()


def test_verify_reapplies_the_resize_and_catches_a_modified_file(tmp_path: Path) -> None:
    source = _photos(tmp_path / "src")
    for storage in ("auto", "encoded", "decoded"):
        target = build_lmdb(source, tmp_path / f"{storage}.lmdb", storage=storage, resize=64, workers=0, progress=False)
        assert verify_lmdb(target, source).ok, storage
    photo(np.random.default_rng(9), 170, 120).save(source / "c1" / "p1.jpg", quality=90)
    for storage in ("auto", "encoded", "decoded"):
        report = verify_lmdb(tmp_path / f"{storage}.lmdb", source)
        assert not report.ok and any("p1.jpg" in p and "resized to 64" in p for p in report.problems), report.problems


def test_the_datamodule_cache_key_covers_resize_and_quality(tmp_path: Path) -> None:
    source = _photos(tmp_path / "src")
    paths = {LMDBDataModule(source, cache_dir=tmp_path, **options).database_path("train")
             for options in ({}, {"resize": 64}, {"resize": 64, "quality": 70}, {"storage": "decoded", "resize": 64})}
    assert len(paths) == 4
    assert LMDBDataModule(source, cache_dir=tmp_path).database_path("train") == LMDBDataModule(source, cache_dir=tmp_path, quality=70
                                                                                               ).database_path("train")
    dm = LMDBDataModule(source, cache_dir=tmp_path, resize=64, build_workers=0, num_workers=0, image_size=32, batch_size=2)
    dm.prepare_data()
    dm.setup("fit")
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 3, 32, 32)
    meta, _ = read_records(dm.database_path("train"))
    assert meta["options"]["resize"] == 64


def test_cli_build_resize_and_bench_decoder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_lmdb.tools.cli import main

    source = _photos(tmp_path / "src")
    target = tmp_path / "cli.lmdb"
    assert main(["build", str(source), str(target), "--resize", "64", "--quality", "80", "--quiet", "--workers", "0"]) == 0
    assert main(["info", str(target), "--json"]) == 0
    assert '"resize": 64' in capsys.readouterr().out
    assert main(["verify", str(target), "--source", str(source)]) == 0
    assert main(["bench", str(source), str(target), "--decode", "--decoder", "auto", "--passes", "1"]) == 0
    assert "read + decode to RGB (auto)" in capsys.readouterr().out
    assert main(["build", str(source), str(target), "--resize", "0"]) == 2
    assert "resize=0 must be a positive integer" in capsys.readouterr().err


def _png_row_filters(data: bytes) -> set[int]:
    """The filter type of every row of a non-interlaced 8-bit RGB PNG."""
    import struct
    import zlib

    width, height = struct.unpack(">II", data[16:24])
    assert data[24:29] == bytes([8, 2, 0, 0, 0]), "8-bit RGB, not interlaced"
    idat, position = b"", 8
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        if kind == b"IDAT":
            idat += data[position + 8 : position + 8 + length]
        position += 12 + length
    rows = zlib.decompress(idat)
    stride = 1 + 3 * width
    assert len(rows) == stride * height
    return {rows[row * stride] for row in range(height)}


def test_resized_lossless_images_are_stored_unfiltered_unless_filters_shrink_them_much() -> None:
    from PIL import ImageDraw

    rng = np.random.default_rng(2)
    flat = Image.new("RGB", (240, 160), (200, 30, 40))  # an icon: flat colours, where filters gain little
    ImageDraw.Draw(flat).ellipse((40, 20, 200, 140), fill=(20, 90, 220))
    smooth = photo(rng, 240, 160)  # photo-like: per-row filters are what compresses it
    for image, filters in ((flat, {0}), (smooth, None)):
        source = encode(image, "PNG")
        value = encode_record(source, "encoded", resize=80)[1]
        stored = _png_row_filters(value)
        if filters is None:
            assert stored != {0}, "photo-like content keeps the filtered, much smaller PNG"
        else:
            assert stored == filters, "flat content is stored without per-row filters (it decodes faster)"
        resized = decode_pixels(encode_record(source, "decoded", resize=80)[1])
        assert np.array_equal(np.asarray(decode_pil(value)), resized), "lossless either way: the resized pixels exactly"
