"""A real S3 server on loopback for the tests: moto's server mode in its own process, one per test process.

The ``s3`` fixture (session-scoped, so once per pytest-xdist worker) starts ``moto.server.ThreadedMotoServer`` in a child
process on 127.0.0.1, port 0 (the child prints the port it got), and stops it at the end. Its own process, not a thread of
the test process: the builds under test fork reader processes, and a fork must not copy a server thread's locks.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
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


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """A moto S3 server in its own process on 127.0.0.1 (see the module docstring)."""
    import boto3

    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
    process = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
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
