"""How busy the machine is while training: CPU ticks from ``/proc/stat`` and GPU utilisation sampled from NVML.

:class:`~lightning_lmdb.experiment.callbacks.PerfMonitor` reads both once per epoch (``perf/cpu_busy_frac``,
``perf/gpu_util_pct``, ``perf/gpu_util_median_pct``).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

#: /proc/stat columns that count as busy: user, nice, system, irq, softirq, steal (of the first 8).
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


def cpu_ticks(cpus: list[int] | None = None) -> tuple[int, int] | None:
    """``(busy, total)`` clock ticks of ``cpus`` (default: all) since boot, from ``/proc/stat``; None without it.

    Busy is user + nice + system + irq + softirq + steal; total adds idle and iowait (guest time is
    already inside user and nice).
    """
    wanted = None if cpus is None else set(cpus)
    busy = total = 0
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            for line in handle:
                if not line.startswith("cpu"):
                    break  # the cpu lines come first
                name, *fields = line.split()
                if name == "cpu" or (wanted is not None and int(name[3:]) not in wanted):
                    continue
                ticks = [int(f) for f in fields[:8]]
                busy += sum(ticks[i] for i in _BUSY_COLUMNS if i < len(ticks))
                total += sum(ticks)
    except (OSError, ValueError):
        return None
    return (busy, total) if total else None


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
