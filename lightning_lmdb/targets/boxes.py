"""Bounding boxes (object detection): the ``"boxes"`` target kind.

A sample's target is a variable number of boxes, each with a class. This module's :class:`Boxes` is how a scan
holds one image's boxes -- every detection source kind (COCO, YOLO, Pascal VOC, a manifest's ``boxes`` column)
produces it, and a ``Dataset`` source's sample gives its JSON form (:meth:`Boxes.from_json`).

Conventions (the same everywhere):

- ``boxes`` are ``XYXY`` in pixels of the image **as stored in its file** (no EXIF rotation applied, as ImageFolder
  reads it): ``x1 <= x2``, ``y1 <= y2``, ``0 <= x <= width``, ``0 <= y <= height``. COCO's ``[x, y, w, h]``,
  YOLO's normalised ``cx cy w h`` and VOC's 1-based inclusive ``bndbox`` are converted once, by their source kind.
- ``labels`` are class indices into the scan's ``classes`` (for COCO: the categories in id order).
- ``iscrowd`` (COCO) and ``difficult`` (VOC) are per-box flags, ``None`` when the format has none.
- ``area`` (COCO's own, else ``None``), ``category_ids`` (COCO's ``category_id`` per box) and ``image_id``
  (COCO's image id) are kept so predictions can be exported back to COCO.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Boxes:
    """One image's boxes as a scan holds them (hashable, comparable, plain values).

    Attributes:
        boxes: ``(x1, y1, x2, y2)`` per box, in pixels of the stored image.
        labels: Class index per box.
        iscrowd: COCO's crowd flag per box (``0`` / ``1``), or ``None``.
        difficult: VOC's difficult flag per box (``0`` / ``1``), or ``None``.
        area: COCO's ``area`` per box, or ``None``.
        category_ids: COCO's ``category_id`` per box, or ``None``.
        image_id: COCO's image id, or ``None``.
    """

    boxes: tuple[Box, ...] = ()
    labels: tuple[int, ...] = ()
    iscrowd: tuple[int, ...] | None = None
    difficult: tuple[int, ...] | None = None
    area: tuple[float, ...] | None = None
    category_ids: tuple[int, ...] | None = None
    image_id: int | None = None

    def __post_init__(self) -> None:
        n = len(self.boxes)
        if len(self.labels) != n:
            raise ValueError(f"has {n} boxes but {len(self.labels)} labels")
        for name in ("iscrowd", "difficult", "area", "category_ids"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"has {n} boxes but {len(value)} {name} values")
        for box in self.boxes:
            if len(box) != 4:
                raise ValueError(f"has a box of {len(box)} numbers, not 4 (x1, y1, x2, y2): {list(box)}")

    def __len__(self) -> int:
        return len(self.boxes)

    def to_json(self) -> dict[str, Any]:
        """The JSON form (lists; the optional fields only when set)."""
        found: dict[str, Any] = {"boxes": [list(b) for b in self.boxes], "labels": list(self.labels)}
        for name in ("iscrowd", "difficult", "area", "category_ids", "image_id"):
            value = getattr(self, name)
            if value is not None:
                found[name] = list(value) if isinstance(value, tuple) else value
        return found

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | Sequence[Any]) -> Boxes:
        """A :class:`Boxes` from its JSON form: ``{"boxes": [[x1, y1, x2, y2], ...], "labels": [...], ...}``.

        Raises:
            ValueError: Not that shape (the message says what is wrong).
        """
        if not isinstance(raw, Mapping) or "boxes" not in raw or "labels" not in raw:
            raise ValueError('is not {"boxes": [[x1, y1, x2, y2], ...], "labels": [...]}')
        try:
            boxes = tuple(tuple(float(v) for v in box) for box in raw["boxes"])
            labels = tuple(int(v) for v in raw["labels"])

            def opt(name: str, kind: type) -> tuple[Any, ...] | None:
                return None if raw.get(name) is None else tuple(kind(v) for v in raw[name])

            image_id = raw.get("image_id")
            return cls(boxes, labels, opt("iscrowd", int), opt("difficult", int), opt("area", float), opt("category_ids", int),  # type: ignore[arg-type]
                       None if image_id is None else int(image_id))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"is not a valid boxes target ({exc})") from None
