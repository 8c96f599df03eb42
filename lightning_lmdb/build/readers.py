"""The builder's readers: a pool of processes that read, fully decode and checksum source files.

Every file a build stores is validated here first (decoded fully, or as ``validate=`` says for a file kept as its bytes:
:func:`lightning_lmdb.codec.storage.encode_record`), either in
this process (``workers=0``) or in a pool of reader processes; :func:`find_bad_files` runs the same
reads without building anything. The pool is sized by :func:`available_cores` unless told otherwise.

A dataset source (:mod:`lightning_lmdb.sources.dataset`) is read the same way, sample by sample
(:func:`lightning_lmdb.sources.dataset.read_sample`): the dataset reaches each reader process once, through the
pool's initializer (inherited with the ``fork`` start method, pickled once per reader otherwise).

A source with segmentation masks (:class:`lightning_lmdb.sources.masks.MaskScan`) is read a pair at a time: the image as any image,
then its mask (:func:`lightning_lmdb.sources.masks.read_mask`, the image's size), packed in one record
(:func:`lightning_lmdb.sources.masks.pack`); the record's target (its progress entry's end) is the classes the mask holds. On object
storage a chunk's images and masks are fetched together (:func:`_fetched`), each ``If-Match`` the ETag its listing gave.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import itertools
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from lightning_lmdb.codec.decoders import decode_pil
from lightning_lmdb.codec.storage import DEFAULT_MAX_PIXELS, ImageDecodeError, encode_record, storage_mode
from lightning_lmdb.errors import RemoteError, RemoteNotFoundError, SourceError
from lightning_lmdb.remote import fastget, objects
from lightning_lmdb.remote import fs as remote_fs
from lightning_lmdb.remote.urls import is_remote, redact
from lightning_lmdb.sources import dataset as datasource
from lightning_lmdb.sources import masks
from lightning_lmdb.sources.base import NotRegularFileError, SourceFile, SourceScan, read_file
from lightning_lmdb.store import format as fmt


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask where the OS has one), else all of them."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def available_cores() -> int:
    """How many CPU cores this process may run on (see :func:`usable_cpus`)."""
    return len(usable_cpus())


#: Reader processes per core when the files are objects of object storage: a reader waits on the network part of the
#: time. Measured (10,000 JPEGs, 20 ms per request, benchmarks/RESULTS.md "Object storage"): with the server side on a
#: core of its own, 4 readers on the other reached 0.60x the local build, 2 readers 0.43x; on 2 shared cores, 8 readers
#: 0.51x, 4 readers 0.45x.
REMOTE_READERS_PER_CORE = 4


def default_readers(scan: SourceScan) -> int:
    """The readers of a build given no ``workers``: one per available core, :data:`REMOTE_READERS_PER_CORE` per core when
    its files are objects (``s3://``)."""
    remote = is_remote(str(scan.root)) or bool(scan.files) and is_remote(scan.files[0].path)
    return available_cores() * (REMOTE_READERS_PER_CORE if remote else 1)


#: One file to read: (index, path, storage or "check", max_pixels, resize, quality[, validate[, etag]]); for a dataset source, the
#: sample's index as text in place of the path; for an image with a mask, then (mask path, ignore_index, num_classes or None).
#: An object of object storage (its path a URL) carries the ETag its listing gave (fetched only while it still has it); a pair with
#: an object then carries (image ETag, mask ETag), each ``""`` for a local file or an object the listing did not find; a local
#: file's task is as it always was.
_Task = tuple[Any, ...]
#: The dataset a reader process reads samples of (set by :func:`_start_reader`; ``None`` when it reads files).
_dataset: Any = None


def sample_source(scan: SourceScan) -> tuple[Any | None, Callable[[SourceFile], str]]:
    """What the readers read for ``scan``: ``(None, file -> path)`` for files, ``(dataset, file -> index as text)`` for a dataset."""
    dataset = datasource.dataset_of(scan)
    return (None, _path_of) if dataset is None else (dataset, _relpath_of)


def tasks_of(scan: SourceScan, storage: str, max_pixels: int | None, resize: int | None = None, quality: int = 0,
             start: int = 0, validate: str = "full") -> list[_Task]:
    """The readers' tasks for ``scan.files[start:]``: each file (or a dataset's sample) with what to make of it (``storage``, or
    ``"check"``: decode only), and its mask with how to read it for a :class:`~lightning_lmdb.sources.masks.MaskScan`.

    ``validate`` (:func:`lightning_lmdb.codec.storage.encode_record`) reaches a file's task as its 7th item; a dataset's samples
    and images with masks are validated fully."""
    dataset, key = sample_source(scan)
    head = (storage, max_pixels, resize, quality)
    if not isinstance(scan, masks.MaskScan):
        tail = (validate,) if dataset is None else ()
        files = scan.files
        return [(i, key(files[i]), *head, *tail, files[i].etag) if dataset is None and files[i].etag else (i, key(files[i]), *head, *tail)
                for i in range(start, len(files))]
    limit = len(scan.classes) if scan.classes else scan.num_classes
    return [(i, f.path, *head, f.mask, scan.ignore_index, limit, *((f.etag, f.mask_etag) if f.etag or f.mask_etag else ()))
            for i, f in enumerate(scan.files[start:], start)]


def record_targets(scan: SourceScan) -> datasource.RecordTargets | masks.MaskTargets:
    """The checker of the targets that come with the records of a ``targets_from_records`` scan (a dataset's, or masks')."""
    return masks.MaskTargets.of(scan) if isinstance(scan, masks.MaskScan) else datasource.RecordTargets.of(scan)


def _path_of(file: SourceFile) -> str:
    return file.path


def _relpath_of(file: SourceFile) -> str:
    return file.relpath


def _read_one(task: _Task, data: bytes | None = None, mask_data: bytes | None = None) -> tuple[int, bytes | None, Any]:
    """Read, fully decode and checksum one file (runs in a pool worker); ``data``: its bytes, fetched already (``mask_data``: its
    mask's, for an image with a mask).

    Returns:
        ``(index, value, entry)`` (``entry``: :func:`lightning_lmdb.store.format.progress_entry`, the digest and the
        record codec), or ``(index, None, reason)`` for a bad file.

    Raises:
        RemoteError: An object that changed since the scan listed it (:class:`~lightning_lmdb.errors.RemoteChangedError`), or
            object storage that failed (access, connection): the build stops there, naming it, never skips it.
    """
    index, path, storage, max_pixels, resize, quality = task[:6]
    if data is None:
        try:
            etag = _etag_of(task)
            data = read_file(path) if etag is None else read_file(path, etag)
        except NotRegularFileError as exc:
            return index, None, exc.reason
        except RemoteNotFoundError as exc:
            if _etag_of(task):  # listed by the scan, gone since: a change, not a bad file
                raise
            return index, None, f"cannot read the object: {exc}"
        except RemoteError:
            raise
        except OSError as exc:
            return index, None, _unreadable(exc, path, "the file")
    if len(task) > 8:
        return _read_pair(task, data, mask_data)
    try:
        if storage == "check":  # validation only (find_bad_files)
            encode_record(data, "encoded", max_pixels=max_pixels, name=path)
            return index, b"", b""
        codec, value = encode_record(data, storage, max_pixels=max_pixels, name=path, resize=resize, quality=quality,
                                     validate=task[6] if len(task) > 6 else "full")
    except ImageDecodeError as exc:
        return index, None, exc.reason
    return index, value, fmt.progress_entry(value, codec)


def _etag_of(task: _Task) -> str | None:
    """The ETag an object's task carries (:func:`tasks_of`; an image with a mask: the image's, ``""`` when it has none), else
    ``None``."""
    return task[7] if len(task) == 8 else task[9] if len(task) == _PAIR_WITH_ETAGS else None


def _mask_etag_of(task: _Task) -> str | None:
    """The ETag of the mask of an image with a mask whose task carries ETags (:func:`tasks_of`; ``""`` when none), else ``None``."""
    return task[10] if len(task) == _PAIR_WITH_ETAGS else None


#: The length of the task of an image with a mask that carries ETags (:func:`tasks_of`).
_PAIR_WITH_ETAGS = 11


def _fetched(chunk: list[_Task]) -> Iterator[tuple[bytes | None, bytes | None]]:
    """The bytes of the chunk's objects of object storage, per task ``(image, mask)``, in order, each task's as soon as they
    arrived: all are requested at once (:func:`lightning_lmdb.remote.objects.read_each`,
    :data:`lightning_lmdb.remote.objects.FETCH_CONCURRENCY` in flight), so the reader decodes the first while the rest arrive
    and a build is not bound by each request's latency. ``None`` for a local file, an image without a mask's mask, a mask
    object its listing did not find, and an object whose fetch failed: :func:`_read_one` reads each of those itself (and
    names the one that fails)."""
    wanted: list[tuple[int, int, str, str | None]] = []  # (task, 0 image / 1 mask, url, etag)
    for k, task in enumerate(chunk):
        if len(task) == _PAIR_WITH_ETAGS:  # an image with a mask: each object the listing found
            wanted += [(k, which, task[at], task[tag]) for which, at, tag in ((0, 1, 9), (1, 6, 10)) if task[tag] and is_remote(task[at])]
        elif len(task) > 1 and is_remote(task[1]) and len(task) <= 8:
            wanted.append((k, 0, task[1], _etag_of(task)))
    if len(wanted) < 2:
        yield from [(None, None)] * len(chunk)
        return
    arriving = objects.read_each([(url, etag, None, None) for _, _, url, etag in wanted], concurrency=objects.FETCH_CONCURRENCY)
    position = 0
    for k in range(len(chunk)):
        pair: list[bytes | None] = [None, None]
        while position < len(wanted) and wanted[position][0] == k:
            data = next(arriving)
            pair[wanted[position][1]] = None if isinstance(data, BaseException) else data
            position += 1
        yield pair[0], pair[1]


def _unreadable(exc: OSError, path: str, what: str) -> str:
    """Why ``what`` (the file at ``path``) cannot be read: missing, not permitted (then: check its permissions), or the OS error."""
    if exc.errno == errno.ENOENT:
        broken = " (a symbolic link to a missing file)" if os.path.islink(path) else ""
        return f"cannot read {what}: no such file{broken}."
    hint = " Check its permissions." if exc.errno in (errno.EACCES, errno.EPERM) else ""
    return f"cannot read {what} ({exc.strerror or exc}).{hint}"


def _read_pair(task: _Task, data: bytes, mask_data: bytes | None = None) -> tuple[int, bytes | None, Any]:
    """:func:`_read_one` of an image with a mask (``data``: the image file's bytes; ``mask_data``: the mask's, fetched already, else
    ``None``): the record :func:`lightning_lmdb.sources.masks.pack` makes of both, its entry
    :func:`lightning_lmdb.store.format.record_entry` with the classes the mask holds (with ``"check"``: ``b""`` and those classes);
    or ``(index, None, reason)``, the reason naming the mask when it is the mask that is bad.

    Raises:
        RemoteError: A mask object that changed since the scan listed it (:class:`~lightning_lmdb.errors.RemoteChangedError`, naming
            it), or object storage that failed: the build stops there, as for an image.
    """
    index, path, storage, max_pixels, resize, quality, mask_path, ignore_index, num_classes = task[:9]
    try:
        image = decode_pil(data, max_pixels=max_pixels, name=path)
        codec, value = storage_mode(storage).encode(data, image, resize, quality) if storage != "check" else (0, b"")
    except ImageDecodeError as exc:
        return index, None, exc.reason
    try:
        if mask_data is None:
            mask_etag = _mask_etag_of(task)
            mask_data = read_file(mask_path) if mask_etag is None else read_file(mask_path, mask_etag)
        values = masks.resize_mask(masks.read_mask(mask_data, mask_path, size=image.size), resize)
    except RemoteNotFoundError as exc:
        if _mask_etag_of(task):  # listed by the scan, gone since: a change, not a bad sample
            raise
        return index, None, f"cannot read its mask: {exc}"
    except RemoteError:
        raise
    except NotRegularFileError as exc:
        return index, None, f"its mask {mask_path!r} {exc.reason}"
    except OSError as exc:
        return index, None, _unreadable(exc, mask_path, f"its mask {mask_path!r}")
    except ImageDecodeError as exc:
        return index, None, f"its mask {_shown(mask_path)!r}: {exc.reason}"
    labels = masks.labels_present(values, ignore_index)
    problem = masks.misfit(labels, num_classes, ignore_index)
    if problem is not None:
        return index, None, f"its mask {_shown(mask_path)!r} {problem}"
    if storage == "check":
        return index, b"", labels
    record = masks.pack(value, masks.encode_mask(values))
    return index, record, fmt.record_entry(record, codec, labels)


def _shown(path: str) -> str:
    """A file's path as a reason names it: as it is, or an object's URL redacted."""
    return redact(path) if is_remote(path) else path


def read_sample(dataset: Any, task: _Task) -> tuple[int, bytes | None, Any]:
    """:func:`lightning_lmdb.sources.dataset.read_sample` as :func:`_read_one` answers: ``(index, value, entry)`` (``entry``:
    :func:`lightning_lmdb.store.format.record_entry`, the progress entry with the target; with ``"check"``: ``b""`` and the
    plain target), or ``(index, None, reason)`` for a bad sample."""
    index, value, codec, found = datasource.read_sample(dataset, task)  # type: ignore[arg-type]
    if value is None or codec is None:
        return index, value, found
    return index, value, fmt.record_entry(value, codec, found)


def _read_sample(task: _Task) -> tuple[int, bytes | None, Any]:
    """:func:`read_sample` of this reader process's dataset (runs in a pool worker)."""
    return read_sample(_dataset, task)


def find_bad_files(scan: SourceScan, *, max_pixels: int | None = DEFAULT_MAX_PIXELS, workers: int | None = None) -> list[fmt.Skipped]:
    """The files of ``scan`` a build with ``on_error="skip"`` would leave out, each with the reason.

    Reads and decodes every file exactly as the builder does (same checks, same process pool), so the
    raw backend of an A/B can serve the samples a database would hold without building one.

    Args:
        scan: The scanned source folder.
        max_pixels: The builder's decompression-bomb limit.
        workers: Reader processes (``None``: one per core; ``0``: in this process).
    """
    if isinstance(scan, masks.MaskScan):
        return read_mask_targets(scan, max_pixels=max_pixels, workers=workers)[1]
    bad = [fmt.Skipped(path, reason) for path, reason in scan.special]
    dataset, _ = sample_source(scan)
    with _read_files(tasks_of(scan, "check", max_pixels), available_cores() if workers is None else workers, dataset) as results:
        bad += [fmt.Skipped(scan.files[i].relpath, reason) for i, value, reason in results if value is None]
    return bad


def read_mask_targets(scan: masks.MaskScan, *, max_pixels: int | None = DEFAULT_MAX_PIXELS, workers: int | None = None
                      ) -> tuple[datasource.FoundTargets, list[fmt.Skipped]]:
    """Read every image and mask of ``scan`` as a build does (same checks, same process pool), storing nothing.

    Returns:
        The targets a build with ``on_error="skip"`` makes (kind ``"mask"``, its classes, per kept file in scan order the class
        ids its mask holds), and the files it leaves out, with the reason (as :func:`find_bad_files`).
    """
    bad = [fmt.Skipped(path, reason) for path, reason in scan.special]
    raws = []
    with _read_files(tasks_of(scan, "check", max_pixels), available_cores() if workers is None else workers) as results:
        for i, value, entry in results:
            if value is None:
                bad.append(fmt.Skipped(scan.files[i].relpath, entry))
            else:
                raws.append(entry)
    return record_targets(scan).finish(raws), bad


def _start_reader(dataset: Any = None, shared: str | None = None, storage: dict[str, dict[str, Any]] | None = None) -> None:
    """A reader process's start: SIGTERM's default action (the pool's terminate must end it), the palette warning off,
    the dataset it reads samples of (``None``: it reads files), the folder its chunks' records cross through
    (:func:`_handed`; ``None``: through the pipe), and its parent's object-storage options
    (:func:`lightning_lmdb.remote.fs.registered`: in memory, through the pool's initializer, never on disk).

    A forked reader inherits its parent's Python SIGTERM handler -- Lightning's, which only sets a flag, or a latency
    mount's -- and a pool that stops early (a bad file, Ctrl-C) would then wait forever for readers that do not end.
    """
    global _dataset, _shared
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _ignore_palette_warning()
    keep_freed_memory()
    _dataset, _shared = dataset, shared
    remote_fs.adopt(storage)
    fastget.allow()  # a reader forks nothing: its GETs may go through obstore


#: ``mallopt`` settings of :func:`keep_freed_memory`: ``M_MMAP_THRESHOLD`` (glibc's largest), ``M_TRIM_THRESHOLD``, ``M_TOP_PAD``.
_MALLOPT = ((-3, 32 << 20), (-1, 256 << 20), (-2, 64 << 20))


def keep_freed_memory() -> bool:
    """Have glibc's ``malloc`` keep the memory a build frees for its next allocations, in this process (Linux only).

    A build allocates and frees the same large buffers over and over: a chunk of records (megabytes), each record's bytes,
    LMDB's dirty pages. By default glibc returns a freed chunk of a few megabytes to the kernel (``munmap``, or a trim of the
    heap's top) and the next one faults in and zeroes fresh pages: 0.04-0.07 ms of kernel time per 62 KB JPEG, a fifth of all
    a build spends beyond the decode. Called in every reader process and by the CLI; never in a process of the caller's own
    (``build_lmdb`` in a training script), whose allocator settings are its own.

    Returns:
        Whether the settings took (``False`` off glibc).
    """
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(option, value) == 1 for option, value in _MALLOPT)


