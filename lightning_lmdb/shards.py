"""Sharded databases: a folder of shard files and a manifest, served as one database.

Layout
------

A sharded database is a **folder**, e.g. ``train.lmdb/``, holding:

* ``shard-00000-of-00004.lmdb`` ... ``shard-00003-of-00004.lmdb``: each a complete database file of
  :mod:`lightning_lmdb.format` (version 2) over a contiguous range of the source scan, with a ``shard``
  header field (``index``, ``of``, ``start``, ``stop``, ``scan_files``, ``scan_fingerprint``). Shard ``i``
  covers ``files[start:stop]`` of the scan; the ranges are cut where the source bytes (plus a per-file cost)
  are even, not the file counts (:func:`shard_ranges`), so a class of large images does not make one shard
  the whole build's time. A shard may hold no record (every file of its range skipped as unreadable). Each
  is built, resumed and renamed into place on its own, like a single-file database (``.partial`` and
  ``.build-lock`` beside it).
* ``manifest.json``, written last, once every shard is complete: UTF-8 JSON (never pickle) with the
  fields of a database header (``format``, ``version``, ``layout: "sharded"``, ``count``, ``storage``,
  ``classes``, ``class_to_idx``, ``checksum``, ``source`` of the whole scan, ``options``, ``skipped``,
  ``created``, ``library_version``, ``build_id``) and ``shards``: per shard its ``file``, record ``count``,
  global ``offset``, ``build_id`` and ``digest`` (the shard's header digest, which covers its targets,
  paths and per-record checksums). Offsets are fixed only here: a skipped file changes its shard's size.
  The manifest is a pure function of the shards (its build id is a digest of theirs), so two processes
  that finish at once write the same file.
* ``build-lock``: the lock under which the manifest is checked and written.

Record ``g`` of the database is record ``g - offset`` of the shard whose range holds it, so a sharded
database serves exactly the samples, in the same order, as one file built from the same folder.
Opening one checks every shard against its manifest entry (count, build id, header digest).

A folder whose shards are all present but has no manifest yet (a job array whose last task died after its
shard) is completed by the next build: :func:`finalize` checks that every shard is there and that they
belong to one build, and writes the manifest. Readers never write (the folder may be read-only): they
refuse such a folder, saying what to run.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import itertools
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from lightning_lmdb import envs
from lightning_lmdb import format as fmt
from lightning_lmdb.errors import OptionError
from lightning_lmdb.options import CONTENT_OPTIONS

MANIFEST_NAME = "manifest.json"
LOCK_NAME = "build-lock"
_SHARD_RE = re.compile(r"^shard-(\d{5})-of-(\d{5})\.lmdb$")
_SHARD_PREFIX_RE = re.compile(r"^shard-\d{5}-of-\d{5}\.lmdb")


def shard_name(index: int, of: int) -> str:
    """The file name of shard ``index`` of ``of``: ``shard-00002-of-00004.lmdb``."""
    return f"shard-{index:05d}-of-{of:05d}.lmdb"


#: What :func:`shard_ranges` counts a file as beyond its bytes (an open, a read, a decoder set up, a record
#: written: about a filesystem block's worth), so a shard of many tiny files is not taken for a light one.
FILE_COST_BYTES = 4096


def shard_ranges(sizes: Sequence[int], shards: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` of the scan each of ``shards`` shards covers, cut where the work is even.

    The work of a file is its size at scan time (``SourceFile.size``: no file is opened) plus
    :data:`FILE_COST_BYTES`; shard ``k`` ends at the file boundary nearest to ``(k + 1) / shards`` of the total.
    The ranges are contiguous, in scan order, cover every file, and none is empty. Integer arithmetic only:
    every task of a job array computes the same ranges from the same scan.

    Args:
        sizes: The scan's file sizes, in scan order.
        shards: How many ranges (``1 <= shards <= len(sizes)``).

    Raises:
        ValueError: ``shards`` is not between 1 and the number of files.
    """
    count = len(sizes)
    if not 1 <= shards <= count:
        raise OptionError(f"shards={shards} must be from 1 to the {count} files of the scan.")
    ends = list(itertools.accumulate((max(size, 0) + FILE_COST_BYTES for size in sizes), initial=0))  # ends[j]: work of files[:j]
    cuts = [0]
    for k in range(1, shards):
        goal = k * ends[-1]  # in units of 1/shards: the boundary j wanted has ends[j] * shards nearest to it
        j = bisect.bisect_left(ends, goal, key=lambda end: end * shards)
        if j > 0 and goal - ends[j - 1] * shards <= ends[j] * shards - goal:
            j -= 1
        cuts.append(min(max(j, cuts[-1] + 1), count - (shards - k)))  # at least one file in this shard and in each after it
    cuts.append(count)
    return list(itertools.pairwise(cuts))


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


