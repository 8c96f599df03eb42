"""Sources: what a database is built from, scanned into one typed list of samples.

Contract: a **source kind** is a module (or object) with ``NAME``, ``DESCRIPTION``, ``accepts(source)``,
``scan(source, options)`` and ``labels(source, options)``, registered with
:func:`~lightning_lmdb.sources.base.register_source_kind`; :func:`~lightning_lmdb.sources.base.scan_source` asks the
registered kinds in order and returns a :class:`~lightning_lmdb.sources.base.SourceScan`.

Modules: ``base`` (the registry, the scan's types, :class:`~lightning_lmdb.sources.base.SourceOptions`), ``manifest`` and
``manifestfile`` (CSV / TSV / JSON Lines manifests), ``folder`` (ImageFolder-layout and flat folders), ``dataset``
(a map-style ``Dataset``), ``masks`` (segmentation masks beside a source's images), the detection formats ``coco``,
``yolo``, ``voc`` and ``boxcolumns`` (a manifest's boxes) with their shared box rules, ``boxcheck``. A new source kind is a file of
its own here plus one ``register_source_kind`` line. ``lightning_lmdb.sources`` re-exports ``base``.
Imports only :mod:`lightning_lmdb.errors`, :mod:`lightning_lmdb.codec` and :mod:`lightning_lmdb.targets`.
"""

from __future__ import annotations

from typing import Any

from lightning_lmdb.sources import base as _base
from lightning_lmdb.sources.base import *  # noqa: F403  (the old module's names, at the package's path)


def __getattr__(name: str) -> Any:
    return getattr(_base, name)
