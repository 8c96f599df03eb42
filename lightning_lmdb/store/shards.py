"""Sharded databases: a folder of shard files and a manifest, served as one database.

Layout
------

A sharded database is a **folder**, e.g. ``train.lmdb/``, holding:

* ``shard-00000-of-00004.lmdb`` ... ``shard-00003-of-00004.lmdb``: each a complete database file of
  :mod:`lightning_lmdb.store.format` (version 2) over a contiguous range of the source scan, with a ``shard``
  header field (``index``, ``of``, ``start``, ``stop``, ``scan_files``, ``scan_fingerprint``). Shard ``i``
  covers ``files[start:stop]`` of the scan; the ranges are cut where the estimated **work** is even, not the
  file counts (:func:`cut_ranges` over :func:`lightning_lmdb.build.workcut.file_work`: the source bytes of a
  file kept as it is, its pixel count from the header for one decoded), so every shard takes about the same
  time. The header's ``shard.cut`` names the method (:data:`CUT_METHOD`; no ``cut``: ``"bytes"``, the cut by
  source bytes of builds before it). A shard may hold no record (every file of its range skipped as unreadable). Each
  is built, resumed and renamed into place on its own, like a single-file database (``.partial`` and
  ``.build-lock`` beside it).
* ``manifest.json``, written last, once every shard is complete: UTF-8 JSON (never pickle) with the
  fields of a database header (``format``, ``version``, ``layout: "sharded"``, ``count``, ``storage``,
  ``classes``, ``class_to_idx``, ``checksum``, ``source`` of the whole scan, ``options``, ``skipped``,
  ``created``, ``library_version``, ``build_id``) and ``shards``: per shard its ``file``, record ``count``,
  global ``offset``, ``build_id`` and ``digest`` (the shard's header digest, which covers its targets,
  paths and per-record checksums), and ``cut``: the ``method`` and the ``bounds`` (shard ``i`` covers files
  ``bounds[i]:bounds[i + 1]`` of the scan). Offsets are fixed only here: a skipped file changes its shard's size.
  The manifest is a pure function of the shards (its build id is a digest of theirs), so two processes
  that finish at once write the same file.
* ``build-lock``: the lock under which the manifest is checked and written.

Record ``g`` of the database is record ``g - offset`` of the shard whose range holds it, so a sharded
database serves exactly the samples, in the same order, as one file built from the same folder.
Opening one checks every shard against its manifest entry (count, build id, header digest): reading either
layout, the manifest included, is :mod:`lightning_lmdb.store.database`'s; this module builds (shard ranges, the manifest).

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_lmdb.errors import OptionError
from lightning_lmdb.options import CONTENT_OPTIONS
from lightning_lmdb.store import database
from lightning_lmdb.store import format as fmt
from lightning_lmdb.store.database import (
    LOCK_NAME,
    MANIFEST_NAME,
    build_id,
    database_bytes,
    database_files,
    load_meta,
    open_database,
    parts,
    shard_files,
    shard_name,
)

__all__ = [
    "CUT_METHOD", "FILE_COST_BYTES", "LOCK_NAME", "MANIFEST_NAME", "cut_ranges", "finalize",
    "manifest_lock", "shard_files", "shard_name", "shard_ranges",
    # Reading a database (either layout) lives in lightning_lmdb.store.database; re-exported for callers that predate it
    # (dataset.py, datamodule.py, the tests).
    "build_id", "database_bytes", "database_files", "load_meta", "open_database", "parts",
]

#: What :func:`shard_ranges` counts a file as beyond its bytes (an open, a read, a decoder set up, a record
#: written: about a filesystem block's worth), so a shard of many tiny files is not taken for a light one.
FILE_COST_BYTES = 4096

#: The cut this library makes (recorded in each shard's header and the manifest): ``"work"``, by estimated work
#: (:func:`lightning_lmdb.build.workcut.file_work`). ``"bytes"`` was the cut by source bytes (:func:`shard_ranges`) of
#: earlier builds; a partial build cut another way is restarted, a finished one is kept.
CUT_METHOD = "work"


def shard_ranges(sizes: Sequence[int], shards: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` of the scan each of ``shards`` shards covers, cut where the source bytes are even (the ``"bytes"`` cut).

    The work of a file is taken as its size at scan time (``SourceFile.size``: no file is opened) plus
    :data:`FILE_COST_BYTES`: the cut of builds before :data:`CUT_METHOD`, which builds now use (:func:`cut_ranges`).

    Args:
        sizes: The scan's file sizes, in scan order.
        shards: How many ranges (``1 <= shards <= len(sizes)``).

    Raises:
        ValueError: ``shards`` is not between 1 and the number of files.
    """
    return cut_ranges([max(size, 0) + FILE_COST_BYTES for size in sizes], shards)


