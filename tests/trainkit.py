"""Training helpers shared by the model tests: a quiet CPU ``Trainer`` and the "overfits one batch" check."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset


def trainer(**kwargs: Any) -> pl.Trainer:
    """A CPU ``Trainer`` with no logger, checkpoints, progress bar, summary or sanity check (``kwargs`` override these)."""
    options = {"accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
               "enable_model_summary": False, "num_sanity_val_steps": 0, **kwargs}
    return pl.Trainer(**options)


class _Losses(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"]))


def overfit_one_batch(model: pl.LightningModule, data: Dataset, steps: int = 30) -> list[float]:
    """Train ``model`` for ``steps`` steps on ``data`` as one batch; assert that every step ran and that the mean loss of the last
    five steps is below half the first step's; return the losses, with ``model`` left in eval mode (the caller then checks that it
    learnt the batch, not just lowered the loss)."""
    losses = _Losses()
    trainer(max_steps=steps, callbacks=[losses], limit_val_batches=0).fit(model, DataLoader(data, batch_size=len(data)))
    assert len(losses.losses) == steps
    assert sum(losses.losses[-5:]) / 5 < 0.5 * losses.losses[0], losses.losses
    model.eval()
    return losses.losses
