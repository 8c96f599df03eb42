"""``storage="auto"``: lossless images as zstd-compressed pixels, lossy ones as their bytes, chosen per record."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch
from imagegen import encode, make_folder, make_image, photo, read_records, save_image
from PIL import Image
from torchvision.datasets import ImageFolder

from lightning_lmdb import LMDBDataModule, LMDBImageDataset, build_lmdb
from lightning_lmdb.build.writer import build
from lightning_lmdb.codec import storage as codec
from lightning_lmdb.codec.storage import JPEG, PNG, ZSTD_PIXELS, decode_record, encode_record
from lightning_lmdb.store import database, envs
from lightning_lmdb.store import format as fmt
from lightning_lmdb.store.format import DatabaseError
from lightning_lmdb.tools import cli
from lightning_lmdb.tools.verify import describe_lmdb, verify_lmdb

TENSOR_DECODERS = ("opencv", "torchcodec", "auto")


def _lossless_cases() -> dict[str, bytes]:
    """Every 8-bit lossless source the codec stores as pixels: each PNG mode, lossless WebP, BMP, TIFF, GIF."""
    rng = np.random.default_rng(3)
    cases = {f"png {mode}": encode(make_image(mode, (23, 17), rng), "PNG") for mode in ("RGB", "RGBA", "L", "LA", "1")}
    palette = make_image("P", (23, 17), rng)
    buffer = io.BytesIO()
    palette.save(buffer, "PNG", transparency=0)
    cases["png P with transparency"] = buffer.getvalue()
    cases["png P"] = encode(make_image("RGB", (23, 17), rng).quantize(40), "PNG")
    cases["png 4-bit grey"] = encode(make_image("L", (23, 17), rng), "PNG", bits=4)
    cases["webp lossless RGBA"] = encode(make_image("RGBA", (23, 17), rng), "WEBP", lossless=True)
    cases["bmp"] = encode(make_image("RGB", (23, 17), rng), "BMP")
    cases["tiff"] = encode(make_image("RGB", (23, 17), rng), "TIFF")
    cases["gif"] = encode(make_image("RGB", (23, 17), rng).quantize(64), "GIF")
    return cases


@pytest.mark.parametrize(("name", "data"), list(_lossless_cases().items()))
def test_lossless_sources_become_pils_exact_pixels_for_every_decoder(name: str, data: bytes) -> None:
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))

    record_codec, value = encode_record(data, "auto")

    assert record_codec == ZSTD_PIXELS, name
    assert np.array_equal(np.asarray(decode_record(value, record_codec, decoder="pil")), expected), name
    for decoder in TENSOR_DECODERS:
        tensor = decode_record(value, record_codec, decoder=decoder)
        assert tensor.dtype == torch.uint8 and np.array_equal(tensor.permute(1, 2, 0).numpy(), expected), (name, decoder)


def test_lossy_and_16_bit_sources_keep_their_bytes_and_decode_as_today() -> None:
    rng = np.random.default_rng(4)
    cases = {
        "jpeg": (encode(photo(rng, 40, 30), "JPEG", quality=90), JPEG),
        "webp lossy": (encode(photo(rng, 40, 30), "WEBP", quality=80), codec.WEBP),
        "png 16-bit": (encode(make_image("I;16", (20, 12), rng), "PNG"), PNG),
    }
    for name, (data, expected_codec) in cases.items():
        record_codec, value = encode_record(data, "auto")
        assert (record_codec, value) == (expected_codec, data), name
        for decoder in ("pil", *TENSOR_DECODERS):  # exactly what each decoder gives for the file itself
            stored = decode_record(value, record_codec, decoder=decoder)
            direct = decode_record(data, codec.FILE, decoder=decoder)
            assert np.array_equal(np.asarray(stored), np.asarray(direct)), (name, decoder)


def test_grey_images_are_stored_as_one_channel() -> None:
    rng = np.random.default_rng(5)
    grey = make_image("L", (64, 48), rng)
    channels = {
        "grey PNG": (encode(grey, "PNG"), 1),
        "grey + alpha PNG": (encode(grey.convert("LA"), "PNG"), 1),
        "1-bit PNG": (encode(grey.convert("1"), "PNG"), 1),
        "grey BMP": (encode(grey, "BMP"), 1),  # no header to ask: the channels are compared
        "colour PNG": (encode(make_image("RGB", (64, 48), rng), "PNG"), 3),
        "colour BMP": (encode(make_image("RGB", (64, 48), rng), "BMP"), 3),
        "RGB PNG of grey content": (encode(grey.convert("RGB"), "PNG"), 3),  # its header says colour: kept as three
    }
    for name, (data, expected) in channels.items():
        _, value = encode_record(data, "auto")
        assert codec._PIXEL_HEADER.unpack_from(value) == (48, 64, expected), name
        assert np.array_equal(codec.decode_zstd_pixels(value), np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))), name


def test_resized_lossless_images_are_zstd_pixels_and_lossy_ones_jpegs() -> None:
    rng = np.random.default_rng(6)
    png = encode(make_image("RGBA", (120, 90), rng), "PNG")
    jpeg = encode(photo(rng, 120, 90), "JPEG", quality=95)

    png_codec, png_value = encode_record(png, "auto", resize=30)
    jpeg_codec, jpeg_value = encode_record(jpeg, "auto", resize=30)

    assert png_codec == ZSTD_PIXELS and jpeg_codec == JPEG
    expected = codec.resize_pixels(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")), 30)
    assert np.array_equal(np.asarray(decode_record(png_value, png_codec)), expected)  # the same pixels "encoded" stores as PNG
    assert Image.open(io.BytesIO(jpeg_value)).size == (40, 30)


@pytest.fixture
def mixed_folder(tmp_path: Path) -> Path:
    return make_folder(tmp_path / "src", per_class=10)


def test_an_auto_database_serves_imagefolders_pixels_and_says_which_codecs(mixed_folder: Path, tmp_path: Path) -> None:
    target = build_lmdb(mixed_folder, tmp_path / "auto.lmdb", workers=2, progress=False)

    meta = database.load_meta(target, arrays=True)
    assert meta.storage == "auto" and meta.options["zstd_level"] == codec.ZSTD_LEVEL
    suffixes = [Path(p).suffix for p in meta.paths.tolist()]
    # JPEGs keep their bytes; 8-bit PNGs, BMP and lossless-or-not WebP... each by its own rule
    assert all(c == JPEG for c, s in zip(meta.codecs, suffixes, strict=True) if s == ".jpg")
    reference = ImageFolder(mixed_folder)
    dataset = LMDBImageDataset(target)
    for i, (path, label) in enumerate(reference.samples):
        image, target_label = dataset[i]
        assert target_label == label
        assert np.array_equal(np.asarray(image), np.asarray(reference.loader(path))), path
        is_16_bit = Image.open(path).mode.startswith("I;16")
        if Path(path).suffix in (".png", ".bmp") and not is_16_bit:
            assert meta.codecs[i] == ZSTD_PIXELS, path
    counts = describe_lmdb(target)["codecs"]
    assert counts["zstd pixels"] == int((meta.codecs == ZSTD_PIXELS).sum()) > 0 and counts["JPEG"] > 0
    assert sum(counts.values()) == meta.count
    report = verify_lmdb(target, source=mixed_folder)
    assert report.ok and report.checked == meta.count, report.problems


def test_info_prints_the_codec_counts(mixed_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = build_lmdb(mixed_folder, tmp_path / "auto.lmdb", workers=0, progress=False)
    capsys.readouterr()

    assert cli.main(["info", str(target)]) == 0

    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("codecs:"))
    counts = describe_lmdb(target)["codecs"]
    assert line.split(":", 1)[1].strip() == ", ".join(f"{name} {count:,}" for name, count in counts.items())


def _damage_first_zstd_record(target: Path) -> int:
    meta = database.load_meta(target)
    row = int(np.flatnonzero(meta.codecs == ZSTD_PIXELS)[0])
    envs.close_all()
    env = lmdb.open(str(target), subdir=False, max_dbs=3, lock=False)
    try:
        records = env.open_db(fmt.RECORDS_DB)
        with env.begin(write=True, db=records) as txn:
            value = bytearray(txn.get(fmt.record_key(row)))
            value[-6] ^= 0x55  # inside the frame: the content checksum no longer matches
            txn.put(fmt.record_key(row), bytes(value))
    finally:
        env.close()
    return row


@pytest.mark.parametrize("decoder", ["pil", "opencv"])
def test_a_damaged_compressed_record_is_a_database_error_naming_the_file(mixed_folder: Path, tmp_path: Path, decoder: str) -> None:
    target = build_lmdb(mixed_folder, tmp_path / "auto.lmdb", workers=0, progress=False)
    row = _damage_first_zstd_record(target)

    with pytest.raises(DatabaseError, match=rf"Record .*auto\.lmdb\[{row}\] \(.*\) is damaged: .*lightning-lmdb verify"):
        LMDBImageDataset(target, decoder=decoder)[row]
    assert any("checksum mismatch" in problem for problem in verify_lmdb(target).problems)


def _strip_codecs(target: Path) -> None:
    """Make ``target`` what a build before ``meta/codecs`` wrote: no codecs array, no digest of it in the header."""
    envs.close_all()
    env = lmdb.open(str(target), subdir=False, max_dbs=3, lock=False)
    try:
        with env.begin(write=True) as txn:
            header = json.loads(bytes(txn.get(fmt.META_KEY)))
            del header["arrays"]["codecs"]
            raw = fmt.dump_json(header)
            txn.delete(fmt.ARRAYS["codecs"][0])
            txn.put(fmt.META_KEY, raw)
            txn.put(fmt.META_DIGEST_KEY, fmt._digest(raw))
    finally:
        env.close()


@pytest.mark.parametrize("storage", ["encoded", "decoded"])
def test_a_database_from_before_codecs_is_read_verified_and_stays_current(mixed_folder: Path, tmp_path: Path, storage: str) -> None:
    target = build_lmdb(mixed_folder, tmp_path / f"{storage}.lmdb", storage=storage, workers=0, progress=False)
    before = [np.asarray(LMDBImageDataset(target)[i][0]) for i in range(len(LMDBImageDataset(target)))]
    _strip_codecs(target)

    meta = database.load_meta(target)
    assert set(meta.codecs.tolist()) == {codec.STORAGE_MODES[storage].default_codec}
    dataset = LMDBImageDataset(target)
    assert all(np.array_equal(np.asarray(dataset[i][0]), pixels) for i, pixels in enumerate(before))
    assert verify_lmdb(target, source=mixed_folder).ok
    assert build(mixed_folder, target, storage=storage, workers=0, progress=False).action == "up-to-date"


def test_the_old_default_is_rebuilt_in_place(mixed_folder: Path, tmp_path: Path) -> None:
    target = build_lmdb(mixed_folder, tmp_path / "db.lmdb", storage="encoded", workers=0, progress=False)

    report = build(mixed_folder, target, workers=0, progress=False)  # the default, now "auto"

    assert report.action == "built" and database.load_meta(target).storage == "auto"
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".lmdb") == ["db.lmdb"]


def test_the_datamodule_replaces_the_old_defaults_cached_copy(mixed_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "cache"
    old = LMDBDataModule(mixed_folder, cache_dir=cache, storage="encoded", num_workers=0, val_fraction=0)
    old.prepare_data()
    old_path = old.database_path("train")
    assert old_path.exists()

    new = LMDBDataModule(mixed_folder, cache_dir=cache, num_workers=0, val_fraction=0)
    with caplog.at_level(logging.INFO, logger="lightning_lmdb.datamodule.backends"):
        new.prepare_data()

    assert new.database_path("train") != old_path and new.database_path("train").exists()
    assert not old_path.exists() and "former default" in caplog.text
    assert sorted(p.name for p in cache.iterdir()) == [new.database_path("train").name, f"{new.database_path('train').name}.build-lock"]


def test_sharded_auto_databases_join_their_codecs(mixed_folder: Path, tmp_path: Path) -> None:
    single = build_lmdb(mixed_folder, tmp_path / "one.lmdb", workers=0, progress=False)
    sharded = build_lmdb(mixed_folder, tmp_path / "three", shards=3, workers=0, progress=False)

    assert np.array_equal(database.load_meta(sharded).codecs, database.load_meta(single).codecs)
    one, three = LMDBImageDataset(single, decoder="opencv"), LMDBImageDataset(sharded, decoder="opencv")
    assert all(torch.equal(one[i][0], three[i][0]) for i in range(len(one)))


def test_zstd_pixels_are_about_the_size_of_the_pngs(tmp_path: Path) -> None:
    """Icon-like PNGs (flat shapes, a gradient): zstd pixels stay near the files' bytes, far below raw pixels."""
    rng = np.random.default_rng(7)
    folder = tmp_path / "icons" / "a"
    for i in range(12):
        pixels = np.zeros((64, 64, 3), dtype=np.uint8)
        pixels[8 + i : 40 + i, 10:50] = rng.integers(0, 255, 3)
        pixels += np.linspace(0, 20, 64, dtype=np.uint8)[None, :, None]
        save_image(Image.fromarray(pixels), folder / f"{i}.png")
    target = build_lmdb(tmp_path / "icons", tmp_path / "icons.lmdb", workers=0, progress=False)

    _, values = read_records(target)
    png_bytes = sum(p.stat().st_size for p in folder.iterdir())
    assert sum(map(len, values)) < 1.5 * png_bytes and sum(map(len, values)) < 0.1 * 12 * 64 * 64 * 3
