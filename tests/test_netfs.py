"""The latency mount: latency applied per request, concurrency, read-only, unmount on exit/error/death, a clear refusal without FUSE."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from ci import require
from imagegen import make_folder, make_jpegs

from lightning_lmdb import LMDBDataModule, LMDBImageDataset, build_lmdb
from lightning_lmdb.experiment.datamodule import ExperimentDataModule
from lightning_lmdb.store import envs
from lightning_lmdb.tools import netfs


def _available() -> str | None:
    try:
        netfs.check_available()
    except netfs.NetfsUnavailableError as exc:
        return str(exc)
    return None


UNAVAILABLE = _available()
pytestmark = pytest.mark.slow


def needs_fuse(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` where FUSE works; elsewhere skip it -- but fail it in CI (``CI=true``), where a skip would hide that it never ran."""

    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        require(UNAVAILABLE is None, f"FUSE unavailable here, so the latency mount is untested: {UNAVAILABLE}")
        test(*args, **kwargs)

    return run


def _mounts_under(root: Path) -> list[str]:
    """The mount points at or under ``root`` (from /proc/mounts)."""
    prefix = os.path.realpath(root)
    with open("/proc/mounts", encoding="utf-8") as handle:
        points = [line.split()[1].replace("\\040", " ") for line in handle]
    return [p for p in points if p == prefix or p.startswith(prefix + os.sep)]


def _servers_under(root: Path) -> list[int]:
    """The live (not zombie) netfs server processes whose mount point lies under ``root``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if b"lightning_lmdb.tools.netfs" in argv and any(a.startswith(str(root).encode()) for a in argv[4:6]) and state != "Z":
            found.append(int(entry.name))
    return found


def _eventually(condition: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    """Whether ``condition`` holds within ``timeout_s`` (a bound on a hang, far above the second it takes)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _clean_up(process: subprocess.Popen, root: Path) -> None:
    """After a test, pass or fail: no process, server or mount of it left behind."""
    if process.poll() is None:
        process.kill()
        process.wait()
    for pid in _servers_under(root):
        os.kill(pid, signal.SIGKILL)
    for point in _mounts_under(root):
        subprocess.run(["fusermount3", "-u", "-z", point], check=False)


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
    with netfs.mount(source, tmp_path / "mnt", latency_ms=250) as mounted:
        names = [mounted.path / f"f{i:02d}.bin" for i in range(16)]
        for name in names:  # a scan: the kernel makes each name's first lookup in a folder one at a time
            os.stat(name)
        time.sleep(netfs.CACHE_TIMEOUT_S + 0.1)  # every name expired: each stat below is a round trip (a revalidation)
        go = threading.Barrier(len(names))
        threads = [threading.Thread(target=lambda n=name: (go.wait(), os.stat(n))) for name in names]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert mounted.requests is not None and mounted.requests >= 2 * len(names), "each stat reached the server"
    assert mounted.max_in_flight is not None and mounted.max_in_flight >= 2, "16 stats released at once were served one at a time"


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
        envs.close_all()


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
    slow = ExperimentDataModule(source, netfs_latency_ms=2, **settings)
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
    again = ExperimentDataModule(source, netfs_latency_ms=2, **settings)
    again.setup("fit")
    assert Path(again.datasets["val"].path if backend == "lmdb" else again.datasets["val"].root) == where, "a stable mount point"
    assert slow.cached_files() and not any(Path(p).is_relative_to(mounts) for p in slow.cached_files()), "evicts the disk's files"
    envs.close_all()


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
    script = (f"import os, signal; from lightning_lmdb import netfs; m = netfs.mount({str(source)!r}, {str(tmp_path / 'mnt')!r}, "
              "latency_ms=0); os.kill(m.process.pid, signal.SIGKILL); m.process.wait(); os._exit(0)")  # both die: a dead mount stays
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert netfs.is_mounted(tmp_path / "mnt")
    with netfs.mount(source, tmp_path / "mnt", latency_ms=0) as mounted:
        assert sorted(os.listdir(mounted.path)) == sorted(os.listdir(source))
    assert not netfs.is_mounted(tmp_path / "mnt")


