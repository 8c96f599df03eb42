"""Scale: metadata size, open time, pickles and per-worker memory of ImageNet-size databases, format 1 vs 2.

Usage:
    python benchmarks/scale.py [--sizes 10000 100000 1281167] [--versions 1 2]
                               [--dir /tmp/lightning_lmdb_scale] [--samples 200000]

A real build at ImageNet size takes too long here, so the databases are **fabricated**: ImageNet-like
paths (1000 classes ``n%08d``, ~1281 files each, ``n01440764/n01440764_10026.JPEG``), targets = class
index, and tiny ``decoded`` records (a 1x1 RGB pixel from :func:`lightning_lmdb.codec.storage.encode_pixels`,
so reading a sample costs microseconds and only the per-record metadata scales). Records go into the
``records`` sub-database with ``append=True``, 100,000 per transaction; the metadata is written as
format 1 (one JSON object with every per-record list inline) or format 2
(:func:`lightning_lmdb.store.format.write_meta`). A file already holding the right version and count is
reused. ``DIR/imagenet_N_vV.lmdb`` is the database of N records in version V.

Every measurement runs in a fresh ``python -c`` subprocess (nothing cached in the measuring process;
the database file itself is in the page cache, as it was just written or read):

* open: seconds of ``LMDBImageDataset(path)`` and its peak RSS growth (``VmHWM`` after, reset just
  before, minus ``VmRSS`` before; MB = 10**6 bytes), torch and ``lightning_lmdb.read.dataset`` imported first;
* pickles: ``len(pickle.dumps(...))`` of the dataset and of its 90 % training view ``ds.split(0.1, 0)[0]``
  (the unpickled view must have the same ``len`` and ``targets``: a warning is printed otherwise);
* fork worker: growth of ``Private_Dirty`` (and ``Pss_Anon``) in ``/proc/self/smaps_rollup`` of a
  forked process reading ``--samples`` random samples of the view its parent created (mapped database
  pages are shared page cache, so RSS would mislead);
* spawn worker: ``Pss_Anon`` of a ``spawn`` process that received the pickled view and read 1,000
  samples, minus that of a ``spawn`` process that only imported torch and ``lightning_lmdb.read.dataset``.

Goals (checked on the 1,281,167-record version 2 row): open < 0.1 s and < 50 MB peak; pickled dataset
and pickled view < 1 MB; fork growth < 10 MiB over 200,000 samples; spawn worker within 20 MiB of the
torch-only worker.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import pickle
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from lightning_lmdb import __version__
from lightning_lmdb.codec.storage import PIXELS, encode_pixels
from lightning_lmdb.store import format as fmt

HERE = str(Path(__file__).resolve().parent)
IMAGENET_TRAIN = 1_281_167
CLASSES = 1000
BATCH = 100_000
MAP_SIZE = 1 << 36  # sparse: the file grows with its pages
SPAWN_SAMPLES = 1000
MIB = 1 << 20
GOALS = {"open_s": 0.1, "open_peak_mb": 50.0, "pickle_bytes": 1_000_000, "fork_mib": 10.0, "spawn_mib": 20.0}


# --- fabricating databases ---------------------------------------------------------------------------


def imagenet_like(count: int, seed: int = 0) -> tuple[list[str], list[str], np.ndarray]:
    """ImageNet-like classes, relative paths and targets of ``count`` images, in ImageFolder (sorted) order.

    Args:
        count: Number of images, spread over 1000 classes as evenly as ImageNet's ~1281 per class.
        seed: Seed of the synset ids and file numbers.

    Returns:
        ``(classes, paths, targets)``: the sorted class names, one path per image, and an ``int32`` target per image.
    """
    rng = np.random.default_rng(seed)
    synsets = np.sort(rng.choice(np.arange(1_000_000, 15_000_000), CLASSES, replace=False))
    classes = [f"n{int(s):08d}" for s in synsets]
    per_class = [count // CLASSES + (1 if c < count % CLASSES else 0) for c in range(CLASSES)]
    paths: list[str] = []
    targets = np.empty(count, dtype=np.int32)
    for index, (name, k) in enumerate(zip(classes, per_class)):
        numbers = rng.choice(60_000, k, replace=False) + 1
        start = len(paths)
        paths.extend(sorted(f"{name}/{name}_{int(n)}.JPEG" for n in numbers))
        targets[start:len(paths)] = index
    return classes, paths, targets


def fabricate(path: Path, version: int, classes: list[str], paths: list[str], targets: np.ndarray) -> None:
    """Write a finished database of ``len(paths)`` 1x1-pixel ``decoded`` records with format ``version`` metadata.

    Written beside ``path`` and renamed onto it once complete, so an interrupted run leaves no half database.
    """
    count = len(paths)
    colours = [encode_pixels(np.array([[[c, c * 7 % 256, c * 13 % 256]]], dtype=np.uint8)) for c in range(256)]
    digests = np.frombuffer(b"".join(fmt.checksum(v) for v in colours), dtype=np.uint8).reshape(256, fmt.CHECKSUM_SIZE)
    checksums = digests[np.arange(count) % 256]
    work = path.with_name(path.name + ".fabricating")
    work.unlink(missing_ok=True)
    env = lmdb.open(str(work), subdir=False, map_size=MAP_SIZE, max_dbs=3, lock=False, readahead=False, meminit=False, sync=False)
    try:
        records = env.open_db(fmt.RECORDS_DB)
        for start in range(0, count, BATCH):
            with env.begin(write=True) as txn:
                items = ((fmt.record_key(i), colours[i % 256]) for i in range(start, min(start + BATCH, count)))
                txn.cursor(db=records).putmulti(items, append=True)
        source = {"root": "/fabricated/imagenet/train", "num_files": count, "bytes": count * 110_000, "fingerprint": f"fabricated-{count}"}
        options = {"storage": "decoded", "max_pixels": 89478485, "on_error": "raise"}
        created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        with env.begin(write=True) as txn:
            if version == 1:
                txn.put(fmt.META_KEY, fmt.dump_json({
                    "format": fmt.FORMAT_NAME, "version": 1, "count": count, "storage": "decoded", "classes": classes,
                    "class_to_idx": {c: i for i, c in enumerate(classes)}, "targets": targets.tolist(), "paths": paths,
                    "checksum": fmt.CHECKSUM_ALGO, "checksums": _hex_rows(digests, count), "source": source, "options": options,
                    "skipped": [], "created": created, "library_version": "0.1.0",
                }))
            else:
                fmt.write_meta(txn, fmt.Metadata(
                    version=2, count=count, storage="decoded", classes=classes, class_to_idx={c: i for i, c in enumerate(classes)},
                    checksum=fmt.CHECKSUM_ALGO, source=fmt.SourceInfo(**source), options=options, skipped=[], created=created,
                    library_version=__version__, build_id=fmt.new_build_id(), targets=targets,
                    codecs=np.full(count, PIXELS, dtype=np.uint8), paths=fmt.PathTable.from_strings(paths), checksums=checksums,
                ))
        env.sync(True)
    finally:
        env.close()
    os.replace(work, path)


def _hex_rows(digests: np.ndarray, count: int) -> list[str]:
    """The format-1 ``checksums`` list: the hex digest of each record (record ``i`` holds colour ``i % 256``)."""
    hexes = [row.tobytes().hex() for row in digests]
    return [hexes[i % 256] for i in range(count)]


def inspect(path: Path) -> dict[str, int] | None:
    """Version, count and metadata sizes of a fabricated database, or ``None`` when there is none usable.

    Reads only the start of the ``meta`` value (a format-1 one is tens of MB of JSON) and the value lengths.
    """
    if not path.is_file():
        return None
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, subdir=False, max_dbs=3)
    except lmdb.Error:
        return None
    try:
        records = env.open_db(fmt.RECORDS_DB, create=False)
        with env.begin(buffers=True) as txn:
            raw = txn.get(fmt.META_KEY)
            if raw is None:
                return None
            prefix = bytes(raw[:200]).decode("ascii", "replace")
            head = '{"format":"lightning_lmdb","version":'
            if not prefix.startswith(head):
                return None
            version_text, count_text = prefix[len(head):].split(',"count":', 1)
            count = int(count_text.split(",", 1)[0])
            arrays = sum(len(txn.get(key) or b"") for key, *_ in fmt.ARRAYS.values())
            info = {"version": int(version_text), "count": count, "header_bytes": len(raw), "meta_bytes": len(raw) + arrays,
                    "records": txn.stat(records)["entries"]}
    except (lmdb.Error, ValueError):
        return None
    finally:
        env.close()
    return info


# --- what the measuring subprocesses run ---------------------------------------------------------------


def _status_kb() -> dict[str, int]:
    with open("/proc/self/status") as handle:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in handle) if k in ("VmHWM", "VmRSS")}


def _smaps_kb() -> dict[str, int]:
    with open("/proc/self/smaps_rollup") as handle:
        fields = dict(line.split(":", 1) for line in handle if ":" in line and not line[0].isdigit() and "[" not in line)
    return {k: int(v.split()[0]) for k, v in fields.items() if k in ("Rss", "Private_Dirty", "Pss_Anon")}


def _emit(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)


def child_open(path: str) -> None:
    """Time ``LMDBImageDataset(path)`` and its peak RSS growth (torch and the dataset module already imported)."""
    import torch  # noqa: F401

    from lightning_lmdb.read.dataset import LMDBImageDataset

    try:  # reset VmHWM to the current RSS (Linux >= 4.0), so the imports' peak does not hide the open's
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass
    before = _status_kb()
    started = time.perf_counter()
    dataset = LMDBImageDataset(path)
    seconds = time.perf_counter() - started
    after = _status_kb()
    _emit({"seconds": seconds, "peak_mb": (after["VmHWM"] - before["VmRSS"]) * 1024 / 1e6, "len": len(dataset)})


def child_pickle(path: str) -> None:
    """Sizes of the pickled dataset and of its pickled 90 % view, and whether the view round-trips."""
    from lightning_lmdb.read.dataset import LMDBImageDataset

    dataset = LMDBImageDataset(path)
    train = dataset.split(0.1, 0)[0]
    size = len(train)
    dataset_bytes, view_pickle = len(pickle.dumps(dataset)), pickle.dumps(train)
    clone = pickle.loads(view_pickle)
    same = len(clone) == size and clone.targets == train.targets
    _emit({"dataset_bytes": dataset_bytes, "view_bytes": len(view_pickle), "view_len": size, "round_trip": bool(same)})


def child_fork(path: str, samples: int) -> None:
    """Private memory a forked worker adds while reading ``samples`` random samples of its parent's 90 % view."""
    from lightning_lmdb.read.dataset import LMDBImageDataset

    view = LMDBImageDataset(path).split(0.1, 0)[0]
    size = len(view)  # the parent computes the view's rows and holds the targets before forking
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        try:
            os.close(read_fd)
            order = np.random.default_rng(0).integers(0, size, samples)
            before = _smaps_kb()
            for i in order:
                view[int(i)]
            after = _smaps_kb()
            result = {key: (after[key] - before[key]) / 1024 for key in ("Private_Dirty", "Pss_Anon", "Rss")}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which prints it
            result = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_fd, json.dumps(result).encode())
        os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    result = json.loads(b"".join(chunks) or b'{"error": "the worker reported nothing"}')
    # Diagnostic: did the parent's view hold its targets at fork time (else each worker reads its own copy)?
    result["parent_view_had_targets"] = getattr(view, "_targets", None) is not None
    _emit(result)


