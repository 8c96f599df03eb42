"""Opening a database, whatever its layout: metadata, parts, files, bytes and build id.

What a database is
------------------

A lightning_lmdb **database** is either

* a **single file** (``train.lmdb``): one LMDB file of :mod:`lightning_lmdb.store.format`; or
* a **sharded folder** (``train.lmdb/``): shard files ``shard-00000-of-00004.lmdb`` ..., each a database file of its
  own, and ``manifest.json``, written last, that joins them into one database (see :mod:`lightning_lmdb.store.shards`,
  which builds them and writes the manifest).

Both serve the same samples in the same order; every reader goes through this module, so none needs to know
which layout it has. The manifest is read only here (:func:`open_database` checks every shard against it).

Functions
---------

* :func:`open_database`: validated metadata and :class:`Part` s in one reading.
* :func:`load_meta`: validated metadata (a folder's shards joined as one database's).
* :func:`parts`: the database files and where their records sit in the whole.
* :func:`database_files` / :func:`database_bytes`: the files holding the records, and their size.
* :func:`build_id`: the identity of the build (a file's own, or the manifest's).
* :func:`is_current` / :func:`stale_reason`: whether a database is what a build of a source scan would make now,
  and if not, how it differs (the one rule every build's "up to date?" decision uses).
* :func:`is_sharded`: whether a path is (or is being built as) a sharded folder.
* :func:`shard_meta`: one shard file's metadata and header digest (what a manifest records of it).
* :func:`shard_name` / :func:`shard_files`, :data:`MANIFEST_NAME`, :data:`LOCK_NAME`: the sharded layout's names.

Readers never write: a sharded folder without a manifest is refused with what to run to finish it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_lmdb.options import CONTENT_OPTIONS
from lightning_lmdb.store import envs
from lightning_lmdb.store import format as fmt
from lightning_lmdb.targets import TargetTable, named
from lightning_lmdb.targets import base as _kinds

if TYPE_CHECKING:
    from lightning_lmdb.sources.base import SourceScan

MANIFEST_NAME = "manifest.json"
LOCK_NAME = "build-lock"
_SHARD_RE = re.compile(r"^shard-(\d{5})-of-(\d{5})\.lmdb$")
_SHARD_PREFIX_RE = re.compile(r"^shard-\d{5}-of-\d{5}\.lmdb")


def shard_name(index: int, of: int) -> str:
    """The file name of shard ``index`` of ``of``: ``shard-00002-of-00004.lmdb``."""
    return f"shard-{index:05d}-of-{of:05d}.lmdb"


def shard_files(folder: Path) -> dict[tuple[int, int], Path]:
    """The finished shard files in ``folder``, by ``(index, of)``."""
    found = {}
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for path in folder.iterdir():
            match = _SHARD_RE.match(path.name)
            if match:
                found[int(match[1]), int(match[2])] = path
    return found


def is_sharded(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is (or is being built as) a sharded database folder."""
    path = Path(path)
    if not path.is_dir():
        return False
    return (path / MANIFEST_NAME).exists() or any(_is_build_file(p.name) for p in path.iterdir())


def _is_build_file(name: str) -> bool:
    """A shard, or a file its build makes on its way (the lock files come first: another node may see only those)."""
    shard = _SHARD_PREFIX_RE.match(name)
    return name == LOCK_NAME or (shard is not None and name in {p.name for p in (Path(shard[0]), *fmt.build_files(Path(shard[0])))})


@dataclass(frozen=True)
class Part:
    """One database file of a database and where its records sit in the whole.

    Attributes:
        path: The file.
        offset: Global index of its first record.
        count: Its records.
        build_id: The build id it must have.
        digest: Its header digest as the manifest records it (``None`` for a single file).
        checksum: The algorithm of its records' checksums (its header's ``checksum``; the shards of a build resumed across
            the change from ``blake2b-64`` may differ). Set by :func:`open_database`; ``""`` from :func:`parts`.
    """

    path: str
    offset: int
    count: int
    build_id: str
    digest: str | None = None
    checksum: str = ""


@dataclass(frozen=True)
class _Manifest:
    """A sharded database's validated manifest: its header fields and its parts."""

    header: dict[str, Any]
    parts: list[Part]

    @property
    def build_id(self) -> str:
        """The identity of this sharded build (a digest of the shards' build ids)."""
        return str(self.header["build_id"])

    @property
    def count(self) -> int:
        """Records in all shards."""
        return int(self.header["count"])


