"""The latency mount: latency applied per request, concurrency, read-only, unmount on exit/error/death, a clear refusal without FUSE."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from imagegen import make_jpegs

from lightning_lmdb import LMDBImageDataset, build_lmdb, netfs


def _available() -> str | None:
    try:
        netfs.check_available()
    except netfs.NetfsUnavailableError as exc:
        return str(exc)
    return None


UNAVAILABLE = _available()
needs_fuse = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"FUSE unavailable here: {UNAVAILABLE}")
pytestmark = pytest.mark.slow


def _folder(root: Path, count: int = 12) -> Path:
    for i in range(count):
        (root / f"f{i:02d}.bin").parent.mkdir(parents=True, exist_ok=True)
        (root / f"f{i:02d}.bin").write_bytes(os.urandom(1000 + i))
    return root


@needs_fuse
def test_latency_is_applied_to_every_request(tmp_path: Path) -> None:
    source = _folder(tmp_path / "src")
    latency = 0.02
    with netfs.mount(source, tmp_path / "mnt", latency_ms=latency * 1e3) as mounted:
        names = sorted(os.listdir(mounted.path))
        assert names == sorted(os.listdir(source))
        started = time.perf_counter()
        for name in names:
            with open(mounted.path / name, "rb") as handle:  # a lookup, an open and a read: at least three round trips
                assert handle.read() == (source / name).read_bytes()
        assert time.perf_counter() - started >= 3 * len(names) * latency
    assert not netfs.is_mounted(tmp_path / "mnt")


@needs_fuse
def test_concurrent_requests_are_served_concurrently(tmp_path: Path) -> None:
    source = _folder(tmp_path / "src", 16)
    latency = 0.1
    with netfs.mount(source, tmp_path / "mnt", latency_ms=latency * 1e3) as mounted:
        names = [mounted.path / f"f{i:02d}.bin" for i in range(16)]
        for name in names:  # a scan: the kernel makes each name's first lookup in a folder one at a time
            os.stat(name)
        threads = [threading.Thread(target=os.stat, args=(name,)) for name in names]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
    assert latency <= elapsed < 6 * latency, f"16 parallel stats took {elapsed:.2f} s: served one at a time?"


@needs_fuse
def test_read_only_and_a_database_reads_through_it(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 8, size=16)
    database = build_lmdb(source, tmp_path / "db" / "images.lmdb", workers=0, progress=False)
    local = LMDBImageDataset(database)
    with netfs.mount(database.parent, tmp_path / "mnt", latency_ms=1) as mounted:
        with pytest.raises(OSError):
            (mounted.path / "new.txt").write_text("no")
        remote = LMDBImageDataset(mounted.path / database.name)  # memory-mapped through the mount
        assert [remote[i][1] for i in range(len(remote))] == [local[i][1] for i in range(len(local))]
        assert all(remote[i][0].tobytes() == local[i][0].tobytes() for i in range(len(local)))
        from lightning_lmdb.dataset import close_environments

        close_environments()


@needs_fuse
def test_unmounted_after_an_error_and_when_the_process_exits(tmp_path: Path) -> None:
    source = _folder(tmp_path / "src")
    with pytest.raises(ValueError, match="boom"):
        with netfs.mount(source, tmp_path / "mnt", latency_ms=0) as mounted:
            server = mounted.process
            raise ValueError("boom")
    assert not netfs.is_mounted(tmp_path / "mnt") and server.poll() is not None
    script = f"from lightning_lmdb import netfs; netfs.mount({str(source)!r}, {str(tmp_path / 'mnt2')!r}, latency_ms=0); print('up')"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "up" in done.stdout, done.stderr
    assert not netfs.is_mounted(tmp_path / "mnt2"), "unmounted at exit"


@needs_fuse
def test_a_mount_left_by_a_killed_run_is_replaced(tmp_path: Path) -> None:
    source = _folder(tmp_path / "src")
    script = (f"import os; from lightning_lmdb import netfs; netfs.mount({str(source)!r}, {str(tmp_path / 'mnt')!r}, latency_ms=0); "
              "os._exit(0)")  # dies without cleaning up: the server and its mount stay behind
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert netfs.is_mounted(tmp_path / "mnt")
    with netfs.mount(source, tmp_path / "mnt", latency_ms=0) as mounted:
        assert sorted(os.listdir(mounted.path)) == sorted(os.listdir(source))
    assert not netfs.is_mounted(tmp_path / "mnt")


@needs_fuse
def test_cli_serves_until_ctrl_c(tmp_path: Path) -> None:
    source = _folder(tmp_path / "src")
    process = subprocess.Popen([sys.executable, "-m", "lightning_lmdb.cli", "netfs", str(source), str(tmp_path / "mnt"), "--latency-ms",
                                "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert "serving" in line and "Ctrl-C unmounts" in line
    assert sorted(os.listdir(tmp_path / "mnt")) == sorted(os.listdir(source))
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and "unmounted" in out, err
    assert not netfs.is_mounted(tmp_path / "mnt")


def test_refused_clearly_without_fuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_exists = os.path.exists
    monkeypatch.setattr(netfs.os.path, "exists", lambda p: False if p == "/dev/fuse" else real_exists(p))
    monkeypatch.setattr(netfs.shutil, "which", lambda name: None)
    with pytest.raises(netfs.NetfsUnavailableError, match="/dev/fuse does not exist; fusermount3 is not on PATH.*apt-get install fuse3"):
        netfs.mount(tmp_path, tmp_path / "mnt")
    from lightning_lmdb.cli import main

    assert main(["netfs", str(tmp_path), str(tmp_path / "mnt")]) == 2
