"""The A/B job order: repeats, with the arms interleaved so drift spreads evenly (used by the ``ABSweeper`` plugin).

``python train.py -m data=raw,lmdb`` asks Hydra for the cartesian product of the swept values, run in
order (raw, lmdb). A comparison on a shared machine needs repeats, and repeats run in blocks (raw,
raw, raw, lmdb, lmdb, lmdb) would give one backend the quiet minutes and the other the busy ones.
The ``ABSweeper`` (a Hydra sweeper plugin, ``hydra_plugins/lightning_lmdb_ab/`` beside ``train.py``:
Hydra loads plugins only from that package) runs ``ab.repeats`` rounds of the product, reversing the
order every other round: raw, lmdb, lmdb, raw, raw, lmdb. Each job gets ``ab.repeat=<round>``. The comparison is written once,
at the end of the multirun, from every job's summary (:class:`lightning_lmdb.experiment.report.ABReport`).
"""

from __future__ import annotations


def interleave(jobs: list[list[str]], repeats: int, max_batch_size: int | None = None) -> list[list[list[str]]]:
    """``repeats`` rounds of ``jobs``, every other round reversed, each job with ``ab.repeat=<round>``, batched."""
    ordered = [[*job, f"ab.repeat={r}"] for r in range(repeats) for job in (jobs if r % 2 == 0 else jobs[::-1])]
    size = len(ordered) if max_batch_size in (None, -1) else max_batch_size
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]
