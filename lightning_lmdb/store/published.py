"""A database published to object storage: its layout, its marker object, pushing it and checking it.

Layout
------

A remote database at ``s3://bucket/name.lmdb`` is a prefix holding

* its **parts** under ``s3://bucket/name.lmdb/parts/<build_id>/<relative path>``: a one-file database's file, or a sharded
  database's shard files and ``manifest.json``. Each build has a folder of its own, so two publishers never write into
  each other's parts;
* its **marker**, ``s3://bucket/name.lmdb/lightning_lmdb.json``, written last and only if absent (``If-None-Match: *``):
  JSON (never pickle) naming the format version, the build id, the layout and every part: its relative path, key (relative
  to the URL), size, ETag (:func:`lightning_lmdb.remote.objects.expected_etag`), block size and the SHA-256 of each block.

A reader accepts a remote database only when the marker exists and ONE listing of ``parts/<build_id>`` shows every part
with the marker's size and ETag (:func:`open_published`); anything else is an upload that did not finish
(:class:`~lightning_lmdb.errors.RemoteIncompleteError`). The block digests let a download check each block before it
records it done (:func:`lightning_lmdb.tools.staging.stage_remote`).

Pushing (:func:`push`): the digests are computed locally (kept in ``<database>.push/`` beside the database, with the state
of each multipart upload, so a rerun after a kill resumes), the parts not already there with the expected ETag are
uploaded (shards in parallel), one listing checks them, then the marker is written. The first marker wins a race between
two publishers; the loser deletes its parts and gets :class:`~lightning_lmdb.errors.RemoteExistsError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_lmdb.errors import RemoteError, RemoteExistsError, RemoteIncompleteError, RemoteNotFoundError
from lightning_lmdb.remote import objects, urls
from lightning_lmdb.store import database

#: The marker object's name under a remote database's URL.
MARKER_NAME = "lightning_lmdb.json"
#: What the marker's ``format`` field says, and its version.
MARKER_FORMAT, MARKER_VERSION = "lightning_lmdb.published", 1
#: Bytes per digested block (what a resumed download redoes at most): staging's block size.
DEFAULT_BLOCK_SIZE = 64 << 20
#: Part files uploaded at once (each a multipart upload of its own).
FILE_CONCURRENCY = 4
_READ_SIZE = 1 << 20


@dataclass(frozen=True)
class PublishedPart:
    """One file of a published database, as its marker records it.

    Attributes:
        path: Its path relative to the database (``train.lmdb``; a shard's file name; ``manifest.json``).
        key: Its object's key relative to the database's URL (``parts/<build_id>/<path>``).
        size: Its bytes.
        etag: Its object's ETag.
        block_size: Bytes per digested block.
        blocks: The SHA-256 (hex) of each block.
    """

    path: str
    key: str
    size: int
    etag: str
    block_size: int
    blocks: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """The marker's JSON of this part."""
        return {"path": self.path, "key": self.key, "size": self.size, "etag": self.etag, "block_size": self.block_size,
                "blocks": list(self.blocks)}


@dataclass(frozen=True)
class Marker:
    """A remote database's marker: what :func:`open_published` checked.

    Attributes:
        url: The database's URL.
        build_id: The build published.
        layout: ``"file"`` or ``"sharded"``.
        parts: Every file (a sharded database's manifest last).
    """

    url: str
    build_id: str
    layout: str
    parts: tuple[PublishedPart, ...]

    def part_url(self, part: PublishedPart) -> str:
        """The URL of ``part``'s object."""
        return urls.join(self.url, part.key)

    @property
    def size(self) -> int:
        """Bytes of all parts."""
        return sum(part.size for part in self.parts)

    def to_json(self) -> bytes:
        """The marker object's bytes."""
        return json.dumps({"format": MARKER_FORMAT, "version": MARKER_VERSION, "build_id": self.build_id, "layout": self.layout,
                           "parts": [part.as_dict() for part in self.parts]}, indent=1).encode("utf-8")


def marker_url(url: str) -> str:
    """The URL of the marker of the remote database ``url``."""
    return urls.join(url, MARKER_NAME)


def parts_prefix(url: str, build_id: str) -> str:
    """The prefix holding the parts of the build ``build_id`` of the remote database ``url``."""
    return urls.join(url, "parts", build_id)


def has_marker(url: str) -> bool:
    """Whether ``url`` holds a published database's marker (else it may be a source prefix, or nothing)."""
    return objects.exists(marker_url(url))


def incomplete_error(url: str, why: str) -> RemoteIncompleteError:
    """The error of a remote database ``url`` that is not complete: ``why``, and "rerun the push"."""
    return RemoteIncompleteError(f"{urls.redact(url)} is not a complete published database ({why}): the upload did not finish: "
                                 "rerun the push (lightning-lmdb push DB URL).")


def parse_marker(url: str, raw: bytes) -> Marker:
    """The marker of ``url`` from its bytes.

    Raises:
        RemoteIncompleteError: Not a marker this version reads (the message says what is wrong).
    """
    try:
        obj = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise incomplete_error(url, f"its {MARKER_NAME} is not JSON: {exc}") from exc
    if not isinstance(obj, dict) or obj.get("format") != MARKER_FORMAT:
        raise incomplete_error(url, f"its {MARKER_NAME} is not a lightning_lmdb marker")
    if obj.get("version") != MARKER_VERSION:
        raise RemoteError(f"{urls.redact(url)}: its marker is version {obj.get('version')!r}, this lightning_lmdb reads version "
                          f"{MARKER_VERSION}: upgrade lightning_lmdb, or push the database again with this version.")
    try:
        parts = tuple(PublishedPart(str(p["path"]), str(p["key"]), int(p["size"]), str(p["etag"]), int(p["block_size"]),
                                    tuple(str(b) for b in p["blocks"])) for p in obj["parts"])
        marker = Marker(url, str(obj["build_id"]), str(obj["layout"]), parts)
    except (KeyError, TypeError, ValueError) as exc:
        raise incomplete_error(url, f"its {MARKER_NAME} lacks a field or has a wrong one: {exc!r}") from exc
    if marker.layout not in ("file", "sharded") or not parts:
        raise incomplete_error(url, f"its {MARKER_NAME} names layout {marker.layout!r} with {len(parts)} parts")
    for part in parts:
        wanted = -(-part.size // part.block_size) if part.block_size > 0 else -1
        if ".." in part.path.split("/") or part.path.startswith("/") or len(part.blocks) != wanted:
            raise incomplete_error(url, f"its {MARKER_NAME} has a bad part {part.path!r}")
    return marker


def read_marker(url: str) -> Marker:
    """The marker of ``url`` (not checked against the parts: :func:`open_published` does).

    Raises:
        RemoteIncompleteError: No marker, or not one this version reads.
    """
    try:
        raw = objects.read(marker_url(url))
    except RemoteNotFoundError as exc:
        raise incomplete_error(url, f"no {MARKER_NAME}") from exc
    return parse_marker(url, raw)


def check_parts(marker: Marker) -> None:
    """Check, with one listing, that every part of ``marker`` is there with its size and ETag.

    Raises:
        RemoteIncompleteError: A part is missing or differs (the message names it).
    """
    listed = {item.url: item for item in objects.list_objects(parts_prefix(marker.url, marker.build_id))}
    for part in marker.parts:
        found = listed.get(marker.part_url(part))
        if found is None:
            raise incomplete_error(marker.url, f"its part {part.path} is missing")
        if found.size != part.size or found.etag != part.etag:
            raise incomplete_error(marker.url, f"its part {part.path} is {found.size:,} bytes with ETag {found.etag}, the marker says "
                                          f"{part.size:,} bytes with ETag {part.etag}")


def open_published(url: str) -> Marker:
    """The checked marker of the remote database ``url``: the marker exists and one listing matches every part.

    Raises:
        RemoteIncompleteError: No marker, or a part missing or different: the upload did not finish.
    """
    marker = read_marker(url)
    check_parts(marker)
    return marker


# --- pushing -------------------------------------------------------------------------------------------------------------


@dataclass
class PushReport:
    """What :func:`push` did.

    Attributes:
        url: The remote database (redacted).
        action: ``"pushed"``, ``"resumed"`` (parts already there or partly uploaded were kept) or ``"up-to-date"``.
        build_id: The build published.
        bytes_uploaded: Bytes sent by this call.
        parts: Files of the database.
        seconds: Wall time of this call.
    """

    url: str
    action: str
    build_id: str
    bytes_uploaded: int
    parts: int
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)


def state_dir(path: str | os.PathLike[str]) -> Path:
    """The local folder :func:`push` keeps its state of ``path``'s push in (digests, multipart uploads): ``<path>.push``."""
    path = Path(path).absolute()
    return path.with_name(path.name + ".push")


def _local_parts(path: Path) -> tuple[str, list[tuple[str, Path]]]:
    """The layout of the local database ``path`` and its files as ``(relative path, file)`` (a manifest last)."""
    if database.is_sharded(path):
        files = [Path(part.path) for part in database.parts(path)]
        return "sharded", [*((f.name, f) for f in files), (database.MANIFEST_NAME, path / database.MANIFEST_NAME)]
    database.parts(path)  # a finished, valid database file
    return "file", [(path.name, path)]


def _digests(file: Path, block_size: int, cache: Path) -> tuple[str, list[str]]:
    """``(ETag, block SHA-256s)`` of ``file``, kept in ``cache`` for the same size and mtime (a rerun does not read it again)."""
    st = file.stat()
    identity = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "block_size": block_size, "single_put": objects.SINGLE_PUT,
                "part_size": objects.part_size(st.st_size)}
    try:
        saved = json.loads(cache.read_text(encoding="utf-8"))
        if saved.get("identity") == identity:
            return str(saved["etag"]), [str(b) for b in saved["blocks"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    blocks = []
    with open(file, "rb") as handle:
        while True:
            digest, left = hashlib.sha256(), block_size
            while left and (data := handle.read(min(_READ_SIZE, left))):
                digest.update(data)
                left -= len(data)
            if left == block_size:
                break
            blocks.append(digest.hexdigest())
    etag = objects.expected_etag(str(file), st.st_size)
    cache.parent.mkdir(parents=True, exist_ok=True)
    temporary = cache.with_name(cache.name + ".tmp")
    temporary.write_text(json.dumps({"identity": identity, "etag": etag, "blocks": blocks}), encoding="utf-8")
    os.replace(temporary, cache)
    return etag, blocks


class ByteMeter:
    """Bytes moved, printed to stderr at most every 2 s when asked (``push``: uploaded, ``pull``: downloaded)."""

    def __init__(self, total: int, show: bool, label: str, verb: str, done: int = 0):
        self.total, self.show, self.label, self.verb, self.done = total, show, label, verb, done
        self._lock, self._shown, self._started, self._first = threading.Lock(), 0.0, time.monotonic(), done

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            now = time.monotonic()
            if self.show and (now - self._shown > 2.0 or self.done >= self.total):
                self._shown = now
                rate = (self.done - self._first) / max(now - self._started, 1e-9) / 1e6
                print(f"{self.label}: {self.done / 1e6:,.0f} of {self.total / 1e6:,.0f} MB {self.verb} ({rate:,.0f} MB/s)",
                      file=sys.stderr, flush=True)


def push(path: str | os.PathLike[str], url: str, *, progress: bool = True, block_size: int = DEFAULT_BLOCK_SIZE) -> PushReport:
    """Publish the local database ``path`` (one file or a sharded folder) at ``url`` (see the module docstring).

    Args:
        path: A finished database.
        url: Where it goes, e.g. ``s3://bucket/train.lmdb`` (a prefix; storage options registered with
            :func:`lightning_lmdb.remote.fs.use_options`).
        progress: Print the bytes uploaded now and then (stderr).
        block_size: Bytes per digested block (what a resumed download redoes at most).

    Returns:
        A :class:`PushReport`.

    Raises:
        RemoteExistsError: ``url`` holds another build already (the message names it and the fix), or another publisher
            wrote its marker first (this push's parts are deleted).
        DatabaseError: ``path`` is not a finished database.
    """
    started = time.perf_counter()
    path = Path(path).expanduser().absolute()
    if not path.exists():
        raise FileNotFoundError(2, f"No database at {str(path)!r} to push", str(path))
    url = url.rstrip("/")
    shown = urls.redact(url)
    layout, files = _local_parts(path)
    build_id = database.build_id(path)
    existing = _existing_marker(url)
    if existing is not None and existing.build_id != build_id:
        raise _exists(url, existing.build_id)
    if existing is not None:
        try:
            check_parts(existing)
            return PushReport(shown, "up-to-date", build_id, 0, len(existing.parts), time.perf_counter() - started)
        except RemoteIncompleteError:
            pass  # this build's marker, a part lost since: uploaded again below, the marker kept
    state = state_dir(path)
    prefix = parts_prefix(url, build_id)
    parts = []
    for relative, file in files:
        etag, blocks = _digests(file, block_size, state / "digests" / f"{relative}.json")
        parts.append(PublishedPart(relative, f"parts/{build_id}/{relative}", file.stat().st_size, etag, block_size, tuple(blocks)))
    marker = Marker(url, build_id, layout, tuple(parts))
    listed = {item.url: item for item in objects.list_objects(prefix)}
    todo = [(part, file) for part, (_, file) in zip(parts, files, strict=True)
            if (found := listed.get(marker.part_url(part))) is None or (found.size, found.etag) != (part.size, part.etag)]
    meter = ByteMeter(sum(part.size for part, _ in todo), progress, f"push {shown}", "uploaded")
    resumed = [len(todo) < len(parts)]

    def send(part: PublishedPart, file: Path) -> None:
        def on_resumed(nbytes: int) -> None:
            resumed[0] = True

        upload_state = state / "uploads" / f"{part.path}.json"
        upload_state.parent.mkdir(parents=True, exist_ok=True)
        etag = objects.upload(str(file), marker.part_url(part), state=str(upload_state), on_part=meter.add, on_resumed=on_resumed)
        if etag != part.etag:
            raise RemoteError(f"{urls.redact(marker.part_url(part))}: uploaded with ETag {etag}, expected {part.etag} (the file "
                              f"{str(file)!r} changed during the push?). Rerun the push.")

    if todo:
        with ThreadPoolExecutor(max_workers=min(FILE_CONCURRENCY, len(todo))) as pool:
            for future in [pool.submit(send, part, file) for part, file in todo]:
                future.result()
    check_parts(marker)  # one listing: every part there, as uploaded
    if existing is not None:
        return PushReport(shown, "resumed", build_id, meter.done, len(parts), time.perf_counter() - started)
    try:
        objects.write(marker_url(url), marker.to_json(), if_absent=True)
    except RemoteExistsError:
        winner = _winning_marker(url)
        if winner is not None and winner.build_id == build_id:  # the same build, published by another process first
            return PushReport(shown, "up-to-date", build_id, meter.done, len(parts), time.perf_counter() - started)
        objects.delete(marker.part_url(part) for part in parts)
        raise _exists(url, winner.build_id if winner is not None else "(unreadable)", lost=True) from None
    shutil.rmtree(state / "uploads", ignore_errors=True)
    action = "resumed" if resumed[0] else "pushed"
    return PushReport(shown, action, build_id, meter.done, len(parts), time.perf_counter() - started)


def _winning_marker(url: str) -> Marker | None:
    """The marker another publisher wrote just before ours was refused, or ``None`` when it cannot be read. S3 shows it at
    once; a server whose conditional put checks, then stores, in two steps (moto) may show it a moment later: up to 5
    tries, 0.1-0.8 s apart."""
    for attempt in range(5):
        try:
            return read_marker(url)
        except RemoteIncompleteError:
            if attempt < 4:
                time.sleep(0.1 * 2 ** attempt)
    return None


def _existing_marker(url: str) -> Marker | None:
    try:
        return read_marker(url)
    except RemoteIncompleteError:
        if objects.exists(marker_url(url)):
            raise
        return None


def _exists(url: str, winner: str, *, lost: bool = False) -> RemoteExistsError:
    how = "another publisher wrote its marker first (this push's parts were deleted)" if lost else "it holds another build"
    return RemoteExistsError(f"{urls.redact(url)} is published already: {how}, build {winner}. Push to another URL, or delete "
                             f"the prefix {urls.redact(url)}/ first to replace it.")
