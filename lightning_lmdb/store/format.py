"""The on-disk contract of a lightning_lmdb database.

Layout (format versions 2 and 3, written by this version)
---------------------------------------------------------

Version 3 is version 2 plus typed targets and splits; a database is written in the lowest version that
holds it -- 2 for class targets (or none) without splits, which earlier releases read too, 3 otherwise, which
they refuse ("upgrade") rather than serve ``-1`` for every target (:func:`version_for`).

A database is **one LMDB file** (``subdir=False``), e.g. ``train.lmdb``. Readers open it read-only
with ``lock=False``, so no lock file is needed beside it and a read-only filesystem works.

* Named sub-database ``records``: one record per image, keyed by its index in scan order as ten
  ASCII digits (``b"0000000042"``), written with ``append=True``. File names never touch a key. The
  value is what :mod:`lightning_lmdb.codec.storage` makes of the file for the database's ``storage``: the
  file's bytes, untouched, a pixel header and RGB pixels, or a pixel header and a zstd frame of them;
  ``meta/codecs`` says which. With ``target_kind`` ``mask``, that value and the mask's are packed in one
  record (:func:`lightning_lmdb.sources.masks.pack`).

* Key ``meta`` of the main database: the **header**, small UTF-8 JSON (never pickle) whatever the
  number of records: ``format`` (``"lightning_lmdb"``), ``version`` (2 or 3), ``count``, ``storage``,
  ``classes``, ``class_to_idx``, ``checksum`` (the per-record checksum's algorithm: ``xxh3-64``, or ``blake2b-64``
  in databases written before it),
  ``source`` (``root``, ``num_files``, ``bytes``, ``fingerprint`` over paths, targets, sizes and
  mtimes), ``target_kind`` (``class``, ``none``, ``multilabel``, ``regression`` or ``mask``; absent from older files:
  ``class`` with classes, else ``none``), ``target_names`` (version 3, regression: the K names), ``split_names`` (version 3,
  when the source has a split column: the split names in order), ``ignore_index`` (version 3, ``mask``: the mask value
  of unlabelled pixels), ``options`` (the build options that shape the
  contents), ``skipped`` (list of
  ``{"path", "reason"}``), ``created``, ``library_version``, ``build_id`` (a random identity of
  this build) and ``arrays``: the hex ``blake2b-128`` digest of each array below.
  A shard of a sharded build (:mod:`lightning_lmdb.store.shards`) also has ``shard``: ``index``, ``of``,
  ``start`` and ``stop`` (the range of the whole scan it covers), ``scan_files`` and ``scan_fingerprint``
  (the whole scan's); its ``source`` describes its own range.
* Key ``meta/digest``: the ``blake2b-128`` digest (16 raw bytes) of the header bytes.
* The per-record arrays, each one LMDB value, little-endian, no framing:

  - ``meta/targets``: ``int32`` per record: the class index (``-1`` for unlabelled images and the other kinds);
  - ``meta/labels`` and ``meta/label-offsets`` (version 3, ``multilabel``; ``mask``: the classes its mask holds): each
    record's class indices (``int32``), concatenated, and ``int64`` per record plus one: record ``i``'s are
    ``labels[offsets[i]:offsets[i+1]]``;
  - ``meta/values`` (version 3, ``regression``): ``float32``, K per record;
  - ``meta/splits`` (version 3, with ``split_names``): ``uint8`` per record, its split's index in ``split_names``;
  - ``meta/checksums``: 8 raw bytes per record, the checksum of its value under the header's ``checksum``
    (:func:`checksum`): ``xxh3-64``, the value's 64-bit XXH3 hash as a little-endian ``uint64`` (written since the change
    from ``blake2b-64``, ~70x slower to compute); ``blake2b-64``, the value's 8-byte BLAKE2b digest (older databases: read
    and checked with it, never converted);
  - ``meta/paths``: the records' relative source paths, UTF-8 (undecodable bytes of a file name kept
    with ``surrogateescape``), concatenated;
  - ``meta/path-offsets``: ``int64`` per record plus one: path ``i`` is ``paths[offsets[i]:offsets[i+1]]``;
  - ``meta/mask-paths`` and ``meta/mask-path-offsets`` (version 3, ``mask``): each record's mask path as ``meta/paths``
    (relative to the source's root when inside it, else absolute);
  - ``meta/boxes`` (version 3, ``boxes``): ``float32``, 4 per box (``x1 y1 x2 y2`` in pixels of the source image), every
    record's boxes concatenated; ``meta/labels`` holds each box's class and ``meta/label-offsets`` indexes both. Beside
    them, when the source gives them: ``meta/box-iscrowd`` and ``meta/box-difficult`` (``uint8`` per box),
    ``meta/box-area`` (``float32`` per box), ``meta/box-category-ids`` (``int64`` per box), ``meta/image-ids`` (``int64``
    per record, ``-1`` for none); always ``meta/image-sizes`` (``int32`` height and width per record of the image the boxes
    are in, ``0 0`` unknown: a ``resize=`` build's boxes are scaled by the stored image's size over it when served). The
    header's ``target_meta`` holds what the source says of its targets as a whole (COCO's ``category_ids`` in class
    order, ``degenerate_dropped``);
  - ``meta/codecs``: ``uint8`` per record, the id of its record codec (:data:`lightning_lmdb.codec.storage.RECORD_CODECS`:
    ``zstd pixels``, ``JPEG``, ``PNG``, ...). Databases written before it existed lack it (and its digest):
    every record then has the codec its ``storage`` always wrote (``StorageMode.default_codec``).

* Key ``build-id``: the build id again as ASCII, read by every process at open (and by datasets with
  each record) to notice a file replaced since a dataset was created, without parsing anything.

Opening reads and checks the header (its digest; every field's presence and type, a wrong one is a
:class:`DatabaseError` naming it), the targets and the checksums (digest and length): a few MB at ImageNet size
(the checksums' 10 MB at 1.28M records are digested, and their first 4 bytes a record kept), no Python object per record.
Paths and whole checksums are read, and their digests checked, only by those who need them (``verify``, error messages,
``dataset.paths``). LMDB does not checksum its pages: these
digests are what turns a flipped byte in a label into an error instead of a wrong label, and the per-record checksums
what turns a flipped bit in a record into an error instead of wrong pixels: every record a dataset reads is checked
against its checksum (its first 4 bytes, :func:`read_check_table`) before it is decoded (a ``zstd pixels`` record relies
on its frame's own content checksum instead, its header checked against the frame's content size), and a mismatch is a
:class:`DatabaseError` naming the record.

The header, its digest, the arrays and ``build-id`` are written in the same final transaction that
completes the build: a file with no ``meta`` key is not a finished database.

Version 1 (still read)
----------------------

``meta`` held every per-record list inline as JSON (no ``meta/*`` keys). Datasets and tools read it; builds
treat it as stale and rebuild it (unless ``on_stale="ignore"``).

While building
--------------

Key ``progress`` of the main database exists only while building: JSON with the number of source
files consumed, a fingerprint of that prefix of the scan, the options and the files skipped so far.
A rerun after a crash resumes from it; it names the checksum algorithm of its entries (``checksum``; absent:
``blake2b-64``, a build begun before ``xxh3-64``, whose entries a resume recomputes once). The named sub-database
``checksums`` (record key to its 8-byte checksum, 1-byte record codec and, for a packed ``Dataset``, the record's target as
JSON) exists only then.

Beside ``X.lmdb`` while building: ``X.lmdb.partial`` (renamed onto ``X.lmdb`` when complete),
``X.lmdb.partial-lock`` (LMDB's writer lock) and ``X.lmdb.build-lock`` (one build at a time); their names and
the durable-write and locking helpers live in :mod:`lightning_lmdb.store.fsops`, re-exported here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lmdb
import numpy as np
import xxhash

from lightning_lmdb.codec import storage as _codec
from lightning_lmdb.errors import DatabaseError
from lightning_lmdb.jsonfields import JsonFields
from lightning_lmdb.pathtable import PathTable

# Re-exported: callers find them here (they moved to keep this module to the format itself).
from lightning_lmdb.store.fsops import (  # noqa: F401
    build_files,
    build_lock_path,
    file_lock,
    fsync_dir,
    partial_lock_path,
    partial_path,
    write_atomically,
)
from lightning_lmdb.targets import TargetTable, read_typed
from lightning_lmdb.targets import base as _kinds

FORMAT_NAME = "lightning_lmdb"
#: The newest format version this library reads and writes.
FORMAT_VERSION = 3
#: The version written for class targets (or none) without splits: what earlier releases read.
BASE_VERSION = 2
#: The version of the ``progress`` record of a build in progress (unchanged by version 3: a partial build resumes across it).
PROGRESS_VERSION = 2
RECORDS_DB = b"records"
META_KEY = b"meta"
META_DIGEST_KEY = b"meta/digest"
BUILD_ID_KEY = b"build-id"
PROGRESS_KEY = b"progress"
CHECKSUMS_DB = b"checksums"
KEY_WIDTH = 10
#: The per-record checksum new builds write (the header's ``checksum`` names it): the value's XXH3 64-bit hash (see :func:`checksum`).
CHECKSUM_ALGO = "xxh3-64"
#: The per-record checksum of databases written before ``xxh3-64``: still read, and checked with it.
LEGACY_CHECKSUM_ALGO = "blake2b-64"
CHECKSUM_SIZE = 8
#: The per-record arrays of format 2: name -> (key, numpy dtype, items per record, extra items).
ARRAYS: dict[str, tuple[bytes, str, int, int]] = {
    "targets": (b"meta/targets", "<i4", 1, 0),
    "checksums": (b"meta/checksums", "u1", CHECKSUM_SIZE, 0),
    "paths": (b"meta/paths", "u1", 0, 0),  # a blob: its length is given by the offsets
    "path_offsets": (b"meta/path-offsets", "<i8", 1, 1),
    "codecs": (b"meta/codecs", "u1", 1, 0),  # absent from databases written before it
    "labels": (b"meta/labels", "<i4", 0, 0),  # version 3, multilabel: a blob, its length given by the offsets
    "label_offsets": (b"meta/label-offsets", "<i8", 1, 1),
    "values": (b"meta/values", "<f4", 0, 0),  # version 3, regression: K per record (checked by the reader)
    "splits": (b"meta/splits", "u1", 1, 0),  # version 3, with split_names
    "mask_paths": (b"meta/mask-paths", "u1", 0, 0),  # version 3, mask: a blob, its length given by the offsets
    "mask_path_offsets": (b"meta/mask-path-offsets", "<i8", 1, 1),
    # version 3, boxes (lightning_lmdb.targets.boxes): per box, in the order of meta/labels (meta/label-offsets index both)
    "boxes": (b"meta/boxes", "<f4", 0, 0),  # x1 y1 x2 y2 per box, pixels of the image in its source
    "box_iscrowd": (b"meta/box-iscrowd", "u1", 0, 0),  # only when the source has the flag (COCO)
    "box_difficult": (b"meta/box-difficult", "u1", 0, 0),  # only when the source has the flag (VOC)
    "box_area": (b"meta/box-area", "<f4", 0, 0),  # only when the source gives it (COCO)
    "box_category_ids": (b"meta/box-category-ids", "<i8", 0, 0),  # only when the source gives them (COCO)
    "image_ids": (b"meta/image-ids", "<i8", 1, 0),  # per record, -1 for none; only when the source gives them (COCO)
    "image_sizes": (b"meta/image-sizes", "<i4", 2, 0),  # per record (height, width) of the image in its source; 0 0: unknown
}


def version_for(target_kind: str, split_names: list[str]) -> int:
    """The format version a database with these targets and splits is written in (the lowest that holds it)."""
    known = _kinds.kind_names()
    typed = _kinds.target_kind(target_kind).typed if target_kind in known else True  # the kind says (class, none: not typed)
    return FORMAT_VERSION if typed or split_names else BASE_VERSION


def record_key(index: int) -> bytes:
    """The key of record ``index``: fixed-width ASCII digits, so byte order equals index order."""
    return b"%0*d" % (KEY_WIDTH, index)


def _xxh3_64(value: bytes | memoryview) -> bytes:
    return xxhash.xxh3_64_intdigest(value).to_bytes(CHECKSUM_SIZE, "little")


def _xxh3_64_head(value: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(value) & 0xFFFFFFFF


def _blake2b_64(value: bytes | memoryview) -> bytes:
    return hashlib.blake2b(value, digest_size=CHECKSUM_SIZE).digest()


def _blake2b_64_head(value: bytes | memoryview) -> int:
    return int.from_bytes(hashlib.blake2b(value, digest_size=CHECKSUM_SIZE).digest()[:READ_CHECK_SIZE], "little")


#: Every per-record checksum algorithm, by the name the header's ``checksum`` field gives: a record value to the
#: :data:`CHECKSUM_SIZE` bytes stored for it.
CHECKSUMS: dict[str, Callable[[bytes | memoryview], bytes]] = {CHECKSUM_ALGO: _xxh3_64, LEGACY_CHECKSUM_ALGO: _blake2b_64}
#: The bytes of a stored checksum that a read compares (its first four: the low half of the ``xxh3-64`` hash or of the
#: ``blake2b-64`` digest).
READ_CHECK_SIZE = 4
#: Per algorithm, what a read computes of a record: its stored checksum's first :data:`READ_CHECK_SIZE` bytes as a
#: little-endian ``uint32``, compared with :func:`read_check_table`'s entry.
READ_CHECKS: dict[str, Callable[[bytes | memoryview], int]] = {CHECKSUM_ALGO: _xxh3_64_head, LEGACY_CHECKSUM_ALGO: _blake2b_64_head}


def checksum(value: bytes | memoryview, algorithm: str = CHECKSUM_ALGO) -> bytes:
    """The :data:`CHECKSUM_SIZE` bytes stored for a record value under ``algorithm`` (:data:`CHECKSUMS`).

    ``xxh3-64`` (what builds write now): the value's XXH3 64-bit hash (the ``xxhash`` package), a little-endian ``uint64``:
    ~50 GB/s here, so a check costs ~2 us per 100 KB (CRC-32 cost ~35 us, BLAKE2b ~140 us). ``blake2b-64`` (older
    databases): the value's 8-byte BLAKE2b digest.
    """
    return CHECKSUMS[algorithm](value)


def read_check_table(checksums: np.ndarray) -> np.ndarray:
    """What every read compares, of a ``count x 8`` checksums array: each row's first :data:`READ_CHECK_SIZE` bytes, as ``count``
    read-only little-endian ``uint32`` (a copy: 4 bytes a record, 5 MB at ImageNet size, half the stored array).

    A read checks the low half of the hash (or of a BLAKE2b digest) alone: a damaged record whose check still matches is
    one in 2**32; ``verify`` compares all 8 bytes.
    """
    table = np.ascontiguousarray(np.asarray(checksums, dtype=np.uint8).reshape(-1, CHECKSUM_SIZE)[:, :READ_CHECK_SIZE]).view("<u4")
    table = table.reshape(-1)
    table.flags.writeable = False
    return table


def progress_entry(value: bytes | memoryview, codec: int) -> bytes:
    """A record's entry in the ``checksums`` sub-database while building: its checksum (:data:`CHECKSUM_ALGO`), then its record
    codec's id (one byte)."""
    return checksum(value) + bytes((codec,))



