"""Shards cut by the work they hold: the estimate, the cut's balance and determinism, its record, and a restart of another cut."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from imagegen import make_jpegs, photo, save_image
from PIL import Image

from lightning_lmdb.build import workcut
from lightning_lmdb.build.writer import build, build_lmdb
from lightning_lmdb.sources.folder import scan_folder
from lightning_lmdb.store import shards


def _mixed_folder(root: Path) -> Path:
    """Small noise PNGs (decoded ~1x their file) in class ``a``, then photo-like JPEGs (decoded ~10x) in class ``b``."""
    rng = np.random.default_rng(0)
    for i in range(60):
        save_image(Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)), root / "a" / f"icon_{i:03d}.png")
    for i in range(40):
        save_image(photo(rng, 256, 192), root / "b" / f"photo_{i:03d}.jpg")
    return root


def _shard_works(works: list[int], ranges: list[tuple[int, int]]) -> list[int]:
    return [sum(works[start:stop]) for start, stop in ranges]


def test_decoded_shards_hold_even_estimated_work_where_a_byte_cut_would_not(tmp_path: Path) -> None:
    scan = scan_folder(_mixed_folder(tmp_path / "src"))
    works = workcut.scan_works(scan.files, "decoded", None)
    ranges = workcut.work_ranges(scan, "decoded", None, 2)
    held = _shard_works(works, ranges)
    assert max(held) <= 1.10 * min(held), held
    by_bytes = _shard_works(works, shards.shard_ranges([f.size for f in scan.files], 2))
    assert max(by_bytes) > 1.5 * min(by_bytes), f"the byte cut was balanced here too ({by_bytes}): this test would not fail"
    # the estimate follows the pixels: a 256x192 JPEG is 8 * 49152 byte-equivalents beyond its bytes
    jpeg = next(f for f in scan.files if f.relpath.endswith(".jpg"))
    assert works[scan.files.index(jpeg)] == workcut.FILE_WORK + jpeg.size + workcut.PIXEL_COST * 256 * 192


def test_the_cut_is_the_same_in_every_computation(tmp_path: Path) -> None:
    source = _mixed_folder(tmp_path / "src")
    for storage, resize in (("decoded", None), ("auto", None), ("encoded", None), ("encoded", 16)):
        first = workcut.work_ranges(scan_folder(source), storage, resize, 3)
        assert workcut.work_ranges(scan_folder(source), storage, resize, 3) == first


def test_kept_files_count_their_bytes_and_decoded_ones_their_pixels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scan = scan_folder(_mixed_folder(tmp_path / "src"))
    png, jpeg = scan.files[0], scan.files[-1]
    sizes = {f.path: f.size + workcut.FILE_WORK for f in scan.files}
    auto = dict(zip([f.path for f in scan.files], workcut.scan_works(scan.files, "auto", None), strict=True))
    assert auto[jpeg.path] == sizes[jpeg.path], "auto keeps a JPEG's bytes"
    assert auto[png.path] == sizes[png.path] + workcut.PIXEL_COST * 64 * 64, "auto stores a PNG's pixels"
    resized = dict(zip([f.path for f in scan.files], workcut.scan_works(scan.files, "encoded", 100), strict=True))
    assert resized[png.path] == sizes[png.path] and resized[jpeg.path] > sizes[jpeg.path], "resize=100 shrinks the JPEGs only"
    monkeypatch.setattr(workcut, "header_info", lambda path: pytest.fail("encoded without resize reads no header"))
    assert workcut.scan_works(scan.files, "encoded", None) == [sizes[f.path] for f in scan.files]


def test_headers_are_read_beyond_the_first_bytes_and_a_damaged_one_counts_its_bytes(tmp_path: Path) -> None:
    big_exif = Image.Exif()
    big_exif[0x010E] = "x" * (2 * workcut.HEADER_BYTES)  # ImageDescription: the frame header comes after it
    path = tmp_path / "late.jpg"
    photo(np.random.default_rng(1), 40, 30).save(path, exif=big_exif)
    gif = tmp_path / "g.gif"
    Image.new("P", (33, 7)).save(gif)
    assert workcut.header_info(path).pixels == 40 * 30 and workcut.header_info(gif).pixels == 33 * 7
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image at all")
    assert workcut.header_info(broken) is None and workcut.header_info(tmp_path / "gone.png") is None
    assert workcut.file_work(19, None, "decoded", None) == 19 + workcut.FILE_WORK
    assert workcut.file_work(10, workcut.header_info(gif), "decoded", None) == 10 + workcut.FILE_WORK + 8 * 33 * 7


def test_the_cut_is_recorded_in_the_shards_and_the_manifest(tmp_path: Path) -> None:
    source = _mixed_folder(tmp_path / "src")
    folder = build_lmdb(source, tmp_path / "db.lmdb", shards=2, storage="decoded", workers=0, progress=False)
    ranges = workcut.work_ranges(scan_folder(source), "decoded", None, 2)
    manifest = json.loads((folder / shards.MANIFEST_NAME).read_text())
    assert manifest["cut"] == {"method": "work", "bounds": [0, ranges[1][0], 100]}
    assert [(m.shard.cut, m.shard.start, m.shard.stop) for m in map(shards.load_meta, shards.database_files(folder))] == [
        ("work", *r) for r in ranges]
    assert ranges != shards.shard_ranges([f.size for f in scan_folder(source).files], 2)
    one = build_lmdb(source, tmp_path / "one.lmdb", storage="decoded", workers=0, progress=False)
    a, b = shards.load_meta(one, arrays=True), shards.load_meta(folder, arrays=True)
    assert a.count == b.count and (a.checksums == b.checksums).all() and a.paths.tolist() == b.paths.tolist()


def _byte_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this library cut as the ones before the work cut did: by source bytes, recorded as no method at all."""
    monkeypatch.setattr(workcut, "work_ranges", lambda scan, storage, resize, k: shards.shard_ranges([f.size for f in scan.files], k))
    monkeypatch.setattr(shards, "CUT_METHOD", "bytes")