def _ignore_palette_warning() -> None:
    """Silence Pillow's "Palette images with Transparency expressed in bytes" warning in this process's filters.

    ``convert("RGB")`` (ImageFolder's decode, which the builder checks every file with) gives such a palette
    image its palette colours, the pixels ImageFolder sees: the warning names nothing wrong with the file,
    yet it was printed into the progress bar once per reader process. Added once per reader process (a pool
    initializer), or once per read in this process (:func:`_read_files`), never per image.
    """
    warnings.filterwarnings("ignore", message="Palette images with Transparency expressed in bytes", category=UserWarning)


#: The most tasks in one chunk a reader process reads and sends back at once (a chunk crosses the pipe as one message).
CHUNK_FILES = 64
#: The most bytes one chunk's records are expected to hold: the source bytes of its files, times :data:`GROWTH` for a storage
#: that decodes. A file larger than that is a chunk alone, so what crosses the pipe at once (and waits in the writer's queue)
#: stays near this bound however large the images, not 64 decoded wallpapers of 100 MB each.
CHUNK_BYTES = 16 << 20
#: How much larger than its file a record is expected to be when the storage is not ``"encoded"`` (JPEG pixels: ~10x).
GROWTH = 12


def chunks_of(tasks: list[_Task], sizes: list[int] | None, workers: int, growth: int = 1) -> list[list[_Task]]:
    """``tasks`` cut, in order, into chunks of at most :data:`CHUNK_FILES` tasks and about :data:`CHUNK_BYTES` expected bytes.

    Args:
        tasks: The readers' tasks.
        sizes: Each task's file size (``None``: unknown, e.g. a dataset's samples: cut by count alone).
        workers: Reader processes: chunks are also at most a quarter of each one's share, so they all stay busy to the end.
        growth: How much larger than its file a record is expected to be.
    """
    most = max(1, min(CHUNK_FILES, len(tasks) // (4 * max(1, workers))))
    chunks: list[list[_Task]] = []
    chunk: list[_Task] = []
    held = 0
    for k, task in enumerate(tasks):
        size = 0 if sizes is None else sizes[k] * growth
        if chunk and (len(chunk) >= most or held + size > CHUNK_BYTES):
            chunks.append(chunk)
            chunk, held = [], 0
        chunk.append(task)
        held += size
    if chunk:
        chunks.append(chunk)
    return chunks


def _read_chunk(chunk: list[_Task]) -> Any:
    """:func:`_read_one` of each task of ``chunk`` (runs in a pool worker; one message back, :func:`_handed`)."""
    return _handed([_read_one(task, *data) for task, data in zip(chunk, _fetched(chunk), strict=True)])


#: A chunk whose records hold at least this many bytes crosses to the writer through a file in shared memory (:func:`_handed`).
SHARED_BYTES = 256 << 10
#: Where the folders of :func:`_shared_folder` are made (a RAM file system), and how their names start.
SHARED_ROOT, SHARED_PREFIX = "/dev/shm", "lightning_lmdb-readers-"
_shared: str | None = None
_handed_count = itertools.count()


def _handed(results: list[tuple[int, bytes | None, Any]]) -> Any:
    """A reader's chunk of results as it crosses to the writer: the list itself, or -- its records holding at least
    :data:`SHARED_BYTES` and this reader given a shared folder -- ``(path, [(index, record length or None, entry)])``, the
    records written one after another to a new file at ``path`` (:func:`_taken` reads them back and removes it).

    A record sent through the pipe is copied five times (pickled, written, read in 64 KiB pieces, joined, unpickled): 0.19 ms
    of CPU for each 62 KB JPEG on 2 cores, as much again as all the rest beyond the decode. Through the file it is written
    once and read once. When the file cannot be written (``/dev/shm`` full: a container's is 64 MB), the list goes through
    the pipe as before.
    """
    if _shared is None or sum(len(value) for _, value, _ in results if value) < SHARED_BYTES:
        return results
    path = os.path.join(_shared, f"{os.getpid()}-{next(_handed_count)}")
    try:
        with open(path, "xb") as out:
            for _, value, _ in results:
                if value:
                    out.write(value)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return results
    return path, [(index, None if value is None else len(value), entry) for index, value, entry in results]


def _taken(handed: Any) -> list[tuple[int, bytes | memoryview | None, Any]]:
    """The results :func:`_handed` made of a chunk, in the writer: a record that crossed through a file is a view of
    the file's bytes (read at once, the file removed)."""
    if isinstance(handed, list):
        return handed
    path, entries = handed
    with open(path, "rb") as held:
        view = memoryview(held.read())
    os.unlink(path)
    results: list[tuple[int, bytes | memoryview | None, Any]] = []
    at = 0
    for index, length, entry in entries:
        if length is None:
            results.append((index, None, entry))
        else:
            results.append((index, view[at:at + length], entry))
            at += length
    return results


@contextlib.contextmanager
def _shared_folder() -> Iterator[str | None]:
    """A new folder under :data:`SHARED_ROOT` for one read's chunks, removed afterwards (``None`` where there is none).

    A writer killed (``SIGKILL``) leaves its folder behind: the next one made removes every such folder whose process is gone.
    """
    if not os.path.isdir(SHARED_ROOT) or not os.access(SHARED_ROOT, os.W_OK | os.X_OK):
        yield None
        return
    _remove_orphans()
    try:
        folder = tempfile.mkdtemp(prefix=f"{SHARED_PREFIX}{os.getpid()}-", dir=SHARED_ROOT)
    except OSError:
        yield None
        return
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _remove_orphans() -> None:
    """Remove the folders of :func:`_shared_folder` whose writer process has ended."""
    with contextlib.suppress(OSError):
        for name in os.listdir(SHARED_ROOT):
            if not name.startswith(SHARED_PREFIX):
                continue
            pid = name[len(SHARED_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(os.path.join(SHARED_ROOT, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def _read_sample_chunk(chunk: list[_Task]) -> Any:
    """:func:`_read_sample` of each task of ``chunk`` (runs in a pool worker; one message back, :func:`_handed`)."""
    return _handed([_read_sample(task) for task in chunk])


@contextlib.contextmanager
def _read_files(tasks: list[_Task], workers: int, dataset: Any = None, sizes: list[int] | None = None,
                growth: int = 1, shared: bool = False) -> Iterator[Iterator[tuple[int, bytes | memoryview | None, Any]]]:
    """:func:`_read_one` of every task (of ``dataset``: :func:`read_sample`), in order: in this
    process (``workers=0``) or in a pool of ``workers`` processes, which send them back in chunks (:func:`chunks_of`: by
    count, and by expected bytes when ``sizes`` gives each task's file size); with ``shared``, a chunk's records cross
    through shared memory (:func:`_handed`), and a record may come as a ``memoryview``.

    Raises:
        SourceError: ``dataset`` cannot be sent to the reader processes (it does not pickle, with a start method that pickles).
    """
    if workers == 0 or len(tasks) < 2:
        read = _read_one if dataset is None else functools.partial(read_sample, dataset)
        if dataset is None and any(len(task) in (8, _PAIR_WITH_ETAGS) for task in tasks):  # objects: fetched a chunk at a time here too
            with warnings.catch_warnings():
                _ignore_palette_warning()
                yield (result for chunk in chunks_of(tasks, sizes, 1, growth)
                       for result in [_read_one(task, *data) for task, data in zip(chunk, _fetched(chunk), strict=True)])
            return
        with warnings.catch_warnings():  # once for the whole read: this process's filters are as they were afterwards
            _ignore_palette_warning()
            yield map(read, tasks)
        return
    # Large chunks keep the single writer process (the bottleneck on few cores) cheap per image; bounded in bytes too.
    chunks = chunks_of(tasks, sizes, workers, growth)
    context = multiprocessing.get_context()
    with _shared_folder() if shared else contextlib.nullcontext() as folder:
        try:
            pool = context.Pool(workers, initializer=_start_reader, initargs=(dataset, folder, remote_fs.registered()))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            if dataset is None:
                raise
            raise SourceError(
                f"The dataset {type(dataset).__qualname__} cannot be sent to the reader processes (start method "
                f"{context.get_start_method()!r} pickles it): {exc}. Make it picklable, or build with workers=0."
            ) from exc
        with pool:
            yield _in_order(pool, _read_chunk if dataset is None else _read_sample_chunk, chunks, AHEAD * workers + 1)


#: Chunks a reader process may have read ahead of the writer (per reader): what waits in memory, and what a kill loses beyond
#: the batch the writer had not committed, is at most ``AHEAD * workers + 1`` chunks.
AHEAD = 2


def _in_order(pool: Any, read: Callable[[list[_Task]], list[Any]], chunks: list[list[_Task]], window: int) -> Iterator[Any]:
    """The results of ``read`` on every chunk, in order, with at most ``window`` chunks submitted and not yet taken (``imap``
    would read every chunk ahead of a slower writer and hold all their records in memory)."""
    pending: collections.deque[Any] = collections.deque()
    waiting = iter(chunks)
    for chunk in itertools.islice(waiting, window):
        pending.append(pool.apply_async(read, (chunk,)))
    while pending:
        done = _taken(pending.popleft().get())
        chunk = next(waiting, None)
        if chunk is not None:
            pending.append(pool.apply_async(read, (chunk,)))
        yield from done