def manifest_lock(folder: Path) -> contextlib.AbstractContextManager[None]:
    """The folder's manifest lock, held in a ``with`` block (across processes and, via NFS locks, nodes)."""
    return fmt.file_lock(folder / LOCK_NAME)


@dataclass(frozen=True)
class Part:
    """One database file of a database and where its records sit in the whole.

    Attributes:
        path: The file.
        offset: Global index of its first record.
        count: Its records.
        build_id: The build id it must have.
        digest: Its header digest as the manifest records it (``None`` for a single file).
    """

    path: str
    offset: int
    count: int
    build_id: str
    digest: str | None = None


@dataclass(frozen=True)
class Manifest:
    """A sharded database's validated manifest: its header fields and its parts (see the module docstring)."""

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


def read_manifest(folder: str | os.PathLike[str]) -> Manifest:
    """Read and check a sharded database's manifest (shards are checked when opened: :func:`load_meta`).

    Raises:
        DatabaseError: No manifest (the shards are not complete yet: the message lists what is missing),
            unreadable JSON, or a field missing or of the wrong type.
    """
    folder = Path(folder)
    path = folder / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise fmt.DatabaseError(_incomplete(folder)) from None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise fmt.DatabaseError(f"{str(path)!r} is not valid JSON ({exc}): delete it and rerun the build to write it again.") from exc
    if not isinstance(obj, dict) or obj.get("format") != fmt.FORMAT_NAME or obj.get("layout") != "sharded":
        raise fmt.DatabaseError(f"{str(path)!r} is not a lightning_lmdb shard manifest. Build one with lightning-lmdb build --shards K.")
    get = fmt.JsonFields(obj, path)
    count = get("count", int)
    parts, offset = [], 0
    for i, entry in enumerate(get("shards", list)):
        item = fmt.JsonFields(entry if isinstance(entry, dict) else get.fail(f"shards[{i}]", "is not an object"), path, f"shards[{i}].")
        name = item("file", str)
        if name != shard_name(i, len(obj["shards"])):
            item.fail("file", f"is {name!r}, not {shard_name(i, len(obj['shards']))!r}")
        if item("offset", int) != offset:
            item.fail("offset", f"is {item('offset', int)}, but the shards before it hold {offset} records")
        parts.append(Part(str(folder / name), offset, item("count", int), item("build_id", str), item("digest", str)))
        offset += parts[-1].count
    if offset != count or not parts:
        get.fail("count", f"is {count}, but its {len(parts)} shards hold {offset} records")
    get("build_id", str)
    return Manifest(obj, parts)


def _incomplete(folder: Path) -> str:
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


def shard_files(folder: Path) -> dict[tuple[int, int], Path]:
    """The finished shard files in ``folder``, by ``(index, of)``."""
    found = {}
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for path in folder.iterdir():
            match = _SHARD_RE.match(path.name)
            if match:
                found[int(match[1]), int(match[2])] = path
    return found


