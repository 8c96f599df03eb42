"""Network storage, emulated: a read-only FUSE passthrough that makes every operation a round trip.

A folder of many small files on network storage pays a round trip for every ``open``, ``stat`` and
``read``; a local disk answers in microseconds and hides it. :func:`mount` serves a folder at a mount
point through a passthrough that sleeps ``latency_ms`` (plus up to ``jitter_ms``) before answering
each lookup, ``getattr``, ``open``, ``readdir``, ``readlink`` and ``read``, optionally under a
``bandwidth_mb_s`` cap shared by all requests -- what an NFS client sees, without an NFS server:

    with netfs.mount("/data/train", "/tmp/slow/train", latency_ms=0.5) as mounted:
        dataset = RawImageDataset(mounted.path)

    lightning-lmdb netfs /data/train /tmp/slow/train --latency-ms 0.5     # until Ctrl-C

How it behaves, and why:

* **Concurrent requests are served concurrently** (libfuse's multithreaded loop, up to
  ``max_threads``; the sleep releases the GIL): N parallel opens take about one latency, not N, as
  NFS serves many requests in flight. One exception, the kernel's: the *first* lookup of each name in
  a folder is made one at a time (later ones, which revalidate it, are parallel) -- a folder's scan
  pays it once. A ``bandwidth_mb_s`` cap is one token bucket for the mount.
* **Like NFS's close-to-open consistency**: names and attributes are trusted for 1 s
  (``entry_timeout=1``, ``attr_timeout=1``; an NFS client trusts them 3-60 s), so a file opened
  again an epoch later pays its round trips again, while the folders on every path are looked up
  once a second, not per file. File contents are kept (``kernel_cache``; ``cache_contents=False``
  drops a file's cached pages at every open, for data larger than RAM). Opening and reading a small
  file then costs 3 round trips the first time (lookup, open, read) and 2 after (lookup, open), what
  an NFSv4 client pays without delegations (OPEN + READ + CLOSE, then OPEN + CLOSE; NFSv3: LOOKUP,
  GETATTR, ACCESS, READ, then GETATTR). Releasing a file is a request too, without the latency.
  Reads arrive in the kernel's FUSE request size (128 KB, page-cache readahead included), so a
  memory-mapped database pays one round trip per page fault's readahead window.
* **The cost is the latency, not this machine's CPU**: a request at 0 ms costs about 0.2 ms of the
  server's time, and a sleep of 0.5 ms about 0.6 ms. The server shares the cores with the loader; it
  raises its own priority (``nice -10``, where allowed: as root) so that busy loader workers do not
  delay its answers -- otherwise, on a machine with few cores, a CPU-bound loader slows the mount too.
* **The server runs in its own process** (``python -m lightning_lmdb.tools.netfs serve ...``, a session of
  its own): DataLoader workers forked later neither inherit nor stall it. Leaving the ``with`` block
  -- normally, by an exception or Ctrl-C -- or the process's exit unmounts it (``fusermount3 -u``,
  lazily with ``-z`` if it is busy), then stops the server, each step with a timeout, so a dead
  mount never hangs a run.
* **SIGTERM** (``kill``, ``timeout``, a scheduler's stop) unmounts too: while a process holds mounts,
  SIGTERM's default action is preceded by the unmount (the exit status stays -15 / 143) -- unless the
  process has its own SIGTERM handler (Lightning's ``Trainer`` installs one that stops the run at the
  next step): that handler decides, and the exit unmounts. A server whose client is gone (``kill -9``,
  a crash) unmounts lazily and exits within a second. A mount point still left mounted (its server
  killed too) is unmounted by the next mount there.
* **Where FUSE is unavailable** (no ``/dev/fuse``, no libfuse / ``fusermount3``, no ``mfusepy``)
  :func:`check_available` raises :class:`NetfsUnavailableError` saying what to install.

Read-only: a write, create or delete through the mount is refused (``EROFS``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_lmdb.errors import NetfsError, NetfsUnavailableError, OptionError

#: What to install where FUSE is missing.
INSTALL_HINT = ("install FUSE 3 (Debian/Ubuntu: apt-get install fuse3; it needs /dev/fuse, e.g. docker run --device /dev/fuse "
                "--cap-add SYS_ADMIN) and the Python binding (pip install 'lightning_lmdb[netfs]')")
_MOUNT_TIMEOUT_S = 15.0
#: libfuse's FUSE_CAP_PARALLEL_DIROPS: lookups in one folder run in parallel (as on NFS), not one at a time.
_PARALLEL_DIROPS = 1 << 18
_UNMOUNT_TIMEOUT_S = 10.0
#: How often the server checks that the process that started it is still alive.
_PARENT_POLL_S = 0.5
#: The server's scheduling priority where allowed (root): a busy loader must not delay its answers past the latency.
_SERVER_NICE = -10
#: How long the kernel trusts a name's lookup and a file's attributes (then asks again: a round trip).
CACHE_TIMEOUT_S = 1.0


def _fusermount() -> str | None:
    return shutil.which("fusermount3") or shutil.which("fusermount")


def check_available() -> None:
    """Raise :class:`NetfsUnavailableError` unless a FUSE mount can be made here (device, library, helper, binding)."""
    missing = []
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse does not exist")
    elif not os.access("/dev/fuse", os.R_OK | os.W_OK):
        missing.append("/dev/fuse is not readable and writable by this user")
    if _fusermount() is None:
        missing.append("fusermount3 is not on PATH")
    try:
        import mfusepy  # noqa: F401  (loads libfuse: an OSError/EnvironmentError when the library is missing)
    except ImportError:
        missing.append("the Python package mfusepy is not installed")
    except (OSError, EnvironmentError) as exc:  # noqa: UP024  (mfusepy raises EnvironmentError without libfuse)
        missing.append(f"libfuse could not be loaded ({exc})")
    if missing:
        raise NetfsUnavailableError(f"FUSE is not available: {'; '.join(missing)}. To emulate network storage, {INSTALL_HINT}.")


# --- the server (runs in its own process) --------------------------------------------------------------


class _Delay:
    """The injected cost of one request: a latency (plus jitter) and a share of a bandwidth shared by all requests."""

    def __init__(self, latency_s: float, jitter_s: float, bandwidth_b_s: float | None):
        self.latency_s, self.jitter_s, self.bandwidth_b_s = latency_s, jitter_s, bandwidth_b_s
        self._lock = threading.Lock()
        self._free_at = 0.0  # when the bandwidth is next free
        self.requests = 0  # delayed requests served
        self.in_flight = 0  # requests being delayed now
        self.max_in_flight = 0  # the most requests delayed at the same time

    def __call__(self, nbytes: int = 0) -> None:
        wait = self.latency_s + (random.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0)
        with self._lock:
            self.requests += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.bandwidth_b_s and nbytes:  # reserve this transfer's slot of the shared bandwidth
                now = time.monotonic()
                start = max(now, self._free_at)
                self._free_at = start + nbytes / self.bandwidth_b_s
                wait = max(wait, self._free_at - now)
        try:
            if wait > 0:
                time.sleep(wait)
        finally:
            with self._lock:
                self.in_flight -= 1

    def counts(self) -> dict[str, int]:
        """What the mount served: ``requests`` (delayed) and ``max_in_flight`` (the most delayed at the same time)."""
        with self._lock:
            return {"requests": self.requests, "max_in_flight": self.max_in_flight}


def _operations(root: str, delay: _Delay) -> Any:
    import mfusepy

    class Passthrough(mfusepy.Operations):
        """A read-only view of ``root`` whose every request waits ``delay`` first."""

        use_ns = True

        def init_with_config(self, conn: Any, config: Any) -> None:
            if conn is not None and conn.capable & _PARALLEL_DIROPS:  # (libfuse 3 asks for it already)
                conn.want |= _PARALLEL_DIROPS

        def _path(self, path: str) -> str:
            return os.path.join(root, path.lstrip("/"))

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            delay()
            try:
                st = os.lstat(self._path(path)) if fh is None else os.fstat(fh)
            except OSError as exc:
                raise mfusepy.FuseOSError(exc.errno) from None
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_ino")
            attrs = {key.replace("_ns", ""): getattr(st, key) for key in keys}
            attrs["st_mode"] &= ~0o222  # read-only
            return attrs

        def readdir(self, path: str, fh: int) -> list[str]:
            delay()
            try:
                return [".", "..", *os.listdir(self._path(path))]
            except OSError as exc:
                raise mfusepy.FuseOSError(exc.errno) from None

        def readlink(self, path: str) -> str:
            delay()
            try:
                return os.readlink(self._path(path))
            except OSError as exc:
                raise mfusepy.FuseOSError(exc.errno) from None

        def open(self, path: str, flags: int) -> int:
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
                raise mfusepy.FuseOSError(errno.EROFS)
            delay()
            try:
                return os.open(self._path(path), os.O_RDONLY)
            except OSError as exc:
                raise mfusepy.FuseOSError(exc.errno) from None

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            delay(size)
            return os.pread(fh, size, offset)

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(root)
            keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")
            return {key: getattr(st, key) for key in keys}

    return Passthrough()


def serve(source: str, mountpoint: str, *, latency_ms: float, jitter_ms: float = 0.0, bandwidth_mb_s: float | None = None,
          max_threads: int = 32, cache_contents: bool = True) -> dict[str, int]:
    """Serve ``source`` at ``mountpoint`` in this process until unmounted or signalled (what :func:`mount` starts).

    Returns:
        What was served (see :meth:`_Delay.counts`).
    """
    import mfusepy

    delay = _Delay(latency_ms / 1e3, jitter_ms / 1e3, None if bandwidth_mb_s is None else bandwidth_mb_s * 1e6)
    with contextlib.suppress(OSError):  # answers from another machine do not wait for this one's busy cores (root may raise it)
        os.setpriority(os.PRIO_PROCESS, 0, _SERVER_NICE)
    mfusepy.FUSE(_operations(os.path.abspath(source), delay), mountpoint, foreground=True, nothreads=False, ro=True,
                 default_permissions=True, kernel_cache=cache_contents, attr_timeout=CACHE_TIMEOUT_S, entry_timeout=CACHE_TIMEOUT_S,
                 negative_timeout=0,
                 max_threads=max_threads, fsname="lightning-lmdb-netfs", subtype="netfs")
    return delay.counts()


def _exit_with(parent_pid: int, mountpoint: str) -> None:
    """Unmount (lazily if busy) and exit once the process ``parent_pid`` that started this server is gone.

    A client killed by SIGKILL or a crash closes nothing; its server must not serve its mount forever. The
    unmount ends :func:`serve`'s loop; should it not end, the server exits anyway.
    """
    def watch() -> None:
        while os.getppid() == parent_pid:  # a dead parent's children are handed to init (or a subreaper)
            time.sleep(_PARENT_POLL_S)
        _unmount(Path(mountpoint))
        time.sleep(_UNMOUNT_TIMEOUT_S)
        os._exit(1)

    threading.Thread(target=watch, name="netfs-parent-watch", daemon=True).start()


# --- the client side ------------------------------------------------------------------------------------


@dataclass
class Mount:
    """A live mount made by :func:`mount` (close it with :meth:`close`, or leave the ``with`` block).

    Attributes:
        source: The folder served.
        path: The mount point (read the files here).
        latency_ms: The latency added to every request.
        cache_contents: Whether files' pages stay cached across opens.
        seconds_to_mount: How long mounting took (the server's start).
        requests: After :meth:`close`, the requests the server delayed (``None`` before, or if it had to be killed).
        max_in_flight: After :meth:`close`, the most requests it delayed at the same time (``None`` likewise).
    """

    source: Path
    path: Path
    latency_ms: float
    cache_contents: bool = True
    process: subprocess.Popen[bytes] | None = field(repr=False, default=None)
    seconds_to_mount: float = 0.0
    requests: int | None = None
    max_in_flight: int | None = None
    owner_pid: int = field(repr=False, default_factory=os.getpid)  # a forked child inherits the handle, not the server

    def close(self) -> None:
        """Unmount (lazily if busy) and stop the server; each step has a timeout. Safe to call twice."""
        process, self.process = self.process, None
        if process is None:
            return
        _unmount(self.path)
        try:
            process.wait(timeout=_UNMOUNT_TIMEOUT_S)
            self._read_counts(process)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=_UNMOUNT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        finally:
            if process.stdout is not None:
                process.stdout.close()
        with contextlib.suppress(ValueError):
            _LIVE.remove(self)
        _release_sigterm()

    def _read_counts(self, process: subprocess.Popen[bytes]) -> None:
        """Take what the server said it served as it exited (one line of JSON, already in the pipe: never waits)."""
        if process.stdout is None:
            return
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(process.stdout.fileno(), False)
            counts = json.loads(os.read(process.stdout.fileno(), 1 << 16) or b"null")
            if isinstance(counts, dict):
                self.requests, self.max_in_flight = counts.get("requests"), counts.get("max_in_flight")

    def through(self, path: str | os.PathLike[str]) -> Path:
        """``path`` (under :attr:`source`) as it is reached through this mount."""
        return self.path / Path(path).relative_to(self.source)

    def __enter__(self) -> Mount:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_LIVE: list[Mount] = []


@atexit.register
def _close_all() -> None:
    """Close this process's live mounts (a forked child's inherited handles belong to its parent)."""
    for live in list(_LIVE):
        if live.owner_pid == os.getpid():
            live.close()


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM while this process holds mounts: unmount them, then end the process as SIGTERM does (status -15)."""
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        return  # chained to by a handler installed later (Lightning's Trainer): that one decides how to stop; the exit unmounts
    _close_all()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _catch_sigterm() -> None:
    """Have SIGTERM unmount first: where its action is the default one, and from the main thread (where handlers are set)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _release_sigterm() -> None:
    """Give SIGTERM its default action back once this process holds no mount (a handler delays it to the next bytecode)."""
    if (threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is _on_sigterm
            and not any(live.owner_pid == os.getpid() for live in _LIVE)):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def disk_path(path: str | os.PathLike[str]) -> Path:
    """``path`` on the disk when it lies under a live mount of this process (that mount's source), else ``path`` itself."""
    path = Path(path)
    for live in _LIVE:
        if path.is_relative_to(live.path):
            return live.source / path.relative_to(live.path)
    return path


def is_mounted(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a mount point now (also a dead FUSE mount, whose ``stat`` fails)."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as handle:
            return any(line.split()[1].replace("\\040", " ") == target for line in handle if len(line.split()) > 1)
    except OSError:
        return os.path.ismount(path)


def _unmount(path: Path) -> None:
    helper = _fusermount()
    if helper is None or not is_mounted(path):
        return
    for flags in (["-u"], ["-u", "-z"]):  # lazily when busy: detached now, freed when its last user leaves
        with contextlib.suppress(subprocess.TimeoutExpired):
            if subprocess.run([helper, *flags, str(path)], capture_output=True, timeout=_UNMOUNT_TIMEOUT_S).returncode == 0:
                return


def mount(source: str | os.PathLike[str], mountpoint: str | os.PathLike[str], *, latency_ms: float = 0.5, jitter_ms: float = 0.0,
          bandwidth_mb_s: float | None = None, max_threads: int = 32, cache_contents: bool = True) -> Mount:
    """Serve ``source`` read-only at ``mountpoint`` with ``latency_ms`` added to every request (see the module docstring).

    Use it as a context manager (or call ``close()``); it is also unmounted when the process exits.

    Args:
        source: The folder to serve.
        mountpoint: An empty folder (created if missing) or a mount point a dead run left behind (unmounted first).
        latency_ms: Added to every request (0 is allowed: FUSE's own cost only).
        jitter_ms: Up to this much more, uniformly at random, per request.
        bandwidth_mb_s: Cap on the bytes read per second, shared by all requests (``None``: no cap).
        max_threads: Requests served at the same time.
        cache_contents: Keep files' pages cached across opens (``False``: every open starts cold, as data
            larger than RAM would).

    Raises:
        NetfsUnavailableError: FUSE cannot be used here (says what to install).
        FileNotFoundError: ``source`` is not a folder.
        ValueError: A negative latency or jitter, a bandwidth <= 0, or a mount point that is not an empty folder.
        NetfsError: The server failed to start or mount in time (its error output included).
    """
    check_available()
    source, target = Path(source).expanduser().resolve(), Path(mountpoint).expanduser().absolute()
    if not source.is_dir():
        raise FileNotFoundError(f"Cannot serve {str(source)!r}: it is not a folder. Pass the folder to put behind the latency mount.")
    if latency_ms < 0 or jitter_ms < 0 or (bandwidth_mb_s is not None and bandwidth_mb_s <= 0) or max_threads < 1:
        raise OptionError(f"latency_ms={latency_ms}, jitter_ms={jitter_ms} must be >= 0, bandwidth_mb_s={bandwidth_mb_s} > 0 or None, "
                         f"max_threads={max_threads} >= 1.")
    if target == source or target.is_relative_to(source):
        raise OptionError(f"Mount point {str(target)!r} lies inside the folder it would serve ({str(source)!r}); choose one outside it.")
    if is_mounted(target):
        _unmount(target)  # left by a run that died
    target.mkdir(parents=True, exist_ok=True)
    if any(target.iterdir()):
        raise OptionError(f"Mount point {str(target)!r} is not empty; FUSE mounts on an empty folder only. Choose or empty another one.")
    command = [sys.executable, "-m", "lightning_lmdb.tools.netfs", "serve", str(source), str(target), "--latency-ms", str(latency_ms),
               "--jitter-ms", str(jitter_ms), "--max-threads", str(max_threads), "--parent-pid", str(os.getpid())]
    if bandwidth_mb_s is not None:
        command += ["--bandwidth-mb-s", str(bandwidth_mb_s)]
    if not cache_contents:
        command.append("--no-cache")
    _catch_sigterm()
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:  # a file, not a pipe: a server that logs much must not block on a full pipe
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
                                   start_new_session=True)  # Ctrl-C reaches us, not the server: we unmount it in order
        handle = Mount(source, target, latency_ms, cache_contents, process)
        _LIVE.append(handle)  # from now on, SIGTERM or the exit stops it
        while not is_mounted(target):
            if process.poll() is not None:
                handle.close()
                errors.seek(0)
                error = errors.read().decode(errors="replace").strip()
                raise NetfsError(f"The latency mount of {str(source)!r} at {str(target)!r} failed to start: {error or 'no error output'}")
            if time.perf_counter() - started > _MOUNT_TIMEOUT_S:
                handle.close()
                raise NetfsError(f"The latency mount at {str(target)!r} did not appear within {_MOUNT_TIMEOUT_S:.0f} s; it was stopped.")
            time.sleep(0.01)
    handle.seconds_to_mount = time.perf_counter() - started
    return handle


def shared_mount(source: str | os.PathLike[str], mountpoint: str | os.PathLike[str], *, latency_ms: float,
                 cache_contents: bool = True) -> Mount:
    """This process's live mount of ``source`` at ``mountpoint`` with these options, else a new one (see :func:`mount`).

    What a caller that mounts at a stable point on every use wants (``LMDBDataModule`` does, once per
    module): one server per mount point and process, replaced when the options differ.
    """
    source, target = Path(source).expanduser().resolve(), Path(mountpoint).expanduser().absolute()
    for live in list(_LIVE):
        if live.path == target:
            alive = live.process is not None and live.process.poll() is None
            if alive and (live.source, live.latency_ms, live.cache_contents) == (source, latency_ms, cache_contents):
                return live
            live.close()
    return mount(source, target, latency_ms=latency_ms, cache_contents=cache_contents)


@contextlib.contextmanager
def mounted(source: str | os.PathLike[str], mountpoint: str | os.PathLike[str], **options: Any) -> Iterator[Mount]:
    """:func:`mount` as an explicit context manager (``with netfs.mounted(src, mnt, latency_ms=0.5) as m: ...``)."""
    handle = mount(source, mountpoint, **options)
    try:
        yield handle
    finally:
        handle.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m lightning_lmdb.tools.netfs serve SOURCE MOUNTPOINT --latency-ms MS``: the server process of :func:`mount`."""
    parser = argparse.ArgumentParser(prog="python -m lightning_lmdb.tools.netfs")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("source")
    parser.add_argument("mountpoint")
    parser.add_argument("--latency-ms", type=float, required=True)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--bandwidth-mb-s", type=float, default=None)
    parser.add_argument("--max-threads", type=int, default=32)
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--parent-pid", type=int, default=None, help="unmount and exit once this process is gone")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client unmounts; a Ctrl-C meant for it must not kill us first
    if args.parent_pid is not None:
        if os.getppid() != args.parent_pid:
            return 1  # the client died before its server started
        _exit_with(args.parent_pid, args.mountpoint)
    counts = serve(args.source, args.mountpoint, latency_ms=args.latency_ms, jitter_ms=args.jitter_ms,
                   bandwidth_mb_s=args.bandwidth_mb_s, max_threads=args.max_threads, cache_contents=not args.no_cache)
    with contextlib.suppress(OSError):  # the client reads it at close (and may be gone)
        os.write(sys.stdout.fileno(), json.dumps(counts).encode() + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
