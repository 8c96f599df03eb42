"""Staging's faults: a copy killed during its read-back, and a local disk too small for the copy or filling up midway."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ci import mount
from imagegen import make_jpegs

from lightning_lmdb import build_lmdb
from lightning_lmdb.build.writer import DiskFullError
from lightning_lmdb.store import shards
from lightning_lmdb.tools import staging

BLOCK = 16 << 10
FINISHED = ["train.lmdb", "train.lmdb.staged.json", "train.lmdb.staging.lock"]
DISK_USAGE = shutil.disk_usage  # the real one, whatever a test patches


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return build_lmdb(make_jpegs(tmp_path / "src", 40, size=48), tmp_path / "shared" / "train.lmdb", workers=0, progress=False)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


class _Killed(BaseException):
    """The process died here (a BaseException, like the signal's end: no handler of the code under test runs)."""


# --- a copy killed once its last block is recorded ------------------------------------------------


@pytest.mark.parametrize("block_size", [staging.DEFAULT_BLOCK_SIZE, BLOCK + 1], ids=["one-short-block", "last-block-short"])
def test_a_copy_killed_during_its_read_back_is_finished_by_a_rerun_without_copying(
    database: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_size: int
) -> None:
    assert database.stat().st_size % block_size, "the database's last block must be shorter than block_size"

    def killed_in_read_back(*args: object) -> None:
        raise _Killed

    monkeypatch.setattr(staging, "_check", killed_in_read_back)
    with pytest.raises(_Killed):
        staging.stage(database, tmp_path / "local", block_size=block_size)
    monkeypatch.undo()
    assert (tmp_path / "local" / "train.lmdb.staging").read_bytes() == database.read_bytes(), "every block was copied"

    report = staging.stage(database, tmp_path / "local", block_size=block_size)
    assert (report.action, report.bytes_copied) == ("resumed", 0)
    assert report.path.read_bytes() == database.read_bytes()
    assert _names(tmp_path / "local") == FINISHED


@pytest.mark.slow
def test_a_process_killed_after_recording_its_last_block_leaves_a_copy_a_rerun_only_renames(database: Path, tmp_path: Path) -> None:
    local = tmp_path / "local"
    script = f"from lightning_lmdb import staging; staging.stage({str(database)!r}, {str(local)!r})"  # one 64 MiB block: short
    killed = subprocess.run([sys.executable, "-c", script], env={**os.environ, staging.FAULT_ENV: "1"}, capture_output=True, timeout=120)
    assert killed.returncode == 17, killed.stderr
    assert not (local / "train.lmdb").exists()

    report = staging.stage(database, local)
    assert (report.action, report.bytes_copied) == ("resumed", 0)
    assert report.path.read_bytes() == database.read_bytes()
    assert _names(local) == FINISHED


# --- a local disk too small: refused up front --------------------------------------------------------


def _killed_after(database: Path, local: Path, blocks: int) -> Path:
    """Leave in ``local`` what staging ``database`` leaves when killed after ``blocks`` blocks of BLOCK bytes: the copy and its record."""
    local.mkdir()
    data, partial = database.read_bytes(), local / "train.lmdb.staging"
    partial.write_bytes(data[: blocks * BLOCK])
    digests = [hashlib.sha256(data[i * BLOCK : (i + 1) * BLOCK]).hexdigest() for i in range(blocks)]
    staging._write_record(local / "train.lmdb.staging.json", staging._record(staging._Identity.of(database), BLOCK, digests))
    return partial


def _report_free(monkeypatch: pytest.MonkeyPatch, folder: Path, free: int) -> None:
    """Make ``shutil.disk_usage`` report ``free`` bytes free for ``folder`` (and fail for any other path)."""
    real = DISK_USAGE(folder.anchor)

    def disk_usage(path: str | os.PathLike[str]) -> Any:
        assert Path(path) == folder, f"asked for the free space of {path}, not of local_dir {folder}"
        return real._replace(free=free)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)


