"""A damaged record is never served: every read checks it (its stored checksum, or a zstd frame's own), on every read path.

The sweep flips single bits inside record values of small databases (JPEG, PNG, zstd pixels, raw pixels, image + mask) in
the file itself, at the value's offset, and reads each damaged copy in a forked child through the dataset and through block
reads: a flipped record is refused with a project error or (a flip the decode cannot see, e.g. in a zstd frame's unused bits)
served with exactly its undamaged pixels -- never wrong pixels, never another exception, never a signal.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import random
import shutil
import struct
from pathlib import Path

import lmdb
import numpy as np
import pytest
from imagegen import make_image, photo, read_records
from PIL import Image

from lightning_lmdb import LMDBImageDataset
from lightning_lmdb.build.writer import BuildError, build
from lightning_lmdb.codec import storage as codec
from lightning_lmdb.errors import DatabaseError, LightningLMDBError, RecordError
from lightning_lmdb.read import blockread
from lightning_lmdb.read.batchdecode import Deferred
from lightning_lmdb.read.transforms import ResizedCrop
from lightning_lmdb.sources import masks
from lightning_lmdb.store import database, envs
from lightning_lmdb.store import format as fmt
from lightning_lmdb.tools.verify import verify_lmdb


def _source(root: Path) -> Path:
    """Three JPEG photos and three RGB PNGs (``auto``: JPEG and zstd pixel records; ``encoded``: JPEG and PNG)."""
    rng = np.random.default_rng(30)
    for i in range(3):
        (root / "a").mkdir(parents=True, exist_ok=True)
        photo(rng, 40 + 8 * i, 32).save(root / "a" / f"photo{i}.jpg", quality=90)
        make_image("RGB", (24 + 4 * i, 20), rng).save(root / "a" / f"icon{i}.png")
    return root


def _mask_source(root: Path) -> Path:
    """A manifest of two image + mask pairs (a JPEG and a PNG image), for a ``mask`` database."""
    rng = np.random.default_rng(31)
    root.mkdir(parents=True)
    rows = []
    for i, ext in enumerate(("jpg", "png")):
        photo(rng, 36, 28).save(root / f"img{i}.{ext}")
        Image.fromarray(rng.integers(0, 4, (28, 36), dtype=np.uint8), mode="L").save(root / f"mask{i}.png")
        rows.append((f"img{i}.{ext}", f"mask{i}.png"))
    with open(root / "pairs.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([("path", "mask"), *rows])
    return root / "pairs.csv"


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("damaged")
    source = _source(root / "src")
    found = {storage: build(source, root / f"{storage}.lmdb", storage=storage, workers=0, progress=False).path
             for storage in ("auto", "encoded", "decoded")}
    found["mask"] = build(_mask_source(root / "seg"), root / "mask.lmdb", workers=0, progress=False).path
    codecs = {name: set(database.load_meta(path).codecs.tolist()) for name, path in found.items()}
    assert codecs["auto"] == {codec.JPEG, codec.ZSTD_PIXELS} and codecs["encoded"] == {codec.JPEG, codec.PNG}
    assert codecs["decoded"] == {codec.PIXELS}
    return found


def _value_spans(db: Path) -> list[tuple[int, int]]:
    """``(file offset, length)`` of each record's value in the file (from its B-tree node, as block reads find it)."""
    count = database.load_meta(db).count
    opened = envs.shared(db)
    try:
        psize = opened.env.stat()["psize"]
        with opened.env.begin(buffers=True) as txn:
            cursor = txn.cursor(db=opened.records)
            spans = [blockread._locate(cursor, row, psize, opened.identity[2]) for row in range(count)]
    finally:
        envs.close(db)
    assert all(span is not None for span in spans)
    return spans  # type: ignore[return-value]


def _flipped(db: Path, out: Path, row: int, byte: int, bit: int) -> Path:
    """A copy of ``db`` with one bit flipped in record ``row``'s value, in place in the file (checked to be the value's byte)."""
    data = bytearray(db.read_bytes())
    offset, length = _value_spans(db)[row]
    _, values = read_records(db)
    assert bytes(data[offset : offset + length]) == values[row] and 0 <= byte < length
    data[offset + byte] ^= 1 << bit
    out.write_bytes(bytes(data))
    return out


