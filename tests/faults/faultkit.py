"""Run a function in a forked child of the test process, where a signal or a hang cannot hurt pytest.

Importing the builder costs seconds (torchvision), so the fault suite never starts a fresh Python:
it forks the already-imported test process. The child leads a process group of its own (so the
builder's kill points, which SIGKILL the group they lead, kill the child and its pool or DataLoader
workers and nothing else), runs the function, sends back what it returned or raised through a pipe
and leaves with ``os._exit`` (never returning into pytest). The parent waits on a pidfd with a
deadline: a child that hangs is killed with its group and reported, never waited on forever.

Also here: :func:`missing_prerequisite`, for a test whose prerequisite (root, a mount) CI provides: it
skips elsewhere, but fails on CI, where a skip would hide that the test never ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ci import require
from imagegen import read_records


@dataclass
class Outcome:
    """What a forked child did.

    Attributes:
        status: ``"returned"``, ``"raised"``, ``"signalled"`` (killed by ``signum``), ``"exited"`` (left
            without reporting, ``exitcode``) or ``"timeout"`` (killed by the parent at the deadline).
        value: The return value (``"returned"``).
        types: Qualified names of the exception's class and its bases (``"raised"``).
        message: ``str()`` of the exception (``"raised"``).
        errno: The exception's ``errno`` attribute, if any.
        traceback: The formatted traceback, for assertion messages.
    """

    status: str
    value: Any = None
    types: list[str] = field(default_factory=list)
    message: str = ""
    errno: int | None = None
    traceback: str = ""
    signum: int | None = None
    exitcode: int | None = None

    def raised(self, name: str) -> bool:
        """Whether the child raised an exception that is a ``name`` (a class name, bases included)."""
        return self.status == "raised" and any(t.rsplit(".", 1)[-1] == name for t in self.types)

    def __str__(self) -> str:
        if self.status == "raised":
            return f"raised {self.types[0]}: {self.message}\n{self.traceback}"
        if self.status == "signalled":
            return f"killed by {signal.Signals(self.signum).name}"
        return f"{self.status} value={self.value!r} exitcode={self.exitcode}"


class Child:
    """``fn(*args, **kwargs)`` running in a forked child that leads its own process group.

    Args:
        fn: What to run (a module-level function or a closure: nothing is pickled on the way in).
        env: Environment variables set in the child only.
        gate: Read end of a pipe; the child blocks on it before calling ``fn`` until the write end is
            closed everywhere (the parent releases every gated child at once by closing it).
        close: File descriptors the child closes first (e.g. the gate's write end).
    """

    def __init__(
        self, fn: Callable[..., Any], *args: Any, env: dict[str, str] | None = None, gate: int | None = None,
        close: tuple[int, ...] = (), **kwargs: Any,
    ):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 3
            try:
                os.close(read_end)
                for fd in close:
                    os.close(fd)
                os.setpgid(0, 0)
                os.environ.update(env or {})
                if gate is not None:
                    os.read(gate, 1)  # EOF once every write end is closed
                try:
                    payload = {"status": "returned", "value": fn(*args, **kwargs)}
                except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
                    payload = {
                        "status": "raised",
                        "types": [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__],
                        "message": str(exc),
                        "errno": getattr(exc, "errno", None),
                        "traceback": "".join(traceback.format_exception(exc)),
                    }
                data = pickle.dumps(payload)
                view = memoryview(data)
                while view:
                    view = view[os.write(write_end, view):]
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.setpgid(pid, pid)  # also here, so that a kill right after the fork reaches the group
        self.pid = pid
        self._pipe = read_end
        os.set_blocking(read_end, False)
        self._pidfd = os.pidfd_open(pid)
        self._data = bytearray()
        self._eof = False
        self._outcome: Outcome | None = None

    def exited_within(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the child to exit (reading its report meanwhile); True if it did."""
        deadline = time.monotonic() + seconds
        while True:
            self._drain()
            watched = [self._pidfd] if self._eof else [self._pidfd, self._pipe]
            ready, _, _ = select.select(watched, [], [], max(0.0, deadline - time.monotonic()))
            if self._pidfd in ready:
                return True
            if not ready:
                return False

    def kill(self) -> None:
        """SIGKILL the child's process group (its pool or DataLoader workers included)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def outcome(self, timeout: float) -> Outcome:
        """Wait up to ``timeout`` seconds for the child, then reap it; on timeout kill its group first."""
        if self._outcome is not None:
            return self._outcome
        try:
            timed_out = not self.exited_within(timeout)
        except BaseException:  # e.g. pytest-timeout interrupting the wait: no child outlives its test
            self.kill()
            os.waitpid(self.pid, 0)
            raise
        self.kill()  # an exited but unreaped leader's pid still names its group: this reaches leftovers
        self._drain()
        _, status = os.waitpid(self.pid, 0)
        os.close(self._pidfd)
        os.close(self._pipe)
        code = os.waitstatus_to_exitcode(status)
        if timed_out:
            self._outcome = Outcome("timeout")
        elif code < 0:
            self._outcome = Outcome("signalled", signum=-code)
        elif code == 0 and self._data:
            self._outcome = Outcome(**pickle.loads(bytes(self._data)))
        else:
            self._outcome = Outcome("exited", exitcode=code)
        return self._outcome

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._pipe, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                self._eof = True
                return
            self._data += chunk


def run_forked(fn: Callable[..., Any], *args: Any, timeout: float = 60, env: dict[str, str] | None = None, **kwargs: Any) -> Outcome:
    """Run ``fn(*args, **kwargs)`` in a forked child (see :class:`Child`) and return its outcome."""
    return Child(fn, *args, env=env, **kwargs).outcome(timeout)


def contents(path: Path) -> tuple[dict, list[bytes]]:
    """(metadata without ``created`` and ``build_id``, record values) of a finished database."""
    meta, values = read_records(path)
    meta.pop("created")
    meta.pop("build_id")
    return meta, values


def sharded_contents(folder: Path) -> tuple[dict, list[tuple[dict, list[bytes]]]]:
    """(manifest without build ids, digests and ``created``, :func:`contents` of each shard) of a finished sharded database.

    Two builds of one source and options give equal results, however their shards were built (build ids,
    creation times and the header digests covering them differ between builds).
    """
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    for key in ("created", "build_id"):
        manifest.pop(key)
    for entry in manifest["shards"]:
        entry.pop("build_id")
        entry.pop("digest")
    return manifest, [contents(folder / entry["file"]) for entry in manifest["shards"]]


def leftovers(target: Path) -> list[str]:
    """Names of build files (``.partial``, ``.partial-lock``) left beside ``target``."""
    return sorted(p.name for p in target.parent.glob(target.name + ".partial*"))


def missing_prerequisite(reason: str, fix: str) -> None:
    """Skip the test because of ``reason`` (a prerequisite is missing) -- but fail it on CI, whose ``.ci/run`` provides it.

    Args:
        reason: What is missing, e.g. ``"mounting a small tmpfs needs root"``.
        fix: What the CI job must provide, e.g. ``"run the job as root"``.
    """
    require(False, f"{reason}; on CI this test must run, not skip: {fix}")
