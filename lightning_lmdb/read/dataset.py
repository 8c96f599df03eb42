"""Map-style datasets: ``LMDBImageDataset`` (a database file or sharded folder) and ``RawImageDataset`` (the image files,
:mod:`lightning_lmdb.read.raw`).

Both are drop-ins for ``torchvision.datasets.ImageFolder`` -- ``len``, ``ds[i] -> (image, target)`` with
a PIL RGB image when no transform is given, ``classes``, ``class_to_idx``, ``targets`` -- and both turn
bytes into pixels through :mod:`lightning_lmdb.codec.storage`, so they differ only in where the bytes come from.
``decoder=`` chooses how (:mod:`lightning_lmdb.codec.decoders`): ``"pil"`` (the default: ``ImageFolder``'s
exact pixels, a PIL image) or a tensor decoder (``"torchcodec"``, ``"opencv"``, ``"auto"``: a ``uint8``
``3 x H x W`` tensor, no PIL object); ``decode_size=`` allows reduced-size JPEG decoding.

A segmentation set (target kind ``"mask"``, :mod:`lightning_lmdb.sources.masks`) serves ``ds[i] -> (image, mask)``: the mask an
``int64`` ``H x W`` tensor of the stored class ids (``ignore_index``, :attr:`ImageDatasetBase.ignore_index`, kept as it is),
transformed **with** the image (:func:`lightning_lmdb.read.transforms.transform_pair`): the default transforms crop, resize
and flip both (the mask nearest-neighbour); a transform of yours takes and returns ``(image, mask)`` -- a
``transforms.v2`` pipeline is called as ``transform(image, tv_tensors.Mask(mask))``. ``target_transform`` then applies
to the transformed mask tensor (e.g. to remap class ids). Reduced-size decoding needs a transform that knows of it
(:func:`lightning_lmdb.read.transforms.joint_crop`: the defaults); with another, the images of a mask set are decoded whole.

Per-process cost that does not grow with the dataset (measured at ImageNet's 1,281,167 records):

* Targets, the rows of a view and paths live in numpy arrays, never one Python object per record:
  ``__getitem__`` reads array elements (no reference-count write), so a forked DataLoader worker does
  not copy them page by page (a Python list of 1.28M targets and paths cost ~165 MiB per worker).
* Paths are read only when needed (``paths``, error messages): the name of a sample is built on error.
* Every record read is checked against its stored checksum before it is decoded or deferred to the batched device
  decode (``xxh3-64``, ~2 us per 100 KB; an older database's ``blake2b-64``), but a ``zstd pixels``
  record, whose frame carries its own content checksum (its header is checked against the frame's content size): a
  damaged record raises :class:`~lightning_lmdb.errors.DatabaseError` naming it, its source file and what to do, and is
  never served. Block reads only warm the page cache: their records are checked here too. What a read compares is one
  read-only ``uint32`` array (the stored checksums' first 4 bytes: the low half of the hash; 5 MB at ImageNet size,
  :func:`lightning_lmdb.store.format.read_check_table`), read with the targets, shared by forked workers.
* A pickled :class:`LMDBImageDataset` (what a ``spawn`` / ``forkserver`` worker receives) holds the
  database path and the steps of its view (:mod:`lightning_lmdb.read.views`), not a row list; each process
  reads the targets back from the database (a few MB, checked against their digest).

Where a sample's time goes (:mod:`lightning_lmdb.read.loadstats`) is measured only once :meth:`enable_loader_stats`
is called (``PerfMonitor`` does it): off, a dataset holds no stats table and ``__getitem__`` neither times
nor page-touches its sample (one ``None`` check). On, the dataset carries a small table in shared memory
(one row per process: the owner and each DataLoader worker, ~10 KB) that reaches the workers started
afterwards -- ``fork`` inherits it, ``spawn`` / ``forkserver`` receive it with the dataset -- and
``__getitem__`` adds its read, decode and transform times (a few ``time.perf_counter()`` calls, ~2 us a
sample) and the process's CPU time to its own row. Only a pickle made to start a process carries the
table; any other pickle drops it (and stays as compact as before).

LMDB environments (each point is a failure of the usual recipe, measured with py-lmdb 3.0):

* py-lmdb >= 2.0 refuses to open one environment twice in a process, and a forked DataLoader worker
  inherits that guard from its parent. So environments are opened lazily, **one per path per process**
  (shared by every dataset object on that file), and every environment of the process is closed just
  before any ``fork`` (``os.register_at_fork``): a worker never inherits an open one, and the parent
  reopens lazily when it next reads. Datasets hold no environment, so they pickle before and after use
  (``fork``, ``spawn`` and ``forkserver`` workers all work).
* Readers open read-only with ``lock=False``: no reader table, any number of workers and ranks, and
  read-only filesystems work.
* ``readahead``: turning it off (the flag every recipe copies) made cold shuffled reads 8-16x slower
  for records larger than a page -- slower than raw files -- when the database fits in RAM. It only
  pays when the database is much larger than RAM. The default (``None``) turns it on when the file is
  smaller than the memory available now, off otherwise; pass ``True``/``False`` to override.
* Block reads (:meth:`LMDBImageDataset.read_blocks`, :mod:`lightning_lmdb.read.blockread`): with readahead off,
  the first sample a process loads from a block of records reads the whole block in one large read,
  for the block shuffle of ``ResumableSampler(shuffle="block")``. Off by default.
"""