def _spawn_reader(view: Any, samples: int, conn: Any) -> None:
    """Spawn worker: read ``samples`` random samples of the view it received pickled, report its memory."""
    order = np.random.default_rng(0).integers(0, len(view), samples)
    for i in order:
        view[int(i)]
    gc.collect()
    conn.send(_smaps_kb())


def _spawn_baseline(conn: Any) -> None:
    """Spawn worker that only imports torch and ``lightning_lmdb.read.dataset``, report its memory."""
    import torch  # noqa: F401

    import lightning_lmdb.read.dataset  # noqa: F401

    gc.collect()
    conn.send(_smaps_kb())


def child_spawn(path: str, samples: int) -> None:
    """Memory of a spawn worker holding the 90 % view, minus that of a torch-only spawn worker."""
    import multiprocessing

    from lightning_lmdb.read.dataset import LMDBImageDataset

    view = LMDBImageDataset(path).split(0.1, 0)[0]
    context = multiprocessing.get_context("spawn")
    reports = {}
    for name, target, args in (("dataset", _spawn_reader, (view, samples)), ("baseline", _spawn_baseline, ())):
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(target=target, args=(*args, sender))
        process.start()
        sender.close()
        try:
            reports[name] = receiver.recv()
        except EOFError:
            process.join()
            _emit({"error": f"the {name} spawn worker exited with {process.exitcode} before reporting"})
            return
        process.join()
    _emit({
        "Pss_Anon": (reports["dataset"]["Pss_Anon"] - reports["baseline"]["Pss_Anon"]) / 1024,
        "Private_Dirty": (reports["dataset"]["Private_Dirty"] - reports["baseline"]["Private_Dirty"]) / 1024,
        "baseline_Pss_Anon": reports["baseline"]["Pss_Anon"] / 1024,
    })


