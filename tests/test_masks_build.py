"""Segmentation masks, the build side: mask sources (a manifest's mask column, an images folder paired with ``masks_dir``),
records that hold an image and its mask, the metadata of their classes, bad masks, resume, staleness, verify and shards."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from imagegen import read_records
from PIL import Image

from lightning_lmdb.build.readers import find_bad_files, read_mask_targets
from lightning_lmdb.build.writer import FAULT_ENV, build, build_lmdb
from lightning_lmdb.codec import storage as codec
from lightning_lmdb.errors import BuildError, OptionError, SourceError
from lightning_lmdb.sources import masks
from lightning_lmdb.sources.base import Labels, SourceOptions, labels_of, scan_source
from lightning_lmdb.store import database, envs
from lightning_lmdb.store import format as fmt
from lightning_lmdb.tools import cli
from lightning_lmdb.tools.verify import describe_lmdb, verify_lmdb

#: The mask modes of the generated sets, cycled over the samples: palette, grey, 16-bit grey.
MASK_MODES = ("P", "L", "I;16")
IGNORE = masks.DEFAULT_IGNORE_INDEX


def _mask_values(mode: str, size: tuple[int, int], rng: np.random.Generator, top: int) -> np.ndarray:
    """Random class ids ``0..top`` with a band of ``ignore_index`` pixels (and, for 16-bit masks, a value above 255)."""
    width, height = size
    values = rng.integers(0, top + 1, (height, width))
    values[0, : width // 2] = IGNORE
    if mode == "I;16":
        values[-1, -1] = 300 + top
    return values.astype(np.uint16 if mode == "I;16" else np.uint8)


def _save_mask(values: np.ndarray, mode: str, path: Path) -> None:
    """Save ``values`` as a lossless mask of ``mode``; a palette mask gets a colourful palette, so no index equals its colour."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "P":
        image = Image.fromarray(values).convert("P")  # indices kept: a grey palette first
        assert np.array_equal(np.asarray(image), values)
        palette = np.random.default_rng(99).integers(0, 256, (256, 3), dtype=np.uint8)
        palette[:, 0] = (np.arange(256) * 7 + 31) % 256  # red never equals the index
        image.putpalette(palette.reshape(-1).tolist())
        image.save(path)
    else:
        Image.fromarray(values).save(path)


def _save_image(path: Path, size: tuple[int, int], rng: np.random.Generator) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = size
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, **({"quality": 90} if path.suffix == ".jpg" else {}))


def _pairs(images: Path, masks_root: Path, count: int = 9, seed: int = 0, top: int = 4) -> list[tuple[str, str]]:
    """``count`` images (PNG and JPEG, some in a subfolder) under ``images`` with masks of every mode under ``masks_root`` (same
    relative path, ``.png``; ``.tif`` for some 16-bit ones); their relative paths."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(count):
        mode = MASK_MODES[i % len(MASK_MODES)]
        stem = f"{'sub/' if i % 4 == 1 else ''}s{i:02d}"
        size = (12 + i, 9 + i % 4)
        image = f"{stem}{'.jpg' if i % 2 else '.png'}"
        mask = f"{stem}{'.tif' if mode == 'I;16' and i % 2 else '.png'}"
        _save_image(images / image, size, rng)
        _save_mask(_mask_values(mode, size, rng, top), mode, masks_root / mask)
        pairs.append((image, mask))
    return pairs


def _manifest(root: Path, rows: list[tuple[str, str]], name: str = "list.csv") -> Path:
    path = root / name
    path.write_text("path,mask\n" + "".join(f"{image},{mask}\n" for image, mask in rows), encoding="utf-8")
    return path


def _source_values(path: Path | str) -> np.ndarray:
    return np.asarray(Image.open(path))


def _records(target: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each record's (image RGB pixels, mask values), every shard of a sharded folder in order."""
    out = []
    meta, parts = database.open_database(target)
    for part in parts:
        with envs.reading(part.path) as opened, opened.env.begin(db=opened.records) as txn:
            for local in range(part.count):
                image, mask = masks.unpack(txn.get(fmt.record_key(local)))
                rgb = np.asarray(codec.decode_record(image, int(meta.codecs[part.offset + local])))
                out.append((rgb, masks.decode_mask(mask)))
    return out