def _read_manifest(folder: Path) -> _Manifest:
    """Read and check a sharded database's manifest (shards are checked when opened: :func:`open_database`).

    Raises:
        DatabaseError: No manifest (the shards are not complete yet: the message lists what is missing),
            unreadable JSON, or a field missing or of the wrong type.
    """
    path = folder / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise fmt.DatabaseError(why_incomplete(folder)) from None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise fmt.DatabaseError(f"{str(path)!r} is not valid JSON ({exc}): delete it and rerun the build to write it again.") from exc
    if not isinstance(obj, dict) or obj.get("format") != fmt.FORMAT_NAME or obj.get("layout") != "sharded":
        raise fmt.DatabaseError(f"{str(path)!r} is not a lightning_lmdb shard manifest. Build one with lightning-lmdb build --shards K.")
    get = fmt.JsonFields(obj, path)
    count = get("count", int)
    found, offset = [], 0
    for i, entry in enumerate(get("shards", list)):
        item = fmt.JsonFields(entry if isinstance(entry, dict) else get.fail(f"shards[{i}]", "is not an object"), path, f"shards[{i}].")
        name = item("file", str)
        if name != shard_name(i, len(obj["shards"])):
            item.fail("file", f"is {name!r}, not {shard_name(i, len(obj['shards']))!r}")
        if item("offset", int) != offset:
            item.fail("offset", f"is {item('offset', int)}, but the shards before it hold {offset} records")
        found.append(Part(str(folder / name), offset, item("count", int), item("build_id", str), item("digest", str)))
        offset += found[-1].count
    if offset != count or not found:
        get.fail("count", f"is {count}, but its {len(found)} shards hold {offset} records")
    get("build_id", str)
    return _Manifest(obj, found)


def why_incomplete(folder: Path) -> str:
    """Why a sharded folder without a manifest is not a database yet, and what to run."""
    found = shard_files(folder)
    if not found:
        return (f"{str(folder)!r} is a folder without shards or a manifest: not a lightning_lmdb database. Build one with "
                "lightning-lmdb build SOURCE TARGET [--shards K].")
    of = max(found)[1]
    missing = [i for i in range(of) if (i, of) not in found]
    if missing:
        shown = ", ".join(f"{i}/{of}" for i in missing[:8]) + (" ..." if len(missing) > 8 else "")
        return (f"{str(folder)!r} has no {MANIFEST_NAME}: it is an unfinished sharded build, shard(s) {shown} are missing. Build "
                f"them (lightning-lmdb build SOURCE {folder} --shard I/{of} for each; the one completing the set writes the "
                f"manifest), or build all with --shards {of}.")
    return (f"{str(folder)!r} has every shard but no {MANIFEST_NAME}: its build did not finish. Run the build again "
            f"(lightning-lmdb build SOURCE {folder} --shards {of}): it keeps the shards and writes the manifest.")


def parts(path: str | os.PathLike[str]) -> list[Part]:
    """The database files of ``path`` (one file, or a sharded folder's shards) and where their records sit.

    Raises:
        FileNotFoundError: Nothing at ``path``.
        DatabaseError: Not a finished, valid database (see :func:`open_database`).
    """
    path = Path(path).absolute()
    if is_sharded(path):
        return _read_manifest(path).parts
    with envs.reading(path) as opened:
        count = int(fmt.read_meta(opened.env, path).count)
        return [Part(str(path), 0, count, opened.build_id)]


def database_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files that hold ``path``'s records: the file itself, or a sharded folder's shard files (what eviction and staging handle)."""
    path = Path(path)
    if is_sharded(path):
        return [p for _, p in sorted(shard_files(path).items())]
    return [path]


def database_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of ``path``'s database files (0 if there are none yet)."""
    total = 0
    for file in database_files(path):
        with contextlib.suppress(OSError):
            total += file.stat().st_size
    return total


def build_id(path: str | os.PathLike[str]) -> str:
    """The build id of a database: a file's own, or a sharded folder's manifest's."""
    if is_sharded(path):
        return _read_manifest(Path(path).absolute()).build_id
    with envs.reading(path) as opened:
        return opened.build_id


