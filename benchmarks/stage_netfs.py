"""First epoch on network storage with and without staging the database to local disk.

Usage:
    python benchmarks/stage_netfs.py SOURCE [--latency-ms 0.5] [--rounds 2] [--cache-dir DIR] [--local-dir DIR]

Builds (once) the database of the image folder SOURCE in ``--cache-dir``, then runs, alternating, ``--rounds``
times each: ``ExperimentDataModule(netfs_latency_ms=...)`` reading the database through a fresh latency mount
(:mod:`lightning_lmdb.tools.netfs`), and the same with ``local_cache_dir=`` (the database copied to local disk in
``prepare_data``, checked, then read there). Before every run the database's pages are evicted and the local
copy deleted, so each starts as a fresh node would. Each run is 2 epochs of the training loader (2 workers,
the default transforms, uint8 batches finished in this process), timed apart: ``stage_s`` (the staging copy,
in ``prepare_data``; ``on_stale="ignore"``, so no rescan of SOURCE), ``setup_s``, epoch 0 and epoch 1; the
mounts' start is not counted.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def run_once(source: Path, cache_dir: Path, local_dir: Path | None, latency_ms: float, workers: int) -> dict[str, float]:
    """One fresh run (in this process): prepare, setup, two epochs; returns seconds per phase."""
    import torch

    from lightning_lmdb.experiment.datamodule import ExperimentDataModule
    from lightning_lmdb.read.transforms import finish_batch
    from lightning_lmdb.tools import pagecache as cache

    torch.set_num_threads(1)
    datamodule = ExperimentDataModule(source, cache_dir=cache_dir, local_cache_dir=local_dir, netfs_latency_ms=latency_ms, image_size=64,
                                      batch_size=256, num_workers=workers, val_fraction=0, on_stale="ignore")
    cache.evict([datamodule.database_path("train")], sync=True)
    datamodule.prepare_data()
    datamodule.setup("fit")
    out = {"stage_s": 0.0} | {k: v for k, v in datamodule.timings.items() if k in ("stage_s", "setup_s")}
    loader = datamodule.train_dataloader()
    for epoch in range(2):
        started = time.perf_counter()
        for images, _ in loader:
            finish_batch(images)
        out[f"epoch{epoch}_s"] = time.perf_counter() - started
    out["samples"] = len(datamodule.datasets["train"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("--latency-ms", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/lightning_lmdb_stage/shared"))
    parser.add_argument("--local-dir", type=Path, default=Path("/tmp/lightning_lmdb_stage/local"))
    parser.add_argument("--child", choices=["direct", "staged"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import json

        local = args.local_dir if args.child == "staged" else None
        print(json.dumps(run_once(args.source.resolve(), args.cache_dir, local, args.latency_ms, args.workers)))
        return
    import json

    from lightning_lmdb import LMDBDataModule

    LMDBDataModule(args.source, cache_dir=args.cache_dir, val_fraction=0).prepare_data()  # the build, not measured
    results: dict[str, list[dict[str, float]]] = {"direct": [], "staged": []}
    for round_ in range(args.rounds):
        for mode in ("direct", "staged") if round_ % 2 == 0 else ("staged", "direct"):
            shutil.rmtree(args.local_dir, ignore_errors=True)
            done = subprocess.run([sys.executable, str(HERE), str(args.source), "--child", mode, "--latency-ms", str(args.latency_ms),
                                   "--workers", str(args.workers), "--cache-dir", str(args.cache_dir), "--local-dir", str(args.local_dir)],
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"the {mode} run failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results[mode].append(result)
            print(f"round {round_} {mode:6s} " + "  ".join(f"{k} {v:.2f}" for k, v in result.items()), flush=True)
    keys = ["stage_s", "setup_s", "epoch0_s", "epoch1_s"]
    print(f"\n{results['direct'][0]['samples']:.0f} samples, {args.workers} workers, {args.latency_ms:g} ms per request; "
          f"median of {args.rounds} runs each\n")
    print("| database read | " + " | ".join(keys) + " | stage + epoch 0 |")
    print("|---|" + "---:|" * (len(keys) + 1))
    for mode, runs in results.items():
        med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in keys}
        label = "through the mount" if mode == "direct" else "staged to local disk"
        print(f"| {label} | " + " | ".join(f"{med[k]:.2f}" for k in keys) + f" | {med['stage_s'] + med['epoch0_s']:.2f} |")


if __name__ == "__main__":
    main()