def cut_ranges(works: Sequence[int], shards: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` of the scan each of ``shards`` shards covers, cut where the work is even.

    Shard ``k`` ends at the file boundary nearest to ``(k + 1) / shards`` of the total work. The ranges are contiguous,
    in scan order, cover every file, and none is empty. Integer arithmetic only: every task of a job array computes the
    same ranges from the same works.

    Args:
        works: Each file's work (a non-negative integer; negative counts as 0), in scan order.
        shards: How many ranges (``1 <= shards <= len(works)``).

    Raises:
        ValueError: ``shards`` is not between 1 and the number of files.
    """
    count = len(works)
    if not 1 <= shards <= count:
        raise OptionError(f"shards={shards} must be from 1 to the {count} files of the scan.")
    ends = list(itertools.accumulate((max(int(work), 0) for work in works), initial=0))  # ends[j]: work of files[:j]
    cuts = [0]
    for k in range(1, shards):
        goal = k * ends[-1]  # in units of 1/shards: the boundary j wanted has ends[j] * shards nearest to it
        j = bisect.bisect_left(ends, goal, key=lambda end: end * shards)
        if j > 0 and goal - ends[j - 1] * shards <= ends[j] * shards - goal:
            j -= 1
        cuts.append(min(max(j, cuts[-1] + 1), count - (shards - k)))  # at least one file in this shard and in each after it
    cuts.append(count)
    return list(itertools.pairwise(cuts))


def manifest_lock(folder: Path) -> contextlib.AbstractContextManager[None]:
    """The folder's manifest lock, held in a ``with`` block (across processes and, via NFS locks, nodes)."""
    return fmt.file_lock(folder / LOCK_NAME)


def finalize(folder: str | os.PathLike[str]) -> fmt.Metadata:
    """Check that every shard of ``folder`` is there and that they make one build; write the manifest if it is not current.

    Needs no source: everything is read from the shards.

    Returns:
        The finished database's metadata, read back through the manifest (:func:`lightning_lmdb.store.database.load_meta`).

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
            raise fmt.DatabaseError(database.why_incomplete(folder))
        of = counts[0]
        metas, digests = zip(*(database.shard_meta(found[index, of], arrays=True) for index in range(of)), strict=True)
        _check_one_build(folder, list(metas))
        manifest = _manifest(folder, list(metas), list(digests))
        path = folder / MANIFEST_NAME
        data = (json.dumps(manifest, indent=1) + "\n").encode("utf-8")
        if not (path.exists() and path.read_bytes() == data):
            fmt.write_atomically(path, data)
    return database.load_meta(folder)


def _check_one_build(folder: Path, metas: list[fmt.Metadata]) -> None:
    """Raise unless the shards are numbered in order, tile one scan, and share storage, options and classes."""
    first = metas[0]
    stop = 0
    for index, meta in enumerate(metas):
        shard = meta.shard
        name = shard_name(index, len(metas))
        problem = None
        if shard is None or meta.version != fmt.version_for(meta.target_kind, meta.split_names):
            problem = "is not a shard of a sharded build (no shard header)"
        elif (shard.index, shard.of) != (index, len(metas)):
            problem = f"says it is shard {shard.index} of {shard.of}"
        elif first.shard is not None and (shard.scan_fingerprint, shard.scan_files) != (first.shard.scan_fingerprint,
                                                                                          first.shard.scan_files):
            raise fmt.DatabaseError(
                f"{str(folder / name)!r} was built from another scan of the source than shard 0 (files were added, removed or "
                f"modified between their builds). Build the folder again: lightning-lmdb build SOURCE {folder} --shards {len(metas)} "
                "rebuilds the shards that do not match the source now.")
        elif first.shard is not None and shard.cut != first.shard.cut:
            problem = f"was cut by {shard.cut!r}, shard 0 by {first.shard.cut!r} (shards of two builds)"
        elif shard.start != stop:
            problem = f"starts at file {shard.start}, but the shards before it end at {stop}"
        elif (meta.storage, _content(meta), meta.classes, meta.target_kind, meta.target_names, meta.split_names) != (
                first.storage, _content(first), first.classes, first.target_kind, first.target_names, first.split_names):
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
        "version": first.version,
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
        "target_kind": first.target_kind,
        **({"target_names": first.target_names} if first.target_names else {}),
        **({"split_names": first.split_names} if first.split_names else {}),
        "cut": {"method": first.shard.cut, "bounds": [m.shard.start for m in metas if m.shard is not None] + [first.shard.scan_files]},
        "shards": entries,
    }