def finalize(folder: str | os.PathLike[str]) -> Manifest:
    """Check that every shard of ``folder`` is there and that they make one build; write the manifest if it is not current.

    Needs no source: everything is read from the shards.

    Raises:
        DatabaseError: A shard is missing (named, with the command that builds it), shards of builds with
            different shard counts, scans or options are mixed, or a shard is damaged.
    """
    folder = Path(folder).absolute()
    with manifest_lock(folder):
        found = shard_files(folder)
        counts = sorted({of for _, of in found})
        if len(counts) > 1:
            raise fmt.DatabaseError(
                f"{str(folder)!r} mixes shards of builds with {' and '.join(map(str, counts))} shards. Remove the shard files of the "
                "build you do not want (or the folder) and build again."
            )
        if not found or len(found) != counts[0]:
            raise fmt.DatabaseError(_incomplete(folder))
        of = counts[0]
        metas, digests = zip(*(_read_shard(found[index, of], arrays=True) for index in range(of)), strict=True)
        _check_one_build(folder, list(metas))
        manifest = _manifest(folder, list(metas), list(digests))
        path = folder / MANIFEST_NAME
        data = (json.dumps(manifest, indent=1) + "\n").encode("utf-8")
        if not (path.exists() and path.read_bytes() == data):
            fmt.write_atomically(path, data)
    return read_manifest(folder)


def _check_one_build(folder: Path, metas: list[fmt.Metadata]) -> None:
    """Raise unless the shards are numbered in order, tile one scan, and share storage, options and classes."""
    first = metas[0]
    stop = 0
    for index, meta in enumerate(metas):
        shard = meta.shard
        name = shard_name(index, len(metas))
        problem = None
        if shard is None or meta.version != fmt.FORMAT_VERSION:
            problem = "is not a shard of a sharded build (no shard header)"
        elif (shard.index, shard.of) != (index, len(metas)):
            problem = f"says it is shard {shard.index} of {shard.of}"
        elif first.shard is not None and (shard.scan_fingerprint, shard.scan_files) != (first.shard.scan_fingerprint,
                                                                                          first.shard.scan_files):
            raise fmt.DatabaseError(
                f"{str(folder / name)!r} was built from another scan of the source than shard 0 (files were added, removed or "
                f"modified between their builds). Build the folder again: lightning-lmdb build SOURCE {folder} --shards {len(metas)} "
                "rebuilds the shards that do not match the source now.")
        elif shard.start != stop:
            problem = f"starts at file {shard.start}, but the shards before it end at {stop}"
        elif (meta.storage, _content(meta), meta.classes) != (first.storage, _content(first), first.classes):
            problem = "was built with other options or classes than shard 0"
        if problem:
            raise fmt.DatabaseError(f"{str(folder / name)!r} {problem}. Rebuild it: lightning-lmdb build SOURCE {folder} "
                                    f"--shard {index}/{len(metas)} (or the whole folder with --shards {len(metas)}).")
        stop = shard.stop
    if first.shard is not None and stop != first.shard.scan_files:
        raise fmt.DatabaseError(f"The shards of {str(folder)!r} cover {stop} of {first.shard.scan_files} files; rebuild the folder.")


def _content(meta: fmt.Metadata) -> dict[str, Any]:
    """The options that shape a shard's records (``on_error`` does not: its shards may differ in it, e.g. after a rerun with skip)."""
    return {key: meta.options.get(key) for key in CONTENT_OPTIONS}


