"""Run by tests/test_datamodule.py: 2-process CPU DDP (gloo) fit that records which samples each rank saw.

Usage: python ddp_epoch_coverage.py SOURCE CACHE_DIR OUT_DIR BACKEND [SHUFFLE]

SHUFFLE ``block``: a block shuffle over blocks of :data:`BLOCK_SIZE` records, with block reads for the LMDB backend;
``default`` (or none): the DataModule's ``shuffle=None`` (an exact shuffle for this small data, chosen by rank 0).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.transforms import eval_transform

#: Records per block with SHUFFLE=block (small, so that the 36 training samples make more than one window of blocks).
BLOCK_SIZE = 2


class WithIndex(Dataset):
    """Wraps a dataset so each sample also carries its index."""

    def __init__(self, inner: Dataset):
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        image, target = self.inner[i]
        return image, target, i

    @property
    def block_size(self) -> int:
        return getattr(self.inner, "block_size", BLOCK_SIZE)


class IndexedDataModule(LMDBDataModule):
    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if self.train_shuffle == "block" and hasattr(self.datasets["train"], "read_blocks"):
            self.datasets["train"].read_blocks(True, block_size=BLOCK_SIZE)
        self.datasets["train"] = WithIndex(self.datasets["train"])


class Recorder(pl.LightningModule):
    def __init__(self, out_dir: Path):
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, 3)
        self.out_dir, self.seen = out_dir, []

    def training_step(self, batch, batch_idx):
        images, targets, indices = batch
        self.seen += indices.tolist()
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), targets)

    def on_train_epoch_end(self) -> None:
        path = self.out_dir / f"rank{self.global_rank}_epoch{self.current_epoch}.json"
        path.write_text(json.dumps(self.seen))
        self.seen = []

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    source, cache_dir, out_dir, backend = sys.argv[1:5]
    shuffle = {"block": "block", "default": None}[sys.argv[5] if len(sys.argv) > 5 else "default"]  # None: rank 0 chooses
    dm = IndexedDataModule(source, backend=backend, cache_dir=cache_dir, batch_size=4, num_workers=1,
                           train_transform=eval_transform(8), build_workers=0, shuffle=shuffle)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(Recorder(Path(out_dir)), datamodule=dm)


if __name__ == "__main__":
    main()
