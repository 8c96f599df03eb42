"""Damaged, foreign, too new and replaced databases: a clear error in the main process and in DataLoader workers.

Each case runs in a forked child (``faultkit``), so a SIGBUS or SIGSEGV on a bad mapping fails the test
instead of killing pytest. The only acceptable failure is a ``DatabaseError`` (or ``FileNotFoundError``)
that says what is wrong: never a signal, a ``KeyError``/``TypeError`` or a raw ``lmdb.Error``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import lmdb
import numpy as np
import pytest
from faultkit import run_forked
from imagegen import make_jpegs
from torch.utils.data import DataLoader
from torchvision.transforms.functional import pil_to_tensor

from lightning_lmdb.build.writer import build, build_lmdb
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.store import database
from lightning_lmdb.store import format as fmt
from lightning_lmdb.tools.verify import describe_lmdb, verify_lmdb

COUNT = 12


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two finished databases of different sources: ``a`` (the one datasets are created on) and ``b``."""
    root = tmp_path_factory.mktemp("damage")
    return {
        name: build(make_jpegs(root / f"src_{name}", COUNT, size=24, seed=seed), root / f"{name}.lmdb", workers=0, progress=False).path
        for name, seed in (("a", 0), ("b", 1))
    }


def _copy(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    return dst


def _edit(path: Path, edit: Callable[[lmdb.Environment, lmdb.Transaction], None]) -> Path:
    env = lmdb.open(str(path), subdir=False, max_dbs=3, lock=False)
    with env.begin(write=True) as txn:
        edit(env, txn)
    env.close()
    return path


def _edit_meta(path: Path, change: Callable[[dict], None], *, reseal: bool = True) -> Path:
    """Edit the header JSON; ``reseal`` also rewrites its digest (so the schema check, not the digest, must catch it)."""

    def edit(env: lmdb.Environment, txn: lmdb.Transaction) -> None:
        meta = json.loads(bytes(txn.get(fmt.META_KEY)))
        change(meta)
        header = json.dumps(meta).encode()
        txn.put(fmt.META_KEY, header)
        if reseal:
            txn.put(fmt.META_DIGEST_KEY, hashlib.blake2b(header, digest_size=16).digest())

    return _edit(path, edit)


def _flip_array_byte(name: str) -> Callable[[dict[str, Path], Path], Path]:
    # A flipped bit in a stored array (LMDB does not checksum pages): e.g. a label that silently changed.
    def edit(env: lmdb.Environment, txn: lmdb.Transaction) -> None:
        key = fmt.ARRAYS[name][0]
        value = bytearray(txn.get(key))
        value[len(value) // 2] ^= 0x01
        txn.put(key, bytes(value))

    return lambda builds, out: _edit(_copy(builds["b"], out), edit)


def _drop_array(name: str) -> Callable[[dict[str, Path], Path], Path]:
    return lambda builds, out: _edit(_copy(builds["b"], out), lambda env, txn: txn.delete(fmt.ARRAYS[name][0]))


def _truncated(builds: dict[str, Path], out: Path) -> Path:
    path = _copy(builds["a"], out)
    os.truncate(path, path.stat().st_size // 2)
    return path


def _zero_length(builds: dict[str, Path], out: Path) -> Path:
    out.write_bytes(b"")
    return out


def _garbage(builds: dict[str, Path], out: Path) -> Path:
    out.write_bytes(np.random.default_rng(0).integers(0, 256, 64 * 1024, dtype=np.uint8).tobytes())
    return out


def _foreign_lmdb(builds: dict[str, Path], out: Path) -> Path:
    env = lmdb.open(str(out), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"hello", b"world")
    env.close()
    return out


def _meta_change(change: Callable[[dict], None]) -> Callable[[dict[str, Path], Path], Path]:
    # Another build (b) with its metadata edited: what a copy of a file damaged elsewhere looks like.
    return lambda builds, out: _edit_meta(_copy(builds["b"], out), change)


def _header_edited_without_digest(builds: dict[str, Path], out: Path) -> Path:
    return _edit_meta(_copy(builds["b"], out), lambda m: m["class_to_idx"].update({m["classes"][0]: 1}), reseal=False)


def _missing_record(builds: dict[str, Path], out: Path) -> Path:
    # The same build (a, same build id) with record 3 deleted from the records table.
    def edit(env: lmdb.Environment, txn: lmdb.Transaction) -> None:
        assert txn.delete(fmt.record_key(3), db=env.open_db(fmt.RECORDS_DB, txn=txn, create=False))

    return _edit(_copy(builds["a"], out), edit)


def _replaced(builds: dict[str, Path], out: Path) -> Path:
    return _copy(builds["b"], out)


REPLACED = "replaced since this dataset was created"
#: name -> (make the damaged file, error when opened afresh, error when it replaces the dataset's file).
#: ``None`` for the first: the case is about a file replaced under an existing dataset only.
CASES: dict[str, tuple[Callable[[dict[str, Path], Path], Path], str | None, str]] = {
    "truncated": (_truncated, "is truncated", "is truncated"),
    "zero-length": (_zero_length, "not an LMDB file", "not an LMDB file"),
    "garbage": (_garbage, "not an LMDB file", "not an LMDB file"),
    "foreign-lmdb": (_foreign_lmdb, "not a lightning_lmdb database", "not a lightning_lmdb database"),
    "missing-field": (_meta_change(lambda m: m.pop("classes")), r"field 'classes' is missing", REPLACED),
    "classes-string": (_meta_change(lambda m: m.update(classes="c0,c1")), r"field 'classes' should be a list", REPLACED),
    "header-digest": (_header_edited_without_digest, "header .* does not match its digest", REPLACED),
    "targets-flipped": (_flip_array_byte("targets"), "targets array .* does not match its digest", REPLACED),
    "targets-missing": (_drop_array("targets"), "lacks its targets array", REPLACED),
    "count-string": (_meta_change(lambda m: m.update(count="12")), r"field 'count' should be an integer", REPLACED),
    "skipped-no-reason": (
        _meta_change(lambda m: m.update(skipped=[{"path": "c0/x.jpg"}])), r"field skipped\[0\]\.'reason' is missing", REPLACED,
    ),
    "newer-version": (
        _meta_change(lambda m: m.update(version=fmt.FORMAT_VERSION + 1)),
        f"format version {fmt.FORMAT_VERSION + 1}; this lightning_lmdb reads versions 1 to {fmt.FORMAT_VERSION}",
        REPLACED,
    ),
    "missing-record": (_missing_record, "Record 3 is missing", "Record 3 is missing"),
    "replaced": (_replaced, None, REPLACED),
}


def _read_all(dataset: LMDBImageDataset) -> list[int]:
    return [dataset[i][1] for i in range(len(dataset))]


def _open_and_read(path: Path) -> list[int]:
    """Open the damaged file afresh in this process and read every sample."""
    return _read_all(LMDBImageDataset(path))


def _replace_then_read(path: Path, damaged: Path) -> list[int]:
    """Create a dataset on the good file, copy the damaged one over it (like ``cp``), read every sample here."""
    dataset = LMDBImageDataset(path)
    shutil.copyfile(damaged, path)
    return _read_all(dataset)


def _replace_then_read_in_workers(path: Path, damaged: Path) -> list[int]:
    """As ``_replace_then_read``, with the reads in two DataLoader workers (each opens the file itself)."""
    dataset = LMDBImageDataset(path, transform=pil_to_tensor)
    shutil.copyfile(damaged, path)
    return [int(t) for _, targets in DataLoader(dataset, batch_size=4, num_workers=2) for t in targets]


MODES = {"open": _open_and_read, "replace-main": _replace_then_read, "replace-workers": _replace_then_read_in_workers}
PARAMS = [(case, mode) for case, (_, opened, _) in CASES.items() for mode in MODES if not (opened is None and mode == "open")]


@pytest.mark.slow
@pytest.mark.parametrize(("case", "mode"), PARAMS, ids=[f"{c}-{m}" for c, m in PARAMS])
def test_damaged_database_raises_a_clear_error(tmp_path: Path, builds: dict[str, Path], case: str, mode: str) -> None:
    make, when_opened, when_replaced = CASES[case]
    damaged = make(builds, tmp_path / "damaged.lmdb")
    if mode == "open":
        outcome = run_forked(_open_and_read, damaged)
        match = when_opened
    else:
        outcome = run_forked(MODES[mode], _copy(builds["a"], tmp_path / "data.lmdb"), damaged)
        match = when_replaced
    assert outcome.raised("DatabaseError"), f"expected a DatabaseError matching {match!r}, got: {outcome}"
    assert re.search(match, outcome.message), f"{match!r} not in: {outcome.message}"
    if mode == "replace-workers":
        assert "DataLoader worker" in outcome.message, "the error should come from a worker"


@pytest.mark.slow
def test_missing_file_and_incomplete_build_in_workers(tmp_path: Path, builds: dict[str, Path]) -> None:
    def read_after(make_absent: Callable[[Path], None]) -> object:
        path = _copy(builds["a"], tmp_path / "data.lmdb")

        def run() -> list[int]:
            dataset = LMDBImageDataset(path, transform=pil_to_tensor)
            make_absent(path)
            return [int(t) for _, targets in DataLoader(dataset, batch_size=4, num_workers=2) for t in targets]

        return run_forked(run)

    gone = read_after(os.unlink)
    assert gone.raised("FileNotFoundError") and "No database at" in gone.message, str(gone)

    def leave_partial(path: Path) -> None:
        os.unlink(path)
        fmt.partial_path(path).write_bytes(b"")

    incomplete = read_after(leave_partial)
    assert incomplete.raised("DatabaseError") and "incomplete build" in incomplete.message, str(incomplete)


# --- a file replaced under a dataset that has already read from it ------------------------------


def _rebuild_other_source_then_read(path: Path, other_source: Path, workers: int) -> list[int]:
    dataset = LMDBImageDataset(path, transform=pil_to_tensor)
    dataset[0]  # the file is open and mapped in this process now
    build(other_source, path, overwrite=True, workers=0, progress=False)
    if workers:
        return [int(t) for _, targets in DataLoader(dataset, batch_size=4, num_workers=workers) for t in targets]
    return _read_all(dataset)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2], ids=["main", "workers"])
def test_overwrite_rebuild_in_the_same_process_is_noticed(tmp_path: Path, workers: int) -> None:
    path = build_lmdb(make_jpegs(tmp_path / "a", COUNT, size=24, seed=0), tmp_path / "data.lmdb", workers=0, progress=False)
    other = make_jpegs(tmp_path / "b", COUNT + 4, size=24, seed=1, classes=3)
    outcome = run_forked(_rebuild_other_source_then_read, path, other, workers)
    assert outcome.raised("DatabaseError") and REPLACED in outcome.message, str(outcome)
    assert ("DataLoader worker" in outcome.message) == bool(workers)


def _copy_over_open_file_then_reopen(path: Path, other: Path) -> dict[str, object]:
    old = LMDBImageDataset(path)
    old[0]  # open and mapped in this process
    shutil.copyfile(other, path)  # in place, like `cp other.lmdb data.lmdb`: same inode, new contents
    new = LMDBImageDataset(path)
    result = {
        "new_build_id": new.build_id, "new_targets": [new[i][1] for i in range(len(new))], "described": describe_lmdb(path)["build_id"],
    }
    try:
        old[0]
        result["old_error"] = None
    except fmt.DatabaseError as exc:
        result["old_error"] = str(exc)
    return result


@pytest.mark.slow
def test_copy_over_an_open_file_is_noticed_by_the_next_open(tmp_path: Path, builds: dict[str, Path]) -> None:
    path = _copy(builds["a"], tmp_path / "data.lmdb")
    other = _copy(builds["b"], tmp_path / "other.lmdb")
    other_id = database.load_meta(other).build_id
    outcome = run_forked(_copy_over_open_file_then_reopen, path, other)
    assert outcome.status == "returned", str(outcome)
    value = outcome.value
    assert value["new_build_id"] == value["described"] == other_id, "the new dataset must describe the file now at the path"
    assert value["new_targets"] == database.load_meta(other).targets.tolist()
    assert value["old_error"] is not None and REPLACED in value["old_error"], "the old dataset must not serve the other build's records"


def _copy_over_open_file_then_read(path: Path, other: Path) -> list[int]:
    dataset = LMDBImageDataset(path)
    dataset[0]
    shutil.copyfile(other, path)
    return _read_all(dataset)


@pytest.mark.slow
def test_copy_over_an_open_file_is_noticed_by_the_dataset_itself(tmp_path: Path, builds: dict[str, Path]) -> None:
    path = _copy(builds["a"], tmp_path / "data.lmdb")
    outcome = run_forked(_copy_over_open_file_then_read, path, _copy(builds["b"], tmp_path / "other.lmdb"))
    assert outcome.raised("DatabaseError") and REPLACED in outcome.message, str(outcome)


# --- reopening one database in one process -------------------------------------------------------


def _reopen_after_reading(source: Path, path: Path) -> dict[str, object]:
    dataset = LMDBImageDataset(path)
    first = np.asarray(dataset[0][0])
    again = build(source, path, workers=0, progress=False)  # up to date: reads the metadata of the open file
    verified = verify_lmdb(path, source)
    described = describe_lmdb(path)
    still = np.asarray(dataset[0][0])
    return {
        "action": again.action, "ok": verified.ok, "problems": verified.problems, "checked": verified.checked,
        "count": described["count"], "same_pixels": bool(np.array_equal(first, still)),
    }


@pytest.mark.slow
def test_build_verify_describe_after_reading_in_one_process(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", COUNT, size=24, seed=0)
    path = build_lmdb(source, tmp_path / "data.lmdb", workers=0, progress=False)
    outcome = run_forked(_reopen_after_reading, source, path)
    assert outcome.status == "returned", str(outcome)
    assert outcome.value == {"action": "up-to-date", "ok": True, "problems": [], "checked": COUNT, "count": COUNT, "same_pixels": True}


def _rebuild_decoded_after_reading(source: Path, path: Path) -> dict[str, object]:
    old = LMDBImageDataset(path)
    before = [np.asarray(old[i][0]) for i in range(len(old))]
    report = build(source, path, storage="decoded", workers=0, progress=False)  # other options: a real rebuild
    new = LMDBImageDataset(path)
    after = [np.asarray(new[i][0]) for i in range(len(new))]
    try:
        old[0]
        old_error = None
    except fmt.DatabaseError as exc:
        old_error = str(exc)
    return {
        "action": report.action, "written": report.records_written, "storage": new.storage,
        "described": describe_lmdb(path)["storage"], "verified": verify_lmdb(path, source).ok,
        "same_pixels": len(before) == len(after) and all(np.array_equal(x, y) for x, y in zip(before, after)),
        "old_error": old_error,
    }


@pytest.mark.slow
def test_rebuild_with_other_options_after_reading_in_one_process(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", COUNT, size=24, seed=0)
    path = build_lmdb(source, tmp_path / "data.lmdb", workers=0, progress=False)
    outcome = run_forked(_rebuild_decoded_after_reading, source, path)
    assert outcome.status == "returned", str(outcome)
    value = outcome.value
    old_error = value.pop("old_error")
    assert value == {
        "action": "built", "written": COUNT, "storage": "decoded", "described": "decoded", "verified": True, "same_pixels": True,
    }
    assert old_error is not None and REPLACED in old_error, "the old dataset must not serve the new build's records"
