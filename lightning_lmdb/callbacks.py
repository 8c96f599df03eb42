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
  worker results otherwise, collate and pin-memory; it excludes the host-to-device copy and the
  creation of the iterator (worker start-up) at the start of epochs after the first. If no such
  event is seen (a Lightning version without it), the fallback is the sum of gaps from the
  previous ``on_train_batch_end`` (or the epoch start) to ``on_train_batch_start``, which also
  includes the device copy; the summary's ``data_wait_method`` ("fetch" or "hook_gap") says which.
- ``perf/data_wait_frac``: ``data_wait_s / epoch_time_s``.
- ``perf/gpu_util_pct`` / ``perf/gpu_util_median_pct``: mean / median of NVML utilisation
  sampled by a daemon thread every ``gpu_sample_interval_s`` during training (paused during
  validation).
- ``perf/gpu_mem_peak_mb``: ``torch.cuda.max_memory_allocated`` in MiB, reset each epoch.

Without a CUDA device or NVML, one info line says so; the GPU metrics are then not sent to the
loggers and are ``None`` in :attr:`PerfMonitor.history` and in the JSON summary.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

FETCH_ACTION_SUFFIX = ".train_dataloader_next"
_COLUMNS = (  # (record key, header, format)
    ("epoch", "epoch", "{:d}"),
    ("samples", "samples", "{:d}"),
    ("epoch_time_s", "time s", "{:.2f}"),
    ("samples_per_s", "samples/s", "{:.1f}"),
    ("data_wait_s", "wait s", "{:.2f}"),
    ("data_wait_frac", "wait %", "{:.1%}"),
    ("gpu_util_pct", "GPU %", "{:.1f}"),
    ("gpu_util_median_pct", "GPU med %", "{:.1f}"),
    ("gpu_mem_peak_mb", "mem MiB", "{:.0f}"),
)
_LOGGED = ("epoch_time_s", "samples_per_s", "data_wait_s", "data_wait_frac", "val_time_s",
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


class _GpuUtilSampler:
    """Daemon thread sampling NVML utilisation of one CUDA device while ``active`` is set."""

    def __init__(self, device_index: int, interval_s: float) -> None:
        import pynvml  # from nvidia-ml-py; ImportError means "not available"

        self._nvml = pynvml
        pynvml.nvmlInit()
        try:
            self._handle = self._find_handle(device_index)
        except Exception:
            pynvml.nvmlShutdown()
            raise
        name = pynvml.nvmlDeviceGetName(self._handle)
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.active = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._samples: list[float] = []
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._run, name="PerfMonitor-nvml", daemon=True)
        self._thread.start()

    def _find_handle(self, device_index: int) -> Any:
        """NVML handle of CUDA device ``device_index``, robust to CUDA_VISIBLE_DEVICES remapping."""
        nvml = self._nvml
        try:
            return nvml.nvmlDeviceGetHandleByUUID(
                "GPU-" + str(torch.cuda.get_device_properties(device_index).uuid))
        except Exception:  # no uuid on this torch build, or a MIG slice: fall back to the index
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
            if all(v.strip().isdigit() for v in visible) and device_index < len(visible):
                device_index = int(visible[device_index])
            return nvml.nvmlDeviceGetHandleByIndex(device_index)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            if not self.active.is_set():
                continue
            try:
                util = float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
            except self._nvml.NVMLError:
                continue
            with self._lock:
                self._samples.append(util)

    def take(self) -> list[float]:
        """Return the samples collected since the last call and start a new list."""
        with self._lock:
            samples, self._samples = self._samples, []
        return samples

    def close(self) -> None:
        """Stop the thread and release NVML; safe to call once."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._nvml.nvmlShutdown()


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
            raise ValueError(f"gpu_sample_interval_s={gpu_sample_interval_s!r} must be > 0; "
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
        self._reset_epoch()

    # ----------------------------------------------------------------- fit lifecycle
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
                      "device": str(device), "world_size": trainer.world_size}
        self._wrap_profiler(trainer.profiler)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._shutdown()
        if self.verbose and trainer.is_global_zero and self.history:
            print(self.format_table())
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
        self._val_s = self._fetch_s = self._gap_s = 0.0
        self._fetches = self._batches = self._samples = 0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_epoch()
        self._in_epoch = True
        if self._cuda_device is not None:
            torch.cuda.reset_peak_memory_stats(self._cuda_device)
        if self._sampler is not None:
            self._sampler.take()
            self._sampler.active.set()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._gap_s += time.perf_counter() - self._last_t

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        self._batches += 1
        self._samples += batch_size_of(batch) or 0
        self._last_t = time.perf_counter()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_t0 = time.perf_counter()
        if self._sampler is not None:
            self._sampler.active.clear()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._in_epoch:  # sanity check or a standalone validate()
            return
        now = time.perf_counter()
        self._val_s += now - self._val_t0
        self._last_t += now - self._val_t0  # validation is not a data-wait gap
        if self._sampler is not None:
            self._sampler.active.set()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        elapsed = time.perf_counter() - self._epoch_t0 - self._val_s
        self._in_epoch = False
        method = "fetch" if self._fetches else "hook_gap"
        self._info["data_wait_method"] = method
        wait = self._fetch_s if self._fetches else self._gap_s
        record: dict[str, Any] = {
            "epoch": trainer.current_epoch, "epoch_time_s": elapsed, "batches": self._batches,
            "samples": self._samples,
            "samples_per_s": self._samples / elapsed if elapsed > 0 else 0.0,
            "data_wait_s": wait, "data_wait_frac": wait / elapsed if elapsed > 0 else 0.0,
            "val_time_s": self._val_s,
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
                self._fetch_s += time.perf_counter() - t0
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
                "world_size": self._info.get("world_size", 1),
                "data_wait_method": self._info.get("data_wait_method"),
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