def _present(values: np.ndarray, ignore: int = IGNORE) -> list[int]:
    return sorted(int(v) for v in np.unique(values) if v != ignore)


def _check_round_trip(target: Path, images: list[Path], mask_files: list[Path]) -> None:
    """Every stored mask equals its file's index values (and dtype), every image part its image's RGB pixels; the metadata's classes."""
    records = _records(target)
    assert len(records) == len(images)
    for (rgb, values), image, mask in zip(records, images, mask_files, strict=True):
        expected = _source_values(mask)
        assert values.dtype == (np.uint16 if expected.dtype.itemsize == 2 else np.uint8)
        np.testing.assert_array_equal(values, expected)
        np.testing.assert_array_equal(rgb, np.asarray(Image.open(image).convert("RGB")))
    meta = database.load_meta(target, arrays=True)
    present = [_present(_source_values(m)) for m in mask_files]
    top = max(max(p, default=-1) for p in present)
    assert meta.target_kind == "mask" and meta.ignore_index == IGNORE and meta.version == 3
    assert meta.classes == [str(k) for k in range(top + 1)]
    assert meta.target_table().tolist() == present


@pytest.mark.parametrize("storage", codec.STORAGES)
def test_a_manifest_with_a_mask_column_stores_every_mask_exactly(tmp_path: Path, storage: str) -> None:
    root = tmp_path / "data"
    pairs = _pairs(root / "images", root / "masks")
    manifest = _manifest(root, [(f"images/{i}", f"masks/{m}") for i, m in pairs])
    target = build_lmdb(manifest, tmp_path / "out.lmdb", storage=storage, workers=0, progress=False)

    _check_round_trip(target, [root / "images" / i for i, _ in pairs], [root / "masks" / m for _, m in pairs])
    meta = database.load_meta(target, arrays=True)
    assert meta.mask_paths is not None and meta.mask_paths.tolist() == [f"masks/{m}" for _, m in pairs]
    assert database.load_meta(target).mask_paths is None  # read only with the arrays
    info = describe_lmdb(target)
    assert (info["target_kind"], info["num_classes"], info["ignore_index"]) == ("mask", len(meta.classes), IGNORE)
    assert verify_lmdb(target, manifest).ok


def test_an_images_folder_paired_with_masks_dir(tmp_path: Path) -> None:
    pairs = _pairs(tmp_path / "images", tmp_path / "masks", count=8, seed=3)
    target = build_lmdb(tmp_path / "images", tmp_path / "out.lmdb", masks_dir=str(tmp_path / "masks"), workers=2, progress=False)

    ordered = sorted(pairs)  # the images' relative paths, sorted
    _check_round_trip(target, [tmp_path / "images" / i for i, _ in ordered], [tmp_path / "masks" / m for _, m in ordered])
    meta = database.load_meta(target, arrays=True)
    assert meta.paths is not None and meta.paths.tolist() == [i for i, _ in ordered]
    assert meta.mask_paths is not None and meta.mask_paths.tolist() == [str(tmp_path / "masks" / m) for _, m in ordered]  # outside the root
    report = verify_lmdb(target, tmp_path / "images", manifest=SourceOptions(masks_dir=str(tmp_path / "masks")))
    assert report.ok, report.problems
    files = [tmp_path / "images" / i for i, _ in ordered] + [tmp_path / "masks" / m for _, m in ordered]
    assert meta.source.bytes == sum(f.stat().st_size for f in files), "the source's bytes count the masks too"


