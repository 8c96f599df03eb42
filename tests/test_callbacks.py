"""PerfMonitor on a tiny CPU fit whose dataset sleeps a known time per item."""

from __future__ import annotations

import csv
import json
import logging
import math
import sys
import threading
import time
import types
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset

from lightning_lmdb.experiment.callbacks import PerfMonitor, _GpuUtilSampler, batch_size_of

TRAIN_ITEMS, VAL_ITEMS, BATCH = 24, 8, 4
TRAIN_SLEEP_S, VAL_SLEEP_S = 0.01, 0.02
NOT_AVAILABLE = "GPU utilisation not available"
CPU_METRICS = ("epoch_time_s", "samples_per_s", "data_wait_s", "data_wait_frac", "val_time_s")
GPU_METRICS = ("gpu_util_pct", "gpu_util_median_pct", "gpu_mem_peak_mb")


class SleepyDataset(Dataset):
    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.sleep_s)
        return torch.full((8,), float(i % 2)), torch.tensor(i % 2)


class TinyModule(pl.LightningModule):
    def __init__(self, fail_at_epoch: int | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 2)
        self.fail_at_epoch = fail_at_epoch

    def training_step(self, batch, batch_idx):
        if self.current_epoch == self.fail_at_epoch:
            raise RuntimeError("boom")
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(SleepyDataset(TRAIN_ITEMS, TRAIN_SLEEP_S), batch_size=BATCH)

    def val_dataloader(self):
        return DataLoader(SleepyDataset(VAL_ITEMS, VAL_SLEEP_S), batch_size=BATCH)


def _trainer(tmp_path: Path, monitor: PerfMonitor, **kwargs) -> pl.Trainer:
    return pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, callbacks=[monitor],
                      logger=CSVLogger(tmp_path, name="csv", version=0),
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, log_every_n_steps=1,
                      **kwargs)


@pytest.fixture
def lightning_logs(monkeypatch, caplog):
    """Let Lightning's rank-zero log lines reach caplog."""
    monkeypatch.setattr(logging.getLogger("lightning.pytorch"), "propagate", True)
    caplog.set_level(logging.INFO)
    return caplog


