"""The rule for a test whose prerequisite is missing: skip it with the reason, except on CI, where it fails.

CI (``.ci/run``, with ``CI=true``) provides every prerequisite the tests have (the ``[test]`` extra's packages,
a disk that honours page-cache eviction, FUSE where it can install it): a skip there would hide a test that
never ran, so it is a failure instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def on_ci() -> bool:
    """Whether the tests run on CI: ``CI`` set to anything but empty, ``0``, ``false`` or ``no`` (``.ci/run``, GitHub Actions, GitLab)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(ok: bool, reason: str) -> None:
    """Go on if ``ok``; else skip the calling test with ``reason`` -- or fail it on CI, where the prerequisite is provided.

    Args:
        ok: Whether the prerequisite is there.
        reason: What is missing and how to provide it (the skip's or the failure's message).
    """
    if ok:
        return
    if on_ci():
        pytest.fail(f"CI={os.environ.get('CI')!r}, but a prerequisite is missing (elsewhere this test skips): {reason}", pytrace=False)
    pytest.skip(reason)


def mount(*args: str) -> subprocess.CompletedProcess:
    """``mount ARGS`` (output captured, never raising)."""
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@contextlib.contextmanager
def small_tmpfs(disk: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``"2m"``) mounted on the empty folder ``disk``, unmounted afterwards.

    Needs root (CI runs as root): elsewhere the calling test skips, on CI it fails (:func:`require`).
    """
    reason = ("mounting a small tmpfs needs root" if os.geteuid() != 0 else "no mount command" if shutil.which("mount") is None
              else None)
    if reason is None and (mounted := mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk))).returncode != 0:
        reason = f"cannot mount a tmpfs here ({mounted.stderr.strip()})"
    require(reason is None, f"{reason}; give the job root and mount rights, as .ci/run expects")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)


def honours_eviction(folder: Path) -> bool:
    """Whether files in ``folder`` leave the page cache when evicted (``posix_fadvise(DONTNEED)``): not on tmpfs, nor on some
    network and FUSE filesystems."""
    from lightning_lmdb.tools.pagecache import evict, resident_fraction

    probe = folder / "fadvise-probe.bin"
    probe.write_bytes(os.urandom(1 << 20))
    try:
        probe.read_bytes()
        evict([probe], sync=True)
        return resident_fraction(probe) < 0.1
    finally:
        probe.unlink()


@contextlib.contextmanager
def evictable_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder whose files the page cache gives up when evicted: ``tmp_path``, else a fresh one beside the tests (the
    checkout's disk; removed afterwards). Neither: the calling test skips with the reason, or fails on CI (:func:`require`),
    whose checkout is on an ordinary disk."""
    if honours_eviction(tmp_path):
        yield tmp_path
        return
    fallback = Path(tempfile.mkdtemp(prefix=".cache-test-", dir=Path(__file__).parent))
    try:
        require(honours_eviction(fallback), f"Neither {tmp_path} nor {fallback} honours posix_fadvise(DONTNEED) (tmpfs or a network "
                                            "filesystem?): run the tests from a checkout on a local disk.")
        yield fallback
    finally:
        shutil.rmtree(fallback, ignore_errors=True)
