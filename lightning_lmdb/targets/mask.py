"""The ``mask`` target kind: a segmentation mask per sample, held in its record (:mod:`lightning_lmdb.sources.masks`: packed with the
image), served as an ``int64`` ``H x W`` tensor resampled with the image's geometry (nearest-neighbour). The metadata holds
the classes each mask holds, as ``multilabel`` does (``meta/labels``, ``meta/label-offsets``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_lmdb.targets.base import TargetTable
from lightning_lmdb.targets.multilabel import MultilabelKind

#: The mask value of unlabelled pixels unless a source says otherwise (Pascal VOC's object borders).
DEFAULT_FILL = 255


class MaskKind(MultilabelKind):
    """A mask per sample, in the record; the metadata's labels are the classes each mask holds."""

    name = "mask"
    DESCRIPTION = "a segmentation mask per sample (an int64 H x W tensor, transformed with the image)"
    in_record = True
    has_geometry = True

    def item(self, table: TargetTable, row: int) -> Any:
        raise TypeError("A segmentation database's targets are its masks, stored in the records (lightning_lmdb.sources.masks.unpack and "
                        "decode_mask); TargetTable.item does not serve them. TargetTable.tolist() gives the classes each mask holds.")

    def geometry(self, target: Any, crop: Any, params: Sequence[int], size: tuple[int, int], **context: Any) -> Any:
        """The mask resampled nearest-neighbour (:meth:`lightning_lmdb.read.transforms.ResizedCrop.apply_mask`), pixels outside the
        image ``context["fill"]`` (the ignore index)."""
        return crop.apply_mask(target, params, context.get("fill", DEFAULT_FILL))

    def named(self, classes: Sequence[str], target: Any) -> Any:
        """``None``: a mask is compared with its file, record by record."""
        return None
