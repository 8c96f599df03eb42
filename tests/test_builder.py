"""The builder: scan parity, record contents, map growth, errors, staleness, idempotence."""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import signal
import warnings
from pathlib import Path

import numpy as np
import pytest
from imagegen import MODE_FILES, bomb_png, make_jpegs, read_records, truncated_jpeg
from PIL import Image
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import pil_loader

from lightning_lmdb.build import onefile as filebuild
from lightning_lmdb.build import writer
from lightning_lmdb.build.writer import BuildError, StaleDatabaseError, build, build_lmdb
from lightning_lmdb.codec.storage import decode_pixels
from lightning_lmdb.sources.folder import NO_TARGET, scan_folder
from lightning_lmdb.store import envs
from lightning_lmdb.store import format as fmt


def test_scan_equals_imagefolder(image_folder: Path) -> None:
    (image_folder / "dog" / "nested").mkdir()
    Image.new("RGB", (5, 5)).save(image_folder / "dog" / "nested" / "deep.png")
    scan = scan_folder(image_folder)
    reference = ImageFolder(image_folder)
    assert scan.classes == reference.classes
    assert scan.class_to_idx == reference.class_to_idx
    assert [(f.path, f.target) for f in scan.files] == reference.samples
    assert any(not f.relpath.isascii() for f in scan.files)


def test_flat_folder_has_no_labels(tmp_path: Path) -> None:
    for i, name in enumerate(["b.png", "a.jpg", "ü.png"]):
        Image.new("RGB", (4, 4), (i, 0, 0)).save(tmp_path / name)
    (tmp_path / "readme.txt").write_text("x")
    scan = scan_folder(tmp_path)
    assert scan.classes == []
    assert [f.relpath for f in scan.files] == ["a.jpg", "b.png", "ü.png"]
    assert {f.target for f in scan.files} == {NO_TARGET}


def test_encoded_records_are_the_source_bytes(image_folder: Path, tmp_path: Path) -> None:
    target = build_lmdb(image_folder, tmp_path / "out.lmdb", storage="encoded", workers=2, progress=False)
    meta, values = read_records(target)
    reference = ImageFolder(image_folder)
    assert meta["count"] == len(values) == len(reference)
    assert meta["targets"] == reference.targets
    assert meta["classes"] == reference.classes
    for (path, _), relpath, value, digest in zip(reference.samples, meta["paths"], values, meta["checksums"]):
        assert Path(path).relative_to(image_folder).as_posix() == relpath
        assert value == Path(path).read_bytes()
        assert fmt.checksum(value).hex() == digest
    assert {Path(p).suffix for p in meta["paths"]} >= {ext for _, _, ext in MODE_FILES}


def test_decoded_records_are_imagefolder_pixels(image_folder: Path, tmp_path: Path) -> None:
    target = build_lmdb(image_folder, tmp_path / "out.lmdb", storage="decoded", workers=0, progress=False)
    meta, values = read_records(target)
    assert meta["storage"] == "decoded"
    modes = set()
    for relpath, value in zip(meta["paths"], values):
        with Image.open(image_folder / relpath) as img:
            modes.add(img.mode)
        expected = np.asarray(pil_loader(image_folder / relpath))
        np.testing.assert_array_equal(decode_pixels(value), expected)
    assert modes >= {"RGB", "L", "LA", "P", "RGBA", "CMYK", "I;16", "1"}


def test_map_grows_from_a_tiny_map_and_file_is_not_preallocated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_jpegs(tmp_path / "src", 60, size=64)
    monkeypatch.setattr(writer._Writer, "_initial_map_size", lambda self: 32 * 1024)
    target = build_lmdb(source, tmp_path / "out.lmdb", workers=0, commit_every=10, progress=False)
    env = envs.open_env(target)
    map_size = env.info()["map_size"]  # LMDB keeps the last map size in the file's meta page
    env.close()
    assert map_size > 32 * 1024, "the map never had to grow"
    _, values = read_records(target)
    assert values == [Path(f.path).read_bytes() for f in scan_folder(source).files]
    payload = sum(len(v) for v in values)
    assert payload > 4 * 32 * 1024
    assert target.stat().st_size < map_size, "the file should not be preallocated to the map size"
    assert target.stat().st_size <= 1.6 * payload + 64 * 1024


