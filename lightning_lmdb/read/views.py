"""The view of a dataset: which of its records it serves, in what order, with their targets and paths.

A view is a chain of steps applied to all records: a seeded :class:`Split`, or an explicit index array.
The rows it selects are computed once per process (:meth:`RowView._view_rows`) from those few steps, and
never pickled: a pickled view (what a ``spawn`` / ``forkserver`` worker receives) holds e.g. a seeded
split as ``(seed, fraction, part)``, recomputed from the record count in each process, not a row list.
Rows live in numpy arrays (``int32`` below 2**31 records), never one Python object per record, so a forked
DataLoader worker does not copy them page by page.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from lightning_lmdb.errors import OptionError

if TYPE_CHECKING:
    from lightning_lmdb.store import format as fmt
    from lightning_lmdb.targets import TargetTable

_View = TypeVar("_View", bound="RowView")


def _index_dtype(size: int) -> type:
    return np.int32 if size < 2**31 else np.int64


def _held_out(size: int, fraction: float) -> int:
    """Samples a share ``fraction`` of ``size`` holds: at least one when ``fraction > 0``, none when it is 0."""
    return max(1, round(size * fraction)) if fraction else 0


@dataclass(frozen=True)
class Split:
    """One part of a seeded random split: a few numbers that recompute the rows in any process.

    One permutation of the samples is cut in three: its first ``fraction`` is ``"val"``, the next ``test_fraction`` is
    ``"test"``, the rest is ``"train"``. So the parts are disjoint, and the validation part is the same with or without a
    test part (the test part comes out of training's share).

    Attributes:
        seed: Seed of the permutation (``torch.randperm``), the same on every rank and run.
        fraction: Share of the samples held out as ``"val"`` (at least one sample when ``> 0``).
        part: ``"train"`` (the rest), ``"val"`` or ``"test"``.
        test_fraction: Share of the samples held out as ``"test"`` (at least one sample when ``> 0``).
    """

    seed: int
    fraction: float
    part: str
    test_fraction: float = 0.0

    def rows(self, size: int) -> np.ndarray:
        """The sorted positions (into ``range(size)``) of this part."""
        order = torch.randperm(size, generator=torch.Generator().manual_seed(self.seed)).numpy()
        n_val = _held_out(size, self.fraction)
        n_test = _held_out(size, self.test_fraction)
        part = {"val": order[:n_val], "test": order[n_val:n_val + n_test]}.get(self.part, order[n_val + n_test:])
        return np.sort(part).astype(_index_dtype(size))


class RowView:
    """The rows of a dataset's records it serves (all, or a chain of :class:`Split` and index steps), and their targets and paths.

    Subclasses provide :meth:`_all_targets` and :meth:`_path_table` (of all records) and a ``transform``
    attribute, which :meth:`view` and :meth:`split` replace in the views they make.
    """

    transform: Callable[[Any], Any] | None

    def __init__(self, count: int, indices: Sequence[int] | None) -> None:
        self._count = count
        self._steps: tuple[Split | np.ndarray, ...] = ()
        self._rows: np.ndarray | None = None  # cache of the view's rows (None: every record)
        if indices is not None:
            self._steps = (self._checked(indices, count),)

    @staticmethod
    def _checked(indices: Sequence[int] | np.ndarray, size: int) -> np.ndarray:
        array = np.asarray(indices, dtype=np.int64).reshape(-1)
        bad = array[(array < 0) | (array >= size)]
        if len(bad):
            raise IndexError(f"indices {bad[:5].tolist()} out of range for {size} samples.")
        return array.astype(_index_dtype(size))

    def _view_rows(self) -> np.ndarray | None:
        if self._rows is None and self._steps:
            rows = np.arange(self._count, dtype=_index_dtype(self._count))
            for step in self._steps:
                rows = rows[step.rows(len(rows))] if isinstance(step, Split) else rows[step]
            self._rows = rows
        return self._rows

    def _row(self, index: int) -> int:
        rows = self._view_rows()
        size = self._count if rows is None else len(rows)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(f"index {index} out of range for {size} samples.")
        return index if rows is None else int(rows[index])

    def _with_step(self: _View, step: Split | np.ndarray | None, transform: Callable[[Any], Any] | None) -> _View:
        clone = object.__new__(type(self))  # not copy.copy: that goes through __getstate__, which drops the arrays
        clone.__dict__.update(self.__dict__)
        clone._steps = self._steps if step is None else (*self._steps, step)
        clone._rows = None
        clone.transform = transform
        return clone

    def view(self: _View, indices: Sequence[int] | None, transform: Callable[[Any], Any] | None) -> _View:
        """A dataset over ``self[i] for i in indices`` (all when ``None``) with another transform; shares the metadata."""
        return self._with_step(None if indices is None else self._checked(indices, len(self)), transform)

    def split(
        self: _View, fraction: float, seed: int, transforms: tuple[Callable[[Any], Any] | None, Callable[[Any], Any] | None] = (None, None)
    ) -> tuple[_View, _View]:
        """A seeded ``(train, val)`` split holding out ``fraction`` of this dataset (at least one sample).

        Both parts pickle as ``(seed, fraction, part)`` and recompute their rows in each process.
        """
        if not 0.0 < fraction < 1.0:
            raise OptionError(f"fraction={fraction} must be in (0, 1).")
        parts = self.parts(seed, fraction, 0.0, {"train": transforms[0], "val": transforms[1]})
        return parts["train"], parts["val"]

    def parts(self: _View, seed: int, val_fraction: float, test_fraction: float,
              transforms: dict[str, Callable[[Any], Any] | None]) -> dict[str, _View]:
        """The seeded parts ``"train"``, ``"val"`` (when ``val_fraction > 0``) and ``"test"`` (when ``test_fraction > 0``) of this
        dataset (:class:`Split`: disjoint, each held-out part at least one sample), with the transform ``transforms`` gives each.

        Raises:
            OptionError: A fraction out of ``[0, 1)``, or a test part that leaves no sample to train on.
        """
        for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 <= value < 1.0:
                raise OptionError(f"{name}={value} must be in [0, 1).")
        if test_fraction and _held_out(len(self), val_fraction) + _held_out(len(self), test_fraction) >= len(self):
            raise OptionError(f"val_fraction={val_fraction} and test_fraction={test_fraction} of {len(self)} samples leave none to train "
                              "on: lower them, or pass val_dir / test_dir.")
        wanted = ("train", *(["val"] if val_fraction else []), *(["test"] if test_fraction else []))
        return {part: self._with_step(Split(seed, val_fraction, part, test_fraction), transforms.get(part)) for part in wanted}

    def __len__(self) -> int:
        rows = self._view_rows()
        return self._count if rows is None else len(rows)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_rows"] = None  # recomputed from the steps in the receiving process
        return state

    @property
    def targets(self) -> list[Any]:
        """Target of each sample, in order: class indices (``-1`` for unlabelled images), lists of class indices
        (multi-label) or lists of numbers (regression)."""
        return self._all_targets().tolist(self._view_rows())

    @property
    def paths(self) -> list[str]:
        """Relative source path of each sample, in order (read on demand)."""
        rows, table = self._view_rows(), self._path_table()
        return table.tolist() if rows is None else [table[int(r)] for r in rows]

    def _all_targets(self) -> TargetTable:
        raise NotImplementedError

    def _path_table(self) -> fmt.PathTable:
        raise NotImplementedError
