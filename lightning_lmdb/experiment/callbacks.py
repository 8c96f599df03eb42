"""Per-epoch training performance metrics as a standalone Lightning callback.

:class:`PerfMonitor` answers "is training input-bound?" for any Lightning 2.x project. Per
training epoch, on each rank for its own device, it measures:

- ``perf/epoch_time_s``: wall time from ``on_train_epoch_start`` to ``on_train_epoch_end``,
  minus validation loops run inside the epoch (reported apart as ``perf/val_time_s``).
- ``perf/samples_per_s``: training samples / ``epoch_time_s``; a batch counts as the first
  dimension of the first tensor found in it (depth first through sequences and mappings;
  a batch without one counts 0).
- ``perf/data_wait_s``: time the training loop was blocked in ``next()`` on the train dataloader.
  Lightning brackets exactly that call (``_DataFetcher.__next__``) with
  ``trainer.profiler.start/stop("[_TrainingEpochLoop].train_dataloader_next")``; the callback
  wraps the trainer's profiler instance to time those events and forwards every call, so a user
  profiler keeps working. This covers loading and decoding with ``num_workers=0``, waiting for
  worker results otherwise, collate and pin-memory -- **plus** the batch's way to the device that
  follows it (``perf/batch_transfer_s``: from the end of the fetch to ``on_train_batch_start``, i.e.
  ``on_before_batch_transfer``, the host-to-device copy and ``on_after_batch_transfer``), so work a
  DataModule moves into those hooks (a batched GPU decode, the uint8-to-float finish) still counts as
  waiting for data. It excludes the creation of the iterator (worker start-up) at the start of
  epochs after the first. If no fetch event is seen (a Lightning version without it), the fallback
  is the sum of gaps from the previous ``on_train_batch_end`` (or the epoch start) to
  ``on_train_batch_start``, which covers the same; the summary's ``data_wait_method`` ("fetch" or
  "hook_gap") says which.
- ``perf/data_wait_frac``: ``data_wait_s / epoch_time_s``.
- ``perf/gpu_util_pct`` / ``perf/gpu_util_median_pct``: mean / median of NVML utilisation
  sampled by a daemon thread every ``gpu_sample_interval_s`` during training (paused during
  validation).
- ``perf/gpu_mem_peak_mb``: ``torch.cuda.max_memory_allocated`` in MiB, reset each epoch.

Where the loader's time goes (CPU time is counted over the training part of the epoch, validation
excluded, like ``epoch_time_s``):

- ``perf/loader_read_ms`` / ``perf/loader_decode_ms`` / ``perf/loader_transform_ms``: mean time per
  sample getting its bytes into memory / decoding them to an image / in the transforms, measured
  inside the processes that load them (the DataLoader workers, or the training process with
  ``num_workers=0``) by datasets with :class:`~lightning_lmdb.read.loadstats.LoaderStats`
  (``LMDBImageDataset``, ``RawImageDataset``; also inside a ``Subset`` or ``ConcatDataset``), which the
  monitor turns on (``enable_loader_stats()``; they are off by default) at ``setup("fit")`` -- before any
  loader of the fit starts its workers -- for the datasets of the loaders given to ``fit`` and those the
  DataModule or LightningModule holds as attributes, and at each training epoch's start for the datasets of
  the train loader. The
  record's ``loader_samples`` is how many samples they counted (it equals ``samples`` unless batches
  prefetched past ``limit_train_batches`` were loaded) and ``loader_workers`` how many worker
  processes loaded them. Another dataset, or one whose workers started without its stats (a dataset
  first made by ``train_dataloader()``: its first epoch's workers, all epochs' persistent ones), gives
  ``None`` ("n/a").
- ``perf/worker_cpu_s``: CPU seconds of the loader's worker processes in the epoch (``0.0`` with
  ``num_workers=0``): each worker's ``time.process_time()`` at its last sample of the epoch minus the
  same at its last sample of the previous epoch (a persistent worker) or since it started (a new one,
  so a ``spawn`` worker's start-up counts too). ``perf/worker_cpu_frac``: that over
  ``epoch_time_s x cores``.
- ``perf/main_cpu_s`` / ``perf/main_cpu_frac``: CPU seconds of the training process itself (all its
  threads, ``time.process_time()``), and that over ``epoch_time_s x cores``.
- ``perf/cpu_busy_frac``: how busy the machine's cores were (those this process may run on, its
  affinity mask: ``cores`` in the record), from ``/proc/stat``: user + nice + system + irq + softirq +
  steal over all time. Near 1 the loader workers and training compete for the cores, even when
  ``data_wait_frac`` is low. ``None`` without ``/proc/stat``.

Before the first epoch, the summary's ``setup`` holds the DataModule's own ``timings`` when it has them
(``LMDBDataModule``: ``prepare_s``, the builds or the stale check's scan of each folder; ``setup_s``,
the raw backend's scan of the files or the LMDB backend's opening of its databases): on network
storage a folder's scan alone can take longer than an epoch.

Without a CUDA device or NVML, one info line says so; the GPU metrics are then not sent to the
loggers and are ``None`` in :attr:`PerfMonitor.history` and in the JSON summary.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_lmdb.build.writer import usable_cpus
from lightning_lmdb.errors import OptionError
from lightning_lmdb.experiment.loaders import _enable, _fit_datasets, loader_stats_of
from lightning_lmdb.experiment.utilisation import _GpuUtilSampler, cpu_ticks
from lightning_lmdb.read.loadstats import LoaderStats, ProcessLoad

FETCH_ACTION_SUFFIX = ".train_dataloader_next"
_COLUMNS = (  # (record key, header, format)
    ("epoch", "epoch", "{:d}"),
    ("samples", "samples", "{:d}"),
    ("epoch_time_s", "time s", "{:.2f}"),
    ("samples_per_s", "samples/s", "{:.1f}"),
    ("data_wait_s", "wait s", "{:.2f}"),
    ("data_wait_frac", "wait %", "{:.1%}"),
    ("cpu_busy_frac", "CPU %", "{:.0%}"),
    ("worker_cpu_s", "workers CPU s", "{:.1f}"),
    ("gpu_util_pct", "GPU %", "{:.1f}"),
    ("gpu_util_median_pct", "GPU med %", "{:.1f}"),
    ("gpu_mem_peak_mb", "mem MiB", "{:.0f}"),
)
_LOGGED = ("epoch_time_s", "samples_per_s", "data_wait_s", "data_wait_frac", "batch_transfer_s", "val_time_s",
           "loader_read_ms", "loader_decode_ms", "loader_transform_ms", "worker_cpu_s", "worker_cpu_frac",
           "main_cpu_s", "main_cpu_frac", "cpu_busy_frac",
           "gpu_util_pct", "gpu_util_median_pct", "gpu_mem_peak_mb")


def batch_size_of(batch: Any) -> int | None:
    """Return the first dimension of the first tensor with ``ndim >= 1`` in ``batch``, else None."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim >= 1 else None
    items = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(items, (list, tuple)) or isinstance(batch, Mapping):
        for item in items:
            size = batch_size_of(item)
            if size is not None:
                return size
    return None


