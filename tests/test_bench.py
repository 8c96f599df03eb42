"""The read benchmark on a tiny folder: every row, positive numbers, a cold regime that really was cold."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lightning_lmdb.bench import REGIMES, STORAGES, run_read_benchmark
from lightning_lmdb.cli import main


@pytest.fixture
def jpeg_folder(tmp_path: Path) -> Path:
    """30 small JPEGs in three classes."""
    rng = np.random.default_rng(0)
    root = tmp_path / "src"
    for i in range(30):
        path = root / f"class_{i % 3}" / f"img_{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (40 + i, 48, 3), dtype=np.uint8)).save(path, quality=90)
    return root


def test_run_read_benchmark(jpeg_folder: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    rows = run_read_benchmark(jpeg_folder, tmp_path / "db.lmdb", passes=2, workers=0, decode=True, out=lines.append)
    assert {(r["storage"], r["regime"]) for r in rows} == {(name, regime) for name, _ in STORAGES for regime in REGIMES}
    for r in rows:
        assert r["samples"] == 30
        assert r["seconds"] > 0 and r["samples_per_s"] > 0 and r["mb_per_s"] > 0 and r["vs_raw"] > 0
        assert len(r["pass_seconds"]) == 2
        if r["regime"] == "cold":
            assert r["evicted"] is True, r
            assert r["resident_before"] <= 0.05
        else:
            assert r["evicted"] is None and r["resident_before"] is None
    assert all(r["vs_raw"] == 1.0 for r in rows if r["storage"] == "raw")
    assert not any(line.startswith("warning") for line in lines), lines
    assert any("lmdb readahead=off" in line for line in lines)


def test_limit_and_bad_arguments(jpeg_folder: Path, tmp_path: Path) -> None:
    rows = run_read_benchmark(jpeg_folder, tmp_path / "db.lmdb", passes=1, limit=7, workers=0, out=lambda _: None)
    assert {r["samples"] for r in rows} == {7}
    with pytest.raises(ValueError, match="passes=0"):
        run_read_benchmark(jpeg_folder, tmp_path / "db.lmdb", passes=0, out=lambda _: None)
    with pytest.raises(ValueError, match="limit=0"):
        run_read_benchmark(jpeg_folder, tmp_path / "db.lmdb", limit=0, out=lambda _: None)


def test_cli_bench(jpeg_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "cli.lmdb"
    assert main(["bench", str(jpeg_folder), str(target), "--passes", "1", "--workers", "0", "--limit", "10"]) == 0
    printed = capsys.readouterr().out
    assert target.exists()
    for name, _ in STORAGES:
        assert name in printed
    assert "10 of 30 records" in printed
    assert main(["bench", str(tmp_path / "missing"), str(target)]) == 2
    assert "missing" in capsys.readouterr().err


@pytest.mark.slow
def test_peers_benchmark_runs_every_kind_of_row(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(script), "--photos", "0", "--pngs", "24", "--rounds", "1", "--dir", str(tmp_path),
                           "--out", str(out), "--warm-passes", "2", "--only", "LitData", "WebDataset", "auto, decode_size", "decoded"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (out / "peers.md").read_text()
    for row in ("ImageFolder (PIL)", "LitData (torchvision.io)", "WebDataset (PIL)", "lmdb auto, decode_size (default)",
                "lmdb decoded storage", "raw files, auto, decode_size"):
        line = next(line for line in table.splitlines() if line.startswith(f"| {row}") or line.startswith(f"| **{row}"))
        cold, warm = (float(cell.strip().rstrip("x")) for cell in line.split("|")[5:8:2])
        assert cold > 0 and warm > 0, line
    assert "| ImageFolder (PIL) |" in table and "| auto, decode_size 73 |" in table, "the ceilings of the measured decoders"
    assert "reduced-size decoding" in table and (out / "peers.png").stat().st_size > 10_000
    import json
    import statistics

    rows = json.loads((out / "peers.json").read_text())["results"]["pngs"]["rows"]
    assert all(len(r["warm_passes"]) == 2 and r["warm"] == statistics.median(r["warm_passes"]) for runs in rows.values() for r in runs)
    from lightning_lmdb import netfs

    try:
        netfs.check_available()
    except netfs.NetfsUnavailableError:
        return
    done = subprocess.run([sys.executable, str(script), "--photos", "0", "--pngs", "24", "--rounds", "1", "--dir", str(tmp_path),
                           "--out", str(out), "--latency-ms", "0", "2"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (out / "peers_netfs.md").read_text().splitlines()
    table_rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("| ")]
    rows = {(cells[0].strip("*"), float(cells[1])): cells for cells in table_rows if cells[1][:1].isdigit()}
    for row in ("ImageFolder (PIL)", "LitData (torchvision.io)", "lmdb auto, decode_size (default)", "raw files, auto, decode_size"):
        for ms in (0.0, 2.0):
            cells = rows[row, ms]
            assert float(cells[3]) > 0 and float(cells[5]) > 0, cells
    assert float(rows["raw files, auto, decode_size", 2.0][2]) >= 24 * 2e-3, "its scan stats every file: a round trip each"
    assert any("copies its chunks to a local cache" in line for line in lines)
