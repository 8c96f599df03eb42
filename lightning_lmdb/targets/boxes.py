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
- ``image_size`` is ``(height, width)`` of the image the boxes are drawn on (COCO's ``height`` / ``width``, VOC's
  ``size``, the image YOLO's coordinates were scaled by; a ``Dataset`` source's is filled in from its image when the
  build reads it). A database built with ``resize=`` stores smaller images: the boxes stay in these pixels and are
  scaled by the stored image's size over this one when served. ``None``: unknown (the boxes are then served as stored).

:class:`BoxesKind` is the ``"boxes"`` target kind: how a database stores them (typed arrays, no pickle), what a sample
serves (``{"boxes": tv_tensors.BoundingBoxes(XYXY), "labels": int64 [N], ...}``), their geometry under the image's
resize / flip (clipped to the image, boxes left smaller than :attr:`BoxesKind.min_size` dropped with their labels, as
torchvision's ``SanitizeBoundingBoxes`` does) and their collate (a list of dicts; :func:`pad_collate` pads to tensors).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_lmdb.targets.base import NO_TARGET, TargetKind, TargetTable, check_offsets, concat_offsets

if TYPE_CHECKING:
    import torch

    from lightning_lmdb.jsonfields import JsonFields

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
    image_size: tuple[int, int] | None = None

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
        for name in ("iscrowd", "difficult", "area", "category_ids", "image_id", "image_size"):
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

            image_id, size = raw.get("image_id"), raw.get("image_size")
            if size is not None and len(size) != 2:
                raise ValueError(f"image_size {list(size)} is not [height, width]")
            return cls(boxes, labels, opt("iscrowd", int), opt("difficult", int), opt("area", float), opt("category_ids", int),  # type: ignore[arg-type]
                       None if image_id is None else int(image_id), None if size is None else (int(size[0]), int(size[1])))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"is not a valid boxes target ({exc})") from None


# --- the "boxes" target kind ------------------------------------------------------------------------------------------------

#: The optional per-box arrays: array name (:data:`lightning_lmdb.store.format.ARRAYS`) -> (:class:`Boxes` field, dtype, value
#: of a record whose source does not give it).
BOX_FIELDS: dict[str, tuple[str, Any, float]] = {
    "box_iscrowd": ("iscrowd", np.uint8, 0),
    "box_difficult": ("difficult", np.uint8, 0),
    "box_area": ("area", np.float32, math.nan),
    "box_category_ids": ("category_ids", np.int64, -1),
}
#: The per-box flags a sample serves (``int64`` tensors beside ``labels``): served key -> array name.
SERVED_FLAGS = {"iscrowd": "box_iscrowd", "difficult": "box_difficult"}


