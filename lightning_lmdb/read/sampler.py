"""Resumable training order: a sampler whose order is a pure function, and a loader that saves its position.

* :class:`ResumableSampler` -- the order of an epoch is a pure function of ``(seed, epoch, rank, world
  size)`` (it is ``torch``'s ``DistributedSampler``, which it subclasses, so Lightning never wraps it:
  each rank gets an equal share, padded unless ``drop_last``). Its only state is one number: how many
  of this rank's samples of the current epoch were consumed. Resuming skips them -- nothing is
  replayed, no worker keeps any bookkeeping, so ``num_workers`` may change between runs.
* Block shuffle (``shuffle="block"``), for data larger than RAM: the epoch visits contiguous blocks of
  ``block_size`` records in a random order, shuffling the records of each group of ``window`` consecutive
  blocks of that order together, and each rank takes a contiguous slice of it (see
  :meth:`ResumableSampler.block_order`). With :meth:`lightning_lmdb.LMDBImageDataset.read_blocks` a worker
  then reads each block's bytes in one large read instead of one page fault at a time.
* :class:`ResumableDataLoader` -- a ``DataLoader`` with ``state_dict()`` / ``load_state_dict()``, the
  contract Lightning (>= 2.2) uses to save a training loader's position in a checkpoint and restore it
  with ``trainer.fit(ckpt_path=...)``. By default the position is the number of batches this loader
  has handed out in the current epoch; a ``progress`` callable can report the batches the consumer
  has actually processed instead (Lightning fetches one batch ahead, so the loader alone would count
  one batch too many -- ``LMDBDataModule`` passes the trainer's own count).

A saved position names its epoch: it is applied only when the loader next iterates that epoch, so a
state saved at an epoch boundary never skips the next epoch. A change of world size, dataset size,
batch size, seed or shuffle (and, for a block shuffle, block size or window) between save and resume is refused
with a message saying what differs (the remaining samples of that epoch are not defined on another split), and so
is another build of the database (its ``build_id``: a rebuild from a changed source may keep the size, not the order).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Literal, get_args

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from lightning_lmdb.errors import OptionError, ResumeError

BlockShuffle = Literal["block"]
#: The training order: ``True`` (exact shuffle), ``False`` (in order) or ``"block"`` (block shuffle).
Shuffle = bool | BlockShuffle
#: The valid values of ``shuffle=``.
SHUFFLES: tuple[Shuffle, ...] = (True, False, *get_args(BlockShuffle))
#: Records per block of a block shuffle over a dataset that does not say (no ``block_size`` attribute).
DEFAULT_BLOCK_SIZE = 64
#: Blocks whose records a block shuffle mixes together.
DEFAULT_WINDOW = 16

#: Keys of a saved position that must match on resume.
_MUST_MATCH = ("world_size", "dataset_size", "batch_size", "seed", "shuffle", "drop_last")
#: Keys that must match too when they are saved (a block shuffle's): absent from positions of other orders.
_MUST_MATCH_IF_SAVED = ("block_size", "window")


def check_shuffle(shuffle: Any, *, none_means: str | None = None, hint: str = "") -> None:
    """Refuse a ``shuffle`` that is not one of :data:`SHUFFLES`: the one check of every caller's ``shuffle=``.

    Args:
        shuffle: The value given (``1`` is not ``True``: a bool is required).
        none_means: For callers that also take ``None``: what it means (said in the message); ``None`` refuses it.
        hint: Where to change it (e.g. ``"Hydra: data.shuffle=..."``), appended to the message; ``""`` for none.

    Raises:
        OptionError: Naming the value and the valid ones.
    """
    allow_none = none_means is not None
    if isinstance(shuffle, bool) or (isinstance(shuffle, str) and shuffle in SHUFFLES) or (allow_none and shuffle is None):
        return
    valid = (*SHUFFLES, None) if allow_none else SHUFFLES
    notes = [note for note in (f"None: {none_means}" if allow_none else "", hint) if note]
    suffix = f" ({'; '.join(notes)})" if notes else ""
    raise OptionError(f"shuffle={shuffle!r} is not one of {', '.join(map(repr, valid))}{suffix}.")


def _positive(name: str, value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise OptionError(f"{name}={value!r} must be a positive integer ({what}).")
    return int(value)


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` that can start an epoch part-way, block-shuffle, and call a hook before each epoch.

    ``shuffle=True`` and ``False`` are ``DistributedSampler``'s orders exactly. ``shuffle="block"`` is a
    block shuffle (:meth:`block_order`): the same padding or dropping as ``DistributedSampler`` (so the same
    samples, each exactly once over the ranks when the length divides evenly), but each rank takes a
    *contiguous* slice of the epoch's order instead of every ``num_replicas``-th sample. Interleaving would
    hand every rank a share of every block, so every rank would read every block (``num_replicas`` times
    the reads of the data, and no rank would find the block it needs already read); a contiguous slice
    gives each rank its own whole blocks, apart from the two groups of blocks at the slice's ends.

    Args:
        dataset: The dataset (its length, and its ``block_size`` attribute if it has one).
        shuffle: ``True``: a permutation seeded by ``seed + epoch`` (the same on every rank); ``False``: in
            order; ``"block"``: a block shuffle seeded the same way.
        seed: Seed of the order.
        drop_last: Drop the tail so ranks get equal shares instead of padding.
        num_replicas: World size (default: from ``torch.distributed`` when initialised, else 1).
        rank: This rank (default: from ``torch.distributed`` when initialised, else 0).
        before_epoch: Called in the main process each time an epoch's iteration starts (e.g. evict the
            data from the page cache for a cold-cache epoch).
        block_size: Records per block of the block shuffle (``None``: the dataset's ``block_size`` when it
            has one -- an :class:`~lightning_lmdb.LMDBImageDataset`'s makes a block about 4 MiB --, else
            :data:`DEFAULT_BLOCK_SIZE`). Used only with ``shuffle="block"``.
        window: Blocks whose records are shuffled together (more mixing, more blocks in flight at once).
            Used only with ``shuffle="block"``.

    Raises:
        ValueError: ``shuffle`` is not ``True``, ``False`` or ``"block"``; ``block_size`` or ``window`` is not a
            positive integer.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        shuffle: Shuffle = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
        before_epoch: Callable[[], None] | None = None,
        block_size: int | None = None,
        window: int = DEFAULT_WINDOW,
    ):
        check_shuffle(shuffle)
        if block_size is None:
            block_size = (getattr(dataset, "block_size", None) if shuffle == "block" else None) or DEFAULT_BLOCK_SIZE
        self.block_size = _positive("block_size", block_size, "records per block of shuffle='block'")
        self.window = _positive("window", window, "blocks shuffled together by shuffle='block'")
        distributed = dist.is_available() and dist.is_initialized()
        num_replicas = num_replicas if num_replicas is not None else (dist.get_world_size() if distributed else 1)
        rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=bool(shuffle), seed=seed, drop_last=drop_last)
        self.shuffle: Shuffle = shuffle  # type: ignore[assignment]
        self.before_epoch = before_epoch
        self._skip: tuple[int, int] | None = None  # (epoch, samples of it already consumed)

    def resume(self, epoch: int, consumed: int) -> None:
        """Skip the first ``consumed`` samples of this rank's share the next time epoch ``epoch`` is iterated."""
        self._skip = (epoch, max(0, min(consumed, self.num_samples)))

    # ``len()`` stays the whole share (``num_samples``) while resuming: Lightning restores the epoch's batch
    # counter too and counts the remaining batches on from there.

    @property
    def start(self) -> int:
        """Samples of the current epoch that the next iteration skips (0 unless resuming it)."""
        return self._skip[1] if self._skip is not None and self._skip[0] == self.epoch else 0

    def __iter__(self) -> Iterator[int]:
        start = self.start
        self._skip = None  # a resume applies to one iteration only
        if self.before_epoch is not None:
            self.before_epoch()
        order = self._block_share() if self.shuffle == "block" else list(super().__iter__())
        return iter(order[start:])

    def block_order(self) -> np.ndarray:
        """The whole epoch's block-shuffle order over all ranks (before padding), a pure function of ``(seed, epoch)``.

        ``range(len(dataset))`` is cut into consecutive blocks of ``block_size`` records (the last may be
        shorter); the blocks are permuted by a ``torch.Generator`` seeded with ``seed + epoch``; the permuted
        blocks are taken in consecutive groups of ``window``, and the records of each group are shuffled
        together (same generator). So a record stays within its group: a worker reading the order meets at
        most ``window`` blocks at a time, each read once.
        """
        size = len(self.dataset)  # type: ignore[arg-type]
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        blocks = math.ceil(size / self.block_size)
        permuted = torch.randperm(blocks, generator=generator).numpy()
        dtype = np.int32 if size < 2**31 else np.int64
        order = np.empty(size, dtype=dtype)
        done = 0
        for first in range(0, blocks, self.window):
            group = permuted[first:first + self.window]
            starts = group.astype(np.int64) * self.block_size
            ends = np.minimum(starts + self.block_size, size)
            indices = np.concatenate([np.arange(a, b, dtype=dtype) for a, b in zip(starts, ends)])
            mixed = indices[torch.randperm(len(indices), generator=generator).numpy()]
            order[done:done + len(mixed)] = mixed
            done += len(mixed)
        return order

    def _block_share(self) -> list[int]:
        """This rank's contiguous slice of :meth:`block_order`, padded or cut exactly as ``DistributedSampler`` does."""
        order = self.block_order().tolist()
        if not self.drop_last:
            padding = self.total_size - len(order)
            if padding <= len(order):
                order += order[:padding]
            else:
                order += (order * math.ceil(padding / len(order)))[:padding]
        else:
            order = order[:self.total_size]
        return order[self.rank * self.num_samples:(self.rank + 1) * self.num_samples]