def test_num_classes_classes_and_ignore_index_options(tmp_path: Path) -> None:
    pairs = _pairs(tmp_path / "images", tmp_path / "masks", count=6, top=3)
    files = [tmp_path / "masks" / m for _, m in pairs]
    top = max(max(_present(_source_values(f))) for f in files)

    wide = build_lmdb(tmp_path / "images", tmp_path / "wide.lmdb", masks_dir=str(tmp_path / "masks"), num_classes=top + 5, workers=0,
                      progress=False)
    assert database.load_meta(wide).classes == [str(k) for k in range(top + 5)]
    names = [f"c{k}" for k in range(top + 1)]
    named = build_lmdb(tmp_path / "images", tmp_path / "named.lmdb", masks_dir=str(tmp_path / "masks"), classes=names, workers=0,
                       progress=False)
    assert database.load_meta(named).classes == names

    # ignore_index=0: 0 is unlabelled (left out of the classes each mask holds), 255 an ordinary class id
    zero = build_lmdb(tmp_path / "images", tmp_path / "zero.lmdb", masks_dir=str(tmp_path / "masks"), ignore_index=0, workers=0,
                      progress=False)
    meta = database.load_meta(zero)
    assert meta.ignore_index == 0
    assert meta.target_table().tolist() == [_present(_source_values(f), ignore=0) for f in sorted(files)]
    assert len(meta.classes) == max(max(_present(_source_values(f), ignore=0)) for f in files) + 1
    np.testing.assert_array_equal(_records(zero)[0][1], _source_values(sorted(files)[0]))  # values stored as they are

    with pytest.raises(BuildError, match=rf"its mask .*holds the class id {top}, but there are {top} classes"):
        build(tmp_path / "images", tmp_path / "small.lmdb", masks_dir=str(tmp_path / "masks"), num_classes=top, workers=0, progress=False)
    assert not (tmp_path / "small.lmdb").exists()
    with pytest.raises(OptionError, match="num_classes=3 but classes= names 2"):
        scan_source(tmp_path / "images", SourceOptions(masks_dir=str(tmp_path / "masks"), num_classes=3, classes=("a", "b")))


def _bad_mask(case: str, path: Path, size: tuple[int, int]) -> None:
    width, height = size
    values = np.zeros((height, width), dtype=np.uint8)
    if case == "jpeg":
        Image.fromarray(values).save(path.with_suffix(".jpg"), quality=95)
        path.with_suffix(".jpg").rename(path)  # named .png, a JPEG inside
    elif case == "rgb":
        Image.fromarray(np.zeros((height, width, 3), dtype=np.uint8)).save(path)
    elif case == "size":
        Image.fromarray(np.zeros((height + 1, width, 1), dtype=np.uint8)[:, :, 0]).save(path)
    elif case == "missing":
        path.unlink()
    else:
        path.write_bytes(b"not an image")


@pytest.mark.parametrize(("case", "why"), [("jpeg", "saved as JPEG"), ("rgb", r"colour-coded \(RGB\)"), ("size", "a mask must be the size"),
                                           ("missing", "cannot read its mask"), ("junk", "not an image in a format Pillow can read")])
def test_a_bad_mask_is_refused_naming_it_and_the_line_or_skipped(tmp_path: Path, case: str, why: str) -> None:
    root = tmp_path / "data"
    rows = [(f"images/{i}", f"masks/{m}") for i, m in _pairs(root / "images", root / "masks", count=5)]
    bad = root / rows[3][1]
    with Image.open(root / rows[3][0]) as image:
        size = image.size
    _bad_mask(case, bad, size)
    manifest = _manifest(root, rows)

    with pytest.raises(BuildError, match=f"^list.csv line 5: .*{why}") as raised:
        build(manifest, tmp_path / "out.lmdb", workers=0, progress=False)
    assert f"its mask {str(bad)!r}" in str(raised.value) and "on_error='skip'" in str(raised.value)
    assert not (tmp_path / "out.lmdb").exists()

    report = build(manifest, tmp_path / "skip.lmdb", workers=2, on_error="skip", progress=False)
    assert report.count == 4 and [s.path for s in report.skipped] == [rows[3][0]]
    assert "line 5" in report.skipped[0].reason and str(bad) in report.skipped[0].reason
    assert database.load_meta(report.path).skipped == report.skipped
    unplaced = [fmt.Skipped(rows[3][0], report.skipped[0].reason.removeprefix("list.csv line 5: "))]  # as for any bad file
    assert find_bad_files(scan_source(manifest), workers=0) == unplaced
    found, skipped = read_mask_targets(scan_source(manifest), workers=0)  # what the raw side reads: the build's targets
    assert skipped == unplaced
    assert found.classes == database.load_meta(report.path).classes
    assert [list(t) for t in found.targets] == database.load_meta(report.path).target_table().tolist()