def run_child(function: str, *args: Any) -> dict[str, Any]:
    """Run ``scale.<function>(*args)`` in a fresh interpreter and return the JSON it printed (or ``{"error": ...}``)."""
    code = f"import sys; sys.path.insert(0, {HERE!r}); import scale; scale.{function}(*{args!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"error": f"{function} failed: {tail}"}
    return json.loads(lines[-1])


# --- the table -----------------------------------------------------------------------------------------


def measure(path: Path, info: dict[str, int], samples: int) -> dict[str, Any]:
    """One row: every measurement of one database, each in its own fresh subprocess."""
    return {
        "N": info["count"],
        "version": info["version"],
        "meta": info,
        "open": run_child("child_open", str(path)),
        "pickle": run_child("child_pickle", str(path)),
        "fork": run_child("child_fork", str(path), samples),
        "spawn": run_child("child_spawn", str(path), SPAWN_SAMPLES),
    }


def _cell(result: dict[str, Any], key: str, spec: str) -> str:
    return "ERROR" if "error" in result else format(result[key], spec)


def _goal(value: str, ok: bool | None) -> str:
    return value if ok is None else f"{value} {'PASS' if ok else 'FAIL'}"


def format_row(row: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The cells of one row, and the goals it fails (checked on the 1,281,167-record version 2 row only)."""
    checked = row["N"] == IMAGENET_TRAIN and row["version"] == 2
    opened, pickles, fork, spawn = row["open"], row["pickle"], row["fork"], row["spawn"]

    def ok(result: dict[str, Any], key: str, limit: float) -> bool | None:
        """``None`` on rows without goals; else whether ``result[key]`` is below ``limit`` (an error fails)."""
        return None if not checked else "error" not in result and abs(result[key]) < limit

    meta = row["meta"]
    meta_text = f"{meta['meta_bytes']:,}" + (f" (header {meta['header_bytes']:,})" if row["version"] >= 2 else "")
    results = {
        "open": ok(opened, "seconds", GOALS["open_s"]),
        "peak": ok(opened, "peak_mb", GOALS["open_peak_mb"]),
        "pickled dataset": ok(pickles, "dataset_bytes", GOALS["pickle_bytes"]),
        "pickled view": ok(pickles, "view_bytes", GOALS["pickle_bytes"]),
        "fork": ok(fork, "Private_Dirty", GOALS["fork_mib"]),
        "spawn": ok(spawn, "Pss_Anon", GOALS["spawn_mib"]),
    }
    fork_text = "ERROR" if "error" in fork else f"{fork['Private_Dirty']:.2f} (Pss_Anon {fork['Pss_Anon']:+.2f})"
    cells = [
        f"{row['N']:,}",
        str(row["version"]),
        meta_text,
        _goal(_cell(opened, "seconds", ".4f"), results["open"]),
        _goal(_cell(opened, "peak_mb", ".1f"), results["peak"]),
        _goal(_cell(pickles, "dataset_bytes", ","), results["pickled dataset"]),
        _goal(_cell(pickles, "view_bytes", ","), results["pickled view"]),
        _goal(fork_text, results["fork"]),
        _goal(_cell(spawn, "Pss_Anon", "+.2f"), results["spawn"]),
    ]
    return cells, [name for name, passed in results.items() if passed is False]


def print_table(rows: list[dict[str, Any]], samples: int) -> list[str]:
    """Print the markdown table; return the goals the 1,281,167-record version 2 row fails."""
    header = [
        "N", "version", "meta bytes (v1: the JSON; v2: header + arrays)", "open in a fresh process (s)", "open peak RSS (+MB)",
        "pickled dataset (bytes)", "pickled 90 % view (bytes)", f"fork worker private-dirty growth after {samples:,} samples (MiB)",
        "spawn worker RSS minus torch-only spawn worker (MiB)",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" for _ in header) + "|")
    failed: list[str] = []
    for row in rows:
        cells, fails = format_row(row)
        failed += fails
        print("| " + " | ".join(cells) + " |")
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, IMAGENET_TRAIN], help="record counts")
    parser.add_argument("--versions", type=int, nargs="+", choices=(1, 2), default=[1, 2], help="format versions")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_scale"), help="where the fabricated databases live")
    parser.add_argument("--samples", type=int, default=200_000, help="samples the forked worker reads")
    args = parser.parse_args()
    command = (f"python benchmarks/scale.py --sizes {' '.join(map(str, args.sizes))} --versions {' '.join(map(str, args.versions))} "
               f"--dir {shlex.quote(str(args.dir))} --samples {args.samples}")
    print(f"command: {command}")
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; lightning_lmdb {__version__}; lmdb {lmdb.__version__}; numpy {np.__version__}", flush=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    walls: dict[int, float] = {}
    for count in args.sizes:
        size_started = time.perf_counter()
        data = None
        for version in args.versions:
            path = args.dir / f"imagenet_{count}_v{version}.lmdb"
            info = inspect(path)
            if info is not None and (info["version"], info["count"], info["records"]) == (version, count, count):
                print(f"reused {path} ({path.stat().st_size / 1e6:.1f} MB)", flush=True)
            else:
                fab_started = time.perf_counter()
                data = data or imagenet_like(count)
                fabricate(path, version, *data)
                info = inspect(path)
                assert info is not None, path
                print(f"fabricated {path} ({path.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - fab_started:.1f} s", flush=True)
            row = measure(path, info, args.samples)
            rows.append(row)
            for part in ("open", "pickle", "fork", "spawn"):
                if "error" in row[part]:
                    print(f"  ERROR N={count:,} v{version} {part}: {row[part]['error']}", flush=True)
            if "error" not in row["fork"] and not row["fork"]["parent_view_had_targets"]:
                print(f"  NOTE N={count:,} v{version}: the parent's 90 % view held no targets when it forked (each worker reads its own)",
                      flush=True)
            if "error" not in row["pickle"] and not row["pickle"]["round_trip"]:
                print(f"  WARNING N={count:,} v{version}: the unpickled 90 % view differs from the original (len or targets)", flush=True)
        del data
        walls[count] = time.perf_counter() - size_started
        print(f"N={count:,}: {walls[count]:.1f} s", flush=True)
    print()
    print(f"command: {command}")
    print()
    failed = print_table(rows, args.samples)
    print()
    print("wall time per size: " + "; ".join(f"N={count:,} {seconds:.1f} s" for count, seconds in walls.items())
          + f"; total {time.perf_counter() - started:.1f} s")
    if any(row["N"] == IMAGENET_TRAIN and row["version"] == 2 for row in rows):
        goals = (f"open < {GOALS['open_s']} s and < {GOALS['open_peak_mb']:.0f} MB; pickles < 1 MB; fork < {GOALS['fork_mib']:.0f} MiB; "
                 f"spawn within {GOALS['spawn_mib']:.0f} MiB")
        print(f"goals (N={IMAGENET_TRAIN:,} v2: {goals}): " + ("PASS" if not failed else "FAIL: " + ", ".join(failed)))


if __name__ == "__main__":
    main()