class BoxesKind(TargetKind):
    """Boxes per image, each with a class (object detection).

    Stored in the database header's typed arrays (:mod:`lightning_lmdb.store.format`): ``meta/labels`` (each box's class,
    ``int32``) and ``meta/label-offsets`` (``int64`` per record plus one) index ``meta/boxes`` (``float32`` ``x1 y1 x2 y2`` per box,
    pixels of the source image); ``meta/image-sizes`` (``int32`` height and width per record), and when the source gives them
    ``meta/box-iscrowd``, ``meta/box-difficult`` (``uint8``), ``meta/box-area`` (``float32``), ``meta/box-category-ids``
    (``int64``) and ``meta/image-ids`` (``int64`` per record, ``-1``: none). The source's ``target_meta`` (COCO's category ids,
    the degenerate boxes dropped) is the header's ``target_meta``.

    A sample's target (:meth:`item`) is ``{"boxes": tv_tensors.BoundingBoxes (XYXY, canvas_size=(H, W)), "labels": int64 [N]}``,
    plus ``iscrowd`` / ``difficult`` (``int64`` [N]) when the source has them and ``image_id`` (an ``int``) when it has one: what
    torchvision's detection models and ``transforms.v2`` take. Its geometry (:meth:`geometry`) maps both corners of each box
    as the image's crop / resize / flip maps points (a flip swaps ``x1`` and ``x2``), clips the boxes to the output image and
    drops those left narrower or shorter than :attr:`min_size` pixels, with their labels and flags. A batch's targets are a
    list of these dicts (:func:`pad_collate` pads them to tensors).

    Args:
        min_size: The smallest width and height (output pixels) a box keeps after the geometry.
    """

    name = "boxes"
    DESCRIPTION = ("boxes per image, each with a class ({'boxes': tv_tensors.BoundingBoxes XYXY, 'labels': int64 [N]}, "
                   "transformed with the image)")
    has_geometry = True
    variable_length = True
    keeps_whole = True

    def __init__(self, min_size: float = 1.0):
        self.min_size = float(min_size)

    # --- scan ------------------------------------------------------------------------------------

    def hold(self, raw: Any) -> Boxes:
        """A :class:`Boxes`, or its JSON form (a ``Dataset`` sample's target), checked: finite ``x1 <= x2``, ``y1 <= y2``,
        labels ``>= 0``, flags 0 or 1."""
        boxes = raw if isinstance(raw, Boxes) else Boxes.from_json(raw)
        for k, (x1, y1, x2, y2) in enumerate(boxes.boxes):
            if not all(math.isfinite(v) for v in (x1, y1, x2, y2)) or x2 < x1 or y2 < y1:
                raise ValueError(f"has box {k} {[x1, y1, x2, y2]}, not x1 <= x2, y1 <= y2 (XYXY pixels): fix it or leave it out")
        if any(label < 0 for label in boxes.labels):
            raise ValueError(f"has a negative label ({min(boxes.labels)}): labels are class indices")
        for name in ("iscrowd", "difficult"):
            flags = getattr(boxes, name)
            if flags is not None and any(v not in (0, 1) for v in flags):
                raise ValueError(f"has {name} values other than 0 and 1: {list(flags)}")
        return boxes

    def width(self, classes: Sequence[str], target_names: Sequence[str]) -> int:
        return len(classes)

    # --- storage ---------------------------------------------------------------------------------

    def pack(self, targets: Sequence[Any], width: int) -> TargetTable:
        held = [t if isinstance(t, Boxes) else Boxes.from_json(t) for t in targets]
        count = len(held)
        offsets = np.zeros(count + 1, dtype=np.int64)
        np.cumsum([len(t) for t in held], out=offsets[1:])
        total = int(offsets[-1])
        labels = np.fromiter((v for t in held for v in t.labels), dtype=np.int32, count=total)
        extra = {"boxes": np.array([b for t in held for b in t.boxes], dtype=np.float32).reshape(total, 4),
                 "image_sizes": np.array([t.image_size or (0, 0) for t in held], dtype=np.int32).reshape(count, 2)}
        for name, (field, dtype, fill) in BOX_FIELDS.items():
            if any(getattr(t, field) is not None for t in held):
                extra[name] = np.fromiter((v for t in held for v in (getattr(t, field) or (fill,) * len(t))), dtype=dtype, count=total)
        if any(t.image_id is not None for t in held):
            extra["image_ids"] = np.array([-1 if t.image_id is None else t.image_id for t in held], dtype=np.int64)
        return TargetTable(self.name, np.full(count, NO_TARGET, dtype=np.int32), width, labels=labels, offsets=offsets, extra=extra)

    def concat(self, tables: Sequence[TargetTable]) -> TargetTable:
        starts = np.cumsum([0] + [len(t.labels) for t in tables[:-1]])  # type: ignore[arg-type]
        offsets = concat_offsets([t.offsets for t in tables], starts)  # type: ignore[misc]
        names = {name for t in tables for name in (t.extra or {})}
        extra = {}
        for name in names:
            parts = []
            for t in tables:
                found = (t.extra or {}).get(name)
                if found is None:  # a part whose source gave no such field: the value of "none"
                    rows = len(t) if name == "image_ids" else len(t.labels)  # type: ignore[arg-type]
                    found = np.full(rows, -1 if name == "image_ids" else BOX_FIELDS[name][2], dtype=BOX_FIELDS.get(name, ("", np.int64))[1])
                parts.append(found)
            extra[name] = np.concatenate(parts)
        return TargetTable(self.name, np.concatenate([t.index for t in tables]), tables[0].width,
                           labels=np.concatenate([t.labels for t in tables]), offsets=offsets, extra=extra)  # type: ignore[misc]

    def read(self, get: JsonFields, read: Callable[[str], np.ndarray], meta: Any) -> dict[str, Any]:
        """The boxes' arrays, checked: offsets that index the labels, 4 coordinates a label, finite ``x1 <= x2``, ``y1 <= y2``,
        labels within the classes, each optional array one value a box."""
        offsets, labels = read("label_offsets"), read("labels")
        check_offsets(get, offsets, labels, "box offsets", "box labels")
        if len(labels) and (labels.min() < 0 or labels.max() >= len(meta.classes)):
            get.fail("arrays", f"holds a box label outside its {len(meta.classes)} classes")
        boxes = read("boxes")
        if len(boxes) != 4 * len(labels):
            get.fail("arrays", f"holds {len(boxes)} box coordinates for {len(labels)} boxes (4 each)")
        boxes = boxes.reshape(-1, 4)
        if not np.isfinite(boxes).all() or np.any(boxes[:, 2] < boxes[:, 0]) or np.any(boxes[:, 3] < boxes[:, 1]):
            get.fail("arrays", "holds a box that is not finite x1 <= x2, y1 <= y2")
        extra = {"boxes": boxes, "image_sizes": read("image_sizes").reshape(-1, 2)}
        stored = get.obj.get("arrays", {})
        for name in (*BOX_FIELDS, "image_ids"):
            if name in stored:
                extra[name] = read(name)
                if name != "image_ids" and len(extra[name]) != len(labels):
                    get.fail("arrays", f"holds {len(extra[name])} {name} values for {len(labels)} boxes")
        for array in extra.values():
            array.flags.writeable = False
        target_meta = get("target_meta", dict) if "target_meta" in get.obj else {}
        return {"labels": labels, "label_offsets": offsets, "target_arrays": extra, "target_meta": target_meta}

    # --- serving ---------------------------------------------------------------------------------

    def item(self, table: TargetTable, row: int) -> dict[str, Any]:
        """``{"boxes": BoundingBoxes (XYXY, canvas_size = the source image's (H, W); (0, 0) unknown), "labels": int64 [N]}``, plus
        ``iscrowd`` / ``difficult`` / ``image_id`` when stored. A dataset then scales the boxes to the image as stored
        (:meth:`at_size`) and gives them the image's geometry (:meth:`geometry`)."""
        import torch
        from torchvision import tv_tensors

        extra = table.extra or {}
        assert table.labels is not None and table.offsets is not None
        start, stop = int(table.offsets[row]), int(table.offsets[row + 1])
        height, width = (int(v) for v in extra["image_sizes"][row])
        target: dict[str, Any] = {
            "boxes": tv_tensors.BoundingBoxes(torch.from_numpy(extra["boxes"][start:stop].copy()), format="XYXY",
                                              canvas_size=(height, width)),
            "labels": torch.from_numpy(table.labels[start:stop].astype(np.int64)),
        }
        for key, name in SERVED_FLAGS.items():
            if name in extra:
                target[key] = torch.from_numpy(extra[name][start:stop].astype(np.int64))
        if "image_ids" in extra and int(extra["image_ids"][row]) >= 0:
            target["image_id"] = int(extra["image_ids"][row])
        return target

    def tolist(self, table: TargetTable, rows: np.ndarray | None) -> list[Any]:
        """Each record's :class:`Boxes` (``float32`` values as Python floats)."""
        extra = table.extra or {}
        assert table.labels is not None and table.offsets is not None
        found = []
        for r in range(len(table)) if rows is None else rows:
            start, stop = int(table.offsets[r]), int(table.offsets[r + 1])

            def field(name: str, start: int = start, stop: int = stop) -> tuple[Any, ...] | None:
                return None if name not in extra else tuple(extra[name][start:stop].tolist())

            size = tuple(int(v) for v in extra["image_sizes"][r])
            image_id = int(extra["image_ids"][r]) if "image_ids" in extra else -1
            found.append(Boxes(tuple(tuple(b) for b in extra["boxes"][start:stop].tolist()), tuple(table.labels[start:stop].tolist()),
                               field("box_iscrowd"), field("box_difficult"), field("box_area"), field("box_category_ids"),
                               None if image_id < 0 else image_id, None if size == (0, 0) else size))  # type: ignore[arg-type]
        return found

    def at_size(self, target: Any, size: tuple[int, int]) -> Any:
        """The boxes scaled from the source image's pixels (their ``canvas_size``) to those of the image as stored (``size``;
        smaller in a ``resize=`` build); their ``canvas_size`` becomes ``size``."""
        import torch
        from torchvision import tv_tensors

        boxes = target["boxes"]
        canvas = tuple(int(v) for v in boxes.canvas_size)
        size = (int(size[0]), int(size[1]))
        if canvas == size:
            return target
        plain = boxes.as_subclass(torch.Tensor)
        if canvas[0] > 0 and canvas[1] > 0:
            sx, sy = size[1] / canvas[1], size[0] / canvas[0]
            plain = plain * plain.new_tensor([sx, sy, sx, sy])
        return {**target, "boxes": tv_tensors.BoundingBoxes(plain, format="XYXY", canvas_size=size)}

    def geometry(self, target: Any, crop: Any, params: Sequence[int], size: tuple[int, int], **context: Any) -> Any:
        """Both corners of each box mapped as the image's pixels are (``crop.map_points``; a flip swaps ``x1`` and ``x2``), clipped
        to the output image (``crop.output_bounds(params)``: a letterbox's picture, without its padding), boxes narrower or
        shorter than :attr:`min_size` dropped with their labels and flags; ``canvas_size`` the output's."""
        import torch

        plain = target["boxes"].as_subclass(torch.Tensor)
        mapped = crop.map_points(plain.reshape(-1, 2), params).reshape(-1, 4)
        xs, ys = mapped[:, 0::2], mapped[:, 1::2]
        boxes = torch.stack([xs.amin(1), ys.amin(1), xs.amax(1), ys.amax(1)], 1) if len(mapped) else mapped.reshape(0, 4)
        bounds = crop.output_bounds(params) if hasattr(crop, "output_bounds") else (crop.size, crop.size)
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, bounds[1])
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, bounds[0])
        return self.sanitized(target, boxes, (crop.size, crop.size))

    def sanitized(self, target: dict[str, Any], boxes: torch.Tensor, canvas: tuple[int, int]) -> dict[str, Any]:
        """``target`` with ``boxes`` (XYXY, on a ``canvas`` of (H, W)), those narrower or shorter than :attr:`min_size` left out
        with their labels and flags (what ``SanitizeBoundingBoxes`` does)."""
        from torchvision import tv_tensors

        keep = ((boxes[:, 2] - boxes[:, 0]) >= self.min_size) & ((boxes[:, 3] - boxes[:, 1]) >= self.min_size)
        found = {key: value[keep] if key in ("labels", *SERVED_FLAGS) else value for key, value in target.items()}
        found["boxes"] = tv_tensors.BoundingBoxes(boxes[keep], format="XYXY", canvas_size=canvas)
        return found

    def collate(self, targets: list[Any]) -> Any:
        """A list of the batch's target dicts (as torchvision's detection models take them); :func:`pad_collate` pads them.

        A :class:`TargetBatch`: a ``list`` that a DataLoader worker sends to the training process by value (its tensors as
        numpy arrays), where it arrives as a plain ``list`` of the same dicts."""
        return TargetBatch(targets)

    def named(self, classes: Sequence[str], target: Any) -> Any:
        """Every box (``float32``, as stored), its class name and its flags, area and category id; the image id and size."""
        boxes = target if isinstance(target, Boxes) else Boxes.from_json(target)

        def f32(values: Any) -> Any:
            return None if values is None else np.asarray(values, dtype=np.float32).tolist()

        return {"boxes": f32(boxes.boxes) if len(boxes) else [],
                "labels": [classes[k] if 0 <= k < len(classes) else str(k) for k in boxes.labels],
                "iscrowd": None if boxes.iscrowd is None else list(boxes.iscrowd),
                "difficult": None if boxes.difficult is None else list(boxes.difficult),
                "area": f32(boxes.area), "category_ids": None if boxes.category_ids is None else list(boxes.category_ids),
                "image_id": boxes.image_id, "image_size": None if boxes.image_size is None else list(boxes.image_size)}

    def describe(self, meta: Any) -> dict[str, Any]:
        """What ``lightning-lmdb info`` shows of a database's boxes: the total, per image min / median / max, the images without
        boxes, the crowd and difficult boxes, and the degenerate boxes the source dropped."""
        offsets = np.asarray(meta.label_offsets)
        per_image = np.diff(offsets) if len(offsets) > 1 else np.zeros(1, dtype=np.int64)
        arrays, extra = meta.target_arrays or {}, meta.target_meta or {}
        found = {"total": int(offsets[-1]) if len(offsets) else 0,
                 "per_image": {"min": int(per_image.min()), "median": float(np.median(per_image)), "max": int(per_image.max())},
                 "images_without_boxes": int(np.sum(np.diff(offsets) == 0)) if len(offsets) > 1 else 0,
                 "degenerate_dropped": int(extra.get("degenerate_dropped", 0))}
        for key, name in SERVED_FLAGS.items():
            if name in arrays:
                found[key] = int(np.sum(arrays[name]))
        return found


