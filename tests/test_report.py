"""A/B report from two summaries shaped exactly like PerfMonitor writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from lightning_lmdb.callbacks import PerfMonitor
from lightning_lmdb.report import (SUMMARY_NAME, comparison_table, load_summaries,
                                   plot_comparison, write_comparison)


def _write_run(run_dir: Path, backend: str, times: list[float], wait_frac: float,
               gpu: float | None) -> None:
    monitor = PerfMonitor(backend=backend, meta={"backend": backend, "batch_size": 64})
    monitor.history = [
        {"epoch": i, "epoch_time_s": t, "batches": 10, "samples": 640, "samples_per_s": 640 / t,
         "data_wait_s": t * wait_frac, "data_wait_frac": wait_frac, "val_time_s": 0.5,
         "gpu_util_pct": gpu, "gpu_util_median_pct": gpu,
         "gpu_mem_peak_mb": None if gpu is None else 512.0}
        for i, t in enumerate(times)]
    run_dir.mkdir(parents=True)
    (run_dir / SUMMARY_NAME).write_text(json.dumps(monitor.summary()), encoding="utf-8")


@pytest.fixture
def multirun(tmp_path) -> Path:
    _write_run(tmp_path / "0", "raw", [10.0, 8.0, 8.0], 0.6, None)
    _write_run(tmp_path / "1", "lmdb", [5.0, 4.0, 4.0], 0.1, 85.0)
    (tmp_path / "1" / ".hydra").mkdir()  # unrelated files are ignored
    return tmp_path


def test_table_has_both_backends_and_speedup(multirun):
    summaries = load_summaries(multirun)
    assert [s["label"] for s in summaries] == ["raw", "lmdb"]
    table = comparison_table(summaries)
    header = table.splitlines()[0]
    assert "raw" in header and "lmdb" in header
    assert "epoch 1 (cold)" in table and "warm" in table
    speedups = [line.split()[-2:] for line in table.splitlines() if "speedup vs raw" in line]
    assert speedups == [["1.00x", "2.00x"], ["1.00x", "2.00x"]]
    assert "n/a" in table and "85.0" in table and "60.0" in table


def test_write_comparison_writes_txt_and_valid_png(multirun):
    txt, png = write_comparison(multirun)
    assert txt == multirun / "comparison.txt" and png == multirun / "comparison.png"
    assert "speedup vs raw" in txt.read_text(encoding="utf-8")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as image:
        image.verify()
        assert image.size[0] > 400


def test_no_reference_and_incomplete_runs(tmp_path):
    _write_run(tmp_path / "a", "lmdb", [3.0], 0.2, None)
    summary = json.loads((tmp_path / "a" / SUMMARY_NAME).read_text())
    summary["completed"] = False
    (tmp_path / "a" / SUMMARY_NAME).write_text(json.dumps(summary))
    table = comparison_table(load_summaries(tmp_path))
    assert "lmdb*" in table and "did not complete" in table
    assert "speedup vs raw" in table and "n/a" in table
    plot_comparison(load_summaries(tmp_path), tmp_path / "out" / "plot.png")
    assert (tmp_path / "out" / "plot.png").stat().st_size > 0


def test_errors_name_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="perf_summary.json"):
        load_summaries(tmp_path)
    (tmp_path / SUMMARY_NAME).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_summaries(tmp_path)
