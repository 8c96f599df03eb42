"""The A/B experiment: is the GPU starved for data, and how much does LMDB win back?

    python train.py data=lmdb                 # one run (demo dataset generated on first use)
    python train.py -m data=raw,lmdb          # A/B: comparison.txt + comparison.png in the multirun dir
    python train.py data.train_dir=/my/images data.cold_cache=true
    python train.py checkpoint_every_n_steps=5          # kill it mid-epoch, then resume:
    python train.py ckpt_path=outputs/<date>/<time>/checkpoints/last.ckpt

Each run logs per-epoch wall time, samples/s, data-wait time and fraction, and GPU utilisation
(``lightning_lmdb.callbacks.PerfMonitor``) to the console, CSV and TensorBoard, and writes a JSON
summary in its output directory.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from omegaconf import DictConfig, open_dict

from lightning_lmdb.callbacks import PerfMonitor
from lightning_lmdb.demo import make_demo_dataset
from lightning_lmdb.report import SUMMARY_NAME, comparison_table, load_summaries, write_comparison

log = logging.getLogger("train")


def run(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """Fit the configured model on the configured data; return the PerfMonitor summary.

    Args:
        cfg: The composed config (see ``configs/train.yaml``).
        output_dir: Where logs and the JSON summary go.
    """
    pl.seed_everything(cfg.seed, workers=True)
    if cfg.data.train_dir is None:
        demo = make_demo_dataset(cfg.paths.demo_dir, **cfg.demo)
        log.info("No data.train_dir given: using the demo dataset in %s", demo)
        with open_dict(cfg):
            cfg.data.train_dir = str(demo)
    datamodule = instantiate(cfg.data)
    model = instantiate(cfg.model, num_classes=datamodule.num_classes)
    meta = {key: cfg.data.get(key) for key in ("storage", "batch_size", "num_workers", "cold_cache", "image_size")}
    monitor = PerfMonitor(output_dir / SUMMARY_NAME, backend=datamodule.backend, meta=meta)
    loggers = [CSVLogger(output_dir, name="csv"), TensorBoardLogger(output_dir, name="tensorboard")]
    callbacks: list[pl.Callback] = [monitor]
    every = cfg.get("checkpoint_every_n_steps")
    if every:  # last.ckpt every N steps, with the training loader's position in the epoch
        callbacks.append(ModelCheckpoint(dirpath=output_dir / "checkpoints", every_n_train_steps=every, save_last=True, save_top_k=1))
        log.info("Checkpoints every %d steps: resume a killed run with ckpt_path=%s", every, output_dir / "checkpoints" / "last.ckpt")
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers, default_root_dir=str(output_dir),
                          enable_checkpointing=bool(every))
    trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    return monitor.summary()


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: one run, plus the running comparison when part of a multirun."""
    hydra_cfg = HydraConfig.get()
    run(cfg, Path(hydra_cfg.runtime.output_dir))
    if hydra_cfg.mode == RunMode.MULTIRUN:
        sweep_dir = Path(hydra_cfg.sweep.dir)
        text_path, png_path = write_comparison(sweep_dir)  # rewritten after each job: complete after the last
        print(f"\n{comparison_table(load_summaries(sweep_dir))}\n(written to {text_path} and {png_path})")


if __name__ == "__main__":
    main()
