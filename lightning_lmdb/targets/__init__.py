"""Typed targets: what a database stores per record beside its image, and what a dataset serves as ``ds[i][1]``.

A source's target kind (``target_kind=``) says what a sample's target is. Each kind is an entry of a registry
(:mod:`lightning_lmdb.targets.base`: :class:`TargetKind`, :func:`register_target_kind`, :func:`target_kind`), one file each;
the library's are:

============== ============================================= ===========================================
kind           stored (:mod:`lightning_lmdb.store.format` arrays)   served
============== ============================================= ===========================================
``class``      ``meta/targets``: ``int32`` class index        ``int`` (as ``ImageFolder``)
``none``       ``meta/targets``: ``-1``                       ``-1`` (as a flat folder)
``multilabel`` ``meta/labels`` (``int32`` class indices of     ``float32`` multi-hot tensor ``[C]`` over
               every record, concatenated) and                the classes
               ``meta/label-offsets`` (``int64``, count + 1)
``regression`` ``meta/values``: ``float32`` ``count x K``     ``float32`` tensor ``[K]``
``mask``       the record holds its mask                      ``int64`` ``H x W`` tensor (the datasets,
               (:mod:`lightning_lmdb.sources.masks`); ``meta/labels``  from the record; not this table)
               and ``meta/label-offsets``: the classes each
               mask holds, as ``multilabel``
============== ============================================= ===========================================

``meta/targets`` is always there (``-1`` for the kinds that are not ``class``), so a per-record class index
is one array read whatever the kind. :class:`TargetTable` holds one database's (or scan's) targets in numpy
arrays -- never one Python object per record -- and builds each sample's target on demand. :func:`read_typed` reads the
typed arrays of a database's metadata (:func:`lightning_lmdb.store.format.read_meta`). Both ask the table's kind.

Add a kind: a file with a :class:`TargetKind` subclass (its storage, serving, geometry and collate), one
:func:`register_target_kind` call in a module your code (and spawned loader workers) imports, and its tests; the loss and
metric of ``train.py``'s toy model are registered apart, in :mod:`lightning_lmdb.experiment.target_losses`.
See docs/extending.md, "Add a target kind".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_lmdb.targets.base import (
    NO_TARGET,
    Target,
    TargetKind,
    TargetTable,
    kind_names,
    register_target_kind,
    target_kind,
    target_kinds,
    unknown_kind,
    unregister_target_kind,
)
from lightning_lmdb.targets.boxes import Boxes, BoxesKind, pad_collate
from lightning_lmdb.targets.class_ import ClassKind
from lightning_lmdb.targets.mask import MaskKind
from lightning_lmdb.targets.multilabel import MultilabelKind
from lightning_lmdb.targets.none import NoneKind
from lightning_lmdb.targets.regression import RegressionKind
from lightning_lmdb.targets.typed import read_typed

__all__ = ["LABEL_KINDS", "NO_TARGET", "TARGET_KINDS", "Boxes", "BoxesKind", "ClassKind", "MaskKind", "MultilabelKind", "NoneKind",  # noqa: F822
           "RegressionKind", "Target", "TargetKind", "TargetTable", "kind_names", "named", "pad_collate", "read_typed",
           "register_target_kind", "target_kind", "target_kinds", "unknown_kind", "unregister_target_kind", "width_of"]

register_target_kind(ClassKind())
register_target_kind(MultilabelKind())
register_target_kind(RegressionKind())
register_target_kind(NoneKind())
register_target_kind(MaskKind())
register_target_kind(BoxesKind())


def __getattr__(name: str) -> Any:
    if name == "TARGET_KINDS":  # the registered kinds' names, derived from the registry on each access
        return kind_names()
    if name == "LABEL_KINDS":  # the kinds whose targets are lists of class indices (meta/labels and meta/label-offsets)
        return tuple(kind.name for kind in target_kinds() if kind.class_lists)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def width_of(kind: str, classes: Sequence[str], target_names: Sequence[str]) -> int:
    """The length of a served target tensor of ``kind`` (:attr:`TargetTable.width`): the classes' count for the label kinds, K
    (the names' count) for regression, else 0 (the kind's :meth:`~TargetKind.width`)."""
    return target_kind(kind).width(classes, target_names)


def named(kind: str, classes: Sequence[str], target: Any) -> Any:
    """A target of ``kind`` as a value that does not depend on the class indices, to compare a database's targets with a
    source's (whose classes may have changed): the class name (``class``), the sorted names (``multilabel``), the numbers as
    stored, ``float32`` (``regression``); ``None`` for the other kinds (no target, or a mask: compared with its file)."""
    return target_kind(kind).named(classes, target)
