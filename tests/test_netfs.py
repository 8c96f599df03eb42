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
import torch
from imagegen import make_folder, make_jpegs

from lightning_lmdb import LMDBDataModule, LMDBImageDataset, build_lmdb, netfs
from lightning_lmdb.dataset import close_environments


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
        for cached, trips in ((False, 3), (True, 2)):  # a lookup, an open and a read; then the contents are cached
            if cached:
                time.sleep(netfs.CACHE_TIMEOUT_S + 0.1)  # names and attributes expired: looked up again, as an epoch later
            started = time.perf_counter()
            for name in names:
                with open(mounted.path / name, "rb") as handle:
                    assert handle.read() == (source / name).read_bytes()
            elapsed = time.perf_counter() - started
            assert elapsed >= trips * len(names) * latency, (cached, elapsed)
    assert not netfs.is_mounted(tmp_path / "mnt")


@needs_fuse
def test_without_cached_contents_every_open_reads_again(tmp_path: Path) -> None:
    source = _folder(tmp_path / "src", 6)
    latency = 0.02
    with netfs.mount(source, tmp_path / "mnt", latency_ms=latency * 1e3, cache_contents=False) as mounted:
        for _ in range(2):
            time.sleep(netfs.CACHE_TIMEOUT_S + 0.1)
            started = time.perf_counter()
            for name in sorted(os.listdir(mounted.path)):
                (mounted.path / name).read_bytes()
            assert time.perf_counter() - started >= 3 * 6 * latency  # the read is a round trip every time


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
        close_environments()


def _first_batch(datamodule: LMDBDataModule) -> tuple[torch.Tensor, torch.Tensor]:
    datamodule.prepare_data()
    datamodule.setup("fit")
    return next(iter(datamodule.val_dataloader()))


@needs_fuse
@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_datamodule_reads_through_stable_latency_mounts(tmp_path: Path, backend: str) -> None:
    source = make_folder(tmp_path / "images", per_class=6)
    settings = dict(cache_dir=tmp_path / "cache", backend=backend, image_size=16, batch_size=64, num_workers=2, build_workers=0,
                    val_fraction=0.5)
    direct = LMDBDataModule(source, **settings)
    expected = _first_batch(direct)
    built = {p: p.stat().st_mtime_ns for p in direct.database_paths()}
    slow = LMDBDataModule(source, netfs_latency_ms=2, **settings)
    images, targets = _first_batch(slow)
    assert torch.equal(images, expected[0]) and torch.equal(targets, expected[1])
    mounts = tmp_path / "cache.netfs"
    served = slow.datasets["val"]
    where = Path(served.path if backend == "lmdb" else served.root)
    assert where.is_relative_to(mounts) and netfs.is_mounted(where if backend == "raw" else where.parent)
    assert {p: p.stat().st_mtime_ns for p in slow.database_paths()} == built, "the mount changed the cache key: rebuilt"
    assert set(slow.timings) == ({"prepare_s", "setup_s"} if backend == "lmdb" else {"setup_s"})
    if backend == "raw":  # its scan is a round trip per file and folder: at least a lookup of each of the 19 entries
        assert slow.timings["setup_s"] >= 19 * 2e-3
    again = LMDBDataModule(source, netfs_latency_ms=2, **settings)
    again.setup("fit")
    assert Path(again.datasets["val"].path if backend == "lmdb" else again.datasets["val"].root) == where, "a stable mount point"
    assert slow.cached_files() and not any(Path(p).is_relative_to(mounts) for p in slow.cached_files()), "evicts the disk's files"
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
    try:
        line = process.stdout.readline()
        assert "serving" in line and "Ctrl-C unmounts" in line
        assert sorted(os.listdir(tmp_path / "mnt")) == sorted(os.listdir(source))
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0 and "unmounted" in out, err
        assert not netfs.is_mounted(tmp_path / "mnt")
    finally:  # a failure must not leave a server running and its mount behind
        if process.poll() is None:
            process.kill()
            process.wait()
        if netfs.is_mounted(tmp_path / "mnt"):
            subprocess.run(["fusermount3", "-u", "-z", str(tmp_path / "mnt")], check=False)


def test_refused_clearly_without_fuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_exists = os.path.exists
    monkeypatch.setattr(netfs.os.path, "exists", lambda p: False if p == "/dev/fuse" else real_exists(p))
    monkeypatch.setattr(netfs.shutil, "which", lambda name: None)
    with pytest.raises(netfs.NetfsUnavailableError, match="/dev/fuse does not exist; fusermount3 is not on PATH.*apt-get install fuse3"):
        netfs.mount(tmp_path, tmp_path / "mnt")
    from lightning_lmdb.cli import main

    assert main(["netfs", str(tmp_path), str(tmp_path / "mnt")]) == 2


@needs_fuse
def test_read_benchmark_through_the_mount(tmp_path: Path) -> None:
    from lightning_lmdb.bench import run_read_benchmark

    source = make_jpegs(tmp_path / "src", 10, size=16)
    lines: list[str] = []
    rows = run_read_benchmark(source, tmp_path / "db" / "bench.lmdb", passes=1, workers=0, latency_ms=5, out=lines.append)
    raw_cold = next(r for r in rows if r["storage"] == "raw" and r["regime"] == "cold")
    assert raw_cold["seconds"] >= 10 * 3 * 5e-3, "a fresh mount: each file's lookup, open and read are round trips"
    assert {r["storage"] for r in rows} == {"raw", "lmdb readahead=on", "lmdb readahead=off"}
    assert "through a latency mount, 5 ms per request" in lines[0]
    assert not list(tmp_path.glob("*/mnt")), "its mounts are gone"


@needs_fuse
def test_datamodule_stages_through_the_mount_and_reads_the_local_copy(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "images", per_class=4)
    datamodule = LMDBDataModule(source, cache_dir=tmp_path / "shared", netfs_latency_ms=1, local_cache_dir=tmp_path / "local",
                                image_size=16, batch_size=64, num_workers=0, build_workers=0, val_fraction=0)
    datamodule.prepare_data()
    datamodule.setup("fit")
    copy = tmp_path / "local" / datamodule.database_path("train").name
    assert Path(datamodule.datasets["train"].path) == copy and copy.read_bytes() == datamodule.database_path("train").read_bytes()
    assert datamodule.timings["stage_s"] > 0 and len(datamodule.datasets["train"]) == 12
    close_environments()


@needs_fuse
def test_datamodule_refuses_to_mount_in_a_multi_process_run(tmp_path: Path) -> None:
    from types import SimpleNamespace

    datamodule = LMDBDataModule(make_folder(tmp_path / "images", per_class=2), cache_dir=tmp_path / "cache", netfs_latency_ms=0.5)
    datamodule.trainer = SimpleNamespace(world_size=2)
    with pytest.raises(ValueError, match="emulates network storage for one process, and this run has 2; run it with devices=1"):
        datamodule.prepare_data()
    assert not (tmp_path / "cache.netfs").exists()