def test_a_bad_mask_of_a_paired_folder_names_the_mask(tmp_path: Path) -> None:
    pairs = _pairs(tmp_path / "images", tmp_path / "masks", count=4)
    bad = tmp_path / "masks" / pairs[2][1]
    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(bad, format="PNG")
    with pytest.raises(BuildError, match=f"its mask {re.escape(repr(str(bad)))}"):
        build(tmp_path / "images", tmp_path / "out.lmdb", masks_dir=str(tmp_path / "masks"), workers=0, progress=False)
    assert not (tmp_path / "out.lmdb").exists()


def test_unmatched_or_ambiguous_pairs_are_refused_naming_them(tmp_path: Path) -> None:
    pairs = _pairs(tmp_path / "images", tmp_path / "masks", count=6)
    (tmp_path / "masks" / pairs[0][1]).unlink()
    _save_mask(np.zeros((3, 3), np.uint8), "L", tmp_path / "masks" / "sub" / "stray.png")
    options = SourceOptions(masks_dir=str(tmp_path / "masks"))
    with pytest.raises(SourceError) as raised:
        scan_source(tmp_path / "images", options)
    message = str(raised.value)
    assert f"1 image(s) in '{tmp_path / 'images'}' without a mask" in message and pairs[0][0] in message
    assert "1 mask(s)" in message and "sub/stray.png" in message and "masks/a/1.png" in message  # the fix

    _save_mask(np.zeros((3, 3), np.uint8), "L", tmp_path / "masks" / pairs[0][1])
    (tmp_path / "masks" / "sub" / "stray.png").unlink()
    _save_mask(np.zeros((3, 3), np.uint8), "L", tmp_path / "masks" / (Path(pairs[1][1]).with_suffix(".bmp")))
    with pytest.raises(SourceError, match="one name but for the extension"):
        scan_source(tmp_path / "images", options)


def test_what_a_folder_with_images_and_masks_is(tmp_path: Path) -> None:
    _pairs(tmp_path / "data" / "images", tmp_path / "data" / "masks", count=3)
    plain = scan_source(tmp_path / "data")  # without masks_dir: an ImageFolder of two classes
    assert plain.target_kind == "class" and plain.classes == ["images", "masks"]
    paired = scan_source(tmp_path / "data" / "images", SourceOptions(masks_dir=str(tmp_path / "data" / "masks")))
    assert labels_of(tmp_path / "data" / "images", SourceOptions(masks_dir=str(tmp_path / "data" / "masks"))).target_kind == "mask"
    assert labels_of(tmp_path / "data").classes == ["images", "masks"]
    assert isinstance(paired, masks.MaskScan) and paired.target_kind == "mask" and paired.targets_from_records
    assert all(f.mask and f.mask_size > 0 and f.mask_mtime_ns > 0 for f in paired.files)
    with pytest.raises(OptionError, match="masks_dir="):
        scan_source(tmp_path / "data" / "images", SourceOptions(num_classes=3))
    with pytest.raises(SourceError, match="hold each other"):
        scan_source(tmp_path / "data", SourceOptions(masks_dir=str(tmp_path / "data" / "masks")))
    with pytest.raises(OptionError, match="label_column"):
        scan_source(tmp_path / "data" / "images", SourceOptions(masks_dir=str(tmp_path / "data" / "masks"), label_column="x"))