def _manifest(folder: Path, metas: list[fmt.Metadata], digests: list[str | None]) -> dict[str, Any]:
    """The manifest of finished, consistent shards (a pure function of them)."""
    first = metas[0]
    assert first.shard is not None  # _check_one_build
    ids = [m.build_id or "" for m in metas]
    entries, offset = [], 0
    for index, (meta, digest) in enumerate(zip(metas, digests, strict=True)):
        entries.append({"file": shard_name(index, len(metas)), "count": meta.count, "offset": offset, "build_id": ids[index],
                        "digest": digest or ""})
        offset += meta.count
    return {
        "format": fmt.FORMAT_NAME,
        "version": fmt.FORMAT_VERSION,
        "layout": "sharded",
        "count": offset,
        "storage": first.storage,
        "classes": first.classes,
        "class_to_idx": first.class_to_idx,
        "checksum": first.checksum,
        "source": {"root": first.source.root, "num_files": sum(m.source.num_files for m in metas),
                   "bytes": sum(m.source.bytes for m in metas), "fingerprint": first.shard.scan_fingerprint},
        # "skip" when any shard was built (or finished) with it, as one file resumed with on_error="skip" would say
        "options": {**first.options, "on_error": "skip" if any(m.options.get("on_error") == "skip" for m in metas)
                    else first.options.get("on_error", "raise")},
        "skipped": [{"path": s.path, "reason": s.reason} for m in metas for s in m.skipped],
        "created": max(m.created for m in metas),
        "library_version": first.library_version,
        "build_id": hashlib.blake2b("\0".join(ids).encode("ascii"), digest_size=16).hexdigest(),
        "shards": entries,
    }


# --- reading either layout ---------------------------------------------------------------------------


def manifest_of(folder: str | os.PathLike[str]) -> Manifest:
    """The manifest of a sharded folder, as a reader sees it: read only, never written (a build writes it, see :func:`finalize`).

    Raises:
        DatabaseError: As :func:`read_manifest`: no manifest yet names the missing shards, or the build to rerun.
    """
    return read_manifest(folder)


def parts(path: str | os.PathLike[str]) -> list[Part]:
    """The database files of ``path`` (one file, or a sharded folder's shards) and where their records sit.

    Raises:
        FileNotFoundError: Nothing at ``path``.
        DatabaseError: Not a finished, valid database (see :func:`read_manifest` / :func:`lightning_lmdb.envs.open_env`).
    """
    path = Path(path).absolute()
    if is_sharded(path):
        return manifest_of(path).parts
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
        return manifest_of(path).build_id
    with envs.reading(path) as opened:
        return opened.build_id


def _read_shard(path: str | os.PathLike[str], *, arrays: bool) -> tuple[fmt.Metadata, str | None]:
    """A shard file's validated metadata and its header digest."""
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
            return meta, [Part(os.path.abspath(path), 0, meta.count, opened.build_id)]
    path = Path(path).absolute()
    manifest = manifest_of(path)
    metas = []
    for part in manifest.parts:
        if not os.path.exists(part.path):
            raise fmt.DatabaseError(
                f"{part.path!r}, a shard of {str(path)!r}, is missing. Build it again: lightning-lmdb build SOURCE {path} "
                f"--shards {len(manifest.parts)} (it rebuilds only what is missing)."
            )
        meta, digest = _read_shard(part.path, arrays=arrays)
        if (meta.count, meta.build_id, digest) != (part.count, part.build_id, part.digest):
            raise fmt.DatabaseError(
                f"{part.path!r} does not match the manifest of {str(path)!r} (another build of that shard replaced it, or a file is "
                f"damaged). Rebuild the folder with lightning-lmdb build --shards {len(manifest.parts)}."
            )
        metas.append(meta)
    return _joined(path, manifest, metas, arrays), manifest.parts


def _joined(path: Path, manifest: Manifest, metas: list[fmt.Metadata], arrays: bool) -> fmt.Metadata:
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
        shard=None,
    )
    joined.targets.flags.writeable = False
    if arrays:
        tables = [m.paths for m in metas]
        assert all(t is not None for t in tables)
        blob = np.concatenate([t.blob for t in tables])  # type: ignore[union-attr]
        starts = np.cumsum([0] + [len(t.blob) for t in tables[:-1]])  # type: ignore[union-attr]
        offsets = np.concatenate([[0]] + [t.offsets[1:] + s for t, s in zip(tables, starts, strict=True)])  # type: ignore[union-attr]
        joined = replace(joined, paths=fmt.PathTable(blob, offsets.astype(np.int64)),
                         checksums=np.concatenate([m.checksums for m in metas]))  # type: ignore[misc]
    return joined