def test_rebuild_is_a_noop_when_up_to_date(image_folder: Path, tmp_path: Path) -> None:
    first = build(image_folder, tmp_path / "out.lmdb", workers=0, progress=False)
    stamp = first.path.stat().st_mtime_ns
    second = build(image_folder, tmp_path / "out.lmdb", workers=0, progress=False)
    assert (first.action, second.action, second.records_written) == ("built", "up-to-date", 0)
    assert first.path.stat().st_mtime_ns == stamp
    forced = build(image_folder, tmp_path / "out.lmdb", workers=0, progress=False, overwrite=True)
    assert forced.action == "built" and forced.records_written == first.count


def test_stale_source_is_detected(image_folder: Path, tmp_path: Path) -> None:
    target = tmp_path / "out.lmdb"
    count = build(image_folder, target, workers=0, progress=False).count
    victim = image_folder / "cat" / "rgb_010.jpg"
    Image.new("RGB", (9, 9), "red").save(victim)
    with pytest.raises(StaleDatabaseError, match="changed"):
        build(image_folder, target, workers=0, progress=False, on_stale="error")
    assert build(image_folder, target, workers=0, progress=False, on_stale="ignore").action == "up-to-date"
    rebuilt = build(image_folder, target, workers=0, progress=False)
    assert rebuilt.action == "built" and rebuilt.count == count
    Image.new("RGB", (9, 9), "blue").save(image_folder / "dog" / "new.png")
    with pytest.raises(StaleDatabaseError, match="1 files added"):
        build(image_folder, target, workers=0, progress=False, on_stale="error")
    assert build(image_folder, target, workers=0, progress=False).count == count + 1
    with pytest.raises(StaleDatabaseError, match="other options"):
        build(image_folder, target, workers=0, progress=False, on_stale="error", storage="decoded")


def _add_bad_files(source: Path) -> dict[str, str]:
    bad = {
        "c0/x_corrupt.jpg": "corrupt or truncated",
        "c0/x_empty.png": "empty",
        "c1/x_text.jpg": "not an image",
        "c1/x_bomb.png": "exceeds the limit",
    }
    (source / "c0" / "x_corrupt.jpg").write_bytes(truncated_jpeg())
    (source / "c0" / "x_empty.png").write_bytes(b"")
    (source / "c1" / "x_text.jpg").write_text("hello, I am not a JPEG")
    (source / "c1" / "x_bomb.png").write_bytes(bomb_png())
    return bad


def test_bad_files_raise_naming_the_file(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 10)
    for relpath, reason in _add_bad_files(source).items():
        single = make_jpegs(tmp_path / f"one_{Path(relpath).stem}", 4)
        shutil.copy(source / relpath, single / relpath)
        with pytest.raises(BuildError, match=reason) as excinfo:
            build_lmdb(single, tmp_path / f"{Path(relpath).stem}.lmdb", workers=0, progress=False)
        assert str(single / relpath) in str(excinfo.value)
        assert "on_error='skip'" in str(excinfo.value)
        assert not (tmp_path / f"{Path(relpath).stem}.lmdb").exists()


def test_a_discarded_partial_build_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source, target = make_jpegs(tmp_path / "src", 3, size=8), tmp_path / "out.lmdb"
    (source / "c0" / "a_text.jpg").write_text("not a JPEG")  # the first file: the build fails before its first commit

    def discarded() -> str:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="lightning_lmdb.build.onefile"), pytest.raises(BuildError, match="a_text.jpg"):
            build_lmdb(source, target, workers=0, progress=False, **options)
        return next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Discarding"))

    options: dict = {}
    with pytest.raises(BuildError):
        build_lmdb(source, target, workers=0, progress=False)
    assert discarded().endswith("out.lmdb.partial: it holds no progress (the build before stopped before its first commit); "
                                "building from the start.")  # the same build again: no other source, options or damage
    (source / "c0" / "a_text.jpg").rename(source / "c1" / "z_text.jpg")  # now the last file: 3 files are committed first
    with pytest.raises(BuildError):
        build_lmdb(source, target, workers=0, progress=False)
    (source / "c1" / "z_text.jpg").rename(source / "c0" / "a_text.jpg")
    options = {"storage": "decoded"}
    assert discarded().endswith(": it was started with other build options; building from the start.")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shard_count", [None, 2])
