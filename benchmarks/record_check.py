"""Checksum on read: what checking every record against its stored checksum costs, on the peers benchmark's rows.

Usage:
    python benchmarks/record_check.py                                   # 1,000 photos, 500 PNGs, 3 rounds
    python benchmarks/record_check.py --photos 2000 --pngs 0 --rounds 5

Two rows of ``benchmarks/peers.py``, each loader made as there (:func:`peers.make_loader`: 2 DataLoader workers, batches of
256, shuffled, the batches finished as ``float32`` in the training process), with the check on and off:

* the default row (``storage="auto"``, the ``auto`` decoder, ``decode_size`` 73): JPEG records checked (``xxh3-64``), zstd
  pixel records relying on their frame's checksum;
* ``storage="decoded"`` (raw pixels: no decode to hide the check; every record checked).

Off is :data:`lightning_lmdb.read.dataset.CHECK_RECORDS` set to ``False`` in the measuring process when the loader's persistent
workers fork (they keep it): a benchmark-only switch. Each round is a fresh process holding both loaders, whose warm
passes alternate on, off, off, on, ... (``--warm-passes`` of each; this machine is shared and noisy, and drifts between
processes); a round's ratio is its median pass on over its median pass off (throughput), and the report gives each round's
and their median. Also, per store, a single-process figure: the
time of ``ds[i]`` over every record, on and off alternating pass by pass (no DataLoader), and the stored checksum's own time
(:func:`lightning_lmdb.store.format.checksum`) over
the records' bytes. Writes ``record_check.json`` and ``record_check.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import peers  # noqa: E402
from common import make_photo_folder, make_png_folder  # noqa: E402

ROWS = [("default: auto, decode_size", {"storage": "auto", "decoder": "auto", "decode_size": peers.SIDE}),
        ("decoded storage", {"storage": "decoded", "decoder": "auto"})]


def _pass(loader: Any) -> float:
    """Samples/s of one pass of ``loader``, each batch finished as ``float32`` (as :func:`peers.measure` does)."""
    import torch

    from lightning_lmdb.read.transforms import finish_batch

    count, started = 0, time.perf_counter()
    for images, _ in loader:
        if images.dtype == torch.uint8:
            images = finish_batch(images)
        count += len(images)
    return count / (time.perf_counter() - started)


def _child(payload: dict[str, Any]) -> None:
    """One round: a loader with the check on and one with it off (each :func:`peers.make_loader`'s, persistent workers forked
    with the switch set), then their warm passes alternated on, off, off, on, ..."""
    import torch

    from lightning_lmdb.read import dataset

    torch.set_num_threads(1)
    loaders = {}
    for check in (True, False):
        dataset.CHECK_RECORDS = check  # the workers fork at the first pass and keep it
        loaders[check] = peers.make_loader("lmdb", payload["options"], payload["store"], payload["workers"], payload["batch_size"])
        _pass(loaders[check])  # starts the workers, warms the page cache
    passes: dict[bool, list[float]] = {True: [], False: []}
    for p in range(2 * payload["warm_passes"]):
        check = p % 4 in (0, 3)
        passes[check].append(_pass(loaders[check]))
    print(json.dumps({"on": statistics.median(passes[True]), "off": statistics.median(passes[False]), "passes": passes}), flush=True)


def _measure(payload: dict[str, Any]) -> dict[str, Any]:
    return peers.run_measure(payload, HERE)


def in_process(path: str, options: dict[str, Any], passes: int) -> dict[str, float]:
    """Microseconds per ``ds[i]`` (every record, shuffled) with the check on and off, alternating pass by pass; the median
    pass of each; and the checksum's microseconds per record over the records' bytes."""
    import random

    import torch

    from lightning_lmdb import LMDBImageDataset
    from lightning_lmdb.read import dataset
    from lightning_lmdb.read.transforms import eval_transform
    from lightning_lmdb.store import envs
    from lightning_lmdb.store import format as fmt

    torch.set_num_threads(1)
    ds = LMDBImageDataset(path, eval_transform(peers.SIZE), decoder=options["decoder"], decode_size=options.get("decode_size"))
    order = list(range(len(ds)))
    random.Random(0).shuffle(order)
    for i in order:  # warm the page cache and first-call costs
        ds[i]
    times: dict[bool, list[float]] = {True: [], False: []}
    for p in range(2 * passes):
        check = p % 4 in (0, 3)  # on, off, off, on, ...: neither side always first
        dataset.CHECK_RECORDS = check
        started = time.perf_counter()
        for i in order:
            ds[i]
        times[check].append((time.perf_counter() - started) / len(order) * 1e6)
    dataset.CHECK_RECORDS = True
    opened = envs.shared(path)
    with opened.env.begin(buffers=True) as txn:
        values = [bytes(txn.get(fmt.record_key(i), db=opened.records)) for i in range(len(ds))]
    started = time.perf_counter()
    for _ in range(5):
        for value in values:
            fmt.checksum(value)
    crc = (time.perf_counter() - started) / (5 * len(values)) * 1e6
    return {"on_us": statistics.median(times[True]), "off_us": statistics.median(times[False]), "check_us": crc,
            "record_kb": sum(map(len, values)) / len(values) / 1e3}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=1000, help="ImageNet-like JPEGs (0: skip)")
    parser.add_argument("--pngs", type=int, default=500, help="mixed-mode PNGs (0: skip)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--warm-passes", type=int, default=4, help="warm passes of each loader per round")
    parser.add_argument("--passes", type=int, default=5, help="single-process passes with the check on (and as many off)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_record_check"))
    parser.add_argument("--out", type=Path, default=HERE.parent / "results")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(json.loads(sys.stdin.read()))
        return
    from lightning_lmdb.build.writer import build

    folders = {}
    if args.photos:
        folders["photos"] = make_photo_folder(args.dir / f"photos_{args.photos}", args.photos)
    if args.pngs:
        folders["pngs"] = make_png_folder(args.dir / f"pngs_{args.pngs}", args.pngs)
    results: dict[str, Any] = {}
    machine = peers.machine()
    lines = [f"Checksum on read, {args.rounds} rounds; {args.workers} workers, batches of {args.batch_size}; machine: {machine}", ""]
    for folder, source in folders.items():
        for label, options in ROWS:
            path = args.dir / f"{folder}-{options['storage']}.lmdb"
            build(source, path, storage=options["storage"], workers=args.workers, progress=False)
            store = peers._store(path, [str(path)], None)
            rounds = []
            for round_ in range(args.rounds):
                payload = {"label": label, "options": options, "store": store, "workers": args.workers, "batch_size": args.batch_size,
                           "warm_passes": args.warm_passes}
                got = _measure(payload)
                rounds.append({"on": got["on"], "off": got["off"], "ratio": got["on"] / got["off"]})
                print(f"{folder} {label:28s} round {round_}: on {rounds[-1]['on']:7.0f}/s  off {rounds[-1]['off']:7.0f}/s  "
                      f"ratio {rounds[-1]['ratio']:.3f}", flush=True)
            single = in_process(str(path), options, args.passes)
            print(f"{folder} {label:28s} single process: on {single['on_us']:.0f} us  off {single['off_us']:.0f} us  "
                  f"checksum {single['check_us']:.1f} us / record of {single['record_kb']:.1f} KB", flush=True)
            ratio = statistics.median(r["ratio"] for r in rounds)
            results[f"{folder}: {label}"] = {"rounds": rounds, "median_ratio": ratio, "single": single, "options": options}
    lines += ["| folder: row | loader on / off, per round | median | cost | single process on / off (us per sample) | "
              "checksum per record |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        per_round = ", ".join(f"{x['on']:.0f}/{x['off']:.0f} ({x['ratio']:.3f})" for x in r["rounds"])
        s = r["single"]
        lines.append(f"| {name} | {per_round} | {r['median_ratio']:.3f} | {1 - r['median_ratio']:+.1%} | "
                     f"{s['on_us']:.0f} / {s['off_us']:.0f} ({s['on_us'] / s['off_us'] - 1:+.1%}) | "
                     f"{s['check_us']:.1f} us ({s['record_kb']:.1f} KB) |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "record_check.md").write_text(text)
    (args.out / "record_check.json").write_text(json.dumps({"machine": machine, "argv": sys.argv[1:], "results": results}, indent=1))


if __name__ == "__main__":
    main()