def test_fit_measures_and_reports(tmp_path, lightning_logs, capsys):
    summary_path = tmp_path / "run" / "perf_summary.json"
    monitor = PerfMonitor(summary_path, backend="raw", meta={"num_workers": 0})
    trainer = _trainer(tmp_path, monitor)
    trainer.fit(TinyModule())

    assert [r["epoch"] for r in monitor.history] == [0, 1]
    for rec in monitor.history:
        assert rec["data_wait_s"] >= TRAIN_ITEMS * TRAIN_SLEEP_S
        assert rec["data_wait_s"] <= rec["epoch_time_s"]
        assert 0.0 < rec["data_wait_frac"] <= 1.0
        assert rec["val_time_s"] >= VAL_ITEMS * VAL_SLEEP_S
        assert rec["samples"] == TRAIN_ITEMS and rec["batches"] == TRAIN_ITEMS // BATCH
        assert rec["samples_per_s"] == pytest.approx(TRAIN_ITEMS / rec["epoch_time_s"])
        assert all(rec[k] is None for k in GPU_METRICS)

    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    assert summary["backend"] == "raw" and summary["completed"] is True
    assert summary["gpu_available"] is False and summary["gpu_util_available"] is False
    assert summary["data_wait_method"] == "fetch"
    assert summary["meta"] == {"num_workers": 0}
    assert summary["epochs"] == monitor.history
    assert set(CPU_METRICS + GPU_METRICS + ("epoch", "samples", "batches")) <= set(
        summary["epochs"][0])

    with open(Path(trainer.logger.log_dir) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for key in CPU_METRICS:
        values = [float(r[f"perf/{key}"]) for r in rows if r.get(f"perf/{key}")]
        assert len(values) == 2, key
    assert not any(f"perf/{k}" in rows[0] for k in GPU_METRICS)
    assert float(rows[-1]["perf/epoch_time_s"]) == pytest.approx(monitor.history[-1]["epoch_time_s"])

    lines = [r.getMessage() for r in lightning_logs.records if NOT_AVAILABLE in r.getMessage()]
    assert len(lines) == 1, lines
    out = capsys.readouterr().out
    assert "samples/s" in out and "n/a" in out
    assert "start" not in trainer.profiler.__dict__  # profiler wrapper removed


def test_exception_stops_and_writes_incomplete_summary(tmp_path, monkeypatch):
    # Also covers the fallback used when Lightning sends no fetch events to the profiler.
    monkeypatch.setattr("lightning_lmdb.experiment.callbacks.FETCH_ACTION_SUFFIX", ".no_such_action")
    summary_path = tmp_path / "perf_summary.json"
    monitor = PerfMonitor(summary_path, backend="lmdb", verbose=False)
    trainer = _trainer(tmp_path, monitor)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(TinyModule(fail_at_epoch=1))
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    assert summary["completed"] is False and len(summary["epochs"]) == 1
    assert summary["data_wait_method"] == "hook_gap"
    assert summary["epochs"][0]["data_wait_s"] >= TRAIN_ITEMS * TRAIN_SLEEP_S
    assert monitor._sampler is None and "start" not in trainer.profiler.__dict__


def test_batch_size_of():
    assert batch_size_of((torch.zeros(5, 3), torch.zeros(5))) == 5
    assert batch_size_of({"meta": [torch.tensor(1.0)], "x": torch.zeros(7, 2)}) == 7
    assert batch_size_of(["a", 3]) is None


def test_sampler_thread_with_fake_nvml(monkeypatch):
    calls: list[str] = []
    fake = types.SimpleNamespace(
        NVMLError=RuntimeError,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByUUID=lambda uuid: (_ for _ in ()).throw(RuntimeError("no uuid")),
        nvmlDeviceGetHandleByIndex=lambda i: f"handle{i}",
        nvmlDeviceGetName=lambda h: b"Fake GPU",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=42),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = _GpuUtilSampler(0, interval_s=0.005)
    assert sampler.name == "Fake GPU"
    time.sleep(0.03)
    assert sampler.take() == []  # inactive: no samples
    sampler.active.set()
    samples: list[float] = []
    deadline = time.monotonic() + 30  # a busy machine may run the thread late: wait for it, do not bound how soon
    while not samples and time.monotonic() < deadline:
        time.sleep(0.01)
        samples = sampler.take()
    assert samples and set(samples) == {42.0}
    sampler.close()
    assert calls == ["init", "shutdown"]
    assert not any(t.name == "PerfMonitor-nvml" for t in threading.enumerate())


def test_rejects_bad_interval():
    with pytest.raises(ValueError, match="gpu_sample_interval_s"):
        PerfMonitor(gpu_sample_interval_s=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_metrics_are_numbers(tmp_path):
    monitor = PerfMonitor(tmp_path / "perf_summary.json", gpu_sample_interval_s=0.01,
                          verbose=False)
    trainer = pl.Trainer(max_epochs=1, accelerator="gpu", devices=1, callbacks=[monitor],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(TinyModule())
    rec = monitor.history[0]
    for key in GPU_METRICS:
        assert isinstance(rec[key], float) and math.isfinite(rec[key]), key
    assert 0.0 <= rec["gpu_util_pct"] <= 100.0 and rec["gpu_mem_peak_mb"] > 0.0
    summary = json.loads((tmp_path / "perf_summary.json").read_text(encoding="utf-8"))
    assert summary["gpu_available"] is True and summary["gpu_util_available"] is True


class SlowTransferModule(TinyModule):
    """The data arrives instantly, but each batch spends TRANSFER_SLEEP_S on its way to the device (the batch hooks),
    and each training step takes STEP_SLEEP_S: known time on each side of the data wait."""

    def on_before_batch_transfer(self, batch, dataloader_idx):
        time.sleep(TRANSFER_SLEEP_S / 2)
        return batch

    def on_after_batch_transfer(self, batch, dataloader_idx):
        time.sleep(TRANSFER_SLEEP_S / 2)
        return batch

    def training_step(self, batch, batch_idx):
        time.sleep(STEP_SLEEP_S)
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return DataLoader(SleepyDataset(TRAIN_ITEMS, 0.0), batch_size=BATCH)


TRANSFER_SLEEP_S, STEP_SLEEP_S = 0.03, 0.03


def test_data_wait_includes_the_batch_transfer_hooks(tmp_path):
    # work moved into on_before/after_batch_transfer (a batched GPU decode, the uint8 finish) must not look like less waiting,
    # and the step must not look like waiting. Only lower bounds from the sleeps: a loaded machine only adds time.
    monitor = PerfMonitor(None, verbose=False)
    _trainer(tmp_path, monitor, limit_val_batches=0).fit(SlowTransferModule())
    batches = TRAIN_ITEMS // BATCH
    assert len(monitor.history) == 2, monitor.history
    for rec in monitor.history:
        assert rec["batches"] == batches
        assert rec["batch_transfer_s"] >= batches * TRANSFER_SLEEP_S, rec
        assert rec["data_wait_s"] >= rec["batch_transfer_s"], rec
        assert rec["epoch_time_s"] - rec["data_wait_s"] >= batches * STEP_SLEEP_S, f"the steps' sleep counted as waiting: {rec}"
        assert rec["data_wait_frac"] == pytest.approx(rec["data_wait_s"] / rec["epoch_time_s"])
