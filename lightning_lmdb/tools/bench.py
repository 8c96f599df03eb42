"""Read benchmark: raw files against the LMDB file, cold and warm page cache, in one process.

Three storages are read in the same shuffled order (a seeded permutation of every record, as a
training epoch with ``shuffle=True`` does):

* ``raw``: ``open`` + ``read`` of each source file (what ``ImageFolder`` pays per sample);
* ``lmdb readahead=on``: ``txn.get`` from the database opened with ``readahead=True`` (our default);
* ``lmdb readahead=off``: the same with ``readahead=False``, the flag most recipes copy.

each in two regimes:

* ``cold``: right before the pass every environment is closed and the source files and the database
  are evicted from the page cache (:mod:`lightning_lmdb.tools.pagecache`); the eviction is then measured with
  ``mincore`` and a warning is printed if pages survived. Inodes and directory entries stay cached
  (see :mod:`lightning_lmdb.tools.pagecache`), which flatters raw files.
* ``warm``: a second pass right after the cold one, everything cached.

With ``latency_ms`` every storage is read through a latency mount (:mod:`lightning_lmdb.tools.netfs`, emulated
network storage: each lookup, open and read is a round trip); a cold pass then also starts from a fresh
mount, as a fresh client would, and a warm one still pays each file's lookup and open.

Each repetition runs every storage once, cold then warm, and rotates the storage order so no storage
always goes first or last; the reported time is the median over repetitions. Opening the database
(which reads its metadata) is not timed: a loader does it once per process, not per sample.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import statistics
import tempfile
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from lightning_lmdb.codec.decoders import check_decoder, decode
from lightning_lmdb.codec.storage import decode_record
from lightning_lmdb.errors import OptionError
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.store import database, envs
from lightning_lmdb.store import format as fmt
from lightning_lmdb.tools.pagecache import evict, resident_fraction

#: (name, readahead) of the storages measured; ``None`` means raw files.
STORAGES: tuple[tuple[str, bool | None], ...] = (("raw", None), ("lmdb readahead=on", True), ("lmdb readahead=off", False))
REGIMES = ("cold", "warm")
#: Eviction counts as failed when more than this fraction of a file stays cached.
EVICTED_MAX = 0.05
_RESIDENT_SAMPLE = 64


def run_read_benchmark(
    source: str | os.PathLike[str],
    target: str | os.PathLike[str],
    *,
    passes: int = 2,
    limit: int | None = None,
    workers: int | None = None,
    decode: bool = False,
    seed: int = 0,
    decoder: str = "pil",
    latency_ms: float | None = None,
    out: Callable[[str], Any] = print,
) -> list[dict[str, Any]]:
    """Measure shuffled reads of raw files and of the LMDB file, cold and warm, and print a table.

    Args:
        source: The image folder.
        target: The database built from it; built first (quietly) if missing or stale. An existing
            database keeps its storage.
        passes: Repetitions of the whole schedule; each row reports the median.
        limit: Read only the first ``limit`` records of the shuffled order (``None``: all).
        workers: Build processes, if a build is needed (``None``: one per core). Reads are measured
            in this one process.
        decode: Also decode every sample to an RGB image (raw files and records through the same
            decoder), the realistic per-sample cost.
        seed: Seed of the shuffled order.
        decoder: With ``decode``: ``"pil"`` (``ImageFolder``'s), ``"torchcodec"``, ``"opencv"`` or ``"auto"``.
        latency_ms: Read through a latency mount adding this per request (``None``: straight from the disk).
        out: Where the table and warnings go (``print`` by default).

    Returns:
        One dict per (storage, regime), with ``storage``, ``regime``, ``samples``, ``seconds``
        (median), ``samples_per_s``, ``mb_per_s``, ``vs_raw`` (samples/s over raw files' in the same
        regime), ``resident_before`` (for cold rows: the largest page-cache fraction measured after
        eviction, else ``None``), ``evicted`` (``True``/``False`` for cold rows) and ``pass_seconds``.

    Raises:
        ValueError: ``passes`` < 1 or ``limit`` < 1.
        FileNotFoundError: Missing source, or a source file listed in the database is gone.
    """
    from lightning_lmdb.build.writer import build_lmdb

    if passes < 1:
        raise OptionError(f"passes={passes} must be >= 1.")
    check_decoder(decoder)
    if limit is not None and limit < 1:
        raise OptionError(f"limit={limit} must be >= 1 (or None for every record).")
    source_root = Path(source).expanduser().resolve()
    target = Path(target).expanduser().absolute()
    storage, shard_count = _existing_layout(target)
    build_lmdb(source_root, target, storage=storage, workers=workers, progress=False, shards=shard_count)
    meta = database.load_meta(target, arrays=True)
    db_files = [str(f) for f in database.database_files(target)]
    storage = meta.storage
    order = list(range(meta.count))
    random.Random(seed).shuffle(order)
    order = order[:limit]
    raw_paths = [str(source_root / p) for p in meta.paths.tolist()]  # type: ignore[union-attr]  # arrays=True
    files = [raw_paths[i] for i in order]
    sample = random.Random(seed + 1).sample(raw_paths, min(_RESIDENT_SAMPLE, len(raw_paths)))

    times: dict[tuple[str, str], list[float]] = {(name, regime): [] for name, _ in STORAGES for regime in REGIMES}
    nbytes: dict[str, int] = {}
    resident: dict[str, list[float]] = {name: [] for name, _ in STORAGES}
    for rep in range(passes):
        shift = rep % len(STORAGES)
        for name, readahead in STORAGES[shift:] + STORAGES[:shift]:
            evict([*raw_paths, *db_files], sync=rep == 0)
            fractions = {"lmdb": max(resident_fraction(f) for f in db_files), "raw": max(resident_fraction(p) for p in sample)}
            worst = fractions["raw"] if readahead is None else fractions["lmdb"]
            resident[name].append(worst)
            if worst > EVICTED_MAX:
                out(
                    f"warning: eviction failed before the cold {name} pass: {worst:.0%} of "
                    f"{'a sampled source file' if readahead is None else target.name} still cached "
                    "(tmpfs or a filesystem ignoring fadvise, or another process maps it); its cold numbers are warm."
                )
            with _served(source_root, target, files, readahead is None, latency_ms) as (served_files, served_target):
                for regime in REGIMES:
                    seconds, size = _pass(name, readahead, served_files, served_target, order, meta.codecs, decoder if decode else None)
                    times[name, regime].append(seconds)
                    nbytes[name] = size

    rows = []
    for regime in REGIMES:
        raw_rate = None
        for name, _ in STORAGES:
            seconds = statistics.median(times[name, regime])
            rate = len(order) / seconds
            raw_rate = rate if raw_rate is None else raw_rate
            rows.append({
                "storage": name,
                "regime": regime,
                "samples": len(order),
                "seconds": seconds,
                "samples_per_s": rate,
                "mb_per_s": nbytes[name] / seconds / 1e6,
                "vs_raw": rate / raw_rate,
                "resident_before": max(resident[name]) if regime == "cold" else None,
                "evicted": max(resident[name]) <= EVICTED_MAX if regime == "cold" else None,
                "pass_seconds": times[name, regime],
            })
    _print_table(rows, out, meta=meta, target=target, passes=passes, decode=decoder if decode else None, storage=storage,
                 latency_ms=latency_ms)
    return rows


@contextlib.contextmanager
def _served(source: Path, target: Path, files: list[str], raw: bool, latency_ms: float | None) -> Iterator[tuple[list[str], Path]]:
    """``(files, target)`` as a pass reads them: as they are, or through a fresh latency mount of their folder."""
    if latency_ms is None:
        yield files, target
        return
    from lightning_lmdb.tools import netfs

    where = Path(tempfile.mkdtemp(prefix="lightning-lmdb-bench-"))
    try:
        with netfs.mount(source if raw else target.parent, where / "mnt", latency_ms=latency_ms) as mounted:
            if raw:
                yield [str(mounted.through(f)) for f in files], target
            else:
                yield files, mounted.path / target.name
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _existing_layout(target: Path) -> tuple[str, int | None]:
    """The storage and shard count of an existing finished database at ``target`` (so it is not rebuilt), else the default's one file."""
    try:
        storage = database.load_meta(target).storage
    except (FileNotFoundError, fmt.DatabaseError):
        return BuildOptions.storage, None
    return storage, len(database.database_files(target)) if database.is_sharded(target) else None


def _pass(
    name: str, readahead: bool | None, files: Sequence[str], target: Path, order: Sequence[int], codecs: np.ndarray, decoder: str | None
) -> tuple[float, int]:
    """One timed pass over the samples; returns (seconds, bytes read)."""
    total = 0
    if readahead is None:
        started = time.perf_counter()
        for path in files:
            with open(path, "rb") as f:
                data = f.read()
            total += len(data)
            if decoder is not None:
                decode(data, decoder, name=path)
        return time.perf_counter() - started, total
    parts = database.parts(target)  # one file, or the shards of a sharded folder
    starts = [part.offset for part in parts]
    opened = []
    try:
        for part in parts:
            envs.close(part.path)  # a private environment, to choose readahead (py-lmdb allows one per file per process)
            env = envs.open_env(part.path, readahead=readahead, validate_meta=False)  # checked by the caller
            opened.append((env, env.open_db(fmt.RECORDS_DB, create=False)))
        txns = [env.begin(db=records) for env, records in opened]
        started = time.perf_counter()
        for index in order:
            at = bisect_right(starts, index) - 1
            key = fmt.record_key(index - starts[at])
            value = txns[at].get(key)  # a bytes copy out of the map
            if value is None:
                raise fmt.DatabaseError(f"{parts[at].path!r} has no record {key.decode()}: the database is damaged; rebuild it.")
            total += len(value)
            if decoder is not None:
                decode_record(value, int(codecs[index]), name=f"{target.name}[{index}]", decoder=decoder)
        seconds = time.perf_counter() - started
        for txn in txns:
            txn.abort()
    except lmdb.Error as exc:
        raise fmt.DatabaseError(f"Reading {str(target)!r} failed ({exc}): rebuild it.") from exc
    finally:
        for env, _ in opened:
            env.close()  # before the next eviction: mapped pages cannot be evicted
    return seconds, total


def _print_table(
    rows: list[dict[str, Any]], out: Callable[[str], Any], *, meta: fmt.Metadata, target: Path, passes: int, decode: str | None,
    storage: str, latency_ms: float | None = None,
) -> None:
    src_mb = meta.source.bytes / 1e6
    db_mb = database.database_bytes(target) / 1e6
    work = f"read + decode to RGB ({decode})" if decode else "read bytes"
    ra_kb = _read_ahead_kb(database.database_files(target)[0])
    out(
        f"{rows[0]['samples']} of {meta.count} records, shuffled; {work}; {storage} storage; "
        f"source {src_mb:.1f} MB, database {db_mb:.1f} MB; median of {passes} pass(es); "
        f"device read_ahead_kb={'?' if ra_kb is None else ra_kb}"
        + (f"; through a latency mount, {latency_ms:g} ms per request (cold: a fresh mount)" if latency_ms is not None else "")
    )
    out(f"{'storage':<19} {'regime':<5} {'samples/s':>10} {'MB/s':>8} {'vs raw':>7} {'cached':>7}")
    for r in rows:
        cached = f"{r['resident_before']:.0%}" if r["resident_before"] is not None else "-"
        out(f"{r['storage']:<19} {r['regime']:<5} {r['samples_per_s']:10.0f} {r['mb_per_s']:8.1f} {r['vs_raw']:6.2f}x {cached:>7}")
    out("cached: page-cache fraction measured right after eviction, before the cold pass (worst over passes).")


def _read_ahead_kb(path: Path) -> int | None:
    """The kernel readahead window of the block device holding ``path`` (it sets what readahead=on gains)."""
    dev = os.stat(path).st_dev
    block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for queue in (block / "queue", block.resolve().parent / "queue"):  # a disk, or a partition of one
        try:
            return int((queue / "read_ahead_kb").read_text())
        except (OSError, ValueError):
            continue
    return None