def test_builder_processes_end_under_a_parent_sigterm_handler_that_only_sets_a_flag(tmp_path: Path, shard_count: int | None) -> None:
    """Readers and shard processes forked from a process whose SIGTERM handler does not exit (Lightning's sets a flag)
    still end when the build stops them early: the build raises instead of waiting for them forever."""
    source = make_jpegs(tmp_path / "src", 40)
    (source / "c0" / "img_00000.jpg").write_bytes(b"not an image")  # the first file: the pool stops at once, readers busy
    flagged: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: flagged.append(signum))
    try:
        with pytest.raises(BuildError, match="img_00000.jpg"):
            build(source, tmp_path / "out.lmdb", workers=2, progress=False, shards=shard_count, commit_every=2)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert flagged == [], "the SIGTERMs went to the builder's processes, not to this one"


def test_reader_processes_start_with_sigterms_default_action() -> None:
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as Lightning's flag-setting handler
    try:
        with multiprocessing.get_context("fork").Pool(1, initializer=writer._start_reader) as pool:
            assert pool.apply(signal.getsignal, (signal.SIGTERM,)) == signal.SIG_DFL, "a reader that a terminate() cannot end"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_bad_files_are_skipped_and_recorded(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 10)
    bad = _add_bad_files(source)
    target = tmp_path / "out.lmdb"
    with pytest.raises(BuildError):
        build(source, target, workers=2, progress=False)
    report = build(source, target, workers=2, progress=False, on_error="skip")
    assert report.action == "resumed", "switching to skip after an error should resume, not restart"
    assert report.count == 10 and report.records_written < 10
    assert {s.path: s.reason for s in report.skipped}.keys() == bad.keys()
    for skipped in report.skipped:
        assert bad[skipped.path] in skipped.reason
    meta, values = read_records(target)
    assert meta["skipped"] == [{"path": s.path, "reason": s.reason} for s in report.skipped]
    assert not set(meta["paths"]) & bad.keys()
    assert values == [(source / p).read_bytes() for p in meta["paths"]]


def test_pixel_limit_is_configurable(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 4, size=32)
    with pytest.raises(BuildError, match="1,024 pixels exceeds the limit of 1,000"):
        build_lmdb(source, tmp_path / "out.lmdb", workers=0, progress=False, max_pixels=1000)
    assert build(source, tmp_path / "out.lmdb", workers=0, progress=False, max_pixels=1024).count == 4


