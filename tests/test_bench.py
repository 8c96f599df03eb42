"""The read benchmark on a tiny folder: every row, positive numbers, a cold regime that really was cold."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from ci import require
from PIL import Image

from lightning_lmdb.build.writer import build_lmdb
from lightning_lmdb.tools import netfs
from lightning_lmdb.tools.bench import REGIMES, STORAGES, run_read_benchmark
from lightning_lmdb.tools.cli import main


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
    file_bytes = sum(f.stat().st_size for f in jpeg_folder.rglob("*.jpg"))
    raw_rate = {r["regime"]: r["samples_per_s"] for r in rows if r["storage"] == "raw"}
    for r in rows:
        assert r["samples"] == 30
        # every figure follows from the passes' times and what was read: each storage read every file's bytes once a pass
        assert len(r["pass_seconds"]) == 2 and r["seconds"] == statistics.median(r["pass_seconds"]) > 0
        assert r["samples_per_s"] == pytest.approx(30 / r["seconds"])
        assert r["mb_per_s"] * r["seconds"] * 1e6 == pytest.approx(file_bytes), "the encoded records are the files' bytes"
        assert r["vs_raw"] == pytest.approx(r["samples_per_s"] / raw_rate[r["regime"]])
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


PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"
#: The cheapest run that still has every kind of row: 8 PNGs, 1 worker, batches of 4, one round.
PEERS_RUN = ["--photos", "0", "--pngs", "8", "--icons", "0", "--rounds", "1", "--workers", "1", "--batch-size", "4"]


def _benchmark_module(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """``benchmarks/NAME.py``, imported for this test (the benchmark scripts are not a package; a process pool finds it by name)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", PEERS.parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    monkeypatch.setattr(sys, "path", list(sys.path))  # peers.py puts benchmarks/ first
    spec.loader.exec_module(module)
    return module


def test_icon_folder_has_every_mode_and_small_sides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    common = _benchmark_module("common", monkeypatch)
    root = common.make_icon_folder(tmp_path / "icons", 21, seed=3)
    files = sorted(root.rglob("*.png"))
    assert len(files) == 21 and (root / ".complete").read_text() == "21"
    kinds, sides = set(), []
    for path in files:
        with Image.open(path) as img:
            kinds.add(img.mode + (" + transparency" if "transparency" in img.info else ""))
            assert img.width == img.height, path
            sides.append(img.width)
    assert kinds == {"RGBA", "RGB", "L", "LA", "P", "P + transparency"}
    assert 16 <= min(sides) and max(sides) <= 256
    assert common.median_file_bytes(root) == statistics.median(path.stat().st_size for path in files)
    assert common.make_icon_folder(tmp_path / "icons", 21, seed=3) == root, "generated once, then reused"


def test_peers_ceiling_reports_a_failed_decode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode that fails in a ceiling's worker is an error naming the store, not a parent waiting forever on its result."""
    source = tmp_path / "src" / "a"
    source.mkdir(parents=True)
    for i in range(4):
        Image.new("RGB", (20 + i, 16), (i * 40, 0, 0)).save(source / f"{i}.png")
    database = build_lmdb(tmp_path / "src", tmp_path / "db.lmdb", storage="encoded", workers=0, progress=False)
    peers = _benchmark_module("peers", monkeypatch)
    with pytest.raises(RuntimeError, match=r"ceiling of .*db\.lmdb failed: .*no-such-decoder"):
        peers.ceiling("lmdb", "no-such-decoder", None, {"path": str(database)}, workers=2)


