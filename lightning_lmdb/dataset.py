"""Map-style datasets: ``LMDBImageDataset`` (one LMDB file) and ``RawImageDataset`` (the image files).

Both are drop-ins for ``torchvision.datasets.ImageFolder`` -- ``len``, ``ds[i] -> (image, target)`` with
a PIL RGB image when no transform is given, ``classes``, ``class_to_idx``, ``targets`` -- and both turn
bytes into pixels through :mod:`lightning_lmdb.decode`, so they differ only in where the bytes come from.

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
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

from lightning_lmdb import format as fmt
from lightning_lmdb.decode import decode_image, record_to_image
from lightning_lmdb.folder import read_file, scan_folder

#: Close every database environment of this process (they reopen lazily); also runs before every fork.
close_environments = fmt.close_all
#: Paths of the database environments open in this process.
open_environments = fmt.open_paths


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


def auto_readahead(path: str | os.PathLike[str]) -> bool:
    """Readahead on when the database file is smaller than the memory available (see module docstring)."""
    try:
        return os.stat(path).st_size < available_memory()
    except OSError:  # no file yet: opening it reports that
        return True


class _ImageDataset(Dataset):
    """What both backends share: the optional index subset, targets, transforms and ``__getitem__``."""

    def __init__(
        self,
        classes: list[str],
        class_to_idx: dict[str, int],
        targets: list[int],
        paths: list[str],
        transform: Callable[[Any], Any] | None,
        target_transform: Callable[[int], Any] | None,
        indices: Sequence[int] | None,
    ):
        self.classes, self.class_to_idx = classes, class_to_idx
        self.transform, self.target_transform = transform, target_transform
        self._all_targets, self._all_paths = targets, paths
        self._rows = list(range(len(targets))) if indices is None else [int(i) for i in indices]
        bad = [i for i in self._rows if not 0 <= i < len(targets)]
        if bad:
            raise IndexError(f"indices {bad[:5]} out of range for {len(targets)} samples.")

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def targets(self) -> list[int]:
        """Target of each sample, in order (``-1`` for unlabelled images)."""
        return [self._all_targets[i] for i in self._rows]

    @property
    def paths(self) -> list[str]:
        """Relative source path of each sample, in order."""
        return [self._all_paths[i] for i in self._rows]

    def view(self, indices: Sequence[int] | None, transform: Callable[[Any], Any] | None) -> _ImageDataset:
        """A dataset over ``self[i] for i in indices`` (all when ``None``) with another transform; shares the metadata."""
        clone = copy.copy(self)
        clone._rows = list(self._rows) if indices is None else [self._rows[int(i)] for i in indices]
        clone.transform = transform
        return clone

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        row = self._rows[index]
        image = self._load(row)
        target: Any = self._all_targets[row]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target

    def _load(self, row: int) -> Image.Image:
        raise NotImplementedError


class LMDBImageDataset(_ImageDataset):
    """An ``ImageFolder`` served from a database built by :func:`lightning_lmdb.build_lmdb`.

    Args:
        path: The database file.
        transform: Applied to the PIL RGB image.
        target_transform: Applied to the target.
        readahead: OS readahead on page faults; ``None`` chooses (on when the file fits in available memory).
        indices: Serve only these records, in this order (e.g. a validation split).

    Raises:
        FileNotFoundError: No database at ``path``.
        DatabaseError: Incomplete, foreign, newer-format or truncated database.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        readahead: bool | None = None,
        indices: Sequence[int] | None = None,
    ):
        self.path = str(Path(path).absolute())
        self.readahead = auto_readahead(self.path) if readahead is None else readahead
        with fmt.reading(self.path) as opened:  # left open only if it was open before
            meta = fmt.read_meta(opened.env, self.path)
            self.build_id: str = opened.build_id
        self._build_id_bytes = self.build_id.encode("ascii", "replace")
        self.storage: str = meta.storage
        super().__init__(meta.classes, meta.class_to_idx, meta.targets, meta.paths, transform, target_transform, indices)

    def _load(self, row: int) -> Image.Image:
        opened = fmt.shared(self.path, readahead=self.readahead, fresh=False)
        if opened.build_id != self.build_id:
            self._check_same_database()
            opened = fmt.shared(self.path, readahead=self.readahead, fresh=False)
        with opened.env.begin(buffers=True) as txn:
            # The build id is read in the same transaction as the record (~1 us): a file copied in place over
            # an open one (same inode) is noticed at the next sample, not served under this dataset's labels.
            build_id = txn.get(fmt.BUILD_ID_KEY)
            if build_id is None or bytes(build_id) == self._build_id_bytes:
                value = txn.get(fmt.record_key(row), db=opened.records)
                if value is None:
                    raise fmt.DatabaseError(f"Record {row} is missing from {self.path!r}: the database is damaged; rebuild it.")
                return record_to_image(value, self.storage, name=f"{self.path}[{row}] ({self._all_paths[row]})")
        fmt.close(self.path)  # the file changed under this process's mapping: reopen it and report
        self._check_same_database()
        raise fmt.DatabaseError(f"{self.path!r} changed while it was open; create the dataset again.")  # pragma: no cover

    def _check_same_database(self) -> None:
        """Raise if the file at ``path`` is no longer the build this dataset was created on."""
        opened = fmt.shared(self.path, readahead=self.readahead, fresh=True)
        if opened.build_id != self.build_id:
            raise fmt.DatabaseError(
                f"{self.path!r} was replaced since this dataset was created (build {self.build_id[:12]}, now "
                f"{opened.build_id[:12]}): another build or a copy overwrote it. Create the dataset (or call "
                "setup()) again so that classes, targets and records belong to the same database."
            )