def test_manifest_mask_column_options(tmp_path: Path) -> None:
    root = tmp_path / "data"
    pairs = _pairs(root, root / "m", count=3)
    rows = [(i, f"m/{m}") for i, m in pairs]
    both = root / "both.csv"
    both.write_text("path,label,mask\n" + "".join(f"{i},cat,{m}\n" for i, m in rows))
    with pytest.raises(SourceError, match="both a 'label' and a 'mask' column: set target_kind="):
        scan_source(both)
    assert scan_source(both, SourceOptions(target_kind="mask")).target_kind == "mask"
    assert scan_source(both, SourceOptions(target_kind="class")).classes == ["cat"]
    with pytest.raises(OptionError, match="label_column='label'"):
        scan_source(both, SourceOptions(label_column="label", mask_column="mask"))

    named = root / "named.jsonl"
    named.write_text("".join(f'{{"path": "{i}", "seg": "{m}"}}\n' for i, m in rows))
    scan = scan_source(named, SourceOptions(mask_column="seg", ignore_index=0))
    assert isinstance(scan, masks.MaskScan) and scan.ignore_index == 0 and [f.mask for f in scan.files] == [str(root / m) for _, m in rows]
    with pytest.raises(SourceError, match="no column 'mask'"):
        scan_source(named, SourceOptions(mask_column="mask"))
    with pytest.raises(OptionError, match="ignore_index=0: these options read segmentation masks"):
        scan_source(named, SourceOptions(ignore_index=0))

    split = root / "split.csv"
    split.write_text("path,mask,split\n" + "".join(f"{i},{m},{s}\n" for (i, m), s in zip(rows, ("train", "val", "train"), strict=True)))
    meta = database.load_meta(build_lmdb(split, tmp_path / "split.lmdb", num_classes=400, workers=0, progress=False))
    assert (meta.target_kind, meta.split_names, meta.splits.tolist()) == ("mask", ["train", "val"], [0, 1, 0])
    assert labels_of(split, SourceOptions(num_classes=3)) == Labels(["0", "1", "2"], {"0": 0, "1": 1, "2": 2}, "mask")
    assert labels_of(split).classes == []  # inferred: known once the masks are read

    out = root / "out.csv"
    out.write_text(f"path,mask\n{rows[0][0]},../outside.png\n{rows[1][0]},\n{rows[2][0]},{rows[2][1]}\n")
    scan = scan_source(out)
    assert [f.relpath for f in scan.files] == [rows[2][0]]
    assert [reason for _, reason in scan.special] == [
        f"out.csv line 2: mask path '../outside.png' leads out of the root {str(root)!r}; list it relative to the root, give its absolute "
        "path, or set root= to a folder that holds it",
        "out.csv line 3: empty mask cell (column 'mask')"]


def test_verify_compares_masks_and_an_edited_mask_rebuilds(tmp_path: Path) -> None:
    root = tmp_path / "data"
    pairs = _pairs(root / "images", root / "masks", count=5)
    manifest = _manifest(root, [(f"images/{i}", f"masks/{m}") for i, m in pairs])
    target = tmp_path / "out.lmdb"
    assert build(manifest, target, workers=0, progress=False).action == "built"
    assert verify_lmdb(target, manifest).ok
    assert build(manifest, target, workers=0, progress=False).action == "up-to-date"

    edited = root / "masks" / pairs[1][1]
    values = _source_values(edited).copy()
    values[2, 2] = 3 if values[2, 2] != 3 else 2
    _save_mask(values, "L", edited)
    report = verify_lmdb(target, manifest)
    assert report.problems == [f"record 1 (images/{pairs[1][0]}): its mask differs from the source mask file {str(edited)!r} (the file "
                               "was modified after the build)"]
    assert cli.main(["verify", str(target), "--source", str(manifest)]) == 1

    assert build(manifest, target, workers=0, progress=False).action == "built"  # the mask's size and mtime are in the fingerprint
    np.testing.assert_array_equal(_records(target)[1][1], values)
    assert verify_lmdb(target, manifest).ok


