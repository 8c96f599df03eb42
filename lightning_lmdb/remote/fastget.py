"""S3 GETs through ``obstore`` (Rust's ``object_store``): the same requests as ``s3fs``'s, for a third of the client's CPU.

A build from object storage makes one GET per image, and so does the raw backend per sample. Measured on one core
(``python benchmarks/bench_s3.py --parts server``), ``s3fs`` (``aiobotocore``) spends ~1.8 ms of CPU per GET, ``obstore``
~0.6 ms, for the same bytes. :func:`lightning_lmdb.remote.objects.read_many` therefore sends its S3 GETs here when
``obstore`` is installed (the ``cloud`` extra installs it) and the storage options are ones this module can map; anything
else keeps the ``s3fs`` path, which stays the one for listings, writes and uploads.

**Options** (the ``s3fs`` names, so a caller's ``storage_options`` mean the same on both paths): ``key``, ``secret``,
``token``, ``endpoint_url`` (also in ``client_kwargs``), ``anon``, ``profile``, ``client_kwargs["region_name"]``; and
:mod:`~lightning_lmdb.remote.fs`'s own ``retries`` / ``config_kwargs`` timeouts, which this path takes from
:mod:`~lightning_lmdb.remote.fs` as well. Any other option (``requester_pays``, ``config_kwargs["s3"]`` …) sends the GETs
through ``s3fs``. Without ``key`` / ``secret`` the credentials come from ``botocore``'s own chain, as on the ``s3fs`` path
(environment, ``AWS_PROFILE``, ``~/.aws`` files, an instance or container role), refreshed when they expire. The region is
``client_kwargs["region_name"]``, else ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` or the profile's, else ``us-east-1``.

**Retries** are the layer's: ``obstore``'s own are off, and each GET is tried up to
:data:`lightning_lmdb.remote.fs.RETRIES` times with a ``min(0.5 x 2^i, 8)`` s backoff (a dropped connection, a timeout, a
5xx). A connection that sends no byte for :data:`~lightning_lmdb.remote.fs.STALL_SECONDS` counts as dropped
(``read_timeout``). A wrong region (a redirect or a signature the bucket refuses) sends this bucket's GETs back to ``s3fs``
for the rest of the process, which finds the region itself.

**Only in the processes that read and fork nothing**: a build's reader processes and the raw backend's DataLoader workers
call :func:`allow`. ``obstore``'s runtime (its threads) does not survive a fork: a child forked from a process that used it
hangs on its first request. So a process that may fork readers or workers (the main process, a shard's process) keeps
``s3fs``, and a process forked from one that used ``obstore`` does too, whatever it calls. One store per (process, bucket,
options) and one event-loop thread per process, made on first use, never inherited.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

from lightning_lmdb.remote import fs, urls

#: The storage options this path maps; any other sends the GETs through ``s3fs``.
MAPPED = frozenset({"key", "secret", "token", "endpoint_url", "anon", "profile", "client_kwargs", "config_kwargs", "retries",
                    "skip_instance_cache", "use_listings_cache"})
#: ``client_kwargs`` / ``config_kwargs`` entries this path maps (the timeouts and retries are the layer's own).
_CLIENT_KEYS = frozenset({"endpoint_url", "region_name"})
_CONFIG_KEYS = frozenset({"connect_timeout", "read_timeout", "retries"})

_stores: dict[tuple[int, str, str], Any] = {}
_allowed: set[int] = set()
#: The process whose address space started ``obstore``'s runtime (a forked child inherits the number, not the threads).
_runtime: int | None = None
_refused: set[tuple[int, str]] = set()
_loops: dict[int, asyncio.AbstractEventLoop] = {}
_lock = threading.Lock()


def allow() -> None:
    """Let this process's S3 GETs go through ``obstore``: call it only in a process that forks no child that reads objects
    (a build's reader, a DataLoader worker)."""
    _allowed.add(os.getpid())


def store_for(url: str) -> Any | None:
    """The ``obstore`` store of ``url``'s bucket in this process, or ``None`` where GETs must go through ``s3fs``: not S3,
    a process not :func:`allow`-ed or forked from one that used ``obstore``, ``obstore`` not installed, an option this
    path does not map, no credentials found, or a region it got wrong."""
    global _runtime
    pid = os.getpid()
    if pid not in _allowed or _runtime not in (None, pid) or not fs.is_s3(url):
        return None
    bucket, _ = urls.bucket_key(url)
    options = fs.options_for(url)
    if (pid, bucket) in _refused or not _mappable(options):
        return None
    key = (pid, bucket, json.dumps(options, sort_keys=True, default=str))
    with _lock:
        if key not in _stores:
            _runtime = pid
            _stores[key] = _make(bucket, options)
        return _stores[key]


def refuse(url: str) -> None:
    """Send the GETs of ``url``'s bucket through ``s3fs`` for the rest of this process (the region was wrong)."""
    _refused.add((os.getpid(), urls.bucket_key(url)[0]))


def _mappable(options: dict[str, Any]) -> bool:
    if not set(options) <= MAPPED:
        return False
    client, config = options.get("client_kwargs") or {}, options.get("config_kwargs") or {}
    return isinstance(client, dict) and isinstance(config, dict) and set(client) <= _CLIENT_KEYS and set(config) <= _CONFIG_KEYS


def _make(bucket: str, options: dict[str, Any]) -> Any | None:
    try:
        from obstore.store import S3Store
    except ImportError:
        return None
    client = options.get("client_kwargs") or {}
    endpoint = (options.get("endpoint_url") or client.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL"))
    config: dict[str, Any] = {}
    provider = None
    if options.get("anon"):
        config["skip_signature"] = True
    elif options.get("key") and options.get("secret"):
        config.update(access_key_id=options["key"], secret_access_key=options["secret"])
        if options.get("token"):
            config["session_token"] = options["token"]
    else:
        provider = _botocore_credentials(options.get("profile"))
        if provider is None:  # no credentials: s3fs raises the layer's clear error
            return None
    config["region"] = client.get("region_name") or _region(options.get("profile"))
    if endpoint:
        config["endpoint"] = str(endpoint)
    timeouts = options.get("config_kwargs") or {}  # a caller's own, as s3fs takes them; else the layer's
    stall = timedelta(seconds=float(timeouts.get("read_timeout", fs.STALL_SECONDS)))
    connect = timedelta(seconds=float(timeouts.get("connect_timeout", fs.CONNECT_SECONDS)))
    client_options = {"connect_timeout": connect, "read_timeout": stall,
                      "timeout": timedelta(days=1), "allow_http": str(endpoint or "").startswith("http://")}
    return S3Store(bucket, config=config, client_options=client_options, retry_config={"max_retries": 0},
                   credential_provider=provider)


def _botocore_credentials(profile: str | None) -> Any | None:
    """A credential provider over ``botocore``'s chain (what ``s3fs`` uses), or ``None`` when it finds none."""
    import botocore.session

    credentials = botocore.session.Session(profile=profile).get_credentials()
    if credentials is None:
        return None
    refreshable = hasattr(credentials, "refresh_needed")

    def provide() -> dict[str, Any]:
        frozen = credentials.get_frozen_credentials()
        expires = datetime.now(timezone.utc) + timedelta(minutes=5) if refreshable else None
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key, "token": frozen.token,
                "expires_at": expires}

    return provide


def _region(profile: str | None) -> str:
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        import botocore.session

        region = botocore.session.Session(profile=profile).get_config_variable("region")
    return region or "us-east-1"


def loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for ``obstore``'s requests, running in a thread of its own (made on first use), so a caller
    inside a running loop (a notebook) can submit to it too."""
    pid = os.getpid()
    with _lock:
        found = _loops.get(pid)
        if found is None:
            found = _loops[pid] = asyncio.new_event_loop()
            threading.Thread(target=found.run_forever, name="lightning-lmdb-obstore", daemon=True).start()
        return found


async def get(store: Any, key: str, etag: str | None, start: int | None, end: int | None) -> bytes:
    """One GET of ``key`` (bytes ``start`` to ``end``, end excluded, when given), only if its ETag is still ``etag``: one
    try; the caller retries (``obstore``'s exceptions propagate)."""
    import obstore

    options: dict[str, Any] = {}
    if etag:
        options["if_match"] = f'"{etag}"'
    if start is not None or end is not None:
        first = start or 0
        if end is not None and end <= first:
            return b""
        options["range"] = (first, end) if end is not None else {"offset": first}
    response = await obstore.get_async(store, key, options=options)
    return bytes(await response.bytes_async())


def classify(exc: BaseException) -> str:
    """What an ``obstore`` error means for the caller: ``missing``, ``denied``, ``changed``, ``region`` (send the bucket
    through ``s3fs``), or ``retry`` (a connection, timeout or server error)."""
    from obstore import exceptions

    if isinstance(exc, exceptions.PreconditionError):
        return "changed"
    if isinstance(exc, (exceptions.NotFoundError, FileNotFoundError)):
        return "missing"
    text = str(exc)
    if any(mark in text for mark in ("PermanentRedirect", "AuthorizationHeaderMalformed", "301 Moved", "IllegalLocationConstraint")):
        return "region"
    if isinstance(exc, (exceptions.PermissionDeniedError, exceptions.UnauthenticatedError, PermissionError)) or "403 Forbidden" in text:
        return "denied"
    return "retry"
