"""The object operations the library needs, on any URL :mod:`~lightning_lmdb.remote.fs` opens.

Every error names the object by its redacted URL (:func:`lightning_lmdb.remote.urls.redact`) and says what to do:
:class:`~lightning_lmdb.errors.RemoteNotFoundError` (no such bucket or key), :class:`~lightning_lmdb.errors.RemoteAccessError`
(credentials or permissions), :class:`~lightning_lmdb.errors.RemoteChangedError` (the ``If-Match`` precondition failed: the
object changed since it was listed), :class:`~lightning_lmdb.errors.RemoteExistsError` (a write only-if-absent found one),
and :class:`~lightning_lmdb.errors.RemoteError` for the rest (a connection that kept dropping after the retries).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import math
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from lightning_lmdb.errors import (
    LightningLMDBError,
    RemoteAccessError,
    RemoteChangedError,
    RemoteError,
    RemoteExistsError,
    RemoteNotFoundError,
)
from lightning_lmdb.remote import fastget, fs, urls

T = TypeVar("T")

#: The smallest part of a multipart upload (S3: 5 MiB, the last part excepted), the most parts, and the part size below which a
#: file goes up in one request.
MIN_PART, MAX_PARTS, SINGLE_PUT = 8 << 20, 10_000, 16 << 20
#: Parts uploaded at once.
PART_CONCURRENCY = 8
#: Objects fetched at once by :func:`read_each` (a reader chunk holds at most 64 files: fetched in one round trip).
FETCH_CONCURRENCY = 64


@dataclass(frozen=True)
class RemoteObject:
    """One object of a listing.

    Attributes:
        url: Its full URL.
        size: Its size in bytes.
        etag: Its ETag, quotes stripped (a multipart upload's ends in ``-N``).
    """

    url: str
    size: int
    etag: str


def _etag(value: Any) -> str:
    return str(value or "").strip('"')


def _path(url: str) -> str:
    """What ``fsspec`` calls the object: the URL without its scheme (``bucket/key``)."""
    return url.split("://", 1)[1]


def list_objects(prefix: str) -> list[RemoteObject]:
    """Every object under ``prefix`` (a "folder": ``s3://bucket/train``), sorted by URL: one listing, no per-object request.

    Raises:
        RemoteNotFoundError: No such bucket.
        RemoteAccessError: Listing is denied.
    """
    filesystem = fs.filesystem(prefix)
    scheme = urls.scheme(prefix)
    found = _call(prefix, "list", lambda: filesystem.find(_path(prefix).rstrip("/"), detail=True, withdirs=False))
    out = []
    for path, info in found.items():
        if info.get("type", "file") != "file":
            continue
        out.append(RemoteObject(f"{scheme}://{path}", int(info.get("size") or 0), _etag(info.get("ETag") or info.get("etag"))))
    return sorted(out, key=lambda item: item.url)


def stat(url: str) -> RemoteObject:
    """One object's size and ETag (a HEAD request).

    Raises:
        RemoteNotFoundError: No such object.
    """
    filesystem = fs.filesystem(url)
    info = _call(url, "read", lambda: filesystem.info(_path(url), refresh=True))
    if info.get("type", "file") != "file":
        raise RemoteNotFoundError(f"{urls.redact(url)} is a prefix (a folder), not an object.")
    return RemoteObject(url, int(info.get("size") or 0), _etag(info.get("ETag") or info.get("etag")))


def exists(url: str) -> bool:
    """Whether the object ``url`` exists."""
    try:
        stat(url)
    except RemoteNotFoundError:
        return False
    return True


def read(url: str, *, etag: str | None = None, start: int | None = None, end: int | None = None) -> bytes:
    """The object's bytes (``start`` to ``end``, end excluded, when given), fetched only if its ETag is still ``etag``.

    A body that drops mid-read is fetched again, up to :data:`lightning_lmdb.remote.fs.RETRIES` tries.

    Raises:
        RemoteChangedError: The object's ETag is no longer ``etag``.
        RemoteNotFoundError: No such object.
    """
    return read_many([(url, etag, start, end)])[0]


#: One read: ``(url, etag or None, start or None, end or None)`` (:func:`read`'s arguments).
Request = tuple[str, str | None, int | None, int | None]


def read_many(requests: Iterable[Request], concurrency: int = FETCH_CONCURRENCY) -> list[bytes]:
    """:func:`read` of each ``(url, etag, start, end)``, at most ``concurrency`` at once, in order (:func:`read_each`).

    Raises:
        The first request's error, among those that failed (each :func:`read` raises).
    """
    results = list(read_each(requests, concurrency))
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


def read_each(requests: Iterable[Request], concurrency: int = FETCH_CONCURRENCY) -> Iterator[bytes | LightningLMDBError]:
    """:func:`read` of each ``(url, etag, start, end)``: all started at once, at most ``concurrency`` in flight, each yielded
    in order as soon as it (and those before it) arrived, so a caller works on the first objects while the rest come. A
    request that fails yields its error (the error :func:`read` raises); the others go on.

    Many small objects are fetched concurrently so a build is not bound by the latency of each request. S3 GETs go through
    ``obstore`` where it can take them (:mod:`~lightning_lmdb.remote.fastget`: a third of ``s3fs``'s CPU per GET), else
    through ``s3fs``; the retries, preconditions and errors are the same either way.
    """
    requests = list(requests)
    if not requests:
        return
    filesystem = fs.filesystem(requests[0][0])
    if not fs.is_s3(requests[0][0]):  # no precondition outside S3 (untested schemes)
        for url, _, start, end in requests:
            try:
                yield _call(url, "read", lambda url=url, start=start, end=end: filesystem.cat_file(_path(url), start=start, end=end))
            except LightningLMDBError as exc:
                yield exc
        return
    bucket = urls.bucket_key(requests[0][0])[0]
    store = fastget.store_for(requests[0][0]) if all(urls.bucket_key(r[0])[0] == bucket for r in requests) else None
    if store is not None:
        loop, get = fastget.loop(), functools.partial(_get_fast, store)
    else:
        loop, get = filesystem.loop, functools.partial(_get_s3, filesystem)
    gate = asyncio.Semaphore(max(1, concurrency))  # bound to ``loop`` on first use there

    async def one(request: Request) -> bytes:
        async with gate:
            return await get(*request)

    futures = [asyncio.run_coroutine_threadsafe(one(request), loop) for request in requests]
    try:
        for request, future in zip(requests, futures, strict=True):
            try:
                yield future.result()
            except _WrongRegion:  # obstore signed for another region: this bucket's GETs go through s3fs from now on
                fastget.refuse(request[0])
                yield from read_each([request], concurrency)
            except LightningLMDBError as exc:
                yield exc
    finally:  # a caller that stops early: what is still queued is not fetched
        for future in futures:
            future.cancel()


class _WrongRegion(RemoteError):
    """``obstore`` signed for a region the bucket is not in: the GETs go through ``s3fs``, which finds it (never escapes
    :func:`read_many`)."""


async def _get_fast(store: Any, url: str, etag: str | None, start: int | None, end: int | None) -> bytes:
    """One object's GET through ``obstore``, with the retries and errors of :func:`_get_s3`."""
    key = urls.bucket_key(url)[1]

    def fatal(exc: Exception) -> None:
        kind = fastget.classify(exc)
        if kind == "region":
            raise _WrongRegion(str(exc)) from exc
        if kind == "changed":
            raise _changed(url, etag) from None
        if kind in ("missing", "denied"):  # not chained: obstore's error prints the request's URL, query string included
            seen = FileNotFoundError(str(exc)) if kind == "missing" else PermissionError(str(exc))
            raise _translated(seen, url, "read", etag) from None

    return await _retried(url, lambda: fastget.get(store, key, etag, start, end), fatal, chain=False)


async def _get_s3(filesystem: Any, url: str, etag: str | None, start: int | None, end: int | None) -> bytes:
    bucket, key = urls.bucket_key(url)
    kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
    if etag:
        kwargs["IfMatch"] = f'"{etag}"'
    if start is not None or end is not None:
        first = start or 0
        if end is not None and end <= first:
            return b""
        kwargs["Range"] = f"bytes={first}-" if end is None else f"bytes={first}-{end - 1}"

    async def once() -> bytes:
        response = await filesystem._call_s3("get_object", **kwargs)
        body = response["Body"]
        try:
            return await body.read()
        finally:
            body.close()

    def fatal(exc: Exception) -> None:  # OSErrors, and aiohttp's payload and timeout errors, which are not, are retried
        if isinstance(exc, (FileNotFoundError, PermissionError)) or _precondition_failed(exc) \
                or "NoCredentialsError" in type(exc).__name__:  # no retry helps these
            raise _translated(exc, url, "read", etag) from exc

    return await _retried(url, once, fatal, chain=True)


async def _retried(url: str, once: Callable[[], Awaitable[bytes]], fatal: Callable[[Exception], None], *, chain: bool) -> bytes:
    """``await once()``, tried up to :data:`lightning_lmdb.remote.fs.RETRIES` times, sleeping ``min(0.5 x 2^i, 8)`` s between
    tries; ``fatal(exc)`` raises the error of a failure no retry helps (else it is retried). The last failure is chained to
    the final error only with ``chain`` (``obstore``'s errors print the request's URL, query string included)."""
    last: Exception | None = None
    for attempt in range(max(1, fs.RETRIES)):
        try:
            return await once()
        except Exception as exc:  # noqa: BLE001 -- classified by fatal; the rest is retried
            fatal(exc)
            last = exc
        if attempt + 1 < fs.RETRIES:
            await asyncio.sleep(min(0.5 * 2 ** attempt, 8.0))
    raise _failed(url, last) from (last if chain else None)


def _failed(url: str, last: BaseException | None) -> RemoteError:
    return RemoteError(f"{urls.redact(url)}: reading it failed {fs.RETRIES} times ({_short(last)}). Check the connection and "
                       "endpoint_url; a rerun resumes where this one stopped.")


def _changed(url: str, etag: str | None) -> RemoteChangedError:
    return RemoteChangedError(f"{urls.redact(url)} changed since it was listed (its ETag is no longer {etag}). Rerun: the "
                              "build lists the source again and rebuilds what changed.")


def write(url: str, data: bytes, *, if_absent: bool = False) -> str:
    """Write the small object ``url`` in one request; with ``if_absent``, only if there is none (``If-None-Match: *``).

    Returns:
        The new object's ETag.

    Raises:
        RemoteExistsError: ``if_absent`` and the object exists (another writer got there first).
    """
    filesystem = fs.filesystem(url)
    if not fs.is_s3(url):
        if if_absent and exists(url):
            raise RemoteExistsError(f"{urls.redact(url)} exists already.")
        _call(url, "write", lambda: filesystem.pipe_file(_path(url), data))
        return stat(url).etag
    from fsspec.asyn import sync

    bucket, key = urls.bucket_key(url)
    kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "Body": data}
    if if_absent:
        kwargs["IfNoneMatch"] = "*"
    try:
        response = sync(filesystem.loop, filesystem._call_s3, "put_object", **kwargs)
    except Exception as exc:  # noqa: BLE001 -- translated
        if if_absent and _precondition_failed(exc):
            raise RemoteExistsError(f"{urls.redact(url)} exists already (written by another process since).") from exc
        raise _translated(exc, url, "write") from exc
    filesystem.invalidate_cache(_path(url))
    return _etag(response.get("ETag"))


def delete(targets: Iterable[str]) -> None:
    """Delete the objects ``targets`` (missing ones ignored)."""
    targets = list(targets)
    if not targets:
        return
    filesystem = fs.filesystem(targets[0])
    for url in targets:
        try:
            _call(url, "delete", lambda url=url: filesystem.rm_file(_path(url)))
        except RemoteNotFoundError:
            pass


def part_size(size: int) -> int:
    """The part size of a multipart upload of ``size`` bytes: :data:`MIN_PART`, or larger (whole MiB) so the parts stay
    under :data:`MAX_PARTS` (S3's limit): 8 MiB up to ~78 GiB, then growing with the file."""
    return max(MIN_PART, math.ceil(size / (MAX_PARTS - 1) / (1 << 20)) * (1 << 20))


def expected_etag(path: str, size: int | None = None) -> str:
    """The ETag S3 gives ``path``'s file uploaded by :func:`upload`: its MD5, or for a multipart upload the MD5 of its
    parts' MD5s followed by ``-N``. Compared with a listing's, it proves the object holds exactly the file."""
    import hashlib

    size = os.path.getsize(path) if size is None else size
    if size <= SINGLE_PUT:
        with open(path, "rb") as handle:
            return hashlib.md5(handle.read(), usedforsecurity=False).hexdigest()
    step = part_size(size)
    digests = []
    with open(path, "rb") as handle:
        while block := handle.read(step):
            digests.append(hashlib.md5(block, usedforsecurity=False).digest())
    return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"


def upload(path: str, url: str, *, state: str | None = None, on_part: Callable[[int], None] | None = None,
           on_resumed: Callable[[int], None] | None = None) -> str:
    """Upload the local file ``path`` to ``url``: in one request up to :data:`SINGLE_PUT` bytes, else in parts of
    :func:`part_size`, :data:`PART_CONCURRENCY` at once.

    Args:
        path: The local file.
        url: Where it goes.
        state: A local JSON file that records a multipart upload's id and finished parts as they finish: an upload
            killed midway resumes from it (the parts the server lists as uploaded are not sent again).
        on_part: Called with each part's bytes once it is uploaded (progress).
        on_resumed: Called with the bytes of each part a resumed upload finds uploaded already (default: ``on_part``).

    Returns:
        The object's ETag.
    """
    size = os.path.getsize(path)
    if size <= SINGLE_PUT or not fs.is_s3(url):
        with open(path, "rb") as handle:
            data = handle.read()
        etag = write(url, data)
        if on_part is not None:
            on_part(size)
        return etag
    return _multipart(path, url, size, state, on_part, on_part if on_resumed is None else on_resumed)


def _multipart(path: str, url: str, size: int, state: str | None, on_part: Callable[[int], None] | None,
               on_resumed: Callable[[int], None] | None) -> str:
    from fsspec.asyn import sync

    filesystem = fs.filesystem(url)
    bucket, key = urls.bucket_key(url)
    step = part_size(size)
    count = math.ceil(size / step)
    identity = {"url_hash": _hash(url), "size": size, "mtime_ns": os.stat(path).st_mtime_ns, "part_size": step}
    done: dict[int, str] = {}
    upload_id = None
    if state is not None and os.path.exists(state):
        try:
            with open(state, encoding="utf-8") as handle:
                saved = json.load(handle)
            if saved.get("identity") == identity:
                upload_id = saved["upload_id"]
                listed = sync(filesystem.loop, filesystem._call_s3, "list_parts", Bucket=bucket, Key=key, UploadId=upload_id)
                done = {int(part["PartNumber"]): _etag(part["ETag"]) for part in listed.get("Parts", [])
                        if int(part["Size"]) == min(step, size - (int(part["PartNumber"]) - 1) * step)}
        except Exception:  # noqa: BLE001 -- an unreadable state, or NoSuchUpload (expired or aborted): start over
            upload_id, done = None, {}
    if upload_id is None:
        created = sync(filesystem.loop, filesystem._call_s3, "create_multipart_upload", Bucket=bucket, Key=key)
        upload_id = created["UploadId"]
    if state is not None:
        _save_state(state, identity, upload_id)
    if on_resumed is not None:
        for number in done:
            on_resumed(min(step, size - (number - 1) * step))

    async def send_all() -> None:
        gate = asyncio.Semaphore(PART_CONCURRENCY)

        async def send(number: int) -> None:
            async with gate:
                with open(path, "rb") as handle:
                    handle.seek((number - 1) * step)
                    block = handle.read(step)
                last: BaseException | None = None
                for attempt in range(max(1, fs.RETRIES)):
                    try:
                        response = await filesystem._call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload_id,
                                                             PartNumber=number, Body=block)
                        break
                    except (FileNotFoundError, PermissionError) as exc:
                        raise _translated(exc, url, "write") from exc
                    except Exception as exc:  # noqa: BLE001 -- a dropped connection: tried again
                        last = exc
                        if attempt + 1 < fs.RETRIES:
                            await asyncio.sleep(min(0.5 * 2 ** attempt, 8.0))
                else:
                    raise RemoteError(f"{urls.redact(url)}: uploading part {number} of {count} failed {fs.RETRIES} times "
                                      f"({_short(last)}). Rerun: the upload resumes from the parts already sent.") from last
                done[number] = _etag(response["ETag"])
                if state is not None:
                    _save_state(state, identity, upload_id)
                if on_part is not None:
                    on_part(len(block))
                _fault("upload", len(done))

        await asyncio.gather(*(send(number) for number in range(1, count + 1) if number not in done))

    sync(filesystem.loop, send_all)
    parts = [{"PartNumber": number, "ETag": f'"{done[number]}"'} for number in range(1, count + 1)]
    try:
        response = sync(filesystem.loop, filesystem._call_s3, "complete_multipart_upload", Bucket=bucket, Key=key,
                        UploadId=upload_id, MultipartUpload={"Parts": parts})
    except Exception as exc:  # noqa: BLE001 -- translated
        raise _translated(exc, url, "write") from exc
    filesystem.invalidate_cache(_path(url))
    if state is not None:
        with contextlib.suppress(OSError):
            os.unlink(state)
    return _etag(response.get("ETag"))


def _save_state(state: str, identity: dict[str, Any], upload_id: str) -> None:
    temporary = f"{state}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump({"identity": identity, "upload_id": upload_id}, handle)
    os.replace(temporary, state)


def _hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: Test hook: ``LIGHTNING_LMDB_TEST_REMOTE_FAULT=upload:N`` kills this process (``SIGKILL``) once N parts are uploaded.
FAULT_ENV = "LIGHTNING_LMDB_TEST_REMOTE_FAULT"


def _fault(point: str, count: int) -> None:
    """Kill this process when :data:`FAULT_ENV` is ``point:N`` and ``count`` reached N (tests only)."""
    wanted = os.environ.get(FAULT_ENV, "")
    if wanted.partition(":")[0] == point and count >= int(wanted.partition(":")[2] or 0):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def _call(url: str, what: str, call: Callable[[], T]) -> T:
    """``call()``, its errors translated (:func:`_translated`)."""
    try:
        return call()
    except LightningLMDBError:
        raise
    except Exception as exc:  # noqa: BLE001 -- translated
        raise _translated(exc, url, what) from exc


def _precondition_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is S3's answer to a failed precondition: HTTP 412 ``PreconditionFailed``
    (an ``If-Match`` or ``If-None-Match`` that did not hold). Read from the response's code, never from the message's digits
    (a port such as 34121 holds "412")."""
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            break
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = str((response.get("Error") or {}).get("Code", ""))
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "412") or status == 412:
                return True
        if "PreconditionFailed" in str(seen) or "At least one of the pre-conditions" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _short(exc: BaseException | None) -> str:
    """``exc`` in one line: its first paragraph (``obstore`` appends a multi-line debug dump), whitespace collapsed."""
    if exc is None:
        return "no response"
    return urls.redact(" ".join(f"{type(exc).__name__}: {exc}".split("\n\n")[0].split())[:300])


def _translated(exc: BaseException, url: str, what: str, etag: str | None = None) -> LightningLMDBError:
    """One clear error for ``exc``, naming the redacted URL and what to do."""
    shown = urls.redact(url)
    if _precondition_failed(exc) and what == "read":
        return _changed(url, etag)
    if isinstance(exc, FileNotFoundError) or getattr(exc, "errno", None) == errno.ENOENT:
        bucket, _ = urls.bucket_key(url)
        if "NoSuchBucket" in str(exc) or "bucket" in str(exc).lower() and "does not exist" in str(exc).lower():
            return RemoteNotFoundError(f"{shown}: no such bucket {bucket!r}. Check the URL (and endpoint_url for an "
                                       "S3-compatible server).")
        return RemoteNotFoundError(f"{shown}: no such object. Check the URL and the key.")
    if "NoCredentialsError" in f"{type(exc).__name__} {exc!r}" or "Unable to locate credentials" in str(exc):
        return RemoteAccessError(f"{shown}: no credentials found. Set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE, "
                                 "pass storage_options={'key': ..., 'secret': ...} (CLI: --storage-option key=...), or "
                                 "storage_options={'anon': True} for a public bucket.")
    if isinstance(exc, PermissionError) or getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM):
        return RemoteAccessError(f"{shown}: access denied to {what} it. Check the credentials (AWS_ACCESS_KEY_ID / "
                                 "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or storage_options key / secret) and the bucket's "
                                 "permissions.")
    return RemoteError(f"{shown}: could not {what} it ({_short(exc)}). Check the connection and endpoint_url; a rerun "
                       "resumes.")