from __future__ import annotations

import os
import shlex
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any, NamedTuple

import lmdb
import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from lightning_lmdb.codec import storage as codec
from lightning_lmdb.codec.storage import ImageDecodeError, RecordError
from lightning_lmdb.deprecated import deprecated_names
from lightning_lmdb.read import blockread
from lightning_lmdb.read.batchdecode import Deferred
from lightning_lmdb.read.decoding import DecodingChoice, check_decoding
from lightning_lmdb.read.loadstats import LoaderStats, touch_pages
from lightning_lmdb.read.transforms import image_size, joint_crop, mask_tensor, transform_pair
from lightning_lmdb.read.views import RowView, Split
from lightning_lmdb.sources import masks
from lightning_lmdb.store import database, envs
from lightning_lmdb.store import format as fmt
from lightning_lmdb.targets import TargetKind, TargetTable, target_kind

#: Check every record against its stored checksum when it is read (see the module docstring). For benchmarks only
#: (``benchmarks/record_check.py`` measures the check's cost by turning it off): off, a damaged record is served as wrong
#: pixels. Read per sample in the loading process (a forked worker inherits it; a spawned one does not).
CHECK_RECORDS = True


class WithMask(NamedTuple):
    """A segmentation sample as loaded: its decoded image (or :class:`Deferred`) and its mask as stored (``H x W`` ``uint8`` /
    ``uint16``, the size of the image in its file)."""

    image: Image.Image | torch.Tensor | Deferred
    mask: np.ndarray


def available_memory() -> int:
    """Bytes of memory available to new page-cache use now (``MemAvailable``), or total RAM as fallback."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def stored_targets(meta: fmt.Metadata) -> tuple[str, list[str], list[str]]:
    """A database's target kind, target names and split names, as :class:`ImageDatasetBase` takes them."""
    return meta.target_kind, list(meta.target_names), list(meta.split_names)


def ignore_index_of(meta: fmt.Metadata) -> int | None:
    """A mask database's ``ignore_index`` (``None`` for the other kinds)."""
    if not target_kind(meta.target_kind).in_record:  # a mask set's (the kind whose records hold their targets)
        return None
    found = getattr(meta, "ignore_index", None)
    return masks.DEFAULT_IGNORE_INDEX if found is None else int(found)


def split_rows(meta: fmt.Metadata, name: str) -> np.ndarray:
    """The records of ``meta``'s database that its source put in split ``name`` (none for a name it does not have)."""
    if name not in meta.split_names or meta.splits is None:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(meta.splits == meta.split_names.index(name))


def auto_readahead(path: str | os.PathLike[str]) -> bool:
    """Readahead on when the database (its file, or all shards of a sharded folder) is smaller than the memory available."""
    return database.database_bytes(path) < available_memory()