def test_a_partial_build_cut_by_bytes_is_restarted_not_merged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    source = _mixed_folder(tmp_path / "src")
    folder = tmp_path / "db.lmdb"
    with monkeypatch.context() as patch:
        _byte_cut(patch)
        build(source, folder, shards=2, shard=0, storage="decoded", workers=0, progress=False)  # a job array's first task
    (folder / "cut.json").unlink()  # builds before the work cut wrote none
    old = shards.load_meta(folder / shards.shard_name(0, 2)).shard
    assert old.cut == "bytes"
    (folder / (shards.shard_name(1, 2) + ".partial")).write_bytes(b"a partial file of the old cut")
    with caplog.at_level(logging.WARNING):
        report = build(source, folder, shards=2, storage="decoded", workers=0, progress=False)
    assert "cut by source bytes (no recorded method)" in caplog.text and "restarting it" in caplog.text
    assert report.action == "built" and report.records_written == 100, "both shards built from the start"
    metas = [shards.load_meta(p) for p in shards.database_files(folder)]
    assert [m.shard.cut for m in metas] == ["work", "work"] and metas[0].shard.stop != old.stop
    assert json.loads((folder / shards.MANIFEST_NAME).read_text())["cut"]["method"] == "work"


def test_a_finished_database_cut_by_bytes_still_opens_and_is_not_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _mixed_folder(tmp_path / "src")
    folder = tmp_path / "db.lmdb"
    with monkeypatch.context() as patch:
        _byte_cut(patch)
        build(source, folder, shards=2, storage="decoded", workers=0, progress=False)
    (folder / "cut.json").unlink()
    manifest = json.loads((folder / shards.MANIFEST_NAME).read_text())
    assert manifest.pop("cut")["method"] == "bytes"
    (folder / shards.MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")  # as builds before the work cut wrote it
    stamps = [p.stat().st_mtime_ns for p in shards.database_files(folder)]
    meta, parts = shards.open_database(folder)
    assert meta.count == 100 and len(parts) == 2
    report = build(source, folder, shards=2, storage="decoded", workers=0, progress=False)
    assert report.action == "up-to-date" and report.records_written == 0
    assert [p.stat().st_mtime_ns for p in shards.database_files(folder)] == stamps


def test_shards_of_two_cuts_are_not_joined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_jpegs(tmp_path / "src", 8, size=16)
    folder = tmp_path / "db.lmdb"
    with monkeypatch.context() as patch:
        _byte_cut(patch)
        build(source, folder, shards=2, shard=0, workers=0, progress=False)
    build(source, tmp_path / "new.lmdb", shards=2, shard=1, workers=0, progress=False)
    (tmp_path / "new.lmdb" / shards.shard_name(1, 2)).rename(folder / shards.shard_name(1, 2))
    with pytest.raises(shards.fmt.DatabaseError, match="cut by 'work', shard 0 by 'bytes'"):
        shards.finalize(folder)