def _start_cli_netfs(tmp_path: Path) -> tuple[Path, subprocess.Popen]:
    """``lightning-lmdb netfs SRC MNT --latency-ms 1`` started on a fresh folder; its source and process."""
    source = _folder(tmp_path / "src")
    process = subprocess.Popen([sys.executable, "-m", "lightning_lmdb.tools.cli", "netfs", str(source), str(tmp_path / "mnt"),
                                "--latency-ms", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return source, process


@needs_fuse
def test_cli_serves_until_ctrl_c(tmp_path: Path) -> None:
    source, process = _start_cli_netfs(tmp_path)
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


@needs_fuse
def test_cli_unmounts_and_stops_its_server_on_sigterm(tmp_path: Path) -> None:
    source, process = _start_cli_netfs(tmp_path)
    try:
        assert "serving" in process.stdout.readline()
        assert _mounts_under(tmp_path / "mnt") and _servers_under(tmp_path / "mnt"), "mounted and served"
        process.send_signal(signal.SIGTERM)  # kill, timeout, a scheduler's stop
        _, err = process.communicate(timeout=60)
        assert process.returncode == -signal.SIGTERM, err  # still reported as ended by SIGTERM
        assert _mounts_under(tmp_path / "mnt") == [], "unmounted before it ended"
        assert _servers_under(tmp_path / "mnt") == [], "its server stopped, not orphaned"
    finally:
        _clean_up(process, tmp_path / "mnt")


_HOLD_DATAMODULE_MOUNTS = """
import sys, time
from lightning_lmdb.experiment.datamodule import ExperimentDataModule
datamodule = ExperimentDataModule(sys.argv[1], cache_dir=sys.argv[2], backend="raw", netfs_latency_ms=1, image_size=16, num_workers=0,
                            val_fraction=0.5)
datamodule.setup("fit")
print("mounted", flush=True)
time.sleep(600)
"""


@needs_fuse
def test_a_run_holding_datamodule_mounts_unmounts_them_on_sigterm(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "images", per_class=2)
    mounts = tmp_path / "cache.netfs"
    process = subprocess.Popen([sys.executable, "-c", _HOLD_DATAMODULE_MOUNTS, str(source), str(tmp_path / "cache")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "mounted", process.stderr.read() if process.poll() is not None else ""
        assert _mounts_under(mounts) and _servers_under(mounts), "the module mounted its folders"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == -signal.SIGTERM, err
        assert _mounts_under(mounts) == [] and _servers_under(mounts) == [], "SIGTERM skips atexit: unmounted by the handler"
    finally:
        _clean_up(process, mounts)


@needs_fuse
def test_a_server_whose_client_is_killed_unmounts_and_exits(tmp_path: Path) -> None:
    source = _folder(tmp_path / "src")
    script = (f"import time; from lightning_lmdb import netfs; netfs.mount({str(source)!r}, {str(tmp_path / 'mnt')!r}); "
              "print('up', flush=True); time.sleep(600)")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "up"
        assert _mounts_under(tmp_path / "mnt") and _servers_under(tmp_path / "mnt")
        process.kill()  # SIGKILL: no handler, no atexit
        process.wait()
        assert _eventually(lambda: not _servers_under(tmp_path / "mnt")), "the server outlived its client"
        assert _mounts_under(tmp_path / "mnt") == [], "the server unmounted before it exited"
    finally:
        _clean_up(process, tmp_path / "mnt")


_LATER_HANDLER = """
import os, signal, sys, time
from lightning_lmdb import netfs
netfs.mount(sys.argv[1], sys.argv[2], latency_ms=0)
previous, stop = signal.getsignal(signal.SIGTERM), []
def handler(signum, frame):  # as Lightning's Trainer does: note the request, call the previous handler, stop at the next step
    stop.append(signum)
    previous(signum, frame)
signal.signal(signal.SIGTERM, handler)
print("up", flush=True)
while not stop:
    time.sleep(0.01)
print("mounted after SIGTERM:", netfs.is_mounted(sys.argv[2]), flush=True)
sys.exit(3)
"""


@needs_fuse
def test_a_sigterm_handler_installed_later_decides_and_the_exit_unmounts(tmp_path: Path) -> None:
    source = _folder(tmp_path / "src")
    process = subprocess.Popen([sys.executable, "-c", _LATER_HANDLER, str(source), str(tmp_path / "mnt")], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "up"
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 3 and "mounted after SIGTERM: True" in out, err  # its handler's choice: stop later
        assert _mounts_under(tmp_path / "mnt") == [] and _servers_under(tmp_path / "mnt") == [], "the exit unmounted"
    finally:
        _clean_up(process, tmp_path / "mnt")


@needs_fuse
def test_a_forked_child_on_sigterm_leaves_its_parents_mount_alone(tmp_path: Path) -> None:
    source = _folder(tmp_path / "src")
    with netfs.mount(source, tmp_path / "mnt", latency_ms=0) as mounted:
        ready, started = os.pipe()
        child = os.fork()  # as a DataLoader worker: it inherits the handle and the SIGTERM handler, not the server
        if child == 0:
            try:
                os.write(started, b"1")
                time.sleep(600)
            finally:
                os._exit(0)
        os.read(ready, 1)  # (Python drops a signal that arrives while the child still sets itself up after the fork)
        os.close(ready)
        os.close(started)
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
        assert netfs.is_mounted(mounted.path) and mounted.process.poll() is None, "the child unmounted its parent's mount"
        assert sorted(os.listdir(mounted.path)) == sorted(os.listdir(source))
    assert not netfs.is_mounted(tmp_path / "mnt")


def test_refused_clearly_without_fuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_exists = os.path.exists
    monkeypatch.setattr(netfs.os.path, "exists", lambda p: False if p == "/dev/fuse" else real_exists(p))
    monkeypatch.setattr(netfs.shutil, "which", lambda name: None)
    with pytest.raises(netfs.NetfsUnavailableError, match="/dev/fuse does not exist; fusermount3 is not on PATH.*apt-get install fuse3"):
        netfs.mount(tmp_path, tmp_path / "mnt")
    from lightning_lmdb.tools.cli import main

    assert main(["netfs", str(tmp_path), str(tmp_path / "mnt")]) == 2


@needs_fuse
def test_read_benchmark_through_the_mount(tmp_path: Path) -> None:
    from lightning_lmdb.tools.bench import run_read_benchmark

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
    latency_s = 1e-3
    datamodule = ExperimentDataModule(source, cache_dir=tmp_path / "shared", netfs_latency_ms=latency_s * 1e3,
                                      local_cache_dir=tmp_path / "local", image_size=16, batch_size=64, num_workers=0, build_workers=0,
                                      val_fraction=0)
    started = time.perf_counter()
    datamodule.prepare_data()
    around = time.perf_counter() - started
    datamodule.setup("fit")
    copy = tmp_path / "local" / datamodule.database_path("train").name
    assert Path(datamodule.datasets["train"].path) == copy and copy.read_bytes() == datamodule.database_path("train").read_bytes()
    # copying through the mount opened the file there (a round trip: one latency at least), within prepare_data's time
    assert latency_s <= datamodule.timings["stage_s"] <= around
    assert len(datamodule.datasets["train"]) == 12
    envs.close_all()


@needs_fuse
def test_datamodule_refuses_to_mount_in_a_multi_process_run(tmp_path: Path) -> None:
    from types import SimpleNamespace

    datamodule = ExperimentDataModule(make_folder(tmp_path / "images", per_class=2), cache_dir=tmp_path / "cache", netfs_latency_ms=0.5)
    datamodule.trainer = SimpleNamespace(world_size=2)
    with pytest.raises(ValueError, match="emulates network storage for one process, and this run has 2; run it with devices=1"):
        datamodule.prepare_data()
    assert not (tmp_path / "cache.netfs").exists()