def record_entry(value: bytes, codec: int, target: Any) -> bytes:
    """A record's progress entry for a ``targets_from_records`` scan: :func:`progress_entry` (digest and
    codec), then the target as compact JSON (ASCII)."""
    return progress_entry(value, codec) + json.dumps(target, separators=(",", ":")).encode("ascii")


def split_entry(entry: bytes) -> tuple[bytes, Any]:
    """A :func:`record_entry` as ``(digest and codec, target)``.

    Raises:
        ValueError: Too short, or its target is not JSON.
    """
    head = CHECKSUM_SIZE + 1
    if len(entry) <= head:
        raise ValueError(f"a progress entry of {len(entry)} bytes holds no target")
    return entry[:head], json.loads(entry[head:])

def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def new_build_id() -> str:
    """A fresh random build identity (written with the metadata of every finished build)."""
    return uuid.uuid4().hex


def dump_json(obj: Any) -> bytes:
    """Serialise metadata: compact JSON (ASCII-escaped, so even undecodable file names round-trip)."""
    return json.dumps(obj, separators=(",", ":")).encode("ascii")


# --- the metadata, as a type ------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceInfo:
    """What the database was built from.

    Attributes:
        root: The source folder.
        num_files: Image files scanned (records plus skipped files).
        bytes: Their total size.
        fingerprint: Digest of paths, targets, sizes and mtimes (see ``sources.SourceScan.fingerprint``).
    """

    root: str
    num_files: int
    bytes: int
    fingerprint: str