def test_a_copy_bigger_than_the_free_space_is_refused_before_copying(database: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    local, size = tmp_path / "local", database.stat().st_size
    _report_free(monkeypatch, local, size - 1)
    with pytest.raises(DiskFullError) as raised:
        staging.stage(database, local, block_size=BLOCK)
    assert isinstance(raised.value, OSError) and raised.value.errno == errno.ENOSPC
    message = str(raised.value)
    assert str(local) in message and f"needs {size:,} more bytes" in message and f"{size - 1:,} bytes are free" in message
    assert "Nothing was copied" in message and "rerun" in message and "\n" not in message
    assert _names(local) == ["train.lmdb.staging.lock"]

    _report_free(monkeypatch, local, size)  # exactly enough
    assert staging.stage(database, local, block_size=BLOCK).path.read_bytes() == database.read_bytes()


def test_a_resumed_copy_needs_only_the_space_for_what_is_left(database: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local, size = tmp_path / "local", database.stat().st_size
    partial = _killed_after(database, local, 3)
    _report_free(monkeypatch, local, size - 3 * BLOCK - 1)
    with pytest.raises(DiskFullError, match=rf"needs {size - 3 * BLOCK:,} more bytes \({3 * BLOCK:,} of {size:,} are there\).*resumes"):
        staging.stage(database, local, block_size=BLOCK)
    assert partial.stat().st_size == 3 * BLOCK, "the copy so far is kept"

    _report_free(monkeypatch, local, size - 3 * BLOCK)
    report = staging.stage(database, local, block_size=BLOCK)
    assert (report.action, report.bytes_copied) == ("resumed", size - 3 * BLOCK)
    assert report.path.read_bytes() == database.read_bytes()


def test_a_sharded_copy_is_refused_up_front_for_all_its_shards(database: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = build_lmdb(tmp_path / "src", tmp_path / "shared" / "sharded.lmdb", shards=2, workers=0, progress=False)
    total = sum(p.stat().st_size for p in shards.database_files(folder))
    largest = max(p.stat().st_size for p in shards.database_files(folder))
    copy = tmp_path / "local" / "sharded.lmdb"
    _report_free(monkeypatch, copy, total - 1)
    assert largest < total - 1, "each shard alone would fit: only the total must be refused"
    with pytest.raises(DiskFullError, match=rf"sharded\.lmdb.*needs {total:,} more bytes"):
        staging.stage(folder, tmp_path / "local", block_size=BLOCK)
    assert _names(copy) == [], "no shard was copied"


# --- a local disk filling up midway ------------------------------------------------------------------


class _FillingFile:
    """A file on a disk with ``room`` bytes left: writes past it write what fits, then fail with ENOSPC."""

    def __init__(self, handle: Any, room: list[int]):
        self.handle, self.room = handle, room

    def write(self, data: bytes) -> int:
        if len(data) > self.room[0]:
            self.handle.write(data[: self.room[0]])
            self.room[0] = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room[0] -= len(data)
        return self.handle.write(data)


def test_a_disk_filling_up_midway_keeps_the_copy_so_far_and_a_rerun_resumes(database: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    local, size = tmp_path / "local", database.stat().st_size
    hash_block, room = staging._hash_block, [2 * BLOCK + BLOCK // 2]

    def hash_block_on_a_filling_disk(handle: Any, block_size: int, copy_to: Any = None) -> tuple[str, int] | None:
        return hash_block(handle, block_size, None if copy_to is None else _FillingFile(copy_to, room))

    monkeypatch.setattr(staging, "_hash_block", hash_block_on_a_filling_disk)
    with pytest.raises(DiskFullError) as raised:
        staging.stage(database, local, block_size=BLOCK)
    partial, progress = local / "train.lmdb.staging", local / "train.lmdb.staging.json"
    assert isinstance(raised.value, OSError) and raised.value.errno == errno.ENOSPC
    message = str(raised.value)
    assert str(local) in message and f"needs {size - partial.stat().st_size:,} more bytes" in message
    assert "copy so far and its record are kept" in message and "rerun; staging resumes" in message and "\n" not in message
    assert len(json.loads(progress.read_text())["blocks"]) == 2 and not (local / "train.lmdb").exists()

    monkeypatch.undo()
    report = staging.stage(database, local, block_size=BLOCK)
    assert (report.action, report.bytes_copied) == ("resumed", size - 2 * BLOCK)
    assert report.path.read_bytes() == database.read_bytes()
    assert _names(local) == FINISHED


# --- a real full disk: a small tmpfs (the small_disk fixture of conftest.py) ---------------------------------------------

SMALL_DISK = "256k"  # its size


@pytest.mark.slow
def test_a_real_full_disk_refuses_up_front_then_stops_midway_and_a_rerun_resumes(tmp_path: Path, small_disk: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    database = build_lmdb(make_jpegs(tmp_path / "src", 120, size=64), tmp_path / "shared" / "train.lmdb", workers=0, progress=False)
    size = database.stat().st_size
    assert size > shutil.disk_usage(small_disk).total, "the database must not fit the disk"
    with pytest.raises(DiskFullError, match="has too little free space"):
        staging.stage(database, small_disk, block_size=BLOCK)
    assert _names(small_disk) == ["train.lmdb.staging.lock"]

    lies = iter([DISK_USAGE(small_disk)._replace(free=size)])  # the space seemed there when checked: another process took it since
    monkeypatch.setattr(shutil, "disk_usage", lambda path: next(lies, None) or DISK_USAGE(path))
    with pytest.raises(DiskFullError, match=rf"{str(small_disk)!r} filled up.*staging resumes where it stopped") as raised:
        staging.stage(database, small_disk, block_size=BLOCK)
    assert raised.value.errno == errno.ENOSPC
    recorded = len(json.loads((small_disk / "train.lmdb.staging.json").read_text())["blocks"])
    assert recorded > 0 and not (small_disk / "train.lmdb").exists()

    grown = mount("-o", "remount,size=64m", str(small_disk))
    assert grown.returncode == 0, grown.stderr
    report = staging.stage(database, small_disk, block_size=BLOCK)
    assert (report.action, report.bytes_copied) == ("resumed", size - recorded * BLOCK)
    assert report.path.read_bytes() == database.read_bytes()
    assert _names(small_disk) == FINISHED


def test_a_disk_full_when_recording_a_checked_copy_leaves_it_for_a_rerun_to_rename(database: Path, tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    write_record = staging._write_record

    def write_record_on_a_full_disk(path: Path, record: dict[str, Any]) -> None:
        if path.name.endswith(".staged.json"):  # the finished copy's record: the last write
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write_record(path, record)

    monkeypatch.setattr(staging, "_write_record", write_record_on_a_full_disk)
    with pytest.raises(DiskFullError, match="staging resumes where it stopped"):
        staging.stage(database, tmp_path / "local", block_size=BLOCK)
    monkeypatch.undo()
    report = staging.stage(database, tmp_path / "local", block_size=BLOCK)
    assert (report.action, report.bytes_copied) == ("resumed", 0), "the checked copy is kept: the rerun copies nothing"
    assert report.path.read_bytes() == database.read_bytes()
    assert _names(tmp_path / "local") == FINISHED
