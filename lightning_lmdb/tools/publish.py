"""Publish a database to object storage (:func:`push`) and serve it from there (:func:`pull`): ``lightning-lmdb push`` / ``pull``.

The format (parts under ``URL/parts/<build_id>/``, the marker ``URL/lightning_lmdb.json`` written last) and the push itself
are in :mod:`lightning_lmdb.store.published`; the download in :func:`lightning_lmdb.tools.staging.stage_remote`.
"""

from __future__ import annotations

import os

from lightning_lmdb.store.published import PushReport, open_published, push
from lightning_lmdb.tools.staging import StageReport, stage_remote

__all__ = ["PushReport", "StageReport", "open_published", "pull", "push"]


def pull(url: str, local_dir: str | os.PathLike[str]) -> StageReport:
    """Download the published database ``url`` into the folder ``local_dir`` (:func:`~lightning_lmdb.tools.staging.stage_remote`)."""
    return stage_remote(url, local_dir)