def shard_meta(path: str | os.PathLike[str], *, arrays: bool) -> tuple[fmt.Metadata, str | None]:
    """A shard file's validated metadata and its header digest (what a manifest records of it)."""
    with envs.reading(path) as opened:
        with opened.env.begin() as txn:
            digest = fmt.header_digest(txn)
        return fmt.read_meta(opened.env, path, arrays=arrays), digest


def load_meta(path: str | os.PathLike[str], *, arrays: bool = False) -> fmt.Metadata:
    """The validated metadata of a database file or sharded folder (for a folder: the shards' joined, as one database's).

    Args:
        path: A database file or a sharded database folder.
        arrays: Also read the paths and checksums.

    Raises:
        FileNotFoundError: Nothing at ``path``.
        DatabaseError: Incomplete, foreign, newer-format, truncated or damaged; a shard that does not match its manifest.
    """
    return open_database(path, arrays=arrays)[0]


def open_database(path: str | os.PathLike[str], *, arrays: bool = False) -> tuple[fmt.Metadata, list[Part]]:
    """:func:`load_meta` and :func:`parts` of ``path`` in one reading (one manifest read, one open of each file).

    Raises:
        As :func:`load_meta`.
    """
    if not is_sharded(path):
        with envs.reading(path) as opened:
            meta = fmt.read_meta(opened.env, path, arrays=arrays)
            return meta, [Part(os.path.abspath(path), 0, meta.count, opened.build_id, checksum=meta.checksum)]
    path = Path(path).absolute()
    manifest = _read_manifest(path)
    metas = []
    for part in manifest.parts:
        if not os.path.exists(part.path):
            raise fmt.DatabaseError(
                f"{part.path!r}, a shard of {str(path)!r}, is missing. Build it again: lightning-lmdb build SOURCE {path} "
                f"--shards {len(manifest.parts)} (it rebuilds only what is missing)."
            )
        meta, digest = shard_meta(part.path, arrays=arrays)
        if (meta.count, meta.build_id, digest) != (part.count, part.build_id, part.digest):
            raise fmt.DatabaseError(
                f"{part.path!r} does not match the manifest of {str(path)!r} (another build of that shard replaced it, or a file is "
                f"damaged). Rebuild the folder with lightning-lmdb build --shards {len(manifest.parts)}."
            )
        metas.append(meta)
    return _joined(path, manifest, metas, arrays), [replace(p, checksum=m.checksum) for p, m in zip(manifest.parts, metas, strict=True)]


def _joined(path: Path, manifest: _Manifest, metas: list[fmt.Metadata], arrays: bool) -> fmt.Metadata:
    """The shards' metadata joined into one database's (the manifest's header fields, the arrays concatenated)."""
    header = manifest.header
    get = fmt.JsonFields(header, path / MANIFEST_NAME)
    source = fmt.JsonFields(get("source", dict), path / MANIFEST_NAME, "source.")
    joined = replace(
        metas[0],
        count=manifest.count,
        source=fmt.SourceInfo(source("root", str), source("num_files", int), source("bytes", int), source("fingerprint", str)),
        options=get("options", dict),
        skipped=[s for m in metas for s in m.skipped],
        created=get("created", str),
        build_id=manifest.build_id,
        targets=np.concatenate([m.targets for m in metas]),
        codecs=np.concatenate([m.codecs for m in metas]),
        read_checks=np.concatenate([m.read_checks for m in metas]),  # each shard's under its own algorithm (Part.checksum)
        shard=None,
    )
    if _kinds.target_kind(joined.target_kind).typed:  # its typed arrays, the shards' joined
        table = TargetTable.concat([m.target_table() for m in metas])
        joined = replace(joined, labels=table.labels, label_offsets=table.offsets,
                         values=None if table.values is None else table.values.reshape(-1), target_arrays=dict(table.extra or {}))
        for array in joined.target_arrays.values():
            array.flags.writeable = False
    if joined.split_names:
        joined = replace(joined, splits=np.concatenate([m.splits for m in metas]))  # type: ignore[misc]
    for array in (joined.targets, joined.codecs, joined.read_checks, joined.labels, joined.label_offsets, joined.values, joined.splits):
        if array is not None:
            array.flags.writeable = False
    if arrays:
        joined = replace(joined, paths=_joined_paths([m.paths for m in metas]), checksums=np.concatenate([m.checksums for m in metas]),
                         mask_paths=None if joined.mask_paths is None else _joined_paths([m.mask_paths for m in metas]))
    return joined