def test_the_cli_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pairs = _pairs(tmp_path / "images", tmp_path / "masks", count=4, top=2)
    target = tmp_path / "out.lmdb"
    flags = ["--masks-dir", str(tmp_path / "masks"), "--ignore-index", "0", "--num-classes", "400"]
    assert cli.main(["build", str(tmp_path / "images"), str(target), "--workers", "0", "--quiet", *flags]) == 0
    meta = database.load_meta(target)
    assert (meta.ignore_index, len(meta.classes)) == (0, 400)
    assert cli.main(["verify", str(target), "--source", str(tmp_path / "images"), *flags]) == 0
    assert cli.main(["info", str(target), "--json"]) == 0
    assert '"ignore_index": 0' in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        cli.main(["build", str(tmp_path / "images"), str(tmp_path / "x.lmdb"), "--num-classes", "two"])
    assert refused.value.code == 2 and "--num-classes: invalid int value: 'two'" in capsys.readouterr().err
    assert len(pairs) == meta.count


def test_a_sharded_mask_build_has_the_single_files_classes_and_labels(tmp_path: Path) -> None:
    root = tmp_path / "data"
    pairs = _pairs(root / "images", root / "masks", count=8, top=6)
    manifest = _manifest(root, [(f"images/{i}", f"masks/{m}") for i, m in pairs])
    single = database.load_meta(build_lmdb(manifest, tmp_path / "one.lmdb", workers=0, progress=False), arrays=True)
    sharded_path = build_lmdb(manifest, tmp_path / "sharded", shards=2, num_classes=len(single.classes), workers=2, progress=False)
    sharded = database.load_meta(sharded_path, arrays=True)

    assert (sharded.target_kind, sharded.classes, sharded.ignore_index) == ("mask", single.classes, IGNORE)
    assert sharded.target_table().tolist() == single.target_table().tolist()
    assert sharded.mask_paths is not None and single.mask_paths is not None
    assert sharded.mask_paths.tolist() == single.mask_paths.tolist()
    assert [m.tolist() for _, m in _records(sharded_path)] == [m.tolist() for _, m in _records(tmp_path / "one.lmdb")]
    assert verify_lmdb(sharded_path, manifest).ok
    with pytest.raises(OptionError, match="needs num_classes="):
        build(manifest, tmp_path / "sharded2", shards=2, workers=0, progress=False)