class ImageDatasetBase(RowView, DecodingChoice, Dataset):
    """What both backends share: the view (:class:`~lightning_lmdb.read.views.RowView`), transforms, decoding and ``__getitem__``
    (the base of :class:`LMDBImageDataset`, :class:`~lightning_lmdb.read.raw.RawImageDataset` and ``SourceDataset``; formerly
    ``_ImageDataset``).

    Loader statistics are off until :meth:`enable_loader_stats`; a view of a dataset with them on gets
    a :class:`LoaderStats` of its own.
    """

    _stats: LoaderStats | None = None  # None: off (the default; also a copy unpickled outside a process start)
    _block_reads: blockread.BlockReads | None = None  # None: off (LMDBImageDataset.read_blocks)

    #: What ``ds[i][1]`` is: a registered target kind's name (:mod:`lightning_lmdb.targets`; :attr:`target_entry` serves it). The
    #: library's: ``"class"`` (an ``int``), ``"none"`` (``-1``),
    #: ``"multilabel"`` (a ``float32`` multi-hot tensor over ``classes``), ``"regression"`` (a ``float32`` tensor, one
    #: value per name of ``target_names``) or ``"mask"`` (an ``int64`` ``H x W`` mask, transformed with the image).
    target_kind: str = "class"
    #: The names of a regression target's values (its manifest columns); ``[]`` for the other kinds.
    target_names: list[str] = []
    #: The splits the source assigned (a manifest's split column), in order; ``[]`` when it assigned none.
    split_names: list[str] = []
    #: The mask value of unlabelled pixels of a segmentation set (``"mask"``: kept in the masks as it is); ``None`` for the other kinds.
    ignore_index: int | None = None

    def __init__(
        self,
        classes: list[str],
        class_to_idx: dict[str, int],
        count: int,
        transform: Callable[[Any], Any] | None,
        target_transform: Callable[[Any], Any] | None,
        indices: Sequence[int] | None,
        decoder: str = "pil",
        decode_size: int | None = None,
        kind: tuple[str, list[str], list[str]] = ("class", [], []),
        ignore_index: int | None = None,
    ):
        check_decoding(decoder, decode_size)
        self.decoder, self.decode_size = decoder, decode_size
        self.classes, self.class_to_idx = classes, class_to_idx
        self.target_kind, self.target_names, self.split_names = kind
        #: The kind's registry entry (:class:`~lightning_lmdb.targets.TargetKind`): it serves, transforms and collates the targets.
        #: Pickled with the dataset, so a kind registered at run time reaches spawned workers.
        self.target_entry: TargetKind = target_kind(self.target_kind)
        if self.target_entry.in_record:
            self.ignore_index = masks.DEFAULT_IGNORE_INDEX if ignore_index is None else int(ignore_index)
        self.transform, self.target_transform = transform, target_transform
        super().__init__(count, indices)

    def _with_step(self, step: Split | np.ndarray | None, transform: Callable[[Any], Any] | None) -> ImageDatasetBase:
        clone = super()._with_step(step, transform)
        clone._stats = None if self._stats is None else LoaderStats()
        return clone

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if get_spawning_popen() is None:  # not starting a worker: the stats stay with this process
            state["_stats"] = None
        return state

    # --- loader statistics ---------------------------------------------------------------------------

    @property
    def loader_stats(self) -> LoaderStats | None:
        """Where this dataset's sample time goes, per process; ``None`` while off (see :meth:`enable_loader_stats`)."""
        return self._stats

    def enable_loader_stats(self) -> LoaderStats:
        """Turn loader statistics on: this dataset's :class:`LoaderStats`, created if it has none.

        Workers started before this call do not report into it; views made afterwards have stats of their own.
        """
        if self._stats is None:
            self._stats = LoaderStats()
        return self._stats

    # --- samples ------------------------------------------------------------------------------------

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if self._stats is not None:
            return self._measured_item(index, self._stats)
        row = self._start_load(index)
        return self._transformed(self._load(row), row)

    def _measured_item(self, index: int, stats: LoaderStats) -> tuple[Any, Any]:
        """``self[index]``, booking its read, decode and transform time in ``stats``."""
        marks = [time.perf_counter()]
        row = self._start_load(index)
        image = self._load(row, marks)
        marks.append(time.perf_counter())
        sample = self._transformed(image, row)
        start, read, decoded = marks if len(marks) == 3 else (marks[0], marks[0], marks[-1])
        stats.record(read - start, decoded - read, time.perf_counter() - decoded)
        return sample

    def _start_load(self, index: int) -> int:
        """The record of sample ``index``; the first sample of a block reads all of it (:mod:`lightning_lmdb.read.blockread`)."""
        row = self._row(index)
        if self._block_reads is not None:
            self._block_reads.before_load(self, index)
        return row

    def _transformed(self, image: Any, row: int) -> tuple[Any, Any]:
        """``(image, target)`` of record ``row`` after ``transform`` and ``target_transform``."""
        if isinstance(image, WithMask):
            return self._transformed_pair(image, row)
        target: Any = self._all_targets().item(row)
        if self.target_entry.has_geometry:  # in the pixels of the image as stored (a resize= build's boxes scaled to it)
            target = self.target_entry.at_size(target, image.size if isinstance(image, Deferred) else image_size(image))
        if self.transform is not None and self.target_entry.has_geometry:
            image, target = self._with_geometry(image, target)
        elif self.transform is not None and not isinstance(image, Deferred):
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def _with_geometry(self, image: Any, target: Any) -> tuple[Any, Any]:
        """``(image, target)`` under ``transform``, the target given the image's crop, resize and flip by its kind's geometry.

        A transform that is not the defaults' (:func:`~lightning_lmdb.read.transforms.joint_crop` finds no crop) is called as
        ``transform(image, target)`` and returns both (as a ``torchvision.transforms.v2`` pipeline does).
        """
        crop, geometry = joint_crop(self.transform), self.target_entry.geometry
        if isinstance(image, Deferred):  # the batched decode crops the image on the device; the target is moved here alike
            return image, geometry(target, crop, image.params, image.size)
        if crop is None:
            return self.transform(image, target)  # type: ignore[misc]
        image, target = crop.joint(image, target, geometry)
        for step in () if crop is self.transform else self.transform.transforms[1:]:  # type: ignore[union-attr]
            image = step(image)
        return image, target

    def _transformed_pair(self, loaded: WithMask, row: int) -> tuple[Any, Any]:
        """``(image, mask)`` of a segmentation record, transformed together; a deferred image's mask takes the crop drawn for it."""
        image, values = loaded
        size = image.size if isinstance(image, Deferred) else image_size(image)
        if values.shape != tuple(size):
            raise ImageDecodeError(self._name(row), f"its mask is {values.shape[1]}x{values.shape[0]} but its image is {size[1]}x{size[0]}"
                                                    "; a mask must be the size of its image (rebuild the database, or fix the files).")
        fill = masks.DEFAULT_IGNORE_INDEX if self.ignore_index is None else self.ignore_index
        if isinstance(image, Deferred):  # the batched decode crops the image on the device; the mask is cropped here alike
            crop = joint_crop(self.transform)
            mask: Any = self.target_entry.geometry(mask_tensor(values, None), crop, image.params, size, fill=fill).long()
        else:
            image, mask = transform_pair(self.transform, image, values, fill)
        if self.target_transform is not None:
            mask = self.target_transform(mask)
        return image, mask

    def _image_decode_size(self) -> int | None:
        """``decode_size``; ``None`` for a mask set whose transform does not know reduced-size decodes (see the module docstring)."""
        if self.target_entry.has_geometry and joint_crop(self.transform) is None:
            return None
        return self.decode_size

    def _name(self, row: int) -> str:  # how errors name record ``row``
        return str(self._path_table()[row])

    def _load(self, row: int, marks: list[float] | None = None) -> Image.Image | torch.Tensor | Deferred | WithMask:
        """The RGB image of record ``row`` (with a mask: :class:`WithMask`); appends ``time.perf_counter()`` to ``marks`` once read."""
        raise NotImplementedError


