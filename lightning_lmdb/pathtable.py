"""Relative paths as one UTF-8 blob plus offsets (:class:`PathTable`): a database's ``meta/paths`` array, read back.

Re-exported by :mod:`lightning_lmdb.store.format`, where callers find it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class PathTable:
    """Relative paths as one UTF-8 blob plus offsets: no Python object per path, cheap to share with workers.

    ``table[i]`` decodes path ``i``; ``len(table)``; ``table.tolist()``.
    """

    __slots__ = ("blob", "offsets")

    def __init__(self, blob: np.ndarray, offsets: np.ndarray):
        self.blob, self.offsets = blob, offsets

    @classmethod
    def from_strings(cls, paths: Iterable[str]) -> PathTable:
        """Pack strings (file names that are not valid UTF-8 kept with ``surrogateescape``)."""
        encoded = [p.encode("utf-8", "surrogateescape") for p in paths]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> str:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"path index {index} out of range for {len(self)} paths.")
        start, stop = int(self.offsets[index]), int(self.offsets[index + 1])
        return self.blob[start:stop].tobytes().decode("utf-8", "surrogateescape")

    def tolist(self) -> list[str]:
        """Every path as a string (one Python object each: for tools, not for per-sample paths)."""
        return [self[i] for i in range(len(self))]
