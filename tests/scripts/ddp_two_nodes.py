"""Run by tests/test_datamodule.py: one "node" of a simulated 2-node CPU DDP job (gloo, one process per node) sharing a cache.

One process group serves three DataModules in turn, each fitted for two epochs with ``shared_filesystem=True``, the
default ``shuffle=None`` (rank 0's choice, broadcast) and one loader worker per rank:

* ``single``: the LMDB backend, one database file (node 0 builds it, node 1 waits at Lightning's barrier);
* ``sharded``: the LMDB backend, a database of :data:`SHARDS` shards (node ``n`` builds shards ``i % 2 == n``);
* ``raw``: the raw backend (nothing is built).

For each it writes ``OUT_DIR/<case>_node<N>.json``: the builds this node ran (``build_lmdb`` calls, ``build_shards``
indices), the database it read, and the training indices it saw in each epoch.

Usage: NODE_RANK=N LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python ddp_two_nodes.py SOURCE SHARED_CACHE_DIR OUT_DIR
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset

from lightning_lmdb.datamodule import backends as build_module  # the LMDB backend's builds
from lightning_lmdb.datamodule import module as dm_module
from lightning_lmdb.read.transforms import eval_transform

SHARDS = 4
#: Case name -> the DataModule settings that make it.
CASES: dict[str, dict[str, Any]] = {"single": {}, "sharded": {"shards": SHARDS}, "raw": {"backend": "raw"}}


class WithIndex(Dataset):
    """Wraps a dataset so each sample also carries its index."""

    def __init__(self, inner: Dataset):
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        image, target = self.inner[i]
        return image, target, i


class IndexedDataModule(dm_module.LMDBDataModule):
    """Records the database its training data comes from, and serves each sample's index with it."""

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        self.served = getattr(self.datasets["train"], "path", None)
        self.datasets["train"] = WithIndex(self.datasets["train"])


class Recorder(pl.LightningModule):
    """Records the training indices of each epoch."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, 3)
        self.epochs: list[list[int]] = []

    def on_train_epoch_start(self) -> None:
        self.epochs.append([])

    def training_step(self, batch, batch_idx):
        images, targets, indices = batch
        self.epochs[-1] += indices.tolist()
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _record_builds() -> dict[str, list]:
    """Make the DataModule's builds append to the dict returned (``build_lmdb``: the targets; ``build_shards``: the indices)."""
    builds: dict[str, list] = {"build_lmdb": [], "build_shards": []}
    build_lmdb, build_shards = build_module.build_lmdb, build_module.build_shards

    def recording_build_lmdb(source, target, options):
        builds["build_lmdb"].append(str(target))
        return build_lmdb(source, target, options)

    def recording_build_shards(source, target, options, indices=None):
        builds["build_shards"].append(list(indices))
        return build_shards(source, target, options, indices)

    build_module.build_lmdb, build_module.build_shards = recording_build_lmdb, recording_build_shards
    return builds


def main() -> None:
    source, cache_dir, out_dir = sys.argv[1:4]
    node = int(os.environ["NODE_RANK"])
    builds = _record_builds()
    for case, settings in CASES.items():
        for calls in builds.values():
            calls.clear()
        dm = IndexedDataModule(source, cache_dir=cache_dir, shared_filesystem=True, batch_size=4, num_workers=1,
                               train_transform=eval_transform(8), build_workers=0, **settings)
        trainer = pl.Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", max_epochs=2, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
        model = Recorder()
        trainer.fit(model, datamodule=dm)
        record = {**builds, "database": dm.served, "epochs": model.epochs}
        (Path(out_dir) / f"{case}_node{node}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without garbage-collecting torch's and Lightning's objects (~1 s of each process's exit)
