"""Format 2 (header + digested arrays), format 1 still read, compact datasets, BuildOptions."""

from __future__ import annotations

import json
import logging
import pickle
import shutil
from pathlib import Path

import lmdb
import numpy as np
import pytest
from imagegen import downgrade_to_v1, make_folder, make_jpegs, read_records

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.build.writer import build
from lightning_lmdb.options import CHOICES, BuildOptions
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.read.raw import RawImageDataset
from lightning_lmdb.sources.base import TARGET_KINDS
from lightning_lmdb.store import database, envs
from lightning_lmdb.store import format as fmt
from lightning_lmdb.tools.verify import describe_lmdb, verify_lmdb


@pytest.fixture(scope="module")
def folder_and_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fmt")
    source = make_folder(root / "src")
    return source, build(source, root / "v2.lmdb", workers=0, progress=False).path


def test_v2_header_is_small_and_arrays_round_trip(folder_and_db: tuple[Path, Path]) -> None:
    source, db = folder_and_db
    raw = RawImageDataset(source)
    with envs.reading(db) as opened, opened.env.begin() as txn:
        header = bytes(txn.get(fmt.META_KEY))
    obj = json.loads(header)
    assert obj["version"] == 2 and not {"targets", "paths", "checksums"} & obj.keys() and len(header) < 2000
    assert set(obj["arrays"]) == {"targets", "checksums", "paths", "path_offsets", "codecs"}, "a class database has no typed-target arrays"
    meta = database.load_meta(db, arrays=True)
    assert meta.version == 2 and meta.count == len(raw) and meta.build_id
    assert meta.targets.dtype == np.int32 and meta.targets.tolist() == raw.targets
    assert not meta.targets.flags.writeable
    assert meta.paths is not None and meta.paths.tolist() == raw.paths
    assert any(not p.isascii() for p in meta.paths.tolist())
    assert meta.checksums is not None and meta.checksums.shape == (meta.count, fmt.CHECKSUM_SIZE)
    assert obj["checksum"] == meta.checksum == "xxh3-64" and not meta.checksums.flags.writeable
    assert [fmt.checksum(raw_value) for raw_value in _records(db)] == [row.tobytes() for row in meta.checksums]
    lean = database.load_meta(db)
    assert lean.paths is None and lean.checksums is None, "opening reads the header, targets and what a read checks"
    assert lean.read_checks is not None and lean.read_checks.dtype == np.dtype("<u4") and not lean.read_checks.flags.writeable
    assert lean.read_checks.tobytes() == meta.checksums[:, :4].tobytes(), "the low half of each hash"


def _records(db: Path) -> list[bytes]:
    with envs.reading(db) as opened, opened.env.begin(db=opened.records) as txn:
        return [bytes(value) for _, value in txn.cursor()]


def test_path_table_keeps_undecodable_names() -> None:
    names = ["a/b.jpg", "ñandú/猫.png", "x/\udcff\udcfe.jpg", ""]
    table = fmt.PathTable.from_strings(names)
    assert len(table) == 4 and table.tolist() == names and table[1] == names[1] and table[-2] == names[2]
    with pytest.raises(IndexError):
        table[4]


def _flip(path: Path, key: bytes) -> None:
    env = lmdb.open(str(path), subdir=False, max_dbs=3, lock=False)
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(key))
        value[-1] ^= 0x40
        txn.put(key, bytes(value))
    env.close()


def test_a_damaged_checksums_array_is_refused_at_open(folder_and_db: tuple[Path, Path], tmp_path: Path) -> None:
    _, db = folder_and_db
    damaged = Path(shutil.copyfile(db, tmp_path / "damaged.lmdb"))
    _flip(damaged, fmt.ARRAYS["checksums"][0])
    with pytest.raises(fmt.DatabaseError, match="checksums array .* does not match its digest"):
        LMDBImageDataset(damaged)  # every record read is checked against it: it is read (and checked) at open
    with pytest.raises(fmt.DatabaseError, match="checksums array .* does not match its digest"):
        verify_lmdb(damaged)


@pytest.mark.parametrize("array", ["paths", "path_offsets"])
def test_a_damaged_array_read_on_demand_is_refused(folder_and_db: tuple[Path, Path], tmp_path: Path, array: str) -> None:
    _, db = folder_and_db
    damaged = Path(shutil.copyfile(db, tmp_path / "damaged.lmdb"))
    _flip(damaged, fmt.ARRAYS[array][0])
    dataset = LMDBImageDataset(damaged)  # header and targets are fine
    assert len(dataset) > 0 and dataset[0][1] == dataset.targets[0]
    with pytest.raises(fmt.DatabaseError, match=f"{array} array .* does not match its digest"):
        verify_lmdb(damaged)
    with pytest.raises(fmt.DatabaseError, match="does not match its digest"):
        _ = dataset.paths


