"""Run by tests/test_resume.py: 2-process CPU DDP (gloo) fit, optionally preempted after k batches or resumed.

Usage: python ddp_resume.py SOURCE CACHE_DIR OUT_DIR CKPT_DIR [--stop-after K | --resume] [--workers N] [--block-bytes B]
--block-bytes: a block shuffle over blocks of about B bytes (``blockread.BLOCK_BYTES``, set in every rank).
Writes OUT_DIR/rank{r}.json: the identities of every training batch that rank saw.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import lightning.pytorch as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_resume import BATCH, SEED, PreemptAfter, Preempted, Recorder, identity  # noqa: E402

from lightning_lmdb import LMDBDataModule  # noqa: E402
from lightning_lmdb.read import blockread


class Writer(pl.Callback):
    def __init__(self, out: Path):
        self.out = out

    def _write(self, trainer, pl_module) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(pl_module.seen))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._write(trainer, pl_module)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._write(trainer, pl_module)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("cache")
    parser.add_argument("out")
    parser.add_argument("ckpt_dir")
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--block-bytes", type=int, default=None)
    args = parser.parse_args()
    if args.block_bytes:
        blockread.BLOCK_BYTES = args.block_bytes
    ckpt = Path(args.ckpt_dir) / "preempted.ckpt"
    callbacks: list[pl.Callback] = [Writer(Path(args.out))]
    if args.stop_after:
        callbacks.append(PreemptAfter(args.stop_after, ckpt))  # after the Writer: the last batch is recorded
    dm = LMDBDataModule(args.source, cache_dir=args.cache, batch_size=BATCH, num_workers=args.workers, train_transform=identity,
                        val_fraction=0, build_workers=0, split_seed=SEED, shuffle="block" if args.block_bytes else None)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, callbacks=callbacks)
    try:
        trainer.fit(Recorder(), datamodule=dm, ckpt_path=ckpt if args.resume else None)
    except Preempted:
        pass


if __name__ == "__main__":
    main()
    gc.freeze()  # exit without garbage-collecting torch's and Lightning's objects (~1 s of each process's exit)
