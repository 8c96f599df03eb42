"""Object storage (#34): staging, building and serving from S3 through a fixed request latency, vs local disk.

Usage:
    python benchmarks/bench_s3.py [--parts stage,build,epoch,server] [--count 10000] [--db-mb 200] [--latency-ms 20]
                                  [--concurrency 1,8,32,64] [--readers N] [--workers 2] [--images photos|small]
                                  [--fast-server] [--pin] [--work DIR]

The S3 server is moto's (``moto.server.ThreadedMotoServer``) in its own process on 127.0.0.1, port 0; in front of it, a TCP
proxy in another process of its own (:func:`proxy_main`, asyncio) adds ``--latency-ms`` to every HTTP request: on each
connection, the first bytes the client sends after it last received bytes from the server (or on a new connection) wait
``--latency-ms`` before they are forwarded; the rest of a request (an upload's body) and every response flow without delay, and
an interim ``100 Continue`` does not count as a response. So each request pays one round trip, as a request to a remote
region would; bandwidth is loopback's. Objects are put in place directly (not through the proxy); every measured request goes
through it. Everything runs on this machine: the server's CPU competes with the client's (the build's readers included).

Parts (each prints a markdown table):

- ``stage``: a database of about ``--db-mb`` MB (generated JPEGs stored as decoded pixels) published with
  ``lightning_lmdb.tools.publish.push``, then downloaded with ``lightning_lmdb.tools.staging.stage_remote``, MB/s; against
  copying the same file on local disk, its pages evicted first (cold) and cached (warm).
- ``build``: ``--count`` JPEGs (``--images``: ImageNet-like, 256-500 px, or small, 32-64 px) built with ``build_lmdb`` and
  ``--readers`` (default: the library's) from the local folder, then from an ``s3://`` prefix holding the same files at
  each ``--concurrency`` (``remote.objects.FETCH_CONCURRENCY``: objects fetched at once), images/s; with the CPU per image
  of the build and of the server + proxy apart, and the rate the build's own CPU allows on this machine's cores (what it
  could reach with the server elsewhere, as S3 is). ``--pin`` puts the server side on the last core and the builds on the
  others; ``--fast-server`` puts a caching GET front before moto (each object answered from memory once read, read once
  before the timed builds), a server that costs this machine little per GET, as S3 costs it nothing.
- ``epoch``: one training epoch (``--workers`` loader workers, 32 px crops) of ``backend="raw"`` reading the objects (one
  GET per sample) vs the database published on S3 and staged to local disk by ``prepare_data`` (its staging timed apart),
  images/s.

- ``server``: what one GET of a 4 KB object costs moto's server and this client in CPU, straight to the server at a few
  concurrencies: moto (Python, one process) bounds any build from it on this machine, whatever the client does.

Parts whose library code is missing (published databases, S3 sources) are skipped with a line that says so.

Caveats: the concurrency is set as ``objects.FETCH_CONCURRENCY`` and ``objects.read_many``'s default in this process, which
the build's reader processes inherit when they are forked (not when spawned). "cold" evicts the database's pages with
``posix_fadvise``, which a tmpfs ignores: put ``--work`` on a disk (a temporary folder in ``/tmp`` may be a tmpfs).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
#: Credentials of the local server (moto takes any).
KEY, SECRET = "AKIABENCHS3LOCAL0001", "bench-s3-local-secret"

_SERVER = """
import sys
from moto.moto_server.werkzeug_app import MotoRequestHandler
from moto.server import ThreadedMotoServer
MotoRequestHandler.protocol_version = "HTTP/1.1"  # keep-alive, as S3: werkzeug's default closes each connection
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server._server.server_port, flush=True)
sys.stdin.read()  # until the parent closes the pipe
server.stop()
"""


# --- the latency proxy (its own process) ---------------------------------------------------------------------------


async def _pipe_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: dict[str, bool], delay: float) -> None:
    """Client -> server: the first chunk of each request waits ``delay`` (see the module docstring)."""
    while data := await reader.read(1 << 16):
        if state["new_request"]:
            state["new_request"] = False
            await asyncio.sleep(delay)
        writer.write(data)
        await writer.drain()
    writer.close()


async def _pipe_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: dict[str, bool]) -> None:
    """Server -> client: a response (not a ``100 Continue``) means the client's next bytes start a new request."""
    while data := await reader.read(1 << 16):
        if not data.startswith(b"HTTP/1.1 100") and not data.startswith(b"HTTP/1.0 100"):
            state["new_request"] = True
        writer.write(data)
        await writer.drain()
    writer.close()