def test_v1_databases_are_still_read_and_rebuilt_in_v2(
    folder_and_db: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source, db = folder_and_db
    encoded = build(source, tmp_path / "encoded.lmdb", storage="encoded", workers=0, progress=False).path  # what 0.1 stored
    v1 = downgrade_to_v1(Path(shutil.copyfile(encoded, tmp_path / "v1.lmdb")))
    new, old = LMDBImageDataset(db), LMDBImageDataset(v1)
    assert old.format_version == 1 and new.format_version == 2
    assert old.build_id.startswith("meta:"), "a v1 file has no build id: its identity is a digest of its metadata"
    assert len(old) == len(new) and old.targets == new.targets and old.paths == new.paths and old.classes == new.classes
    for i in range(len(new)):
        assert np.array_equal(np.asarray(old[i][0]), np.asarray(new[i][0]))
    clone = pickle.loads(pickle.dumps(old.split(0.25, 3)[1]))
    assert clone.targets == new.split(0.25, 3)[1].targets
    assert describe_lmdb(v1)["format_version"] == 1
    assert verify_lmdb(v1, source).ok
    assert build(source, v1, on_stale="ignore", workers=0, progress=False).action == "up-to-date"
    assert database.load_meta(v1).version == 1
    with caplog.at_level(logging.INFO, logger="lightning_lmdb.build.writer"):
        report = build(source, v1, storage="encoded", workers=0, progress=False)
    assert report.action == "built" and "format version 1" in caplog.text
    assert database.load_meta(v1).version == 2
    assert read_records(v1)[1] == read_records(encoded)[1]


def test_views_and_splits_pickle_as_a_recipe_not_a_row_list(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 400, size=8, classes=4)
    dataset = LMDBImageDataset(build(source, tmp_path / "db.lmdb", workers=0, progress=False).path)
    train, val = dataset.split(0.1, seed=7)
    assert len(train) == 360 and len(val) == 40 and not set(train.paths) & set(val.paths)
    assert train._targets is dataset._targets, "a view shares its parent's arrays (a forked worker then copies nothing)"
    picked = dataset.view([5, 3, 399], None).view([2, 0], None)  # views compose
    for view in (dataset, train, val, picked, val.view([1, 0], None)):
        clone = pickle.loads(pickle.dumps(view))
        assert len(clone) == len(view) and clone.targets == view.targets and clone.paths == view.paths
        assert [clone[i][1] for i in range(min(5, len(view)))] == view.targets[:5]
        assert np.array_equal(np.asarray(clone[0][0]), np.asarray(view[0][0]))
    assert picked.paths == [dataset.paths[399], dataset.paths[5]]
    small_source = make_jpegs(tmp_path / "src40", 40, size=8, classes=4)
    small = LMDBImageDataset(build(small_source, tmp_path / "db40.lmdb", workers=0, progress=False).path)
    # The pickle of a split does not grow with the number of records (no per-record list in it).
    assert len(pickle.dumps(train)) <= len(pickle.dumps(small.split(0.1, seed=7)[0])) + 64
    with pytest.raises(IndexError):
        dataset.view([400], None)
    assert dataset[-1][1] == dataset.targets[-1]


def test_build_options_validate_once_everywhere(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"storage='jpg' is not one of 'auto', 'encoded', 'decoded'"):
        BuildOptions(storage="jpg")
    with pytest.raises(ValueError, match="on_error='ignore' is not one of 'raise', 'skip'"):
        LMDBDataModule(make_jpegs(tmp_path / "src", 4, size=8), on_error="ignore", cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="commit_every=0"):
        build(tmp_path / "src", tmp_path / "x.lmdb", commit_every=0)
    with pytest.raises(ValueError, match="workers=-1"):
        BuildOptions(workers=-1)
    assert BuildOptions().content() == {"storage": "auto", "max_pixels": 89_478_485}
    from lightning_lmdb.tools.cli import make_parser

    build_parser = make_parser()._subparsers._group_actions[0].choices["build"]  # type: ignore[union-attr]
    choices = {a.dest: tuple(a.choices) for a in build_parser._actions if a.choices}
    assert choices == {**CHOICES, "manifest_target_kind": TARGET_KINDS}, "the CLI offers exactly the declared choices"


def test_file_lock_makes_a_second_holder_wait_and_says_so(tmp_path: Path) -> None:
    import threading

    lock = tmp_path / "x.lock"
    events: list[str] = []
    waiting = threading.Event()

    def second() -> None:
        with fmt.file_lock(lock, on_wait=lambda: (events.append("waiting"), waiting.set())):
            events.append("second holds it")

    with fmt.file_lock(lock, on_wait=lambda: events.append("first waited")):
        thread = threading.Thread(target=second)
        thread.start()
        assert waiting.wait(timeout=120), "the second holder never found the lock taken"
        events.append("first releases")
    thread.join(timeout=120)
    assert events == ["waiting", "first releases", "second holds it"]
    assert lock.exists(), "the lock file stays in place"
