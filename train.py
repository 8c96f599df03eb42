"""The A/B experiment: is the GPU starved for data, and how much does LMDB win back?

    python train.py data=lmdb                 # one run (demo dataset generated on first use)
    python train.py data=lmdb demo.kind=detection   # the detection demo (COCO JSON) and the toy detector, logs mAP
    python train.py -m data=raw,lmdb          # A/B: comparison.txt + comparison.png in the multirun dir
    python train.py data.train_dir=/my/images data.cold_cache=true
    python train.py -m data=raw,lmdb model=noop data.netfs_latency_ms=0.5   # A/B on emulated network storage
    python train.py checkpoint_every_n_steps=5          # kill it mid-epoch, then resume:
    python train.py checkpoint_every_n_steps=5 ckpt_path=outputs/<date>/<time>/checkpoints/last.ckpt

Each run logs per-epoch wall time, samples/s, data-wait time and fraction, and GPU utilisation
(``lightning_lmdb.experiment.callbacks.PerfMonitor``) to the console, CSV and TensorBoard, and writes a JSON
summary in its output directory.

An expected failure -- bad input or config, an unreadable or unwritable file (the project's errors, ``OSError``,
``lmdb.Error``, Hydra/OmegaConf config errors) -- is reported as one ``train.py: error: ...`` line on stderr with exit
status 2; anything else is a bug and shows its traceback (as does everything with ``HYDRA_FULL_ERROR=1``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
import lmdb
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

import lightning_lmdb
import lightning_lmdb.experiment  # registers the config resolvers (${lmdb_num_classes:${data}}) before Hydra composes
from lightning_lmdb.datamodule.module import default_cache_dir
from lightning_lmdb.experiment.callbacks import PerfMonitor
from lightning_lmdb.experiment.demo import (
    DETECTION_ANNOTATIONS,
    SEGMENTATION_MANIFEST,
    make_demo_dataset,
    make_detection_demo,
    make_segmentation_demo,
)
from lightning_lmdb.experiment.report import SUMMARY_NAME
from lightning_lmdb.experiment.secrets import (
    RedactingRecordFactory,
    option_values,
    override_secrets,
    redact_override,
    redact_text,
    redact_yaml_file,
)
from lightning_lmdb.tools.cli import EXIT_ERROR, describe_error

log = logging.getLogger("train")

#: Failures of the input, the config or the disk: one line, no traceback (the project's own errors count too).
_EXPECTED_ERRORS = (lightning_lmdb.LightningLMDBError, OSError, lmdb.Error, OmegaConfBaseException, HydraException)


#: The secrets given on the command line (values of overrides under ``storage_options``): redacted from every log record,
#: whoever logs it (Hydra's launcher logs each job's overrides), from Hydra's files (:func:`redact_hydra_files`) and from an
#: error line; each run adds the values of its composed ``data.storage_options`` (:func:`remember_secrets`).
COMMAND_LINE_SECRETS = override_secrets(sys.argv[1:])
_LOG_REDACTION = RedactingRecordFactory.install(COMMAND_LINE_SECRETS) if __name__ == "__main__" else None


#: The demo kinds (``demo.kind``).
DEMO_KINDS = ("classification", "segmentation", "detection")


def demo_folder(cfg: DictConfig) -> Path:
    """Where the demo of ``demo.kind`` lives: ``paths.demo_dir``, with ``_segmentation`` or ``_detection`` appended for those demos."""
    kind = cfg.demo.get("kind", "classification")
    return Path(cfg.paths.demo_dir if kind == "classification" else f"{cfg.paths.demo_dir}_{kind}")


def make_demo(cfg: DictConfig) -> Path:
    """The demo dataset of ``demo.kind`` (``classification``: an ImageFolder; ``segmentation``: a manifest of image and mask
    pairs; ``detection``: COCO annotation files, whose train split is returned), generated on first use; what
    ``data.train_dir`` is set to.

    Raises:
        OptionError: ``demo.kind`` is none of :data:`DEMO_KINDS`.
    """
    demo = cfg.demo
    kind = demo.get("kind", "classification")
    if kind == "segmentation":
        return make_segmentation_demo(demo_folder(cfg), count=demo.count, size=demo.size, seed=demo.seed)
    if kind == "detection":
        detection = demo.get("detection", {})
        root = make_detection_demo(demo_folder(cfg), count=detection.get("count", 300), size=detection.get("size", 112),
                                   max_objects=detection.get("max_objects", 5), seed=demo.seed)
        return root / DETECTION_ANNOTATIONS["train"]
    if kind != "classification":
        raise lightning_lmdb.errors.OptionError(f"demo.kind={kind!r} is not one of {', '.join(map(repr, DEMO_KINDS))}.")
    return make_demo_dataset(demo_folder(cfg), num_classes=demo.num_classes, images_per_class=demo.images_per_class, seed=demo.seed)


def use_demo(cfg: DictConfig) -> Path:
    """Generate the demo of ``demo.kind`` when needed and point ``data`` at it: ``train_dir`` (for the detection demo also
    ``val_dir``, its val split, unless set, and ``source_options.root``, the images' folder, unless set)."""
    demo = make_demo(cfg)
    with open_dict(cfg):
        cfg.data.train_dir = str(demo)
        if cfg.demo.get("kind") == "detection":
            if cfg.data.get("val_dir") is None:
                cfg.data.val_dir = str(demo.parent / DETECTION_ANNOTATIONS["val"])
            if cfg.data.get("source_options") is not None and cfg.data.source_options.get("root") is None:
                cfg.data.source_options.root = str(demo.parent)
    return demo


def redact_hydra_files() -> list[Path]:
    """Rewrite what Hydra wrote for this job -- ``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml``, and a multirun's
    ``multirun.yaml`` -- with every value under ``storage_options`` (and every override of one) as ``***``
    (:mod:`lightning_lmdb.experiment.secrets`); ``${oc.env:NAME}`` references are kept. Returns the files rewritten.
    """
    hydra_cfg = HydraConfig.get()
    output_dir = Path(hydra_cfg.runtime.output_dir)
    files = [output_dir / hydra_cfg.output_subdir / name for name in ("config.yaml", "hydra.yaml", "overrides.yaml")
             if hydra_cfg.output_subdir is not None]
    if hydra_cfg.mode is not None and hydra_cfg.mode.name == "MULTIRUN":
        files.append(Path(hydra_cfg.sweep.dir) / "multirun.yaml")
    secrets = [*COMMAND_LINE_SECRETS, *override_secrets(hydra_cfg.overrides.task)]
    return [path for path in files if redact_yaml_file(path, secrets)]


def remember_secrets(cfg: DictConfig) -> None:
    """Redact the values of ``data.storage_options`` (from a config file, an override or the environment) from the log records
    and an error line of this process too."""
    values = option_values(storage_options(cfg))
    COMMAND_LINE_SECRETS[:] = sorted({*COMMAND_LINE_SECRETS, *values}, key=len, reverse=True)
    if _LOG_REDACTION is not None:
        _LOG_REDACTION.add(values)


def storage_options(cfg: DictConfig) -> dict[str, Any] | None:
    """``data.storage_options`` as a plain dict (its ``${oc.env:...}`` references resolved), or ``None`` when unset or empty."""
    options = cfg.data.get("storage_options")
    if options is None:
        return None
    plain = OmegaConf.to_container(options, resolve=True) if isinstance(options, DictConfig) else options
    if not isinstance(plain, dict):
        raise lightning_lmdb.errors.OptionError("data.storage_options must be a mapping of fsspec options (e.g. "
                                                "+data.storage_options.endpoint_url=http://...), not a "
                                                f"{type(plain).__name__}.")
    return plain or None


def expected_error(exc: BaseException) -> BaseException | None:
    """The exception to report in one line for ``exc``, or ``None`` when ``exc`` is a bug (its traceback is wanted).

    Hydra's ``InstantiationException`` stands for its cause: ``data.batch_size=abc`` is reported as the
    DataModule's own message. Without a cause, or a cause that is a mismatched call (an unknown keyword), it is a config error.
    """
    if isinstance(exc, InstantiationException) and exc.__cause__ is not None:
        cause = exc.__cause__
        if expected_error(cause) is not None:
            return cause
        mismatched_call = isinstance(cause, TypeError) and cause.__traceback__ is not None and cause.__traceback__.tb_next is None
        return exc if mismatched_call else None
    return exc if isinstance(exc, _EXPECTED_ERRORS) else None


def error_line(exc: BaseException) -> str:
    """The one line that reports ``exc``: its message (of the worker's original error when a loader worker raised it) and advice."""
    text = str(exc)
    if "\nOriginal Traceback" in text:  # re-raised by a DataLoader worker: keep the original message, not the worker's traceback
        return " ".join(text.rpartition(f"{type(exc).__name__}: ")[2].split())
    return describe_error(exc)


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Report an expected failure as one ``train.py: error: ...`` line and exit with status 2; let a bug propagate."""
    try:
        yield
    except Exception as exc:
        reported = None if os.environ.get("HYDRA_FULL_ERROR") == "1" else expected_error(exc)
        if reported is None:
            raise
        sys.stdout.flush()
        print(f"train.py: error: {redact_text(error_line(reported), COMMAND_LINE_SECRETS)}", file=sys.stderr)
        sys.exit(EXIT_ERROR)


def run(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """Fit the configured model on the configured data; return the PerfMonitor summary.

    The model is built with the data's ``num_classes`` and, for targets other than classes, its ``target_kind`` and output
    size ``num_outputs`` (the classes of a multi-label target or of a mask, or the K values of a regression target), so its loss
    fits the targets (see :mod:`lightning_lmdb.experiment.toy_model`); for masks also the data's ``ignore_index``. So the default
    ``model=toy_cnn`` is the fully convolutional toy model on segmentation data (per-pixel cross-entropy, ``{stage}/miou``
    logged), with no ``model=`` override.

    Args:
        cfg: The composed config (see ``configs/train.yaml``).
        output_dir: Where logs and the JSON summary go.
    """
    pl.seed_everything(cfg.seed, workers=True)
    if cfg.data.train_dir is None:
        demo = use_demo(cfg)
        log.info("No data.train_dir given: using the demo dataset in %s", demo)
    datamodule = instantiate(cfg.data, storage_options=storage_options(cfg))  # plain values; in memory only, never logged
    kind = datamodule.target_kind  # the model's loss follows it; its head has one output per class, or per regression value
    outputs = len(datamodule.target_names) if kind == "regression" else datamodule.num_classes
    # class targets: num_classes alone, as before (a model of yours need not take the others); masks: their ignore value too
    typed = {} if kind == "class" else {"target_kind": kind, "num_outputs": outputs}
    if kind == "mask":
        typed["ignore_index"] = datamodule.ignore_index
    model = instantiate(cfg.model, num_classes=datamodule.num_classes, **typed)
    meta = {key: cfg.data.get(key) for key in ("storage", "batch_size", "num_workers", "cold_cache", "image_size", "netfs_latency_ms")}
    meta["model"] = type(model).__name__
    meta["repeat"] = cfg.get("ab", {}).get("repeat", 0)
    if HydraConfig.initialized():  # the report's arms: every override but the backend and the repeat (report.arm_overrides)
        meta["overrides"] = [redact_override(o) for o in HydraConfig.get().overrides.task]  # storage_options: ***
    monitor = PerfMonitor(output_dir / SUMMARY_NAME, backend=datamodule.backend, meta=meta)
    loggers = [CSVLogger(output_dir, name="csv"), TensorBoardLogger(output_dir, name="tensorboard")]
    callbacks: list[pl.Callback] = [monitor]
    every = cfg.get("checkpoint_every_n_steps")
    if every:  # last.ckpt every N steps, with the training loader's position in the epoch
        callbacks.append(ModelCheckpoint(dirpath=output_dir / "checkpoints", every_n_train_steps=every, save_last=True, save_top_k=1))
        log.info("Checkpoints every %d steps: resume a killed run with checkpoint_every_n_steps=%d ckpt_path=%s", every, every,
                 output_dir / "checkpoints" / "last.ckpt")
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers, default_root_dir=str(output_dir),
                          enable_checkpointing=bool(every))
    trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    return monitor.summary()


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: one run (a multirun's comparison is written at its end by ``ABReport``)."""
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    with one_line_errors():
        redact_hydra_files()  # before anything else runs: storage_options never stay in .hydra/
        remember_secrets(cfg)
        summary = run(cfg, output_dir)
    where = {
        "summary": output_dir / SUMMARY_NAME,
        "CSV": output_dir / "csv",
        "TensorBoard": output_dir / "tensorboard",
        "databases": Path(cfg.data.cache_dir).expanduser().resolve() if cfg.data.get("cache_dir") else default_cache_dir(),
    }
    demo_dir = demo_folder(cfg).resolve()
    demo_files = (demo_dir, demo_dir / SEGMENTATION_MANIFEST, demo_dir / DETECTION_ANNOTATIONS["train"])
    if cfg.data.train_dir is None or Path(str(cfg.data.train_dir)).resolve() in demo_files:
        where["demo data"] = demo_dir
    print(f"run {summary.get('backend')}: outputs in {output_dir}\n" + "\n".join(f"  {k}: {v}" for k, v in where.items()))


if __name__ == "__main__":
    main()