async def _serve_proxy(upstream_port: int, delay_ms: float, ready: Callable[[int], None]) -> None:
    delay = delay_ms / 1000

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            client_writer.close()
            return
        state = {"new_request": True}
        tasks = [asyncio.create_task(_pipe_client(client_reader, server_writer, state, delay)),
                 asyncio.create_task(_pipe_server(server_reader, client_writer, state))]
        try:
            await asyncio.gather(*tasks)
        except (ConnectionError, OSError):
            pass
        finally:
            for task in tasks:
                task.cancel()
            for writer in (client_writer, server_writer):
                writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    ready(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


# --- a caching GET front (its own process; --fast-server) -----------------------------------------------------------


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[str, str, dict[str, str], bytes]:
    """One HTTP/1.1 request: method, target, headers (lower-case names), body (after a ``100 Continue`` when asked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:] if line)}
    if headers.pop("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
    return method, target, headers, body


def _response(status: int, reason: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{name}: {value}" for name, value in headers.items()),
             f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


async def _serve_gets(upstream_port: int, ready: Callable[[int], None]) -> None:
    """Answer ``GET /bucket/key`` of an object read once already from memory (``If-Match`` against its ETag, ``Range``);
    send every other request to moto. What a server that costs this machine little looks like: S3's own CPU is elsewhere."""
    import http.client

    cache: dict[str, tuple[bytes, str]] = {}

    def forward(method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, str, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
        sent = {name: value for name, value in headers.items() if name not in ("connection", "content-length")}
        connection.request(method, target, body=body or None, headers=sent)
        answer = connection.getresponse()
        data = answer.read()
        kept = {name: value for name, value in answer.getheaders()
                if name.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date")}
        connection.close()
        return answer.status, answer.reason, kept, data

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                method, target, headers, body = await _read_request(reader, writer)
                hit = cache.get(target) if method == "GET" and "?" not in target else None
                if hit is not None:
                    data, etag = hit
                    if headers.get("if-match", etag).strip('"') != etag:
                        writer.write(_response(412, "Precondition Failed", {}, b"<Error><Code>PreconditionFailed</Code></Error>"))
                    elif "range" in headers:
                        first, _, last = headers["range"].removeprefix("bytes=").partition("-")
                        end = min(len(data), int(last) + 1) if last else len(data)
                        writer.write(_response(206, "Partial Content", {"ETag": f'"{etag}"',
                                                                       "Content-Range": f"bytes {first}-{end - 1}/{len(data)}"},
                                               data[int(first):end]))
                    else:
                        writer.write(_response(200, "OK", {"ETag": f'"{etag}"', "Content-Type": "binary/octet-stream"}, data))
                else:
                    status, reason, kept, data = await asyncio.to_thread(forward, method, target, headers, body)
                    etag = next((value for name, value in kept.items() if name.lower() == "etag"), "")
                    if method == "GET" and "?" not in target and status == 200 and "range" not in headers and etag:
                        cache[target] = (data, etag.strip('"'))
                    writer.write(_response(status, reason, kept, data))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    ready(server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


def proxy_main(upstream_port: int, delay_ms: float) -> None:
    """Run the proxy in this process: print the port it listens on, serve until killed."""
    asyncio.run(_serve_proxy(upstream_port, delay_ms, lambda port: print(port, flush=True)))


# --- processes ----------------------------------------------------------------------------------------------------


@dataclass
class Endpoints:
    """The S3 server (``direct``, to put objects in place) and the latency proxy in front of it (``proxied``)."""

    direct: str
    proxied: str
    latency_ms: float
    server_pid: int = 0
    proxy_pid: int = 0
    front_pid: int = 0

    @property
    def pids(self) -> list[int]:
        """The server's, the proxy's and the GET front's processes (their CPU is the server side's)."""
        return [pid for pid in (self.server_pid, self.proxy_pid, self.front_pid) if pid]

    def options(self, *, proxied: bool = True) -> dict[str, Any]:
        """The ``storage_options`` that reach the server (through the proxy by default)."""
        return {"endpoint_url": self.proxied if proxied else self.direct, "key": KEY, "secret": SECRET}

    def client(self) -> Any:
        """A boto3 client to the server itself (not through the proxy)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.direct, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                            region_name="us-east-1", config=Config(max_pool_connections=32))


def _child(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, env={**os.environ, **(env or {})})  # moto logs every request on stderr
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.strip().isdigit():
        process.kill()
        raise RuntimeError(f"{shlex.join(args[:2])}... did not start (printed {line!r}); is moto installed? "
                           "pip install -e '.[test]' (moto[s3] and flask)")
    return process, int(line)


@contextmanager
def s3_behind_proxy(latency_ms: float, fast: bool = False) -> Iterator[Endpoints]:
    """moto's S3 server and the latency proxy, each in its own process, stopped at the end. With ``fast``, a caching GET
    front (:func:`_serve_gets`, its own process) between them: ``direct`` is then the front."""
    server, port = _child(["-c", _SERVER], {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET})
    proxy = front = None
    try:
        if fast:
            front, port = _child([str(HERE), "--front", str(port)])
        proxy, proxy_port = _child([str(HERE), "--proxy", str(port), str(latency_ms)])
        yield Endpoints(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{proxy_port}", latency_ms, server.pid, proxy.pid,
                        front.pid if front is not None else 0)
    finally:
        for child in (proxy, front):
            if child is not None:
                child.kill()
                child.wait(10)
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


# --- helpers ------------------------------------------------------------------------------------------------------


def library(module: str, name: str) -> Any:
    """``module.name`` of the library, imported by name (the modules of #34 written in parallel may be missing here)."""
    import importlib

    return getattr(importlib.import_module(module), name)


def missing(module: str, name: str) -> str | None:
    """``None`` when ``module.name`` imports, else a line saying what is missing."""
    try:
        library(module, name)
    except (ImportError, AttributeError) as exc:
        return f"{module}.{name} is not available here ({type(exc).__name__}: {exc}): this part needs #34's publish/staging work"
    return None


def table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def make_bucket(endpoints: Endpoints, name: str) -> str:
    endpoints.client().create_bucket(Bucket=name)
    return f"s3://{name}"


def upload_folder(endpoints: Endpoints, folder: Path, url: str) -> int:
    """Put every file of ``folder`` under the prefix ``url`` directly on the server (32 at once); returns the bytes."""
    from concurrent.futures import ThreadPoolExecutor

    client = endpoints.client()
    bucket, _, prefix = url.split("://", 1)[1].partition("/")
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".")]

    def put(path: Path) -> int:
        client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}".lstrip("/"))
        return path.stat().st_size

    with ThreadPoolExecutor(32) as pool:
        return sum(pool.map(put, files))


def set_fetch_concurrency(value: int) -> None:
    """``remote.objects.FETCH_CONCURRENCY`` (and ``read_many``'s default) in this process and the readers it forks."""
    from lightning_lmdb.remote import objects

    objects.FETCH_CONCURRENCY = value
    defaults = objects.read_many.__defaults__
    if defaults:
        objects.read_many.__defaults__ = (*defaults[:-1], value)


# --- parts --------------------------------------------------------------------------------------------------------


def part_stage(endpoints: Endpoints, work: Path, db_mb: int, rounds: int) -> str:
    problem = missing("lightning_lmdb.tools.publish", "push") or missing("lightning_lmdb.tools.staging", "stage_remote")
    if problem:
        return f"stage: skipped: {problem}"
    from common import make_jpeg_folder

    from lightning_lmdb import build_lmdb
    from lightning_lmdb.remote import fs
    from lightning_lmdb.tools import pagecache

    push = library("lightning_lmdb.tools.publish", "push")
    stage_remote = library("lightning_lmdb.tools.staging", "stage_remote")

    count = max(8, db_mb * 1_000_000 // 173_000)  # decoded pixels of 160-320 px JPEGs: ~173 KB each
    source = make_jpeg_folder(work / f"stage_src_{count}", count)
    database = build_lmdb(source, work / f"stage_{count}.lmdb", storage="decoded", on_stale="ignore")
    size = Path(database).stat().st_size
    bucket = make_bucket(endpoints, "stage")
    url = f"{bucket}/stage.lmdb"
    fs.use_options(bucket, endpoints.options())
    started = time.perf_counter()
    push(database, url, progress=False)
    push_s = time.perf_counter() - started
    rows: dict[str, list[float]] = {"S3 stage_remote": [], "local copy (cold)": [], "local copy (warm)": []}
    for round_ in range(rounds):
        target = work / f"staged_{round_}"
        shutil.rmtree(target, ignore_errors=True)
        started = time.perf_counter()
        stage_remote(url, target)
        rows["S3 stage_remote"].append(time.perf_counter() - started)
        for label, evict in (("local copy (cold)", True), ("local copy (warm)", False)):
            copy = work / "copy.lmdb"
            copy.unlink(missing_ok=True)
            if evict:
                pagecache.evict([str(database)], sync=True)
            started = time.perf_counter()
            shutil.copyfile(database, copy)
            with open(copy, "rb+") as handle:
                os.fsync(handle.fileno())
            rows[label].append(time.perf_counter() - started)
        shutil.rmtree(target, ignore_errors=True)
    mb = size / 1e6
    body = [[label, f"{statistics.median(times):.2f}", f"{mb / statistics.median(times):.0f}"] for label, times in rows.items()]
    return table(f"Staging a {mb:.0f} MB database ({endpoints.latency_ms:g} ms per request; push took {push_s:.1f} s)",
                 ["how", "s (median)", "MB/s"], body)


def _cpu_now(pids: list[int]) -> tuple[float, float]:
    """``(this process and its reaped children, the processes pids)`` CPU seconds so far."""
    import resource

    mine = sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return mine, sum(_process_cpu(pid) for pid in pids)


def part_build(endpoints: Endpoints, work: Path, count: int, workers: int | None, concurrencies: list[int],
               images: str = "photos") -> tuple[str, str | None]:
    """The build table, and the S3 prefix of the images (for ``epoch``; ``work/built.lmdb`` is their database).

    Each row also gives the CPU the build used per image (this process, its writer, and its reader processes) and the CPU
    the server and the proxy used per image: on real S3 the server's share is not on this machine, so the build's own CPU,
    spread on this machine's cores, bounds what it could reach there (the "client-bound" columns).
    """
    from common import make_jpeg_folder, make_photo_folder

    from lightning_lmdb import build_lmdb
    from lightning_lmdb.remote import fs

    if images == "photos":
        source, what = make_photo_folder(work / f"photos_{count}", count), "ImageNet-like JPEGs (256-500 px)"
    else:
        source, what = make_jpeg_folder(work / f"small_{count}", count, min_side=32, max_side=64), "small JPEGs (32-64 px)"
    bucket = make_bucket(endpoints, "build")
    prefix = f"{bucket}/{images}"
    upload_folder(endpoints, source, prefix)
    if endpoints.front_pid:  # every object read once through the GET front: the timed builds' GETs are answered from memory
        from concurrent.futures import ThreadPoolExecutor

        client, bucket_name = endpoints.client(), bucket[5:]
        keys = [f"{images}/{path.relative_to(source).as_posix()}" for path in sorted(source.rglob("*")) if path.is_file()
                and not path.name.startswith(".")]
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda key: client.get_object(Bucket=bucket_name, Key=key)["Body"].read(), keys))
    fs.use_options(bucket, endpoints.options())
    from lightning_lmdb.remote import objects

    default = objects.FETCH_CONCURRENCY
    cores = len(os.sched_getaffinity(0))
    rows: list[list[Any]] = []
    target = work / "built.lmdb"
    local_rate = local_bound = 0.0
    for label, concurrency in [("local folder", None)] + [(prefix, c) for c in concurrencies]:
        shutil.rmtree(target, ignore_errors=True)
        if concurrency is not None:
            set_fetch_concurrency(concurrency)
        mine, theirs = _cpu_now(endpoints.pids)
        started = time.perf_counter()
        build_lmdb(source if concurrency is None else prefix, target, workers=workers, overwrite=True)
        seconds = time.perf_counter() - started
        spent, served = _cpu_now(endpoints.pids)
        per_image, server_per_image = (spent - mine) / count, (served - theirs) / count
        rate, bound = count / seconds, cores / per_image
        if concurrency is None:
            local_rate, local_bound = rate, bound
        rows.append([label, "-" if concurrency is None else concurrency, f"{seconds:.2f}", f"{rate:,.0f}", f"{rate / local_rate:.2f}",
                     f"{per_image * 1e3:.2f}", f"{server_per_image * 1e3:.2f}" if concurrency is not None else "-",
                     f"{bound:,.0f}", f"{bound / local_bound:.2f}"])
    set_fetch_concurrency(default)
    server = ", GETs answered by the caching front" if endpoints.front_pid else ""
    from lightning_lmdb.build import readers

    how = (f"{workers} readers" if workers is not None else
           f"default readers ({cores} locally, {cores * readers.REMOTE_READERS_PER_CORE} from S3)")
    title = f"Building {count:,} {what}, {how}, {endpoints.latency_ms:g} ms per request, {cores} cores{server}"
    header = ["source", "FETCH_CONCURRENCY", "s", "images/s", "x local", "build ms CPU/image", "server + proxy ms CPU/image",
              "client-bound images/s (cores / build CPU)", "client-bound x local"]
    return table(title, header, rows), prefix


def _epoch(train_dir: str, work: Path, workers: int, **kwargs: Any) -> tuple[float, float, int]:
    """``(prepare_s, epoch_s, samples)`` of one epoch of the training loader."""
    import torch

    from lightning_lmdb import LMDBDataModule
    from lightning_lmdb.read.transforms import finish_batch

    torch.set_num_threads(1)
    dm = LMDBDataModule(train_dir, cache_dir=work / "cache", image_size=32, batch_size=64, num_workers=workers, val_fraction=0,
                        persistent_workers=False, **kwargs)
    started = time.perf_counter()
    dm.prepare_data()
    dm.setup("fit")
    prepared = time.perf_counter() - started
    started = time.perf_counter()
    samples = 0
    for images, _ in dm.train_dataloader():
        finish_batch(images)
        samples += len(images)
    return prepared, time.perf_counter() - started, samples


def part_epoch(endpoints: Endpoints, work: Path, prefix: str, count: int, workers: int) -> str:
    problem = missing("lightning_lmdb.tools.publish", "push")
    from lightning_lmdb.remote import fs

    options = endpoints.options()
    rows = []
    try:
        prepared, seconds, samples = _epoch(prefix, work, workers, backend="raw", storage_options=options)
        rows.append(["raw (one GET per sample)", f"{prepared:.2f}", f"{seconds:.2f}", f"{samples / seconds:.0f}"])
    except (FileNotFoundError, ValueError, NotImplementedError, OSError) as exc:
        rows.append(["raw (one GET per sample)", "-", "-", f"skipped: the raw backend on S3 is not available ({type(exc).__name__})"])
    if problem:
        rows.append(["staged database", "-", "-", f"skipped: {problem}"])
    else:
        push = library("lightning_lmdb.tools.publish", "push")
        database = work / "built.lmdb"
        url = f"{prefix}.lmdb"
        fs.use_options(url, options)
        push(database, url, progress=False)
        local = work / "node_local"
        shutil.rmtree(local, ignore_errors=True)
        prepared, seconds, samples = _epoch(url, work, workers, local_cache_dir=local, storage_options=options)
        rows.append(["staged database (local_cache_dir)", f"{prepared:.2f}", f"{seconds:.2f}", f"{samples / seconds:.0f}"])
    title = f"One epoch of {count:,} JPEGs, {workers} loader workers, {endpoints.latency_ms:g} ms per request"
    return table(title, ["served from", "prepare_data + setup s", "epoch s", "images/s"], rows)


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def part_server(endpoints: Endpoints, count: int) -> str:
    """What one GET of a small object costs moto's server and this client, in CPU, straight to the server (no proxy): the
    server's cost bounds what any build from it can reach on this machine, whatever the client does. Both clients:
    ``s3fs`` (what this process, which forks, uses) and ``obstore`` (what a build's readers and the raw backend's workers
    use, ``remote.fastget``), measured last: once ``obstore`` ran here, a child forked from this process would keep ``s3fs``."""
    from concurrent.futures import ThreadPoolExecutor

    from lightning_lmdb.remote import fastget, fs, objects

    bucket = make_bucket(endpoints, "server-cost")
    client, body = endpoints.client(), os.urandom(4096)
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda i: client.put_object(Bucket=bucket[5:], Key=f"o/{i:06d}.bin", Body=body), range(count)))
    fs.use_options(bucket, endpoints.options(proxied=False))
    listed = objects.list_objects(f"{bucket}/o")
    rows = []
    for name in ("s3fs (aiobotocore)", "obstore"):
        if name == "obstore":
            fastget.allow()
        for concurrency in (1, 8, 32):
            server, mine, started = _process_cpu(endpoints.server_pid), time.process_time(), time.perf_counter()
            objects.read_many([(item.url, item.etag, None, None) for item in listed], concurrency=concurrency)
            wall = time.perf_counter() - started
            server, mine = _process_cpu(endpoints.server_pid) - server, time.process_time() - mine
            rows.append([name, concurrency, f"{count / wall:.0f}", f"{server / count * 1e3:.2f}", f"{mine / count * 1e3:.2f}"])
    return table(f"One GET of a 4 KB object ({count:,} objects, If-Match, straight to moto's server), CPU per GET",
                 ["client", "concurrency", "GETs/s", "server ms CPU/GET", "client ms CPU/GET"], rows)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--proxy"]:
        proxy_main(int(argv[1]), float(argv[2]))
        return
    if argv[:1] == ["--front"]:
        asyncio.run(_serve_gets(int(argv[1]), lambda port: print(port, flush=True)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="stage,build,epoch,server", help="comma-separated: stage, build, epoch, server")
    parser.add_argument("--count", type=int, default=10_000, help="images of the build and epoch parts")
    parser.add_argument("--db-mb", type=int, default=200, help="size of the staged database")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to every HTTP request by the proxy")
    parser.add_argument("--concurrency", default="1,8,32,64", help="FETCH_CONCURRENCY values of the S3 builds")
    parser.add_argument("--workers", type=int, default=2, help="loader workers of the epoch part")
    parser.add_argument("--readers", type=int, default=None,
                        help="build readers (default: the library's: one per core locally, four per core from S3)")
    parser.add_argument("--fast-server", action="store_true",
                        help="put a caching GET front before moto (objects answered from memory once read): the build's "
                             "objects are read once before it is timed, so its GETs cost the server side little, as S3's")
    parser.add_argument("--pin", action="store_true",
                        help="the server and the proxy on the last core, this process (the builds, their readers) on the others: "
                             "the build's CPU per image measured without the server on its cores")
    parser.add_argument("--images", choices=["photos", "small"], default="photos",
                        help="the build's images: ImageNet-like JPEGs (256-500 px) or small ones (32-64 px)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the stage part (median)")
    parser.add_argument("--work", type=Path, default=None, help="where generated data goes (default: a temporary folder)")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - {"stage", "build", "epoch", "server"}
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))} (stage, build, epoch, server)")
    sys.path.insert(0, str(HERE.parent))  # common.py
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_s3_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"command: python benchmarks/{HERE.name} {shlex.join(argv)}\n", flush=True)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    with s3_behind_proxy(args.latency_ms, args.fast_server) as endpoints:
        if args.pin:
            cores = sorted(os.sched_getaffinity(0))
            if len(cores) < 2:
                parser.error("--pin needs 2 cores or more")
            for pid in endpoints.pids:
                for task in os.listdir(f"/proc/{pid}/task"):  # every thread of the server and the proxy
                    os.sched_setaffinity(int(task), {cores[-1]})
            os.sched_setaffinity(0, set(cores[:-1]))
            print(f"pinned: server and proxy on core {cores[-1]}, the builds on {cores[:-1]}\n", flush=True)
        if "stage" in parts:
            print(part_stage(endpoints, work, args.db_mb, args.rounds) + "\n", flush=True)
        if "build" in parts or "epoch" in parts:
            built, prefix = part_build(endpoints, work, args.count, args.readers, concurrencies if "build" in parts else [64],
                                       args.images)
            if "build" in parts:
                print(built + "\n", flush=True)
        if "epoch" in parts:  # the objects and the local database of part build
            print(part_epoch(endpoints, work, prefix, args.count, args.workers) + "\n", flush=True)
        if "server" in parts:
            print(part_server(endpoints, min(args.count, 2000)) + "\n", flush=True)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without the final garbage collections over torch's and Lightning's objects (~1 s); the servers are stopped
