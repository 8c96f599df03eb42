"""What ``LMDBDataModule`` serves its datasets with: the loaders (:class:`LoadersMixin`), the batch hooks (:class:`DeviceBatchesMixin`)."""

from __future__ import annotations

import warnings
from typing import Any, cast

import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader

from lightning_lmdb.read import transforms
from lightning_lmdb.read.batchdecode import Collate, DeferredImages
from lightning_lmdb.read.sampler import ResumableDataLoader, ResumableSampler
from lightning_lmdb.read.transforms import ResizedCrop


class LoadersMixin:
    """``LMDBDataModule``'s loaders: in order, or (training) resumable, from ``self.datasets`` and the loader settings."""

    # set by LMDBDataModule.__init__ / setup
    datasets: dict[str, Any]
    sources: dict[str, Any]
    val_fraction: float
    test_fraction: float
    trainer: Any

    def _loader(self, split: str, train: bool) -> DataLoader:
        if split not in self.datasets:
            raise RuntimeError(self._no_data(split))
        workers = self.num_workers > 0
        settings: dict[str, Any] = dict(
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            prefetch_factor=self.prefetch_factor if workers else None,
            persistent_workers=self.persistent_workers and workers,
            multiprocessing_context=self.multiprocessing_context if workers else None,
        )
        dataset = self.datasets[split]
        kind = getattr(dataset, "target_entry", None)
        custom = kind if kind is not None and kind.custom_collate else None  # its targets collated by their kind (a list, ...)
        if self.decode_device is not None or custom is not None:
            settings["collate_fn"] = Collate(cast(ResizedCrop, dataset.transform) if self.decode_device is not None else None, custom)
        if not train:
            return DataLoader(dataset, shuffle=False, **settings)
        shuffle = self.train_shuffle if self.train_shuffle is not None else (True if self.shuffle is None else self.shuffle)
        sampler = ResumableSampler(dataset, shuffle=shuffle, seed=self.split_seed, drop_last=self.drop_last,
                                   before_epoch=self._before_epoch(),
                                   block_size=self._backend.block_size("train", dataset) if shuffle == "block" else None)
        # sampler by keyword: Lightning rebuilds the loader from these arguments with sampler= of its own (overfit_batches)
        return ResumableDataLoader(dataset, sampler=sampler, progress=self._batches_processed, drop_last=self.drop_last, **settings)

    def _no_data(self, split: str) -> str:
        """Why ``split`` has no dataset: not set up yet (its data is given), or no data given for it (the options that give it)."""
        given = self.sources[split] is not None or (split == "val" and self.val_fraction) or (split == "test" and self.test_fraction)
        stage = {"train": "fit", "val": "validate", "test": "test"}[split]
        if given:
            return f"No {split} data yet: call setup({stage!r}) first (Lightning's Trainer calls it)."
        if split == "train":
            return "No train data: pass train_dir= (a folder, a manifest, a database or a Dataset; Hydra: data.train_dir=...)."
        fraction = f"{split}_fraction=0.1 (Hydra: data.{split}_fraction=0.1) to hold out a share of train_dir"
        column = f"or a manifest with a split column whose rows say {split!r}"
        return f"No {split} data: pass {split}_dir= (Hydra: data.{split}_dir=...), {fraction}, {column}."

    def _batches_processed(self) -> int | None:
        """Training batches of the current epoch the trainer has processed (None outside ``fit``)."""
        trainer = self.trainer
        if trainer is None or trainer.state.fn != TrainerFn.FITTING:
            return None
        return trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def train_dataloader(self) -> ResumableDataLoader:
        """Shuffled training batches, from a loader that saves its position in checkpoints (see :mod:`lightning_lmdb.read.sampler`)."""
        loader = cast(ResumableDataLoader, self._loader("train", train=True))
        if self._pending_train_state is not None:
            loader.load_state_dict(self._pending_train_state)
            self._pending_train_state = None
        self._train_loader = loader
        return loader

    def state_dict(self) -> dict[str, Any]:
        """The training loader's position (saved in Lightning checkpoints with the DataModule)."""
        return {"train_loader": self._train_loader.state_dict()} if self._train_loader is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the training loader's position (called by Lightning when fitting from a checkpoint).

        Applied to the current training loader, or to the next one created. Lightning also restores the
        loader's own state; both are the same position. Going through the DataModule as well keeps the
        position when ``trainer.estimated_stepping_batches`` was touched before the restore (which makes
        Lightning create the loader early and skip its own restore).
        """
        state = state_dict.get("train_loader")
        if state is None:
            return
        if self._train_loader is not None:  # this module's loader of an earlier fit, or the one Lightning created early
            self._train_loader.load_state_dict(state)
        self._pending_train_state = state  # and the next loader created (a reused module's next fit creates a new one)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        """Validation batches in order; ``[]`` (Lightning: no validation) when there is no validation data by choice.

        With ``val_fraction=0`` and no ``val_dir`` every image of ``train_dir`` is trained on and nothing is validated.
        """
        if self.sources["val"] is None and not self.val_fraction and "val" not in self.datasets:
            warnings.filterwarnings("ignore", message="Total length of `list` across ranks is zero")  # Lightning's "is [] intended?"
            return []
        return self._loader("val", train=False)

    def test_dataloader(self) -> DataLoader:
        """Test batches in order."""
        return self._loader("test", train=False)

    def predict_dataloader(self) -> DataLoader:
        """Test batches (or validation batches when there is no test folder) in order."""
        return self._loader("test" if "test" in self.datasets else "val", train=False)


class DeviceBatchesMixin:
    """``LMDBDataModule``'s batch hooks: decode deferred JPEGs, normalise ``uint8`` batches on the device, chain the model's own hooks."""

    trainer: Any

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """With ``decode_device``: decode the batch's deferred JPEGs there in one batched call (they are still host-side bytes).

        A LightningModule's own ``on_before_batch_transfer`` then runs on the result (Lightning calls only one of the two).
        """
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], DeferredImages):
            device = self.decode_device or "cpu"
            if device == "cuda" and self.trainer is not None and self.trainer.strategy.root_device.type == "cuda":
                device = self.trainer.strategy.root_device
            batch = type(batch)((batch[0].decode(device), *batch[1:]))
        return self._chain("on_before_batch_transfer", batch, dataloader_idx)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Finish ``uint8`` image batches on the device (:meth:`finish`), then run the LightningModule's own hook, if any."""
        return self._chain("on_after_batch_transfer", self.finish(batch) if self.finish_on_device else batch, dataloader_idx)

    def finish(self, batch: Any) -> Any:
        """``(uint8 images, targets)`` to ``(normalised float32 images, targets)`` where the images are; anything else unchanged.

        What ``on_after_batch_transfer`` does on the training device; call it yourself when you iterate the loaders outside
        Lightning. Float images (e.g. from transforms of yours that normalise) pass through untouched, and so do the targets
        (a segmentation batch's ``int64`` masks).
        """
        if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor) and batch[0].dtype == torch.uint8 \
                and batch[0].ndim == 4:
            return type(batch)((transforms.finish_batch(batch[0], self.mean, self.std), *batch[1:]))
        return batch

    def _chain(self, hook: str, batch: Any, dataloader_idx: int) -> Any:
        """Run the LightningModule's own ``hook`` on ``batch`` when it overrides it (Lightning would skip it for ours)."""
        module = self.trainer.lightning_module if self.trainer is not None else None
        if module is not None and is_overridden(hook, module):
            if not getattr(self, f"_chained_{hook}", False):
                rank_zero_info(f"LMDBDataModule.{hook} runs first, then {type(module).__name__}.{hook} on its result.")
                setattr(self, f"_chained_{hook}", True)
            batch = getattr(module, hook)(batch, dataloader_idx)
        return batch
