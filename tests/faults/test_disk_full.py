"""A build that fills its disk: a ``DiskFullError`` that says what to do, nothing committed lost, a rerun resumes.

The disk is a 2 MB tmpfs mounted for the test and grown with ``remount`` before the rerun, so the partial
build stays where it was. Mounting needs root and mount rights: without them the test skips, except on CI
(``CI`` set), whose ``.ci/run`` runs as root -- there it fails, so the real message is never left unchecked.
"""

from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

import pytest
from ci import mount
from faultkit import contents, leftovers, missing_prerequisite, run_forked
from imagegen import make_jpegs

from lightning_lmdb.build.writer import build
from lightning_lmdb.store import format as fmt

COUNT = 300  # 128 px noise JPEGs: about 3.3 MB, more than the disk
SMALL_DISK = "2m"  # the size of the small_disk fixture's tmpfs (conftest.py)


@pytest.mark.slow
def test_full_disk_raises_disk_full_and_a_rerun_resumes(tmp_path: Path, small_disk: Path) -> None:
    source = make_jpegs(tmp_path / "src", COUNT, size=128)
    assert sum(p.stat().st_size for p in source.rglob("*.jpg")) > shutil.disk_usage(small_disk).total, "the source must not fit the disk"
    reference = build(source, tmp_path / "reference.lmdb", workers=0, progress=False)
    target = small_disk / "out.lmdb"

    # In a forked child: a full disk must end in an exception, never a SIGBUS (e.g. from a writable mapping).
    full = run_forked(build, source, target, workers=0, commit_every=25, progress=False)
    assert full.raised("DiskFullError") and full.raised("OSError"), str(full)
    assert full.errno == errno.ENOSPC
    _check_message(full.message, small_disk, target, source_bytes=sum(p.stat().st_size for p in source.rglob("*.jpg")))
    assert not target.exists() and fmt.partial_path(target).exists()

    grown = mount("-o", "remount,size=64m", str(small_disk))
    assert grown.returncode == 0, grown.stderr
    report = build(source, target, workers=0, commit_every=25, progress=False)
    assert report.action == "resumed"
    assert 0 < report.records_written < COUNT, "the batches committed before the disk filled up must be kept"
    assert (COUNT - report.records_written) % 25 == 0, "the rerun resumes after the last committed batch"
    assert leftovers(target) == []
    assert contents(target) == contents(reference.path)


def _check_message(message: str, disk: Path, target: Path, source_bytes: int) -> None:
    """The disk-full message names the full folder, the database, the bytes still needed and the fix, on one line."""
    assert "\n" not in message, message
    assert f"The disk holding {disk} is full" in message, "the message should name the folder that is full"
    assert target.name in message, "the message should name the database being built"
    assert "Nothing was lost" in message and "free space" in message and "another disk" in message, "the message should say the fix"
    assert "rerun" in message and "resumes" in message
    numbers = re.search(r"is full \(([\d.]+) MB free\).* needs about ([\d.]+) MB more \(([\d.]+) MB written of an estimated "
                        r"([\d.]+) MB\)", message)
    assert numbers, f"the message should say how many bytes are free and still needed: {message}"
    free, more, written, estimate = (float(n) * 1e6 for n in numbers.groups())
    total = shutil.disk_usage(disk).total
    assert free < total and 0 < written <= total, "what is free and what was written are of this disk"
    assert estimate >= source_bytes, "an encoded build stores every source file's bytes: the estimate cannot be less"
    assert more >= estimate - written - 0.1e6, "what is still needed is the rest of the estimate (to the message's rounding)"
    assert more >= source_bytes - total, "what is still needed is at least what the disk could not hold"


@pytest.mark.parametrize(("ci", "on_ci"), [("", False), ("0", False), ("false", False), ("No", False), ("true", True), ("1", True)])
def test_a_missing_prerequisite_skips_but_fails_on_ci(monkeypatch: pytest.MonkeyPatch, ci: str, on_ci: bool) -> None:
    monkeypatch.setenv("CI", ci)
    outcome = pytest.fail.Exception if on_ci else pytest.skip.Exception
    with pytest.raises(outcome, match="needs root"):
        missing_prerequisite("mounting a small tmpfs needs root", "run the job as root")
