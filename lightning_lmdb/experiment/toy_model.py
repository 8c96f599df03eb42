"""Models of the A/B: a small CNN (:class:`ToyCNN`), and a model that does nothing (:class:`NoOpModel`).

Both are cheap enough that the data loader, not the model, is what a run measures; with ``NoOpModel``
(``python train.py model=noop``) an epoch takes as long as the loader needs to produce its batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F

from lightning_lmdb.errors import SourceError


class ToyCNN(pl.LightningModule):
    """Three strided conv blocks, global average pooling and a linear head.

    Args:
        num_classes: Output classes.
        width: Channels of the first block (doubled in each next one).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
    """

    def __init__(self, num_classes: int, width: int = 32, lr: float = 3e-3, weight_decay: float = 1e-4):
        super().__init__()
        if num_classes < 1:
            raise SourceError(
                f"num_classes={num_classes}: the data has no classes (a flat folder?). Use a folder with one subfolder per class."
            )
        self.save_hyperparameters()

        def block(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))

        self.features = nn.Sequential(block(3, width), block(width, 2 * width), block(2 * width, 4 * width), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Class logits of a batch of images."""
        return self.head(self.features(images).flatten(1))

    def _step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> torch.Tensor:
        images, targets = batch
        logits = self(images)
        loss = F.cross_entropy(logits, targets)
        accuracy = (logits.argmax(1) == targets).float().mean()
        self.log_dict(
            {f"{stage}/loss": loss, f"{stage}/acc": accuracy}, prog_bar=True, on_step=False, on_epoch=True, batch_size=len(targets)
        )
        return loss

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)


def _images(batch: Any) -> torch.Tensor | None:
    """The first tensor of a batch: the images of an ``(images, targets)`` pair, or the batch itself."""
    if isinstance(batch, torch.Tensor):
        return batch
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    return next((item for item in items if isinstance(item, torch.Tensor)), None)


class NoOpModel(pl.LightningModule):
    """Stands in for an infinitely fast accelerator: each step reads one value per sample of the batch, and that is all.

    The loss is ``0 * (one element of each image) + 0 * w`` with one parameter ``w``, so the batch is consumed
    (on a GPU its copy and the step are ordered on the stream), the optimizer has something to step and nothing
    changes. Nothing is logged per step (``self.log`` would cost more than the step); validation and test
    steps touch their batch the same way.

    Training on the CPU, it keeps the training process to one intra-op thread while it runs (restored after):
    an accelerator leaves the CPU to the loader, but torch's idle OpenMP threads would spin on the cores
    the loader's workers need (on 2 cores that took half the training process's CPU time).

    Args:
        num_classes: Classes of the data (kept in the hyperparameters only; any value, 0 for a flat folder).
        lr: SGD learning rate (the gradient is zero, so it does not matter).
    """

    def __init__(self, num_classes: int = 0, lr: float = 0.0):
        super().__init__()
        self.save_hyperparameters()
        self.w = nn.Parameter(torch.zeros(1))

    def on_fit_start(self) -> None:
        self._threads = torch.get_num_threads()
        if self.device.type == "cpu":
            torch.set_num_threads(1)

    def teardown(self, stage: str) -> None:
        if getattr(self, "_threads", None):
            torch.set_num_threads(self._threads)
            self._threads = None

    def _touch(self, batch: Any) -> torch.Tensor:
        images = _images(batch)
        loss = self.w.sum() * 0.0
        if images is not None and images.ndim and images.numel():
            loss = loss + images.reshape(len(images), -1)[:, 0].float().sum() * 0.0
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._touch(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._touch(batch)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._touch(batch)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self._touch(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
