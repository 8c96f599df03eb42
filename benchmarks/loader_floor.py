"""How close can any DataLoader get to the decode-only ceiling here? A control for benchmarks/peers.py.

Usage:
    python benchmarks/loader_floor.py DATABASE [--decoder auto] [--batch-size 256] [--rounds 4]

Three measurements, interleaved, per round, on the records of an existing database (e.g. one of the
stores ``benchmarks/peers.py`` builds under ``/tmp/lightning_lmdb_peers``):

* the **ceiling**: 2 forked processes decoding + transforming the record bytes, already in memory;
* **in memory, through a DataLoader**: a Dataset holding the same bytes in a list, 2 workers, the same
  decode and transform, batches finished (float) in the training process -- no LMDB, no statistics;
* the same without the finish;
* the database itself behind the same DataLoader (``LMDBImageDataset``, the same decode and transform), finished.

The ratios of the in-memory loaders to the ceiling are what torch's DataLoader itself leaves of it on
this machine, whatever the storage; the last one's gap to them is what the database's reads cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import ceiling  # noqa: E402

from lightning_lmdb import LMDBImageDataset  # noqa: E402
from lightning_lmdb.codec.storage import decode_record  # noqa: E402
from lightning_lmdb.read.transforms import eval_transform, finish_batch  # noqa: E402
from lightning_lmdb.store import database, envs
from lightning_lmdb.store import format as fmt  # noqa: E402

TRANSFORM = eval_transform(64)


class InMemory(Dataset):
    """The encoded records in a list; decoded and transformed like the benchmark's rows."""

    def __init__(self, blobs: list[bytes], codecs: list[int], decoder: str):
        self.blobs, self.codecs, self.decoder = blobs, codecs, decoder

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return TRANSFORM(decode_record(self.blobs[index], self.codecs[index], decoder=self.decoder)), 0


def one_pass(loader: DataLoader, finish: bool) -> float:
    count, started = 0, time.perf_counter()
    for images, _ in loader:
        if finish:
            images = finish_batch(images)
        count += len(images)
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("database", type=Path)
    parser.add_argument("--decoder", default="auto")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with envs.reading(args.database) as opened, opened.env.begin() as txn:
        blobs = [txn.get(fmt.record_key(i), db=opened.records) for i in range(txn.stat(opened.records)["entries"])]
    settings = {"batch_size": args.batch_size, "shuffle": True, "num_workers": 2, "persistent_workers": True}
    codecs = [int(c) for c in database.load_meta(args.database).codecs]
    loader = DataLoader(InMemory(blobs, codecs, args.decoder), **settings)
    served = DataLoader(LMDBImageDataset(args.database, TRANSFORM, decoder=args.decoder), **settings)
    one_pass(loader, finish=False)  # start the workers
    one_pass(served, finish=False)
    ratios: dict[str, list[float]] = {"in memory, finished": [], "in memory, uint8": [], "the database, finished": []}
    for round_ in range(args.rounds):
        top = ceiling("lmdb", args.decoder, None, {"path": str(args.database)}, 2)
        finished, raw, stored = one_pass(loader, finish=True), one_pass(loader, finish=False), one_pass(served, finish=True)
        ratios["in memory, finished"].append(finished / top)
        ratios["in memory, uint8"].append(raw / top)
        ratios["the database, finished"].append(stored / top)
        print(f"round {round_}: ceiling {top:.0f}/s; through the DataLoader {finished:.0f}/s finished ({finished / top:.2f}), "
              f"{raw:.0f}/s uint8 ({raw / top:.2f}); the database {stored:.0f}/s finished ({stored / top:.2f})", flush=True)
    for name, values in ratios.items():
        print(f"{name}: {statistics.median(values):.2f} of the ceiling (range {min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
