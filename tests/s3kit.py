"""A real S3 server on loopback for the tests: moto's server mode in its own process, one per test process.

The ``s3`` fixture (session-scoped, so once per pytest-xdist worker) starts ``moto.server.ThreadedMotoServer`` in a child
process on 127.0.0.1, port 0 (the child prints the port it got), and stops it at the end. Its own process, not a thread of
the test process: the builds under test fork reader processes, and a fork must not copy a server thread's locks.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

_SERVER = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server._server.server_port, flush=True)
sys.stdin.read()  # until the test process closes the pipe
server.stop()
"""

#: Credentials of the loopback server (moto accepts any; these are what the tests must never find printed or saved).
KEY, SECRET = "AKIATESTKEYLLMDB0001", "s3cr3t-TEST-value-that-must-not-leak"


@dataclass
class S3Server:
    """The running server: its endpoint, the storage options that reach it, and a boto3 client."""

    endpoint: str
    options: dict[str, Any]
    client: Any
    _names: Iterator[int] = field(default_factory=itertools.count)

    def bucket(self, prefix: str = "b") -> str:
        """A new empty bucket: ``s3://<name>``."""
        name = f"{prefix}-{os.getpid()}-{next(self._names)}"
        self.client.create_bucket(Bucket=name)
        return f"s3://{name}"


@contextmanager
def running_server(**env: str) -> Iterator[S3Server]:
    """A moto S3 server in its own process on 127.0.0.1, with ``env`` added to its environment (see the module docstring)."""
    import boto3

    environment = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, **env}
    process = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env=environment)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                              region_name="us-east-1")
        yield S3Server(endpoint, {"endpoint_url": endpoint, "key": KEY, "secret": SECRET}, client)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """A moto S3 server in its own process on 127.0.0.1 (see the module docstring)."""
    with running_server() as server:
        yield server


_AGENT = re.compile(rb"(?im)^user-agent: *([^/ \r\n]+)")


class FaultProxy:
    """A TCP proxy in front of the S3 server that drops or stalls connections when told to (a hook, never a timer).

    ``fail("drop" | "stall", direction="down" | "up", times=N, after=BYTES)``: the next ``N`` connections that carry more than
    ``after`` bytes in ``direction`` (``down``: responses, ``up``: uploads) are cut there -- closed (``drop``) or held open
    with no byte more (``stall``) until :meth:`close`. ``faults`` counts those done; ``agents`` holds the client libraries
    seen (the ``User-Agent`` headers' first word: which client made the requests).
    """

    def __init__(self, upstream: str) -> None:
        self._upstream = int(upstream.rsplit(":", 1)[1])
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._plan: tuple[str, str, int, int] = ("", "", 0, 0)
        self._closed = threading.Event()
        self.faults = 0
        self.agents: set[str] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def fail(self, kind: str, *, direction: str = "down", times: int = 1, after: int = 64 << 10) -> None:
        with self._lock:
            self._plan, self.faults = (kind, direction, times, after), 0

    def _take(self, direction: str, count: int) -> str:
        with self._lock:
            kind, wanted, times, after = self._plan
            if kind and wanted == direction and times > 0 and count > after:
                self._plan = (kind, wanted, times - 1, after)
                self.faults += 1
                return kind
        return ""

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._upstream))
            for source, sink, direction in ((client, upstream, "up"), (upstream, client, "down")):
                threading.Thread(target=self._pump, args=(source, sink, direction, (client, upstream)), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, direction: str, pair: tuple[socket.socket, socket.socket]) -> None:
        count, fault = 0, ""
        try:
            while not fault:
                data = source.recv(16 << 10)
                if not data:
                    break
                count += len(data)
                if direction == "up":
                    self.agents.update(agent.decode(errors="replace") for agent in _AGENT.findall(data))
                fault = self._take(direction, count)
                if fault == "stall":
                    self._closed.wait()
                if not fault:
                    sink.sendall(data)
        except OSError:
            pass
        for end in pair if fault else (sink,):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR) if fault else end.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
