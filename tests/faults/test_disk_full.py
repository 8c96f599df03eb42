"""A build that fills its disk: a ``DiskFullError`` that says what to do, nothing committed lost, a rerun resumes.

The disk is a 2 MB tmpfs mounted for the test (needs root and mount rights; skipped otherwise) and grown
with ``remount`` before the rerun, so the partial build stays where it was.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultkit import contents, leftovers, run_forked
from imagegen import make_jpegs

from lightning_lmdb import format as fmt
from lightning_lmdb.writer import build

COUNT = 300  # 128 px noise JPEGs: about 3.3 MB, more than the disk


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs mounted on a fresh folder; unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = _mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)


@pytest.mark.slow
def test_full_disk_raises_disk_full_and_a_rerun_resumes(tmp_path: Path, small_disk: Path) -> None:
    source = make_jpegs(tmp_path / "src", COUNT, size=128)
    assert sum(p.stat().st_size for p in source.rglob("*.jpg")) > (5 << 20) // 2, "the source must not fit the 2 MB disk"
    reference = build(source, tmp_path / "reference.lmdb", workers=0, progress=False)
    target = small_disk / "out.lmdb"

    # In a forked child: a full disk must end in an exception, never a SIGBUS (e.g. from a writable mapping).
    full = run_forked(build, source, target, workers=0, commit_every=25, progress=False)
    assert full.raised("DiskFullError") and full.raised("OSError"), str(full)
    assert full.errno == errno.ENOSPC
    message = full.message
    assert "is full" in message
    assert str(small_disk) in message, "the message should name the folder that is full"
    assert "MB more" in message
    assert "rerun" in message and "resumes" in message
    assert not target.exists() and fmt.partial_path(target).exists()

    grown = _mount("-o", "remount,size=64m", str(small_disk))
    assert grown.returncode == 0, grown.stderr
    report = build(source, target, workers=0, commit_every=25, progress=False)
    assert report.action == "resumed"
    assert 0 < report.records_written < COUNT, "the batches committed before the disk filled up must be kept"
    assert (COUNT - report.records_written) % 25 == 0, "the rerun resumes after the last committed batch"
    assert leftovers(target) == []
    assert contents(target) == contents(reference.path)
