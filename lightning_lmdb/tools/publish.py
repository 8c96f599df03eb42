"""Publish a database to object storage (:func:`push`) and serve it from there (:func:`pull`): ``lightning-lmdb push`` / ``pull``.

The format (parts under ``URL/parts/<build_id>/``, the marker ``URL/lightning_lmdb.json`` written last) and the push itself
are in :mod:`lightning_lmdb.store.published`; the download in :func:`lightning_lmdb.tools.staging.stage_remote`.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning_lmdb.store.published import PushReport, open_published, push
from lightning_lmdb.tools.staging import StageReport, stage_remote

__all__ = ["PushReport", "StageReport", "open_published", "pull", "push"]


def pull(url: str, path: str | os.PathLike[str], *, progress: bool = False) -> StageReport:
    """Download the published database ``url`` to the local database ``path`` (a file, or a sharded folder), checked block by
    block, resumable, skipped when current (:func:`~lightning_lmdb.tools.staging.stage_remote`); with ``progress``, the bytes
    downloaded and the rate printed at most every 2 s (stderr)."""
    path = Path(path).expanduser().absolute()
    return stage_remote(url, path.parent, name=path.name, progress=progress)