def _peers(tmp: Path, out: Path, *args: str) -> None:
    """Run benchmarks/peers.py (its stores under ``tmp``, reused by a later run) and check it succeeded."""
    done = subprocess.run([sys.executable, str(PEERS), *PEERS_RUN, "--dir", str(tmp), "--out", str(out), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def _table_rows(text: str, header: str) -> dict[str, list[str]]:
    """The data rows of the markdown table whose header row starts with ``header``, by their first cell (bold marks removed)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header)) + 2  # past the header and its |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return {cells[0].strip("*"): cells for cells in rows}


@pytest.fixture(scope="module")
def peers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The peers benchmark's folder and stores, shared by its runs (LitData's build alone takes seconds)."""
    missing = [name for name in ("litdata", "webdataset") if importlib.util.find_spec(name) is None]
    require(not missing, f"the benchmark peers {missing} are not installed: pip install -e '.[bench]'")
    return tmp_path_factory.mktemp("peers")


def _sizes(files: list[Path]) -> tuple[int, int]:
    """(apparent bytes, allocated bytes) of ``files``, from the file system."""
    stats = [os.stat(f) for f in files]
    return sum(st.st_size for st in stats), sum(st.st_blocks * 512 for st in stats)


def _check_stores(result: dict[str, Any], table: dict[str, list[str]]) -> None:
    """Each row's store is the one its storage names, and the size columns are that store's bytes and disk blocks."""
    stores = result["stores"]
    assert result["row_stores"]["**lmdb auto, decode_size (default)**"] == "lmdb-auto"
    assert {name for name in stores if name.startswith("lmdb")} == {"lmdb-auto", "lmdb-encoded", "lmdb-decoded", "lmdb-auto-resize80",
                                                                    "lmdb-decoded-resize80"}
    files = sorted(Path(stores["files"]["path"]).rglob("*.png"))
    assert (stores["files"]["bytes"], stores["files"]["disk_bytes"]) == _sizes(files)
    for name in ("lmdb-auto", "lmdb-encoded"):
        assert (stores[name]["bytes"], stores[name]["disk_bytes"]) == _sizes([Path(stores[name]["path"])]), name
    for label, name in result["row_stores"].items():
        size, disk = (float(cell) for cell in table[label.strip("*")][2:4])
        assert (size, disk) == pytest.approx((stores[name]["bytes"] / 1e6, stores[name]["disk_bytes"] / 1e6), rel=0.01), label


@pytest.mark.slow
def test_peers_benchmark_runs_every_kind_of_row(peers_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _peers(peers_dir, out, "--warm-passes", "2", "--only", "LitData", "WebDataset", "auto, decode_size", "lmdb decoded")
    result = json.loads((out / "peers.json").read_text())["results"]["pngs"]
    rows = result["rows"]
    assert set(rows) == {"ImageFolder (PIL)", "LitData (torchvision.io)", "WebDataset (PIL)", "lmdb encoded storage, auto, decode_size",
                         "**lmdb auto, decode_size (default)**", "lmdb decoded storage", "raw files, auto, decode_size"}
    text = (out / "peers.md").read_text()
    table = _table_rows(text, "| loader |")
    base = rows["ImageFolder (PIL)"][0]
    for label, (run,) in rows.items():
        assert len(run["warm_passes"]) == 2 and run["warm"] == statistics.median(run["warm_passes"]), label
        assert run["cold_cached"] <= 0.05, f"{label}: the cold pass was not cold ({run['cold_cached']:.0%} of a file still cached)"
        # the table shows what was measured: each row's figures and its ratios to ImageFolder's, recomputed here
        cells = table[label.strip("*")]
        assert [cells[4], cells[6]] == [f"{run['cold']:.0f}", f"{run['warm']:.0f}"], (label, cells)
        assert [cells[5], cells[7]] == [f"{run['cold'] / base['cold']:.2f}x", f"{run['warm'] / base['warm']:.2f}x"], (label, cells)
    assert table["ImageFolder (PIL)"][1] == "-" and float(table["lmdb decoded storage"][1]) >= 0, "build seconds: ours, not the folder's"
    _check_stores(result, table)
    ratio = result["stores"]["lmdb-auto"]["bytes"] / result["stores"]["files"]["bytes"]
    assert f'the default database (storage="auto") is {ratio:.2f}x the files\' bytes' in text
    # the ceilings of the measured decoders: the auto decoder on the files' bytes, and the default (zstd pixels for PNGs)
    assert result["ceiling_rows"] == {"ImageFolder (PIL)": "ImageFolder (PIL)",
                                      "encoded storage, auto, decode_size 73": "lmdb encoded storage, auto, decode_size",
                                      "auto storage, auto, decode_size 73": "**lmdb auto, decode_size (default)**"}
    assert all(rows[label][0]["ceiling"] > 0 for label in result["ceiling_rows"].values())
    assert result["bounds"]["images"] == 8 and (out / "peers.png").stat().st_size > 10_000


@pytest.mark.slow
def test_peers_benchmark_icons_folder(peers_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _peers(peers_dir, out, "--pngs", "0", "--icons", "8", "--no-peers", "--warm-passes", "1", "--only", "(default)")
    result = json.loads((out / "peers.json").read_text())["results"]
    assert list(result) == ["icons"]
    icons = sorted((peers_dir / "icons_8").rglob("*.png"))
    median = statistics.median(path.stat().st_size for path in icons) / 1e3
    assert result["icons"]["description"] == f"8 small mixed-mode PNG icons, 16-256 px (median {median:.1f} KB)"
    assert set(result["icons"]["rows"]) == {"ImageFolder (PIL)", "**lmdb auto, decode_size (default)**"}
    text = (out / "peers.md").read_text()
    assert "### icons: 8 small mixed-mode PNG icons" in text
    _check_stores(result["icons"], _table_rows(text, "| loader |"))


LATENCY_MS = 20.0


@pytest.mark.slow
def test_peers_benchmark_through_a_latency_mount(peers_dir: Path, tmp_path: Path) -> None:
    require(importlib.util.find_spec("mfusepy") is not None, "mfusepy is not installed: pip install -e '.[netfs]'")
    try:
        netfs.check_available()
    except netfs.NetfsUnavailableError as exc:
        require(False, str(exc))
    out = tmp_path / "out"
    # the mounted rows of ours and ImageFolder (the peers' rows are the same code path as in the test above; --no-peers: their
    # stores are not built, should this test run first or in another process than that one)
    _peers(peers_dir, out, "--no-peers", "--warm-passes", "1", "--latency-ms", f"{LATENCY_MS:g}", "--only", "auto, decode_size")
    text = (out / "peers_netfs.md").read_text()
    rows = _table_rows(text, "| loader |")
    assert set(rows) == {"ImageFolder (PIL)", "lmdb auto, decode_size (default)", "raw files, auto, decode_size"}
    assert all(float(cells[1]) == LATENCY_MS for cells in rows.values())
    # the injected latency bounds what was measured, whatever the load: one worker reading one file after another pays at
    # least one round trip a file, and the raw files' scan stats every file
    for label in ("ImageFolder (PIL)", "raw files, auto, decode_size"):
        cold, warm = float(rows[label][3]), float(rows[label][5])
        assert cold <= 1e3 / LATENCY_MS and warm <= 1e3 / LATENCY_MS, rows[label]
    assert float(rows["raw files, auto, decode_size"][2]) >= 8 * LATENCY_MS / 1e3, "its scan stats every file: a round trip each"