class PerfMonitor(pl.Callback):
    """Log epoch time, throughput, data-wait and GPU utilisation once per training epoch.

    Args:
        summary_path: Where rank zero writes the JSON summary at the end of ``fit``
            (also after an exception, with ``"completed": false``); None writes nothing.
        backend: Free label stored in the summary (e.g. ``"lmdb"`` or ``"raw"``).
        meta: Extra JSON-serialisable facts stored in the summary (batch size, workers, ...).
        gpu_sample_interval_s: Seconds between two NVML utilisation samples.
        verbose: Print a table row per epoch and the full table at fit end (rank zero).

    Attributes:
        history: One dict per finished training epoch, with an ``epoch`` field.
    """

    def __init__(self, summary_path: str | os.PathLike[str] | None = None, *,
                 backend: str | None = None, meta: Mapping[str, Any] | None = None,
                 gpu_sample_interval_s: float = 0.1, verbose: bool = True) -> None:
        if gpu_sample_interval_s <= 0:
            raise OptionError(f"gpu_sample_interval_s={gpu_sample_interval_s!r} must be > 0; "
                             "HINT: 0.1 samples ten times a second.")
        self.summary_path = Path(summary_path) if summary_path is not None else None
        self.backend = backend
        self.meta = dict(meta or {})
        self.gpu_sample_interval_s = gpu_sample_interval_s
        self.verbose = verbose
        self.history: list[dict[str, Any]] = []
        self._sampler: _GpuUtilSampler | None = None
        self._cuda_device: torch.device | None = None
        self._profiler: Any = None
        self._info: dict[str, Any] = {}
        self._in_epoch = False
        self._cpus = usable_cpus()
        self._loader_stats: list[LoaderStats] = []
        self._in_process = True  # every training loader has num_workers=0
        self._loader_paused = False  # validation shares a dataset (and its stats) with training
        self._reset_epoch()

    # ----------------------------------------------------------------- fit lifecycle
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # before any training loader starts (configure_optimizers may start one)
            for dataset in _fit_datasets(trainer, pl_module):
                _enable(dataset)
            LoaderStats.next_period()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.history = []
        device = trainer.strategy.root_device
        self._cuda_device = device if device.type == "cuda" else None
        gpu_name, why = None, None
        if self._cuda_device is None:
            why = f"training runs on {device.type!r}, not a CUDA device"
        else:
            try:
                self._sampler = _GpuUtilSampler(self._cuda_device.index or 0,
                                                self.gpu_sample_interval_s)
                gpu_name = self._sampler.name
            except Exception as exc:  # ImportError, NVMLError, ...
                why = f"NVML is unavailable ({type(exc).__name__}: {exc}); install nvidia-ml-py"
                gpu_name = torch.cuda.get_device_name(self._cuda_device)
        if why:
            rank_zero_info(f"PerfMonitor: GPU utilisation not available: {why}; "
                           "perf/gpu_util_* will not be logged.")
        self._info = {"gpu_available": self._cuda_device is not None,
                      "gpu_util_available": self._sampler is not None, "gpu_name": gpu_name,
                      "device": str(device), "world_size": trainer.world_size,
                      "cores": len(self._cpus),
                      # the DataModule's prepare_data / setup seconds (ExperimentDataModule.timings), before any epoch
                      "setup": {k: float(v) for k, v in (getattr(trainer.datamodule, "timings", None) or {}).items()}}
        self._wrap_profiler(trainer.profiler)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._shutdown()
        if self.verbose and trainer.is_global_zero and self.history:
            setup = self._info.get("setup") or {}
            before = ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in setup.items())
            print(self.format_table() + (f"\nbefore epoch 0: {before}" if before else ""))
        self._write_summary(trainer, completed=True)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self._shutdown()
        if trainer.state.fn == "fit":
            self._write_summary(trainer, completed=False)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._shutdown()

    # ----------------------------------------------------------------- epoch measurements
    def _reset_epoch(self) -> None:
        self._epoch_t0 = self._last_t = time.perf_counter()
        self._val_t0 = 0.0
        self._val_s = self._fetch_s = self._gap_s = self._transfer_s = 0.0
        self._fetch_end: float | None = None  # when the last fetch ended (its batch is on its way to the device)
        self._fetches = self._batches = self._samples = 0
        self._busy_ticks = self._total_ticks = 0
        self._main_cpu_s = 0.0
        self._cpu_known = True
        self._loads: list[ProcessLoad] = []
        self._cpu_mark: tuple[tuple[int, int] | None, float] | None = None

    def _start_cpu(self) -> None:
        self._cpu_mark = (cpu_ticks(self._cpus), time.process_time())

    def _stop_cpu(self) -> None:
        """Add the CPU use since :meth:`_start_cpu` to the epoch's."""
        if self._cpu_mark is None:
            return
        (ticks0, main0), now = self._cpu_mark, cpu_ticks(self._cpus)
        self._main_cpu_s += time.process_time() - main0
        if ticks0 is None or now is None:
            self._cpu_known = False
        else:
            self._busy_ticks += now[0] - ticks0[0]
            self._total_ticks += now[1] - ticks0[1]
        self._cpu_mark = None

    def _harvest(self) -> None:
        """Move what the loader processes counted so far into the epoch's sums, and start a new period."""
        for stats in self._loader_stats:
            self._loads.extend(stats.processes())
        LoaderStats.next_period()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_epoch()
        self._in_epoch = True
        self._loader_stats, self._in_process = loader_stats_of(trainer.train_dataloader)
        self._start_cpu()
        if self._cuda_device is not None:
            torch.cuda.reset_peak_memory_stats(self._cuda_device)
        if self._sampler is not None:
            self._sampler.take()
            self._sampler.active.set()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        self._gap_s += now - self._last_t
        if self._fetch_end is not None:  # the batch transfer hooks and the copy ran since the fetch
            self._transfer_s += now - self._fetch_end
            self._fetch_end = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._batches += 1
        self._samples += batch_size_of(batch) or 0
        self._last_t = time.perf_counter()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_t0 = time.perf_counter()
        if self._sampler is not None:
            self._sampler.active.clear()
        if self._in_epoch:
            self._stop_cpu()
            val_stats, _ = loader_stats_of(trainer.val_dataloaders)
            train_ids = {id(s) for s in self._loader_stats}
            self._loader_paused = any(id(s) in train_ids for s in val_stats)
            if self._loader_paused:  # the same dataset serves validation: do not count its samples
                self._harvest()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._in_epoch:  # sanity check or a standalone validate()
            return
        if self._loader_paused:
            LoaderStats.next_period()  # drop what validation loaded
            self._loader_paused = False
        self._start_cpu()
        now = time.perf_counter()
        self._val_s += now - self._val_t0
        self._last_t += now - self._val_t0  # validation is not a data-wait gap
        if self._sampler is not None:
            self._sampler.active.set()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        elapsed = time.perf_counter() - self._epoch_t0 - self._val_s
        self._stop_cpu()
        self._harvest()
        self._in_epoch = False
        method = "fetch" if self._fetches else "hook_gap"
        self._info["data_wait_method"] = method
        wait = self._fetch_s + self._transfer_s if self._fetches else self._gap_s
        record: dict[str, Any] = {
            "epoch": trainer.current_epoch, "epoch_time_s": elapsed, "batches": self._batches,
            "samples": self._samples,
            "samples_per_s": self._samples / elapsed if elapsed > 0 else 0.0,
            "data_wait_s": wait, "data_wait_frac": wait / elapsed if elapsed > 0 else 0.0,
            "batch_transfer_s": self._transfer_s if self._fetches else None,
            "val_time_s": self._val_s,
            **self._cpu_record(elapsed),
            "gpu_util_pct": None, "gpu_util_median_pct": None, "gpu_mem_peak_mb": None}
        if self._sampler is not None:
            self._sampler.active.clear()
            samples = self._sampler.take()
            if samples:
                record["gpu_util_pct"] = statistics.fmean(samples)
                record["gpu_util_median_pct"] = statistics.median(samples)
        if self._cuda_device is not None:
            record["gpu_mem_peak_mb"] = torch.cuda.max_memory_allocated(self._cuda_device) / 2**20
        self.history.append(record)
        for key in _LOGGED:
            if record[key] is not None:
                pl_module.log(f"perf/{key}", float(record[key]), on_step=False, on_epoch=True,
                              batch_size=1)
        if self.verbose and trainer.is_global_zero:
            lines = self.format_table([record]).splitlines()
            header = "\n".join(lines[:2]) + "\n" if len(self.history) == 1 else ""
            _print(trainer, header + lines[-1])

    def _cpu_record(self, elapsed: float) -> dict[str, Any]:
        """The epoch's loader-time and CPU fields (see the module docstring)."""
        cores = len(self._cpus)
        capacity = elapsed * cores
        record: dict[str, Any] = {
            "loader_samples": None, "loader_workers": None,
            "loader_read_ms": None, "loader_decode_ms": None, "loader_transform_ms": None,
            "worker_cpu_s": None, "worker_cpu_frac": None,
            "main_cpu_s": self._main_cpu_s, "main_cpu_frac": self._main_cpu_s / capacity if capacity > 0 else None,
            "cpu_busy_frac": None, "cores": cores}
        if self._cpu_known and self._total_ticks > 0:
            record["cpu_busy_frac"] = min(1.0, max(0.0, self._busy_ticks / self._total_ticks))
        loads = self._loads
        counted = sum(load.samples for load in loads)
        if counted:  # else: no dataset with stats, or its workers started without them
            workers = [load for load in loads if load.slot > 0]
            record["loader_samples"] = counted
            record["loader_workers"] = len({load.pid for load in workers})
            for key, field in (("loader_read_ms", "read_s"), ("loader_decode_ms", "decode_s"), ("loader_transform_ms", "transform_s")):
                record[key] = 1e3 * sum(getattr(load, field) for load in loads) / counted
            if workers or self._in_process:
                cpu = sum(load.cpu_s for load in workers)
                record["worker_cpu_s"] = cpu
                record["worker_cpu_frac"] = cpu / capacity if capacity > 0 else None
        return record

    # ----------------------------------------------------------------- fetch timing
    def _wrap_profiler(self, profiler: Any) -> None:
        """Time the train-dataloader fetch events Lightning sends to ``trainer.profiler``."""
        self._unwrap_profiler()
        starts: dict[str, float] = {}
        inner_start, inner_stop = profiler.start, profiler.stop

        def start(action_name: str) -> None:
            if action_name.endswith(FETCH_ACTION_SUFFIX):
                starts[action_name] = time.perf_counter()
            inner_start(action_name)

        def stop(action_name: str) -> None:
            inner_stop(action_name)
            t0 = starts.pop(action_name, None)
            if t0 is not None and self._in_epoch:
                self._fetch_end = time.perf_counter()
                self._fetch_s += self._fetch_end - t0
                self._fetches += 1

        profiler.start, profiler.stop = start, stop  # instance attributes shadow the methods
        self._profiler = profiler

    def _unwrap_profiler(self) -> None:
        if self._profiler is not None:
            for name in ("start", "stop"):
                self._profiler.__dict__.pop(name, None)
            self._profiler = None

    def _shutdown(self) -> None:
        """Stop the sampler thread and restore the profiler; idempotent."""
        self._in_epoch = False
        self._unwrap_profiler()
        if self._sampler is not None:
            sampler, self._sampler = self._sampler, None
            sampler.close()

    # ----------------------------------------------------------------- reporting
    def summary(self, completed: bool = True) -> dict[str, Any]:
        """Return the JSON-serialisable run summary (see module docstring for the metrics)."""
        return {"backend": self.backend, "completed": completed,
                "gpu_available": bool(self._info.get("gpu_available", False)),
                "gpu_util_available": bool(self._info.get("gpu_util_available", False)),
                "gpu_name": self._info.get("gpu_name"), "device": self._info.get("device"),
                "world_size": self._info.get("world_size", 1), "cores": self._info.get("cores", len(self._cpus)),
                "data_wait_method": self._info.get("data_wait_method"),
                "setup": dict(self._info.get("setup") or {}),
                "gpu_sample_interval_s": self.gpu_sample_interval_s, "meta": self.meta,
                "epochs": [dict(r) for r in self.history]}

    def _write_summary(self, trainer: pl.Trainer, completed: bool) -> None:
        if self.summary_path is None or not trainer.is_global_zero:
            return
        self.summary_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.summary_path.with_name(self.summary_path.name + ".tmp")
        tmp.write_text(json.dumps(self.summary(completed), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, self.summary_path)

    def format_table(self, records: list[dict[str, Any]] | None = None) -> str:
        """Render ``records`` (default: :attr:`history`) as a fixed-width text table."""
        rows = [[h for _, h, _ in _COLUMNS]]
        for rec in self.history if records is None else records:
            rows.append(["n/a" if rec.get(k) is None else fmt.format(rec[k])
                         for k, _, fmt in _COLUMNS])
        widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
        lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def _print(trainer: pl.Trainer, text: str) -> None:
    """Print without breaking the progress bar, if there is one."""
    bar = trainer.progress_bar_callback
    (bar.print if bar is not None else print)(text)
