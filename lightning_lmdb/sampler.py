"""Resumable training order: a sampler whose order is a pure function, and a loader that saves its position.

* :class:`ResumableSampler` -- the order of an epoch is a pure function of ``(seed, epoch, rank, world
  size)`` (it is ``torch``'s ``DistributedSampler``, which it subclasses, so Lightning never wraps it:
  each rank gets an equal share, padded unless ``drop_last``). Its only state is one number: how many
  of this rank's samples of the current epoch were consumed. Resuming skips them -- nothing is
  replayed, no worker keeps any bookkeeping, so ``num_workers`` may change between runs.
* :class:`ResumableDataLoader` -- a ``DataLoader`` with ``state_dict()`` / ``load_state_dict()``, the
  contract Lightning (>= 2.2) uses to save a training loader's position in a checkpoint and restore it
  with ``trainer.fit(ckpt_path=...)``. By default the position is the number of batches this loader
  has handed out in the current epoch; a ``progress`` callable can report the batches the consumer
  has actually processed instead (Lightning fetches one batch ahead, so the loader alone would count
  one batch too many -- ``LMDBDataModule`` passes the trainer's own count).

A saved position names its epoch: it is applied only when the loader next iterates that epoch, so a
state saved at an epoch boundary never skips the next epoch. A change of world size, dataset size,
batch size, seed or shuffle between save and resume is refused with a message saying what differs
(the remaining samples of that epoch are not defined on another split).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

#: Keys of a saved position that must match on resume.
_MUST_MATCH = ("world_size", "dataset_size", "batch_size", "seed", "shuffle", "drop_last")


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` that can start an epoch part-way, and an optional hook before each epoch.

    Args:
        dataset: The dataset (only its length is used).
        shuffle: Shuffle, seeded by ``seed + epoch`` (the same on every rank).
        seed: Seed of the order.
        drop_last: Drop the tail so ranks get equal shares instead of padding.
        num_replicas: World size (default: from ``torch.distributed`` when initialised, else 1).
        rank: This rank (default: from ``torch.distributed`` when initialised, else 0).
        before_epoch: Called in the main process each time an epoch's iteration starts (e.g. evict the
            data from the page cache for a cold-cache epoch).
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
        before_epoch: Callable[[], None] | None = None,
    ):
        distributed = dist.is_available() and dist.is_initialized()
        num_replicas = num_replicas if num_replicas is not None else (dist.get_world_size() if distributed else 1)
        rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
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
        order = list(super().__iter__())
        return iter(order[start:])


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` over a :class:`ResumableSampler` that saves and restores its position in the epoch.

    Args:
        dataset: The dataset.
        sampler: Its :class:`ResumableSampler`.
        progress: Batches of the current epoch the consumer has processed (e.g. the trainer's count), or
            ``None`` when it cannot tell; without it (or when it says ``None``) the loader counts the
            batches it has handed out.
        **kwargs: Any other ``DataLoader`` argument (``batch_size``, ``num_workers``, ...).
    """

    def __init__(self, dataset: Dataset, sampler: ResumableSampler, progress: Callable[[], int | None] | None = None, **kwargs: Any):
        if not isinstance(sampler, ResumableSampler):
            raise TypeError(f"sampler must be a ResumableSampler, not {type(sampler).__name__}.")
        if kwargs.get("batch_size") is None:
            raise ValueError("ResumableDataLoader needs a batch_size (its position is counted in batches).")
        super().__init__(dataset, sampler=sampler, **kwargs)
        self.progress = progress
        self._epoch_start = 0  # samples skipped at the start of the current iteration (a resume)
        self._handed_out = 0  # batches handed out by the current iteration

    def __iter__(self) -> Iterator[Any]:
        sampler: ResumableSampler = self.sampler  # type: ignore[assignment]
        self._epoch_start, self._handed_out = sampler.start, 0
        for batch in super().__iter__():
            self._handed_out += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The position: the epoch and how many of this rank's samples of it were consumed, with what defines the order."""
        sampler: ResumableSampler = self.sampler  # type: ignore[assignment]
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
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position the next time its epoch is iterated.

        Raises:
            ValueError: The position was saved with another world size, dataset size, batch size, seed,
                shuffle or drop_last (named), so "the samples that were next" are not defined here.
        """
        sampler: ResumableSampler = self.sampler  # type: ignore[assignment]
        here = self.state_dict()
        differ = [f"{key}={state.get(key)!r} then, {here[key]!r} now" for key in _MUST_MATCH if state.get(key) != here[key]]
        if differ:
            raise ValueError(
                "Cannot resume the training loader mid-epoch: it was saved with " + "; ".join(differ) + ". The remaining "
                "samples of that epoch are only defined for the same split. Resume with the same settings (e.g. the same "
                "number of devices), or start a fresh epoch from the checkpoint's weights (load the model with "
                "Model.load_from_checkpoint and call fit without ckpt_path)."
            )
        sampler.resume(int(state["epoch"]), int(state["consumed"]))