class TargetBatch(list):  # type: ignore[type-arg]
    """A batch's target dicts, pickled by value: each CPU tensor as a numpy array (``BoundingBoxes`` with their format and
    canvas), unpickled as a plain ``list`` of dicts of tensors equal to these.

    A DataLoader worker sends a tensor through shared memory: a segment and a file descriptor handed over a socket for each
    one, ~0.2-0.5 ms apiece measured on 2 cores -- for the 3 small tensors of each image's target, more than its decode and
    resize. Pickled by value, the few hundred bytes of a target cost microseconds. (Any other value is pickled as it is.)
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpacked_targets, ([{key: _packed(value) for key, value in target.items()} for target in self],)


def _packed(value: Any) -> tuple[Any, ...]:
    """``value`` as ``(tag, data, ...)``: ``("boxes", array, format, canvas, options)``, ``("tensor", array)`` or ``("value", value)``."""
    import torch
    from torchvision import tv_tensors

    if isinstance(value, tv_tensors.BoundingBoxes) and value.device.type == "cpu":
        extra = {"clamping_mode": value.clamping_mode} if hasattr(value, "clamping_mode") else {}  # torchvision >= 0.23
        return "boxes", value.as_subclass(torch.Tensor).numpy(force=True), value.format.name, tuple(value.canvas_size), extra
    if type(value) is torch.Tensor and value.device.type == "cpu" and not value.requires_grad:
        return "tensor", value.numpy()
    return "value", value


def _unpacked_targets(packed: list[dict[str, tuple[Any, ...]]]) -> list[dict[str, Any]]:
    """The target dicts of :meth:`TargetBatch.__reduce__`, with their tensors again."""
    import torch
    from torchvision import tv_tensors

    def value(item: tuple[Any, ...]) -> Any:
        if item[0] == "boxes":
            return tv_tensors.BoundingBoxes(torch.from_numpy(item[1]), format=item[2], canvas_size=item[3], **item[4])
        return torch.from_numpy(item[1]) if item[0] == "tensor" else item[1]

    return [{key: value(item) for key, item in target.items()} for target in packed]


def pad_collate(targets: Sequence[dict[str, Any]], max_boxes: int | None = None) -> dict[str, Any]:
    """A batch's target dicts (:meth:`BoxesKind.collate`) padded to tensors, for models that want them.

    Args:
        targets: ``B`` dicts of ``boxes`` ``[N_i, 4]`` and ``labels`` ``[N_i]`` (and ``iscrowd`` / ``difficult``).
        max_boxes: ``K``, the padded length (boxes beyond it are left out); ``None``: the batch's largest ``N_i`` (at least 1).

    Returns:
        ``{"boxes": float32 [B, K, 4] (0 where padded), "labels": int64 [B, K] (-1 where padded), "mask": bool [B, K]
        (True: a real box)}``, plus ``iscrowd`` / ``difficult`` ``int64`` [B, K] (0 where padded) when the targets have them.
    """
    import torch

    k = max(1, max((len(t["labels"]) for t in targets), default=0)) if max_boxes is None else int(max_boxes)
    b = len(targets)
    out: dict[str, Any] = {"boxes": torch.zeros(b, k, 4), "labels": torch.full((b, k), -1, dtype=torch.int64),
                           "mask": torch.zeros(b, k, dtype=torch.bool)}
    flags = [key for key in SERVED_FLAGS if targets and all(key in t for t in targets)]
    for key in flags:
        out[key] = torch.zeros(b, k, dtype=torch.int64)
    for i, t in enumerate(targets):
        n = min(k, len(t["labels"]))
        out["boxes"][i, :n] = t["boxes"].as_subclass(torch.Tensor)[:n].to(torch.float32)
        out["labels"][i, :n] = t["labels"][:n]
        out["mask"][i, :n] = True
        for key in flags:
            out[key][i, :n] = t[key][:n]
    return out
