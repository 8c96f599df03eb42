"""Sources compared on the same images: an ImageFolder folder, a CSV manifest, a JSON Lines multi-label manifest, a Dataset.

Usage:
    python benchmarks/bench_sources.py [--count 10000] [--repeats 3] [--dir /tmp/lightning_lmdb_bench]

On one folder of generated JPEGs (``benchmarks/common.py``, 10 classes) it writes a CSV manifest listing the same
files with the folder names as labels, a JSON Lines manifest giving each file 0-3 of 20 tags, a regression CSV
(two value columns), and an in-memory ``Dataset`` returning each file's bytes and class. Then, the median of
``--repeats`` runs each:

* **scan**: ``sources.scan_source`` of each (the folder: torchvision's ImageFolder scan; a manifest: parse, check
  every row, stat every image);
* **build**: ``build_lmdb`` of each (all cores, ``storage="auto"``), and its time against the folder's;
* **serve**: one pass over every sample of each database with ``LMDBImageDataset`` (``decoder="auto"``, in this
  process), samples/s against the folder's: what a typed target (a multi-hot or a value tensor built per sample)
  costs over a class index.

Every figure is a ratio to the folder's in the same run (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_jpeg_folder  # noqa: E402

from lightning_lmdb.build.writer import build_lmdb  # noqa: E402
from lightning_lmdb.read.dataset import LMDBImageDataset  # noqa: E402
from lightning_lmdb.sources.base import SourceOptions, scan_source  # noqa: E402


class FilesDataset:
    """A user's own Dataset: each file's bytes and its class index (what ``build_lmdb(dataset, ...)`` packs)."""

    def __init__(self, files: list[Path], targets: list[int]):
        self.files, self.targets = files, targets

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        return self.files[index].read_bytes(), self.targets[index]


def write_manifests(folder: Path) -> dict[str, tuple[object, dict]]:
    """Every source to compare: ``name -> (source, build options)``."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    rng = np.random.default_rng(0)
    rows = [{"path": p.relative_to(folder).as_posix(), "label": p.parent.name} for p in files]
    out = folder.parent / f"{folder.name}_manifests"
    out.mkdir(exist_ok=True)
    with (out / "classes.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, ["path", "label"])
        writer.writeheader()
        writer.writerows(rows)
    tags = [f"tag{k:02d}" for k in range(20)]
    with (out / "tags.jsonl").open("w") as handle:
        for row in rows:
            handle.write(json.dumps({"path": row["path"], "label": sorted(rng.choice(tags, rng.integers(0, 4), replace=False).tolist())})
                         + "\n")
    with (out / "values.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "x", "y"])
        writer.writerows([row["path"], f"{rng.normal():.4f}", f"{rng.normal():.4f}"] for row in rows)
    classes = sorted({row["label"] for row in rows})
    dataset = FilesDataset(files, [classes.index(row["label"]) for row in rows])
    return {
        "folder": (folder, {}),
        "CSV manifest (classes)": (out / "classes.csv", {"root": str(folder)}),
        "JSONL manifest (multi-label)": (out / "tags.jsonl", {"root": str(folder)}),
        "CSV manifest (regression, 2 values)": (out / "values.csv", {"root": str(folder), "label_column": "x,y",
                                                                      "target_kind": "regression"}),
        "Dataset (bytes, int)": (dataset, {"version": 1}),
    }


def timed(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def serve(path: Path) -> float:
    dataset = LMDBImageDataset(path, decoder="auto")
    started = time.perf_counter()
    for i in range(len(dataset)):
        dataset[i]
    return len(dataset) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_bench"))
    args = parser.parse_args()
    folder = make_jpeg_folder(args.dir / f"jpegs_{args.count}", args.count)
    sources = write_manifests(folder)
    out = args.dir / "sources_dbs"
    print(f"{args.count} JPEGs in {folder}; median of {args.repeats} runs; ratios to the folder's")
    print(f"{'source':38} {'scan s':>8} {'build s':>8} {'build x':>8} {'serve img/s':>12} {'serve x':>8}")
    base: tuple[float, float] | None = None
    for name, (source, options) in sources.items():
        manifest = SourceOptions.of(options)
        scan_s = timed(lambda s=source, m=manifest: scan_source(s, m), args.repeats) if name != "Dataset (bytes, int)" else float("nan")
        target = out / f"{name.split()[0].lower()}-{len(name)}.lmdb"

        def build_once(s=source, o=options, t=target) -> None:
            shutil.rmtree(out, ignore_errors=True)
            build_lmdb(s, t, progress=False, **o)

        build_s = timed(build_once, args.repeats)
        rate = statistics.median(serve(target) for _ in range(args.repeats))
        base = base or (build_s, rate)
        print(f"{name:38} {scan_s:8.2f} {build_s:8.2f} {build_s / base[0]:8.2f} {rate:12.0f} {rate / base[1]:8.2f}")


if __name__ == "__main__":
    main()
