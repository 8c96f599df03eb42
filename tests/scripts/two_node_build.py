"""Run by tests/test_shards.py: one "node" of a simulated 2-node CPU job (gloo) sharing a cache directory.

Each node's prepare_data builds its own shards (recorded in OUT/node<N>_built.json); after the fit every rank
records the database it read and the samples it saw (OUT/node<N>_seen.json).

Usage: NODE_RANK=N python two_node_build.py SOURCE SHARED_CACHE_DIR OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from ddp_epoch_coverage import WithIndex  # this script's folder is on sys.path

from lightning_lmdb import datamodule as dm_module
from lightning_lmdb.transforms import eval_transform


class IndexedDataModule(dm_module.LMDBDataModule):
    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        self.served = self.datasets["train"].path
        self.datasets["train"] = WithIndex(self.datasets["train"])


class Recorder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, 3)
        self.seen: list[int] = []

    def training_step(self, batch, batch_idx):
        images, targets, indices = batch
        self.seen += indices.tolist()
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    source, cache_dir, out_dir = sys.argv[1:4]
    node = int(os.environ["NODE_RANK"])
    out = Path(out_dir)
    built: list[list[int]] = []
    build_shards = dm_module.build_shards

    def recording_build_shards(source, target, options, indices=None):
        built.append(list(indices))
        return build_shards(source, target, options, indices)

    dm_module.build_shards = recording_build_shards
    dm = IndexedDataModule(source, cache_dir=cache_dir, shards=4, shared_filesystem=True, val_fraction=0, batch_size=4,
                           num_workers=0, train_transform=eval_transform(8), build_workers=0)
    trainer = pl.Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    model = Recorder()
    trainer.fit(model, datamodule=dm)
    (out / f"node{node}_built.json").write_text(json.dumps(built))
    (out / f"node{node}_seen.json").write_text(json.dumps({"database": dm.served, "indices": model.seen}))


if __name__ == "__main__":
    main()