class RawImageDataset(_ImageDataset):
    """The same samples read straight from the image files (the baseline of an A/B).

    The folder is scanned with torchvision's ImageFolder helpers (see :mod:`lightning_lmdb.folder`) and
    each file goes through the same decode function as :class:`LMDBImageDataset`.

    Args:
        root: The image folder (ImageFolder layout, or a flat folder of images).
        transform: Applied to the PIL RGB image.
        target_transform: Applied to the target.
        indices: Serve only these samples, in this order.
        exclude: Relative paths to leave out (e.g. the bad files :func:`lightning_lmdb.writer.find_bad_files` found).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        indices: Sequence[int] | None = None,
        exclude: Collection[str] = (),
    ):
        scan = scan_folder(root)
        self.root = str(scan.root)
        kept = [f for f in scan.files if f.relpath not in exclude] if exclude else scan.files
        super().__init__(scan.classes, scan.class_to_idx, [f.target for f in kept], [f.relpath for f in kept],
                         transform, target_transform, indices)

    @classmethod
    def from_database(
        cls,
        root: str | os.PathLike[str],
        database: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        indices: Sequence[int] | None = None,
    ) -> RawImageDataset:
        """The samples a database built from ``root`` holds -- same classes, order and skipped files -- read from the files.

        This is the raw side of an A/B that must differ in storage alone: a database built with
        ``on_error="skip"`` leaves bad files out, and this dataset leaves out exactly the same ones.

        Raises:
            FileNotFoundError, DatabaseError: As :class:`LMDBImageDataset`.
        """
        meta = fmt.load_meta(database)
        dataset = cls.__new__(cls)
        dataset.root = str(Path(root).expanduser().resolve())
        _ImageDataset.__init__(dataset, meta.classes, meta.class_to_idx, meta.targets, meta.paths, transform, target_transform, indices)
        return dataset

    def files(self) -> list[str]:
        """Absolute path of every image file of the folder (all samples, not only this view's)."""
        return [os.path.join(self.root, p) for p in self._all_paths]

    def _load(self, row: int) -> Image.Image:
        path = os.path.join(self.root, self._all_paths[row])
        return decode_image(read_file(path), max_pixels=None, name=path)