def _pixels(sample: tuple) -> list[np.ndarray]:
    image, target = sample
    return [np.asarray(image), np.asarray(target)] if hasattr(target, "numpy") else [np.asarray(image)]  # a mask: a tensor


def _read_in_child(path: Path, row: int, expected: list[np.ndarray]) -> list[str]:
    """Read record ``row`` of ``path`` in a forked child, through the dataset and through block reads: each read's outcome,
    ``"same"`` (the undamaged pixels), ``"refused"`` (a project error), ``"WRONG"`` (other pixels), ``"FOREIGN ..."`` or
    ``"SIGNAL n"``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            outcomes = []
            for blocks in (False, True):
                try:
                    dataset = LMDBImageDataset(path, readahead=not blocks)
                    if blocks:
                        dataset.read_blocks(True, block_size=2)
                    got = _pixels(dataset[row])
                    same = len(got) == len(expected) and all(g.shape == e.shape and np.array_equal(g, e) for g, e in zip(got, expected))
                    outcomes.append("same" if same else "WRONG")
                except LightningLMDBError:
                    outcomes.append("refused")
                except BaseException as exc:  # noqa: BLE001 - what the sweep counts
                    outcomes.append(f"FOREIGN {type(exc).__name__}: {str(exc)[:200]}")
            os.write(write_end, json.dumps(outcomes).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as handle:
        text = handle.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return [f"SIGNAL {os.WTERMSIG(status)}"]
    return json.loads(text) if text else [f"FOREIGN child exit {os.WEXITSTATUS(status)}"]


def _flips(db: Path, seed: int) -> list[tuple[int, int, int]]:
    """A fixed, seeded list of ``(row, byte, bit)`` single-bit flips inside the records of ``db``: two anywhere in each value;
    and at each header (the value's start; a mask record's image value and mask value) two in its first 24 bytes (a pixel or
    mask header, then a zstd frame header) and one in the top byte of each of its height and width (an allocation of GiBs)."""
    rng = random.Random(seed)
    _, values = read_records(db)
    mask_db = database.load_meta(db).target_kind == "mask"
    flips = []
    for row, value in enumerate(values):
        flips += [(row, rng.randrange(len(value)), rng.randrange(8)) for _ in range(2)]
        for head in (4, 4 + struct.unpack_from("<I", value)[0]) if mask_db else (0,):
            flips += [(row, rng.randrange(head, min(head + 24, len(value))), rng.randrange(8)) for _ in range(2)]
            flips += [(row, head + top, rng.randrange(8)) for top in (3, 7)]
    return flips


@pytest.mark.slow
def test_single_bit_flips_in_records_are_never_served_as_wrong_pixels(databases: dict[str, Path], tmp_path: Path) -> None:
    outcomes: dict[str, int] = {}
    bad = []
    for seed, (name, db) in enumerate(sorted(databases.items())):
        clean = LMDBImageDataset(db)
        expected = [_pixels(clean[i]) for i in range(len(clean))]
        codecs = database.load_meta(db).codecs
        envs.close_all()
        for row, byte, bit in _flips(db, seed):
            damaged = _flipped(db, tmp_path / f"{name}-{row}-{byte}-{bit}.lmdb", row, byte, bit)
            got = _read_in_child(damaged, row, expected[row])
            for outcome in got:
                outcomes[outcome.split(":")[0]] = outcomes.get(outcome.split(":")[0], 0) + 1
                checked = name == "mask" or codecs[row] != codec.ZSTD_PIXELS  # else its frame's checksum may be relied on
                if outcome not in ("same", "refused") or (checked and outcome != "refused"):  # a 32-bit check misses one flip in 2**32
                    bad.append(f"{name} record {row} ({codec.RECORD_CODECS[codecs[row]].name}) byte {byte} bit {bit}: {outcome}")
            damaged.unlink()
    assert not bad, f"{len(bad)} damaged reads served or crashed ({outcomes}):\n" + "\n".join(bad)
    assert outcomes.get("refused", 0) >= 60, outcomes


# --- each read path, one flip each (no fork) ---------------------------------------------------------------------------


def _first(db: Path, wanted: int) -> int:
    return int(np.flatnonzero(database.load_meta(db).codecs == wanted)[0])


def test_a_flipped_jpeg_record_is_refused_naming_it_and_what_to_do(databases: dict[str, Path], tmp_path: Path) -> None:
    db = databases["auto"]
    row = _first(db, codec.JPEG)
    damaged = _flipped(db, tmp_path / "jpeg.lmdb", row, len(read_records(db)[1][row]) // 2, 3)
    dataset = LMDBImageDataset(damaged)
    with pytest.raises(DatabaseError) as info:
        dataset[row]
    message = str(info.value)
    assert f"[{row}]" in message and dataset.paths[row] in message and str(damaged) in message
    assert "does not match its checksum (xxh3-64)" in message and f"lightning-lmdb verify {damaged}" in message
    assert "rebuild" in message
    assert dataset[(row + 1) % len(dataset)] is not None, "the other records are still served"


@pytest.mark.parametrize(("storage", "wanted"), [("encoded", codec.PNG), ("decoded", codec.PIXELS)])
def test_flipped_png_and_pixel_records_are_refused(databases: dict[str, Path], tmp_path: Path, storage: str, wanted: int) -> None:
    db = databases[storage]
    row = _first(db, wanted)
    damaged = _flipped(db, tmp_path / "flip.lmdb", row, len(read_records(db)[1][row]) - 1, 0)  # the last byte: pixels, or PNG's IEND CRC
    with pytest.raises(DatabaseError, match="does not match its checksum"):
        LMDBImageDataset(damaged, decoder="opencv")[row]


def test_block_reads_refuse_a_flipped_record(databases: dict[str, Path], tmp_path: Path) -> None:
    db = databases["auto"]
    row = _first(db, codec.JPEG)
    damaged = _flipped(db, tmp_path / "blocks.lmdb", row, 40, 5)
    blockread.reset_counters()
    dataset = LMDBImageDataset(damaged, readahead=False).read_blocks(True, block_size=len(read_records(db)[1]))
    with pytest.raises(DatabaseError, match="does not match its checksum"):
        dataset[row]
    assert blockread.counters().blocks_read == 1, "the sample was read through a block read"


def test_a_flipped_jpeg_is_refused_before_it_is_deferred_to_the_batched_decode(databases: dict[str, Path], tmp_path: Path) -> None:
    db = databases["auto"]
    row = _first(db, codec.JPEG)
    dataset = LMDBImageDataset(db, ResizedCrop(16, train=False))
    dataset.set_decoding(defer_jpeg=True)
    assert isinstance(dataset[row][0], Deferred), "an undamaged JPEG is deferred"
    damaged = LMDBImageDataset(_flipped(db, tmp_path / "defer.lmdb", row, 60, 1), ResizedCrop(16, train=False))
    damaged.set_decoding(defer_jpeg=True)
    with pytest.raises(DatabaseError, match="does not match its checksum"):
        damaged[row]


def test_a_flipped_mask_record_is_refused(databases: dict[str, Path], tmp_path: Path) -> None:
    db = databases["mask"]
    value = read_records(db)[1][0]
    mask_start = 4 + struct.unpack_from("<I", value)[0]
    for at, name in ((0, "length"), (mask_start + 30, "mask")):  # the record's image length field; the mask's zstd frame
        damaged = _flipped(db, tmp_path / f"{name}.lmdb", 0, at, 2)
        with pytest.raises(DatabaseError, match="does not match its checksum"):
            LMDBImageDataset(damaged)[0]
        envs.close_all()


# --- fault 5: a pixel or mask header is checked against its zstd frame before anything is allocated ------------------


def test_a_zstd_pixel_header_is_checked_against_its_frame_before_allocating() -> None:
    pixels = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    value = bytearray(codec.encode_zstd_pixels(pixels))
    value[3] ^= 0x40  # height 5 -> 2**30 + 5: 33 GiB for numpy before the frame was looked at
    with pytest.raises(RecordError, match="header says .* but its zstd frame holds 105 bytes"):
        codec.decode_zstd_pixels(bytes(value))
    value[3] ^= 0x40
    value[12 + 4] &= ~0x04  # the frame header no longer declares its content checksum
    with pytest.raises(RecordError, match="no content checksum"):
        codec.decode_zstd_pixels(bytes(value))


def test_a_mask_header_is_checked_against_its_frame_before_allocating() -> None:
    value = bytearray(masks.encode_mask(np.ones((6, 9), np.uint8)))
    value[7] ^= 0x80  # width 9 -> 2**31 + 9: 512 TiB with a 2-byte value
    with pytest.raises(RecordError, match="its zstd frame holds 54 bytes"):
        masks.decode_mask(bytes(value))


def test_a_flipped_zstd_pixel_header_is_a_database_error(databases: dict[str, Path], tmp_path: Path) -> None:
    db = databases["auto"]
    row = _first(db, codec.ZSTD_PIXELS)
    damaged = _flipped(db, tmp_path / "header.lmdb", row, 3, 6)
    with pytest.raises(DatabaseError, match=r"damaged: Compressed-pixel record's header says .*lightning-lmdb verify"):
        LMDBImageDataset(damaged)[row]


# --- older databases (blake2b-64) are still read and checked with theirs ----------------------------------------------


def _to_legacy(db: Path, out: Path | None = None) -> Path:
    """A copy of ``db`` (``None``: ``db`` itself) whose checksums and header are what a build before ``xxh3-64`` wrote
    (``blake2b-64``)."""
    if out is None:
        out = db
    else:
        shutil.copyfile(db, out)
    meta = database.load_meta(out, arrays=True)
    _, values = read_records(out)
    digests = np.frombuffer(b"".join(fmt.checksum(v, fmt.LEGACY_CHECKSUM_ALGO) for v in values), np.uint8).reshape(-1, 8)
    envs.close_all()
    env = lmdb.open(str(out), subdir=False, max_dbs=3, lock=False)
    with env.begin(write=True) as txn:
        fmt.write_meta(txn, dataclasses.replace(meta, checksum=fmt.LEGACY_CHECKSUM_ALGO, checksums=digests))
    env.close()
    return out


def test_an_older_blake2b_database_is_read_and_checked_with_its_algorithm(databases: dict[str, Path], tmp_path: Path) -> None:
    db = databases["auto"]
    legacy = _to_legacy(db, tmp_path / "legacy.lmdb")
    meta = database.load_meta(legacy, arrays=True)
    assert meta.checksum == "blake2b-64" and meta.checksums.tobytes() != database.load_meta(db, arrays=True).checksums.tobytes()
    assert meta.read_checks.tobytes() == meta.checksums[:, :4].tobytes(), "a read compares half the digest"
    assert verify_lmdb(legacy).ok
    clean = LMDBImageDataset(legacy)
    assert all(np.array_equal(np.asarray(clean[i][0]), np.asarray(LMDBImageDataset(db)[i][0])) for i in range(len(clean)))
    row = _first(db, codec.JPEG)
    damaged = _flipped(legacy, tmp_path / "legacy-flip.lmdb", row, 50, 4)
    with pytest.raises(DatabaseError, match=r"does not match its checksum \(blake2b-64\)"):
        LMDBImageDataset(damaged)[row]
    assert not verify_lmdb(damaged).ok


def test_an_unknown_checksum_algorithm_is_refused_naming_the_field(databases: dict[str, Path], tmp_path: Path) -> None:
    out = shutil.copyfile(databases["auto"], tmp_path / "newer.lmdb")
    meta = database.load_meta(out, arrays=True)
    envs.close_all()
    env = lmdb.open(str(out), subdir=False, max_dbs=3, lock=False)
    with env.begin(write=True) as txn:
        fmt.write_meta(txn, dataclasses.replace(meta, checksum="xxh128"))
    env.close()
    with pytest.raises(DatabaseError, match=r"field 'checksum' is 'xxh128', not one of .*upgrade"):
        LMDBImageDataset(out)


def test_a_sharded_database_checks_each_shard_with_its_algorithm(tmp_path: Path) -> None:
    folder = build(_source(tmp_path / "src"), tmp_path / "sharded", shards=2, workers=0, progress=False).path
    shard_parts = database.open_database(folder)[1]
    assert [p.checksum for p in shard_parts] == ["xxh3-64", "xxh3-64"]
    row = database.load_meta(folder).count - 1  # a/photo2.jpg, in the second shard
    assert database.load_meta(folder).codecs[row] == codec.JPEG
    local = row - shard_parts[1].offset
    shard = Path(shard_parts[1].path)
    data = bytearray(shard.read_bytes())
    offset, _ = _value_spans(shard)[local]
    data[offset + 20] ^= 0x10
    shard.write_bytes(bytes(data))
    envs.close_all()
    with pytest.raises(DatabaseError, match=r"photo2.jpg\) \(in its shard .*shard-00001-of-00002.lmdb'\) is damaged: it does not match"):
        LMDBImageDataset(folder)[row]


def test_a_sharded_database_resumed_across_the_change_checks_each_shard_with_its_own(tmp_path: Path) -> None:
    folder = build(_source(tmp_path / "src"), tmp_path / "sharded", shards=2, workers=0, progress=False).path
    part = database.open_database(folder)[1][1]  # the photos (JPEG records); shard 0 holds the icons (zstd pixels)
    second = Path(part.path)
    _to_legacy(second)  # as a build before xxh3-64 wrote it; the manifest records its new header digest
    manifest = json.loads((folder / "manifest.json").read_text())
    with envs.reading(second) as opened, opened.env.begin() as txn:
        manifest["shards"][1]["digest"] = fmt.header_digest(txn)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    envs.close_all()
    assert [p.checksum for p in database.open_database(folder)[1]] == ["xxh3-64", "blake2b-64"]
    assert verify_lmdb(folder).ok
    dataset = LMDBImageDataset(folder)
    assert all(dataset[i] is not None for i in range(len(dataset))), "each shard's records pass under their own algorithm"
    local = _first(second, codec.JPEG)
    data = bytearray(second.read_bytes())
    data[_value_spans(second)[local][0] + 33] ^= 0x08
    second.write_bytes(bytes(data))
    envs.close_all()
    with pytest.raises(DatabaseError, match=r"shard-00001-of-00002.lmdb'\) is damaged: it does not match its checksum \(blake2b-64\)"):
        LMDBImageDataset(folder)[part.offset + local]


# --- resume of a partial build begun before xxh3-64 ------------------------------------------------------------------


def test_a_partial_build_begun_with_blake2b_resumes_into_xxh3_checksums(tmp_path: Path) -> None:
    source = _source(tmp_path / "src")
    (source / "a" / "zz_bad.jpg").write_bytes(b"not a jpeg")  # the last file: the build stops there, the rest committed
    target = tmp_path / "out.lmdb"
    with pytest.raises(BuildError):
        build(source, target, workers=0, progress=False)
    partial = fmt.partial_path(target)
    env = lmdb.open(str(partial), subdir=False, max_dbs=3, lock=False)
    with env.begin(write=True) as txn:  # what an earlier version left: blake2b entries, no "checksum" in the progress
        records, entries = env.open_db(fmt.RECORDS_DB, txn=txn), env.open_db(fmt.CHECKSUMS_DB, txn=txn)
        rewritten = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=entries)]
        assert len(rewritten) == 6
        for key, entry in rewritten:
            txn.put(key, fmt.checksum(txn.get(key, db=records), fmt.LEGACY_CHECKSUM_ALGO) + entry[fmt.CHECKSUM_SIZE:], db=entries)
        progress = json.loads(txn.get(fmt.PROGRESS_KEY))
        progress.pop("checksum", None)
        txn.put(fmt.PROGRESS_KEY, fmt.dump_json(progress))
    env.close()
    photo(np.random.default_rng(1), 30, 30).save(source / "a" / "zz_bad.jpg")
    report = build(source, target, workers=0, progress=False)
    assert report.action == "resumed" and report.records_written == 1 and report.count == 7
    meta = database.load_meta(target, arrays=True)
    _, values = read_records(target)
    assert meta.checksum == "xxh3-64" and [row.tobytes() for row in meta.checksums] == [fmt.checksum(v) for v in values]
    assert verify_lmdb(target).ok