@dataclass(frozen=True)
class Skipped:
    """A source file left out of the database, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class ShardInfo:
    """Which part of a sharded build a database file is (see :mod:`lightning_lmdb.store.shards`).

    Attributes:
        index: This shard's number, from 0.
        of: How many shards the build has.
        start: First file of the whole scan this shard covers; stop: one past its last (it covers ``files[start:stop]``).
        scan_files: Files in the whole scan.
        scan_fingerprint: The whole scan's fingerprint (every shard of one build carries the same).
        cut: How the scan was cut into shards (:data:`lightning_lmdb.store.shards.CUT_METHOD`): ``"bytes"`` (source bytes,
            the only cut before it was recorded: a header without ``cut`` says it) or ``"work"`` (estimated work).
    """

    index: int
    of: int
    start: int
    stop: int
    scan_files: int
    scan_fingerprint: str
    cut: str = "bytes"


@dataclass(frozen=True, eq=False)
class Metadata:
    """The validated metadata of a finished database (see the module docstring for the layout).

    Read it with :func:`read_meta` and by attribute. ``targets`` and ``codecs`` are always there (read-only
    ``int32`` and ``uint8`` arrays; ``codecs`` of an older database is its storage's one codec), and so are the typed
    targets of its kind (``labels`` / ``label_offsets``, ``values``), ``splits`` and ``read_checks`` (what a read compares:
    :func:`read_check_table`, ``count`` read-only ``uint32``); ``paths`` (a :class:`PathTable`) and ``checksums`` (``count x 8``
    read-only bytes, under the algorithm ``checksum`` names) are ``None`` unless asked for (``read_meta(..., arrays=True)``;
    version 1 databases always carry them). :meth:`target_table` gives the targets as a
    dataset serves them. A ``mask`` database has ``ignore_index`` (else ``None``) and, with ``arrays=True``, ``mask_paths``
    (a :class:`PathTable`, else ``None``).
    """

    version: int
    count: int
    storage: str
    classes: list[str]
    class_to_idx: dict[str, int]
    checksum: str
    source: SourceInfo
    options: dict[str, Any]
    skipped: list[Skipped]
    created: str
    library_version: str
    build_id: str | None
    targets: np.ndarray
    codecs: np.ndarray
    paths: PathTable | None = None
    checksums: np.ndarray | None = None
    read_checks: np.ndarray | None = None
    shard: ShardInfo | None = None
    target_kind: str = ""  # "": "class" with classes, else "none" (set in __post_init__)
    target_names: list[str] = dataclasses.field(default_factory=list)
    labels: np.ndarray | None = None
    label_offsets: np.ndarray | None = None
    values: np.ndarray | None = None
    split_names: list[str] = dataclasses.field(default_factory=list)
    splits: np.ndarray | None = None
    ignore_index: int | None = None
    mask_paths: PathTable | None = None
    target_arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    target_meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.target_kind:
            object.__setattr__(self, "target_kind", "class" if self.classes else "none")

    def target_table(self) -> TargetTable:
        """The targets as a dataset serves them (:class:`~lightning_lmdb.targets.TargetTable`)."""
        return _kinds.target_kind(self.target_kind).table(self)

    def header(self) -> dict[str, Any]:
        """The header JSON object (version 2 or 3, :func:`version_for`), without ``arrays``."""
        return {
            **({"shard": _shard_header(self.shard)} if self.shard is not None else {}),
            "format": FORMAT_NAME,
            "version": version_for(self.target_kind, self.split_names),
            "count": self.count,
            "storage": self.storage,
            "classes": self.classes,
            "class_to_idx": self.class_to_idx,
            "checksum": self.checksum,
            "source": dataclasses.asdict(self.source),
            "options": self.options,
            "skipped": [dataclasses.asdict(s) for s in self.skipped],
            "created": self.created,
            "library_version": self.library_version,
            "build_id": self.build_id,
            "target_kind": self.target_kind,
            **({"target_names": self.target_names} if self.target_names else {}),
            **({"split_names": self.split_names} if self.split_names else {}),
            **({"ignore_index": self.ignore_index} if self.ignore_index is not None else {}),
            **({"target_meta": self.target_meta} if self.target_meta else {}),
        }


def read_meta(env: lmdb.Environment, path: str | os.PathLike[str] = "<database>", *, arrays: bool = False) -> Metadata:
    """Read and validate the metadata of an open database file (version 1 or 2).

    The low-level reader of one open environment; to open a database of either layout by path use
    :func:`lightning_lmdb.store.database.open_database` / :func:`lightning_lmdb.store.database.load_meta`.

    Args:
        env: The open environment.
        path: How to name the database in errors.
        arrays: Also read (and check) the paths and the whole checksums (their first 4 bytes a record, ``read_checks``, are
            always read: every record read is checked against them).

    Raises:
        DatabaseError: No metadata (incomplete or foreign), unreadable JSON, a newer format version, a
            field missing or of the wrong type (named in the message), or a digest that does not match.
    """
    with env.begin(buffers=True) as txn:
        raw = txn.get(META_KEY)
        if raw is None:
            raise_no_meta(txn, path)
        raw = bytes(raw)
        try:
            obj = json.loads(raw.decode("utf-8"))
        except ValueError as exc:
            raise DatabaseError(f"Metadata of {str(path)!r} is not valid JSON ({exc}): the database is damaged; rebuild it.") from exc
        version = _check_version(obj, path)
        if version == 1:
            return _meta_v1(obj, path)
        digest = txn.get(META_DIGEST_KEY)
        if digest is None or bytes(digest) != _digest(raw):
            raise DatabaseError(f"Metadata header of {str(path)!r} does not match its digest: the database is damaged; rebuild it.")
        get = JsonFields(obj, path)
        count = get("count", int)
        digests = get.dict_of("arrays", str)
        read = _ArrayReader(txn, path, count, digests)
        targets = read("targets")
        codecs = read("codecs") if "codecs" in digests else None
        checksums = None
        if arrays:
            checksums = read("checksums").reshape(count, CHECKSUM_SIZE)
            read_checks = read_check_table(checksums)
        else:  # every record read is checked against it: only those 4 bytes a record are copied out of the map
            read_checks = read("checksums", READ_CHECK_SIZE).view("<u4").reshape(-1)
        paths = None
        if arrays:
            offsets = read("path_offsets")
            blob = read("paths")
            if offsets[0] != 0 or offsets[-1] != len(blob) or np.any(np.diff(offsets) < 0):
                raise DatabaseError(f"Path offsets of {str(path)!r} do not index its path blob: the database is damaged; rebuild it.")
            paths = PathTable(blob, offsets)
        meta = _meta(get, version, count, targets, paths, checksums, get("build_id", str), codecs, read_checks)
        meta = dataclasses.replace(meta, **read_typed(get, read, meta, arrays=arrays))
        if "shard" in obj:
            shard = JsonFields(get("shard", dict), path, "shard.")
            info = ShardInfo(*(shard(name, int) for name in ("index", "of", "start", "stop", "scan_files")),
                             shard("scan_fingerprint", str), shard("cut", str) if "cut" in obj["shard"] else "bytes")
            meta = dataclasses.replace(meta, shard=info)
        return meta


def _shard_header(shard: ShardInfo) -> dict[str, Any]:
    """A shard header's ``shard`` object (``cut`` left out when ``"bytes"``: such a header reads back as it was written)."""
    fields = dataclasses.asdict(shard)
    if fields["cut"] == "bytes":
        del fields["cut"]
    return fields


def _check_version(obj: Any, path: str | os.PathLike[str]) -> int:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        raise DatabaseError(f"{str(path)!r} is an LMDB file but not a lightning_lmdb database. Build one with lightning-lmdb build.")
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        raise DatabaseError(
            f"{str(path)!r} has format version {version!r}; this lightning_lmdb reads versions 1 to {FORMAT_VERSION}. "
            "Upgrade lightning_lmdb or rebuild the database with this version."
        )
    return version


def _meta(get: JsonFields, version: int, count: int, targets: np.ndarray, paths: PathTable | None, checksums: np.ndarray | None,
          build_id: str | None, codecs: np.ndarray | None = None, read_checks: np.ndarray | None = None) -> Metadata:
    """The fields both versions share, validated (``codecs``: ``None`` for a database without them; ``read_checks``: ``None``
    to take them from ``checksums``)."""
    if count < 0:
        get.fail("count", f"is {count}")
    storage = get("storage", str)
    if storage not in _codec.STORAGE_MODES:
        get.fail("storage", f"is {storage!r}, not one of {tuple(_codec.STORAGE_MODES)} (a newer lightning_lmdb built it: upgrade; "
                            "or a storage mode of your own: register_storage_mode() it first)")
    if codecs is None:
        default = _codec.STORAGE_MODES[storage].default_codec
        if default is None:
            get.fail("arrays", f"lacks the codecs array that storage {storage!r} always writes")
        codecs = np.full(count, default, dtype=np.uint8)
    elif len(codecs) and int(codecs.max()) >= len(_codec.RECORD_CODECS):
        get.fail("codecs", f"holds record codec {int(codecs.max())}, unknown here (a newer lightning_lmdb built it: upgrade; or a "
                           "record codec of your own: register_record_codec() it first)")
    codecs.flags.writeable = False
    algorithm = get("checksum", str)
    if algorithm not in CHECKSUMS:
        get.fail("checksum", f"is {algorithm!r}, not one of {tuple(CHECKSUMS)} (a newer lightning_lmdb built it: upgrade)")
    if checksums is not None:
        checksums.flags.writeable = False
    if read_checks is None:
        assert checksums is not None
        read_checks = read_check_table(checksums)
    read_checks.flags.writeable = False
    source = JsonFields(get("source", dict), get.path, "source.")
    skipped = []
    for i, item in enumerate(get("skipped", list)):
        entry = JsonFields(item if isinstance(item, dict) else get.fail(f"skipped[{i}]", "is not an object"), get.path, f"skipped[{i}].")
        skipped.append(Skipped(entry("path", str), entry("reason", str)))
    targets.flags.writeable = False
    return Metadata(
        version=version,
        count=count,
        storage=storage,
        classes=get.list_of("classes", str),
        class_to_idx=get.dict_of("class_to_idx", int),
        checksum=algorithm,
        source=SourceInfo(source("root", str), source("num_files", int), source("bytes", int), source("fingerprint", str)),
        options=get("options", dict),
        skipped=skipped,
        created=get("created", str),
        library_version=get("library_version", str),
        build_id=build_id,
        targets=targets,
        codecs=codecs,
        paths=paths,
        checksums=checksums,
        read_checks=read_checks,
    )


def _meta_v1(obj: dict[str, Any], path: str | os.PathLike[str]) -> Metadata:
    get = JsonFields(obj, path)
    count = get("count", int)
    targets = np.array(get.list_of("targets", int, length=count), dtype=np.int32)
    paths = PathTable.from_strings(get.list_of("paths", str, length=count))
    hexes = get.list_of("checksums", str, length=count)
    try:
        checksums = np.frombuffer(bytes.fromhex("".join(hexes)), dtype=np.uint8).reshape(count, CHECKSUM_SIZE)
    except ValueError:
        get.fail("checksums", f"should hold {count} hex digests of {CHECKSUM_SIZE} bytes")
    return _meta(get, 1, count, targets, paths, checksums, get("build_id", str) if "build_id" in obj else None)


class _ArrayReader:
    """Reads one format-2 array: present, the length ``count`` implies, and matching its digest in the header."""

    def __init__(self, txn: lmdb.Transaction, path: str | os.PathLike[str], count: int, digests: dict[str, str]):
        self.txn, self.path, self.count, self.digests = txn, path, count, digests

    def __call__(self, name: str, columns: int | None = None) -> np.ndarray:
        """The array ``name``, copied out of the map; with ``columns``, only each record's first ``columns`` items (a
        ``count x columns`` array: the rest is digested, never copied)."""
        key, dtype, per_record, extra = ARRAYS[name]
        value = self.txn.get(key)
        expected = self.digests.get(name)
        if value is None or expected is None:
            raise DatabaseError(f"{str(self.path)!r} lacks its {name} array ({key.decode()}): the database is damaged; rebuild it.")
        if _digest(value).hex() != expected:
            raise DatabaseError(f"The {name} array of {str(self.path)!r} does not match its digest: the database is damaged; rebuild it.")
        array = np.frombuffer(value, dtype=dtype)
        if per_record and len(array) != self.count * per_record + extra:
            raise DatabaseError(
                f"The {name} array of {str(self.path)!r} holds {len(array)} items for {self.count} records: damaged; rebuild it."
            )
        if columns is not None:
            return np.ascontiguousarray(array.reshape(self.count, per_record)[:, :columns])
        return array.copy()  # out of the map: private, never a page fault later


def write_meta(txn: lmdb.Transaction, meta: Metadata) -> None:
    """Write a finished database's metadata in format 2 (header, its digest, the arrays, the build id).

    ``meta.paths`` and ``meta.checksums`` must be set; ``meta.build_id`` too.
    """
    if meta.paths is None or meta.checksums is None or meta.build_id is None:
        raise ValueError("write_meta needs paths, checksums and a build id.")
    values = {
        "targets": np.ascontiguousarray(meta.targets, dtype="<i4").tobytes(),
        "checksums": np.ascontiguousarray(meta.checksums, dtype=np.uint8).tobytes(),
        "paths": meta.paths.blob.tobytes(),
        "path_offsets": np.ascontiguousarray(meta.paths.offsets, dtype="<i8").tobytes(),
        "codecs": np.ascontiguousarray(meta.codecs, dtype=np.uint8).tobytes(),
    }
    typed = {"labels": (meta.labels, "<i4"), "label_offsets": (meta.label_offsets, "<i8"), "values": (meta.values, "<f4"),
             "splits": (meta.splits, np.uint8), "mask_paths": (None if meta.mask_paths is None else meta.mask_paths.blob, np.uint8),
             "mask_path_offsets": (None if meta.mask_paths is None else meta.mask_paths.offsets, "<i8")}
    values.update({name: np.ascontiguousarray(array, dtype=dtype).reshape(-1).tobytes()
                   for name, (array, dtype) in typed.items() if array is not None})
    values.update({name: np.ascontiguousarray(array, dtype=ARRAYS[name][1]).reshape(-1).tobytes()
                   for name, array in meta.target_arrays.items()})
    header = dump_json({**meta.header(), "arrays": {name: _digest(value).hex() for name, value in values.items()}})
    for name, value in values.items():
        txn.put(ARRAYS[name][0], value)
    txn.put(META_KEY, header)
    txn.put(META_DIGEST_KEY, _digest(header))
    txn.put(BUILD_ID_KEY, meta.build_id.encode("ascii"))


def header_digest(txn: lmdb.Transaction) -> str | None:
    """The hex digest of a format-2 database's header (``meta/digest``; it covers every array's digest), or ``None``."""
    value = txn.get(META_DIGEST_KEY)
    return None if value is None else bytes(value).hex()


def raise_no_meta(txn: lmdb.Transaction, path: str | os.PathLike[str]) -> None:
    """Raise the right :class:`DatabaseError` for a file without metadata (an unfinished build, or not ours)."""
    if txn.get(PROGRESS_KEY) is not None:
        raise DatabaseError(f"{str(path)!r} is an unfinished build. Run the build again: it resumes where it stopped.")
    raise DatabaseError(
        f"{str(path)!r} is an LMDB file but not a lightning_lmdb database (no metadata). Build one with lightning-lmdb build."
    )