def test_a_mask_table_serves_no_item(tmp_path: Path) -> None:
    pairs = _pairs(tmp_path / "images", tmp_path / "masks", count=2)
    target = build_lmdb(tmp_path / "images", tmp_path / "out.lmdb", masks_dir=str(tmp_path / "masks"), workers=0, progress=False)
    table = database.load_meta(target).target_table()
    assert table.kind == "mask" and len(table) == len(pairs)
    with pytest.raises(TypeError, match="masks.unpack"):
        table.item(0)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_killed_mask_build_resumes_as_an_uninterrupted_one(tmp_path: Path, workers: int) -> None:
    root = tmp_path / "data"
    pairs = _pairs(root / "images", root / "masks", count=11, top=2)
    first = root / "masks" / pairs[0][1]  # the largest class id only in a record committed before the kill
    values = _source_values(first).astype(np.uint16)
    values[1, 1] = 5000
    _save_mask(values, "I;16", first)
    manifest = _manifest(root, [(f"images/{i}", f"masks/{m}") for i, m in pairs])
    target = tmp_path / "out.lmdb"
    script = textwrap.dedent(f"""
        from lightning_lmdb.build.writer import build
        build({str(manifest)!r}, {str(target)!r}, workers={workers}, commit_every=3, progress=False)
    """)
    killed = subprocess.run([sys.executable, "-c", script], env={**os.environ, FAULT_ENV: "commit:2"}, start_new_session=True,
                            capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    assert not target.exists()

    report = build(manifest, target, workers=workers, commit_every=3, progress=False)
    assert report.action == "resumed" and report.records_written == 11 - 6
    reference = build(manifest, tmp_path / "reference.lmdb", workers=0, commit_every=3, progress=False).path
    contents = [read_records(path) for path in (target, reference)]
    for meta, _ in contents:
        meta.pop("created"), meta.pop("build_id")
    assert contents[0] == contents[1]
    resumed, again = database.load_meta(target, arrays=True), database.load_meta(reference, arrays=True)
    assert resumed.target_table().tolist() == again.target_table().tolist()
    assert resumed.classes == [str(k) for k in range(5001)]
    assert resumed.mask_paths is not None and again.mask_paths is not None and resumed.mask_paths.tolist() == again.mask_paths.tolist()


def test_a_moved_segmentation_set_is_still_current(tmp_path: Path) -> None:
    root = tmp_path / "data"
    pairs = _pairs(root / "images", root / "masks", count=4)
    _manifest(root, [(f"images/{i}", f"masks/{m}") for i, m in pairs])
    target = build_lmdb(root / "list.csv", tmp_path / "out.lmdb", workers=0, progress=False)
    moved = tmp_path / "elsewhere"
    os.rename(root, moved)  # the whole set moves: its manifest, images and masks (modification times kept)
    assert build(moved / "list.csv", target, workers=0, progress=False).action == "up-to-date", "masks hashed relative to the root"


def test_pre_resized_storage_shrinks_each_mask_with_its_image_nearest(tmp_path: Path) -> None:
    colours = np.array([[200, 30, 30], [30, 200, 30], [30, 30, 200], [220, 220, 40]], dtype=np.uint8)
    rng = np.random.default_rng(5)
    rows = []
    for i in range(4):
        width, height = 96 + 8 * i, 64 + 4 * i
        ids = np.zeros((height, width), dtype=np.uint8)  # four blocks of unequal sizes: the mask is a function of the colour
        cut_y, cut_x = int(rng.integers(20, height - 20)), int(rng.integers(20, width - 20))
        ids[:cut_y, cut_x:], ids[cut_y:, :cut_x], ids[cut_y:, cut_x:] = 1, 2, 3
        Image.fromarray(colours[ids]).save(tmp_path / f"{i}.png")
        Image.fromarray(ids, mode="L").save(tmp_path / f"{i}_mask.png")
        rows.append((f"{i}.png", f"{i}_mask.png"))
    manifest = _manifest(tmp_path, rows)
    target = build_lmdb(manifest, tmp_path / "out.lmdb", resize=32, workers=0, progress=False)
    for (image_file, mask_file), (image, mask) in zip(rows, _records(target), strict=True):
        source = np.asarray(Image.open(tmp_path / mask_file))
        assert min(mask.shape) == 32 and image.shape[:2] == mask.shape, "the mask is shrunk to its stored image's size"
        assert np.array_equal(mask, masks.resize_mask(source, 32)) and set(np.unique(mask)) <= set(np.unique(source)), "no new ids"
        interior = np.ones(mask.shape, dtype=bool)  # away from block borders (1 px: INTER_AREA blends the edge pixels)
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                interior &= np.roll(np.roll(mask, dy, 0), dx, 1) == mask
        interior[[0, -1], :] = interior[:, [0, -1]] = False
        assert np.abs(image[interior].astype(int) - colours[mask[interior]].astype(int)).max() <= 1, image_file
    assert verify_lmdb(target, manifest).ok
    from lightning_lmdb.read.dataset import LMDBImageDataset

    served_image, served_mask = LMDBImageDataset(target)[0]  # served as stored: the pair at the resized size
    assert tuple(served_mask.shape) == served_image.size[::-1] and min(served_mask.shape) == 32