def _at_epoch_boundary(state: dict[str, Any]) -> bool:
    """Whether a saved position took none or all of its rank's share of the epoch (as ``DistributedSampler`` sizes it)."""
    consumed, size, replicas = int(state["consumed"]), int(state["dataset_size"]), int(state["world_size"])
    share = size // replicas if state["drop_last"] else -(-size // replicas)
    return consumed == 0 or consumed >= share


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` over a :class:`ResumableSampler` that saves and restores its position in the epoch.

    Lightning may rebuild it with a sampler of its own (``Trainer(overfit_batches=...)`` gives a ``SequentialSampler``):
    the loader then serves that order and has no position (:meth:`state_dict` is ``{}``). It re-creates the loader from
    the arguments of the first construction, with ``sampler=`` replaced, so pass ``sampler`` by keyword when you create one
    in a ``*_dataloader`` hook.

    Args:
        dataset: The dataset.
        sampler: Its :class:`ResumableSampler` (another sampler: no position to save or restore).
        progress: Batches of the current epoch the consumer has processed (e.g. the trainer's count), or
            ``None`` when it cannot tell; without it (or when it says ``None``) the loader counts the
            batches it has handed out.
        **kwargs: Any other ``DataLoader`` argument (``batch_size``, ``num_workers``, ...).
    """

    def __init__(self, dataset: Dataset, sampler: ResumableSampler | Sampler, progress: Callable[[], int | None] | None = None,
                 **kwargs: Any):
        if kwargs.get("batch_size") is None:
            raise ValueError("ResumableDataLoader needs a batch_size (its position is counted in batches).")
        super().__init__(dataset, sampler=sampler, **kwargs)
        self.progress = progress
        self._epoch_start = 0  # samples skipped at the start of the current iteration (a resume)
        self._handed_out = 0  # batches handed out by the current iteration

    def __iter__(self) -> Iterator[Any]:
        sampler = self.sampler
        self._epoch_start, self._handed_out = sampler.start if isinstance(sampler, ResumableSampler) else 0, 0
        for batch in super().__iter__():
            self._handed_out += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The position: the epoch and how many of this rank's samples of it were consumed, with what defines the order (``{}``
        over a sampler that is no :class:`ResumableSampler`)."""
        sampler = self.sampler
        if not isinstance(sampler, ResumableSampler):
            return {}
        batches = self.progress() if self.progress is not None else None
        if batches is None:
            batches = self._epoch_start // self.batch_size + self._handed_out
        return {
            "epoch": sampler.epoch,
            "consumed": min(sampler.num_samples, batches * self.batch_size),
            "world_size": sampler.num_replicas,
            "dataset_size": len(sampler.dataset),  # type: ignore[arg-type]
            "batch_size": self.batch_size,
            "seed": sampler.seed,
            "shuffle": sampler.shuffle,
            "drop_last": sampler.drop_last,
            **({"block_size": sampler.block_size, "window": sampler.window} if sampler.shuffle == "block" else {}),
            **({"build_id": build_id} if (build_id := getattr(sampler.dataset, "build_id", None)) is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position the next time its epoch is iterated.

        The database's build id (an :class:`~lightning_lmdb.LMDBImageDataset`'s ``build_id``) must match too: a
        database rebuilt from a changed source can keep its size but not its order. A position saved without one
        (a checkpoint of an older version) or restored onto a dataset without one (e.g. the raw backend) cannot
        be checked: it is applied as before, with a warning.

        A position at an epoch boundary (none or all of the epoch's share consumed) applies under any settings:
        no sample of that epoch is left to define.

        Raises:
            ValueError: The position was saved mid-epoch with another world size, dataset size, batch size, seed,
                shuffle, drop_last, (block shuffle) block size or window, or on another build of the database (named),
                so "the samples that were next" are not defined here.
        """
        sampler = self.sampler
        if not state:  # saved by a loader without a position
            return
        if not isinstance(sampler, ResumableSampler):
            warnings.warn(f"The training loader's saved position is not applied: the loader now serves the order of a "
                          f"{type(sampler).__name__} (e.g. Lightning's, for overfit_batches), which has no position.", stacklevel=2)
            return
        if _at_epoch_boundary(state):  # nothing of that epoch left (or none taken): any split may follow
            sampler.resume(int(state["epoch"]), sampler.num_samples if int(state["consumed"]) else 0)
            return
        here = self.state_dict()
        keys = (*_MUST_MATCH, *(k for k in _MUST_MATCH_IF_SAVED if k in state or k in here))
        differ = [f"{key}={state.get(key)!r} then, {here.get(key)!r} now" for key in keys if state.get(key) != here.get(key)]
        then, now = state.get("build_id"), here.get("build_id")
        rebuilt = then is not None and now is not None and then != now
        if rebuilt:
            differ.append(f"database build {then} then, {now} now (rebuilt since, e.g. from a changed source)")
        elif (then is None) != (now is None):
            warnings.warn(f"Resuming the training loader without checking the database build (build_id={then!r} saved, {now!r} now): "
                          "if the database was rebuilt since, the rest of this epoch may skip or repeat samples.", stacklevel=2)
        if differ:
            how = (f"Restore the database of build {then} (lightning-lmdb info shows a database's build_id)" if rebuilt
                   else "Resume with the same settings (e.g. the same number of devices)")
            raise ResumeError(
                "Cannot resume the training loader mid-epoch: it was saved with " + "; ".join(differ) + ". The remaining "
                f"samples of that epoch are only defined for the same split of the same database. {how}, or start a fresh "
                "epoch from the checkpoint's weights (load the model with Model.load_from_checkpoint and call fit without ckpt_path)."
            )
        sampler.resume(int(state["epoch"]), int(state["consumed"]))