class LMDBImageDataset(ImageDatasetBase):
    """An ``ImageFolder`` served from a database built by :func:`lightning_lmdb.build_lmdb`.

    Args:
        path: The database: one file, or a sharded folder (:mod:`lightning_lmdb.store.shards`; the same samples in the same order).
        transform: Applied to the decoded image (a PIL RGB image with ``decoder="pil"``, else a ``uint8`` tensor); for a mask
            database, to ``(image, mask)``, returning both (see the module docstring).
        target_transform: Applied to the target (a mask database's: the transformed ``int64`` mask).
        decoder: ``"pil"`` (``ImageFolder``'s exact pixels), ``"torchcodec"``, ``"opencv"`` or ``"auto"`` (see
            :mod:`lightning_lmdb.codec.decoders`).
        decode_size: The shorter side ``transform`` needs: JPEGs much larger are decoded at 1/2, 1/4 or 1/8 scale.
        readahead: OS readahead on page faults; ``None`` chooses (on when the file fits in available memory).
        indices: Serve only these records, in this order (e.g. a validation split).

    Raises:
        FileNotFoundError: No database at ``path``.
        DatabaseError: Incomplete, foreign, newer-format, truncated or damaged database.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        decoder: str = "pil",
        decode_size: int | None = None,
        readahead: bool | None = None,
        indices: Sequence[int] | None = None,
    ):
        check_decoding(decoder, decode_size)
        self.path = str(Path(path).absolute())
        self.readahead = auto_readahead(self.path) if readahead is None else readahead
        meta = self._set_parts()
        super().__init__(meta.classes, meta.class_to_idx, meta.count, transform, target_transform, indices, decoder, decode_size,
                         stored_targets(meta), ignore_index_of(meta))

    def _set_parts(self) -> fmt.Metadata:
        """Read the metadata, the database's files (one, or a sharded folder's shards) and the build id; keep the targets."""
        try:
            meta, parts = database.open_database(self.path)  # environments left open only if they were open before
        except lmdb.Error as exc:
            raise envs.damaged(self.path, exc) from exc
        single = parts[0].path == self.path  # one file: its own id (older files have none in the metadata)
        self.build_id: str = parts[0].build_id if single else str(meta.build_id)
        self.storage: str = meta.storage
        self._codecs: np.ndarray | None = meta.codecs  # each record's codec (codec.RECORD_CODECS), one byte a record
        self._checksums: np.ndarray | None = meta.read_checks  # what each record's read compares, a uint32 (fmt.read_check_table)
        self._part_checksums = [part.checksum for part in parts]  # each file's checksum algorithm (fmt.READ_CHECKS)
        self.format_version: int = meta.version
        self._targets: TargetTable | None = meta.target_table()
        self._paths: fmt.PathTable | None = meta.paths  # version 1 carries them; version 2 reads them on demand
        self._files = [part.path for part in parts]
        self._starts = [part.offset for part in parts]  # a short list: bisect per sample, no per-record object
        self._part_ids = [part.build_id for part in parts]
        self._part_keys = [part.build_id.encode("ascii", "replace") for part in parts]  # as the record transactions read it
        return meta

    @property
    def sharded(self) -> bool:
        """Whether the database is a sharded folder (:mod:`lightning_lmdb.store.shards`)."""
        return len(self._files) > 1 or self._files[0] != self.path

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_targets"] = state["_paths"] = state["_codecs"] = state["_checksums"] = None  # read back in the receiving process
        return state

    @property
    def block_size(self) -> int:
        """Records per block: those of :meth:`read_blocks` when on, else enough for a block of about 4 MiB
        (:func:`lightning_lmdb.read.blockread.block_size_for` of the file size and record count).

        ``ResumableSampler(shuffle="block")`` takes its ``block_size`` from here, so its blocks are the blocks read.
        """
        if self._block_reads is not None:
            return self._block_reads.block_size
        return blockread.block_size_for(database.database_bytes(self.path), self._count)

    def read_blocks(self, enabled: bool = True, block_size: int | None = None) -> LMDBImageDataset:
        """Read each block's bytes in one large read the first time a process loads a sample of it
        (see :mod:`lightning_lmdb.read.blockread`).

        Block ``b`` is samples ``b * block_size`` to ``(b + 1) * block_size - 1`` of this dataset (view).
        Worth it with readahead off and a block-shuffled order (``ResumableSampler(shuffle="block")``);
        the samples are the same either way. Views made afterwards inherit the setting.

        Args:
            enabled: Turn block reads on (``False``: off, the default state).
            block_size: Records per block (``None``: :attr:`block_size`, about 4 MiB of records).

        Returns:
            ``self``.

        Raises:
            ValueError: ``block_size`` is not a positive integer.
        """
        if not enabled:
            self._block_reads = None
            return self
        size = self.block_size if block_size is None else block_size
        self._block_reads = blockread.BlockReads(size)
        return self

    def _all_targets(self) -> TargetTable:
        if self._targets is None:
            self._read_arrays()
        return self._targets

    def rows_of_split(self, name: str) -> np.ndarray:
        """The records (positions in the whole database) the source put in split ``name`` (see :attr:`split_names`)."""
        return split_rows(self._read_meta(), name)

    def _all_codecs(self) -> np.ndarray:
        if self._codecs is None:
            self._read_arrays()
        return self._codecs

    def _all_checksums(self) -> np.ndarray:
        if self._checksums is None:
            self._read_arrays()
        return self._checksums

    def _read_arrays(self) -> None:
        """The per-record arrays every sample needs (targets, codecs, checksums), read back once in this process."""
        meta = self._read_meta()
        self._targets, self._codecs, self._checksums = meta.target_table(), meta.codecs, meta.read_checks

    def _path_table(self) -> fmt.PathTable:
        if self._paths is None:
            self._paths = self._read_meta(arrays=True).paths
        assert self._paths is not None
        return self._paths

    def _read_meta(self, arrays: bool = False) -> fmt.Metadata:
        """This database's metadata, checked to be the build this dataset was created on."""
        try:
            if not self.sharded:
                return fmt.read_meta(self._opened(0).env, self.path, arrays=arrays)
            meta = database.load_meta(self.path, arrays=arrays)
        except lmdb.Error as exc:
            raise envs.damaged(self.path, exc) from exc
        if meta.build_id != self.build_id:
            self._check_same_database()
        return meta

    def _parts_of(self, rows: np.ndarray) -> list[tuple[envs.Opened, np.ndarray, int]]:
        """For block reads: each database file holding some of ``rows``, with those rows numbered in it, and its record count."""
        ends = [*self._starts[1:], self._count]
        found = []
        for part, (start, end) in enumerate(zip(self._starts, ends, strict=True)):
            mine = rows[(rows >= start) & (rows < end)]
            if len(mine):
                found.append((self._opened(part), mine - start, end - start))
        return found

    def _name(self, row: int) -> str:
        return f"{self.path}[{row}] ({self._path_table()[row]})"

    def _opened(self, part: int) -> envs.Opened:
        """This process's environment on file ``part``, checked to be the build this dataset was created on."""
        path = self._files[part]
        opened = envs.shared(path, readahead=self.readahead, fresh=False)
        if opened.build_id != self._part_ids[part]:
            self._check_same_database()
            opened = envs.shared(path, readahead=self.readahead, fresh=False)
        return opened

    def _load(self, row: int, marks: list[float] | None = None) -> Image.Image | torch.Tensor | Deferred | WithMask:
        part = bisect_right(self._starts, row) - 1
        kind = codec.RECORD_CODECS[self._all_codecs()[row]]  # before the transaction: the first call reads the metadata
        # Every record is checked before it is decoded (or deferred), but one whose decode checks it whole (zstd pixels);
        # a mask database's records always (their length field and mask header are outside the image's frame).
        checked = CHECK_RECORDS and (self.target_entry.in_record or not kind.self_checked)
        check = fmt.READ_CHECKS[self._part_checksums[part]] if checked else None
        checksums = self._all_checksums()
        opened = self._opened(part)
        expected = self._part_keys[part]
        error = damage = None
        try:
            with opened.env.begin(buffers=True) as txn:
                # The build id is read in the same transaction as the record (~1 us): a file copied in place over
                # an open one (same inode) is noticed at the next sample, not served under this dataset's labels.
                build_id = txn.get(fmt.BUILD_ID_KEY)
                if build_id is None or bytes(build_id) == expected:
                    value = txn.get(fmt.record_key(row - self._starts[part]), db=opened.records)
                    if value is None:
                        raise fmt.DatabaseError(f"Record {row} is missing from {self.path!r}: the database is damaged; rebuild it.")
                    if marks is not None:  # the lookup returns the memory map: its page faults are the read
                        touch_pages(value)
                        marks.append(time.perf_counter())
                    if check is not None and check(value) != int(checksums[row]):
                        damage = f"it does not match its checksum ({self._part_checksums[part]})"
                    else:
                        try:
                            return self._decode_record(value, kind)
                        except ImageDecodeError as exc:
                            error = exc
                        except RecordError as exc:  # a damaged pixel record (its zstd checksum, its header, its length)
                            damage = str(exc)
        except lmdb.Error as exc:  # a damaged page (lmdb.CorruptedError, PageNotFoundError, ...)
            raise envs.damaged(opened.path, exc, self.path) from exc
        if damage is not None:  # the name is built only on error (it reads the paths), outside the transaction
            raise self._damaged_record(row, part, damage)
        if error is not None:
            raise ImageDecodeError(self._name(row), error.reason) from None
        envs.close(self._files[part])  # the file changed under this process's mapping: reopen it and report
        self._check_same_database()
        raise fmt.DatabaseError(f"{self.path!r} changed while it was open; create the dataset again.")  # pragma: no cover

    def _damaged_record(self, row: int, part: int, why: str) -> fmt.DatabaseError:
        """The error for record ``row`` (in file ``part``) found damaged: it names the record and its source file, and what to do."""
        try:
            name = self._name(row)
        except fmt.DatabaseError:  # the paths are damaged too
            name = f"{self.path}[{row}]"
        shard = f" (in its shard {self._files[part]!r})" if self.sharded else ""
        why = why.rstrip(".").removesuffix(": the database is damaged")
        return fmt.DatabaseError(
            f"Record {name}{shard} is damaged: {why}. It is not served. Check the whole database with "
            f"`lightning-lmdb verify {shlex.quote(self.path)}`, then rebuild it (or copy or stage it again)."
        )

    def _decode_record(self, value: memoryview, kind: codec.RecordCodec) -> Image.Image | torch.Tensor | Deferred | WithMask:
        """A record's image (deferred, or decoded by its codec) -- and of a mask database's record, its mask too
        (:func:`lightning_lmdb.sources.masks.unpack`: the mask is copied out of the memory map)."""
        mask = None
        if self.target_entry.in_record:  # a mask set's record: the image and its mask
            value, mask_value = masks.unpack(value)
            mask = masks.decode_mask(mask_value)
        image = self._deferred(value) if kind.file_bytes else None
        if image is None:
            image = kind.decode(value, self.decoder, self._image_decode_size(), "<record>")
        return image if mask is None else WithMask(image, mask)

    def _check_same_database(self) -> None:
        """Raise if the database at ``path`` (or one of its shards) is no longer the build this dataset was created on."""
        if not self.sharded:
            self._check_build(self.path, self.build_id, envs.shared(self.path, readahead=self.readahead, fresh=True).build_id)
            return
        for file in self._files:
            envs.close(file)
        self._check_build(self.path, self.build_id, database.build_id(self.path))
        for file, expected in zip(self._files, self._part_ids, strict=True):
            self._check_build(file, expected, envs.shared(file, readahead=self.readahead).build_id)

    def _check_build(self, file: str, then: str, now: str) -> None:
        """Raise if ``file`` (this database or one of its shards) is of build ``now``, not of build ``then``."""
        if now != then:
            which = repr(file) if file == self.path else f"{file!r}, a shard of {self.path!r},"
            raise fmt.DatabaseError(
                f"{which} was replaced since this dataset was created (build {then}, now {now}): another build or a "
                "copy overwrote it. Create the dataset (or call setup()) again so that classes, targets and records "
                "belong to the same database."
            )


#: Names kept for one release: old name -> (the object, its new name). ``kind_of`` is also :func:`lightning_lmdb.sources.base.kind_of`
#: (a source's kind), hence the new name for this one.
__getattr__ = deprecated_names(__name__, {"_ImageDataset": (ImageDatasetBase, "ImageDatasetBase"),
                                          "kind_of": (stored_targets, "stored_targets")})