@pytest.mark.parametrize(
    ("setup", "error", "match"),
    [
        (lambda tmp: (tmp / "missing", tmp / "o.lmdb"), FileNotFoundError, "does not exist"),
        (lambda tmp: (tmp / "missing", tmp / "new" / "o.lmdb"), FileNotFoundError, "does not exist"),
        (lambda tmp: (tmp / "empty", tmp / "o.lmdb"), ValueError, "No images found"),
        (lambda tmp: (tmp / "textonly", tmp / "o.lmdb"), ValueError, "no valid file.*add images"),
        (lambda tmp: (tmp / "good", tmp / "good" / "o.lmdb"), ValueError, "inside the source"),
        (lambda tmp: (tmp / "good", tmp / "foreign.lmdb"), FileExistsError, "not a usable lightning_lmdb database"),
        (lambda tmp: (tmp / "good", tmp / "somedir"), FileExistsError, "folder"),
    ],
)
def test_clear_errors(tmp_path: Path, setup, error: type[Exception], match: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "textonly" / "a").mkdir(parents=True)
    (tmp_path / "textonly" / "a" / "x.txt").write_text("x")
    make_jpegs(tmp_path / "good", 2)
    (tmp_path / "foreign.lmdb").write_bytes(b"precious data that is not ours" * 100)
    (tmp_path / "somedir").mkdir()
    (tmp_path / "somedir" / "keep.txt").write_text("keep")
    source, target = setup(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(error, match=match):
        build_lmdb(source, target, workers=0, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "a refused build created something"
    assert (tmp_path / "foreign.lmdb").read_bytes() == b"precious data that is not ours" * 100
    assert (tmp_path / "somedir" / "keep.txt").read_text() == "keep"


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 3)
    (source / "c0" / "dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with pytest.raises(BuildError, match="dangling.jpg: cannot read the file"):
        build_lmdb(source, tmp_path / "o.lmdb", workers=0, progress=False)
    report = build(source, tmp_path / "o.lmdb", workers=0, progress=False, on_error="skip")
    assert [s.path for s in report.skipped] == ["c0/dangling.jpg"] and report.count == 3


def test_the_final_transaction_survives_a_full_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A map so small that the metadata transaction itself hits MapFullError and is retried after the map grows.
    source = make_jpegs(tmp_path / "src", 26, size=16)
    monkeypatch.setattr(filebuild, "_MIN_MAP_SIZE", 64 << 10)
    monkeypatch.setattr(writer._Writer, "_initial_map_size", lambda self: 64 << 10)
    report = writer.build(source, tmp_path / "out.lmdb", workers=0, progress=False)
    assert report.action == "built" and report.count == 26
    _, values = read_records(report.path)
    assert values == [Path(f.path).read_bytes() for f in scan_folder(source).files]


def _palette_icons(root: Path, count: int = 3) -> Path:
    """Palette PNGs whose transparency is a byte per palette entry (PIL warns when converting them to RGB), in one class."""
    rng = np.random.default_rng(0)
    for i in range(count):
        icon = Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).quantize(8)
        (root / "icons").mkdir(parents=True, exist_ok=True)
        icon.save(root / "icons" / f"icon_{i}.png", transparency=bytes([0, 128, 255, 64, 255, 255, 255, 255]))
    return root


PALETTE_WARNING = "Palette images with Transparency expressed in bytes"


def test_palette_transparency_builds_without_a_warning(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    source = _palette_icons(tmp_path / "src")
    assert isinstance(Image.open(source / "icons" / "icon_0.png").info["transparency"], bytes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = build(source, tmp_path / "inline.lmdb", workers=0, progress=False, storage="decoded")
    assert report.count == 3 and not [w for w in caught if PALETTE_WARNING in str(w.message)]
    build(source, tmp_path / "pool.lmdb", workers=2, progress=False)  # reader processes: their warnings go to stderr
    assert PALETTE_WARNING not in capfd.readouterr().err
    meta, values = read_records(report.path)
    with pytest.warns(UserWarning, match=PALETTE_WARNING):  # ImageFolder's loader still warns: the filter does not outlive the build
        expected = [np.asarray(pil_loader(str(source / p))).tolist() for p in meta["paths"]]
    assert [decode_pixels(v).tolist() for v in values] == expected  # ImageFolder's pixels


@pytest.mark.parametrize("bad", [1, 2])
def test_skipped_files_are_counted_in_words(tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: int) -> None:
    source = make_jpegs(tmp_path / "src", 4)
    for i in range(bad):
        (source / "c0" / f"bad_{i}.jpg").write_bytes(b"not a jpeg")
    with caplog.at_level(logging.WARNING, logger="lightning_lmdb.build.onefile"):
        build(source, tmp_path / "out.lmdb", workers=0, progress=False, on_error="skip")
    assert f"Skipped {bad} bad {'file' if bad == 1 else 'files'} while building" in caplog.text
    for path in (source / "c0").glob("bad_*.jpg"):
        path.unlink()
    (source / "c0" / "img_00001.jpg").write_bytes(b"not a jpeg")  # after img_00000.jpg: one file before it
    with pytest.raises(BuildError, match="the 1 file before it is committed"):
        build(source, tmp_path / "other.lmdb", workers=0, progress=False)
