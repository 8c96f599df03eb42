"""A small CNN classifier: cheap enough that the data loader, not the model, is what a run measures."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F


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
            raise ValueError(f"num_classes={num_classes}: the data has no classes (a flat folder?). Use a folder with one subfolder per class.")
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
        self.log_dict({f"{stage}/loss": loss, f"{stage}/acc": accuracy}, prog_bar=True, on_step=False, on_epoch=True, batch_size=len(targets))
        return loss

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