def _joined_paths(tables: list[fmt.PathTable | None]) -> fmt.PathTable:
    """The path tables of consecutive shards as one."""
    assert all(t is not None for t in tables)
    blob = np.concatenate([t.blob for t in tables])  # type: ignore[union-attr]
    starts = np.cumsum([0] + [len(t.blob) for t in tables[:-1]])  # type: ignore[union-attr]
    offsets = np.concatenate([[0]] + [t.offsets[1:] + s for t, s in zip(tables, starts, strict=True)])  # type: ignore[union-attr]
    return fmt.PathTable(blob, offsets.astype(np.int64))


#: :func:`is_current`'s ``shard`` when the shard header is not compared (a single-file target: kept as it was built).
ANY_SHARD: Any = object()


def is_current(meta: fmt.Metadata, scan: SourceScan, options: dict[str, Any], *, shard: fmt.ShardInfo | None = ANY_SHARD) -> bool:
    """Whether a database (or a shard, or a partial build) is what a build of ``scan`` with ``options`` would make now.

    Current means: the format version this library writes for it, the scan's fingerprint, and the same content options
    (:data:`~lightning_lmdb.options.CONTENT_OPTIONS`).

    Args:
        meta: The database's metadata.
        scan: The source as scanned now (for a shard: its range of the scan).
        options: The content options of the build (``BuildOptions.content()``).
        shard: The shard header it must have (``None``: none, a single file's partial build); by default not compared.
    """
    return (meta.version == fmt.version_for(meta.target_kind, meta.split_names) and meta.source.fingerprint == scan.fingerprint()
            and _same_options(meta, options)
            and (shard is ANY_SHARD or meta.shard == shard))


def _same_options(meta: fmt.Metadata, options: dict[str, Any]) -> bool:
    """The content options (:data:`CONTENT_OPTIONS`) a database was built with equal ``options`` (absent = not set)."""
    keys = set(options) | (set(meta.options) & set(CONTENT_OPTIONS))
    return all(meta.options.get(key) == options.get(key) for key in keys)


def stale_reason(path: str | os.PathLike[str], meta: fmt.Metadata, scan: SourceScan, options: dict[str, Any]) -> str:
    """How the database at ``path`` differs from what a build now would make (completes "was built ...")."""
    written = fmt.version_for(meta.target_kind, meta.split_names)
    if meta.version != written:
        return f"in format version {meta.version}; this lightning_lmdb writes version {written}"
    if not _same_options(meta, options):
        return f"with other options ({meta.options} vs {options})"
    full = load_meta(path, arrays=True)
    paths = full.paths.tolist() if full.paths is not None else []
    old, files = set(paths) | {s.path for s in meta.skipped}, {f.relpath: f for f in scan.files}
    kind, classes = full.target_kind, full.classes
    compared = kind == scan.target_kind and not _kinds.target_kind(kind).in_record  # a mask is compared with its file
    stored = full.target_table().tolist() if compared else None
    relabelled = moved = 0
    for index, relpath in enumerate(paths):
        file = files.get(relpath)
        if file is None:
            continue
        relabelled += stored is not None and named(kind, classes, stored[index]) != named(kind, scan.classes, file.target)
        moved += file.split != (full.split_names[full.splits[index]] if full.splits is not None else "")
    added, removed = len(files.keys() - old), len(old - files.keys())
    found = [f"{added} files added", f"{removed} removed", f"{relabelled} relabelled"]
    found += [f"{moved} moved to another split"] if moved else []
    if kind != scan.target_kind:
        found.append(f"its targets are {scan.target_kind}, were {kind}")
    elif (scan.classes, scan.target_names) != (classes, full.target_names):
        values = bool(scan.target_names or full.target_names)  # K named values (regression), not classes
        now, was = (scan.target_names, full.target_names) if values else (scan.classes, classes)
        found.append(f"the {'target names' if values else 'classes'} are now {_few(now)}, were {_few(was)}")
    if not (added or removed or relabelled or moved) and len(found) == 3:
        changed = "size or ETag" if any(f.etag for f in scan.files) else "size or modification time"
        found.append(f"so files were modified (their {changed}) or listed in another order")
    return f"from a source that changed since ({', '.join(found)})"


def _few(names: list[str], most: int = 8) -> str:
    """``names`` as a list, the first ``most`` of a longer one."""
    return repr(names) if len(names) <= most else f"[{', '.join(map(repr, names[:most]))}, ... ({len(names)} in all)]"
