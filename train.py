"""The A/B experiment: is the GPU starved for data, and how much does LMDB win back?

    python train.py data=lmdb                 # one run (demo dataset generated on first use)
    python train.py -m data=raw,lmdb          # A/B: comparison.txt + comparison.png in the multirun dir
    python train.py data.train_dir=/my/images data.cold_cache=true
    python train.py -m data=raw,lmdb model=noop data.netfs_latency_ms=0.5   # A/B on emulated network storage
    python train.py checkpoint_every_n_steps=5          # kill it mid-epoch, then resume:
    python train.py ckpt_path=outputs/<date>/<time>/checkpoints/last.ckpt

Each run logs per-epoch wall time, samples/s, data-wait time and fraction, and GPU utilisation
(``lightning_lmdb.experiment.callbacks.PerfMonitor``) to the console, CSV and TensorBoard, and writes a JSON
summary in its output directory.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from omegaconf import DictConfig, open_dict

from lightning_lmdb.experiment.callbacks import PerfMonitor
from lightning_lmdb.experiment.demo import make_demo_dataset
from lightning_lmdb.experiment.report import SUMMARY_NAME

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
    meta = {key: cfg.data.get(key) for key in ("storage", "batch_size", "num_workers", "cold_cache", "image_size", "netfs_latency_ms")}
    meta["model"] = type(model).__name__
    meta["repeat"] = cfg.get("ab", {}).get("repeat", 0)
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
    """Hydra entry point: one run (a multirun's comparison is written at its end by ``ABReport``)."""
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    summary = run(cfg, output_dir)
    where = {
        "summary": output_dir / SUMMARY_NAME,
        "CSV": output_dir / "csv",
        "TensorBoard": output_dir / "tensorboard",
        "databases": Path(cfg.paths.cache_dir).resolve(),
    }
    if cfg.data.train_dir is None or str(Path(cfg.paths.demo_dir).resolve()) == str(Path(str(cfg.data.train_dir)).resolve()):
        where["demo data"] = Path(cfg.paths.demo_dir).resolve()
    print(f"run {summary.get('backend')}: outputs in {output_dir}\n" + "\n".join(f"  {k}: {v}" for k, v in where.items()))


if __name__ == "__main__":
    main()
