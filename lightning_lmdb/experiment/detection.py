"""The toy detector of ``train.py``: a CenterNet-style head on ``ToyCNN``'s backbone, its loss, decoding and metric.

The ``boxes`` target kind serves per image ``{"boxes": BoundingBoxes (XYXY pixels of the served image), "labels": int64 [N]}``
(plus ``iscrowd`` / ``difficult`` flags when the source has them). ``ToyCNN(target_kind="boxes", num_outputs=C)`` learns it
as CenterNet does ("Objects as Points", Zhou et al. 2019), reduced to a toy:

- **Head** (:class:`CenterHead`): the backbone's stride-8 features upsampled twice (stride :data:`STRIDE` = 4), a 3x3
  convolution, then a 1x1 convolution to ``C + 4`` channels per cell: one centre-heatmap logit per class, the box's
  log width and log height in cells, and the centre's offset within its cell (``[0, 1)``, as a logit).
- **Loss** (:func:`detection_loss`): the penalty-reduced focal loss of CenterNet on the heatmap, whose target is 1 at each
  box's centre cell and an elliptical Gaussian around it (sigmas of a sixth of the box's width and height), summed over
  the cells and divided by the number of boxes; plus the L1 loss of the size and of the offset at the centre cells. Boxes
  flagged ``iscrowd`` or ``difficult`` are left out of it altogether, as torchvision's detection references drop COCO's
  crowd boxes from training: the loss is the same with or without them.
- **Decoding** (:func:`decode`): the heatmap's local maxima (a 3x3 max-pool), the top ``k`` over classes and cells, each
  a box of the predicted size around its predicted centre, clipped to the image; its score is the peak's probability.
- **Metric**: torchmetrics' ``MeanAveragePrecision`` (COCO's evaluation: ``map_50`` is mAP at IoU 0.5, ``map`` the mean
  over IoU 0.5:0.95), logged per validation / test epoch as ``{stage}/map_50`` and ``{stage}/map``. ``iscrowd`` and
  ``difficult`` boxes are passed to it as crowd regions, which COCO's evaluation ignores: a detection matched to one is
  neither a true nor a false positive, and they are not objects to find (Pascal VOC's rule for ``difficult``, up to
  COCO's crowd IoU, which divides by the detection's area).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from lightning_lmdb.errors import OptionError

#: The head's output stride: one heatmap cell per ``STRIDE x STRIDE`` pixels of the input.
STRIDE = 4
#: Boxes per image that :func:`decode` keeps (the highest scores).
TOP_K = 100
#: Weights of the size and offset L1 losses (the heatmap's focal loss has weight 1).
SIZE_WEIGHT = 1.0
OFFSET_WEIGHT = 1.0


class CenterHead(nn.Module):
    """The CenterNet-style head: stride-8 features in, ``[N, C + 4, H / 4, W / 4]`` out (heatmap logits, log size, offset logits).

    Args:
        in_channels: Channels of the backbone's features.
        num_classes: Classes ``C`` (one heatmap each).
    """

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        mid = max(in_channels // 2, 16)
        self.num_classes = num_classes
        self.body = nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                                  nn.Conv2d(in_channels, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True))
        self.out = nn.Conv2d(mid, num_classes + 4, 1)
        with torch.no_grad():  # CenterNet's prior: every cell starts at a heatmap probability of 0.1 (a stable focal loss)
            self.out.bias[:num_classes].fill_(-2.19)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(features))


def make_head(in_channels: int, num_outputs: int) -> nn.Module:
    """The ``boxes`` kind's head for ``ToyCNN`` (:class:`CenterHead`); ``num_outputs`` is the number of classes."""
    return CenterHead(in_channels, num_outputs)


def _plain(value: Any) -> torch.Tensor:
    """A tensor without its ``tv_tensors`` subclass (``BoundingBoxes`` ops would otherwise keep wrapping)."""
    return value.as_subclass(torch.Tensor) if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def ignored(target: Mapping[str, Any]) -> torch.Tensor:
    """``bool [N]``: the boxes of ``target`` flagged ``iscrowd`` or ``difficult`` (left out of the loss, ignored by the metric)."""
    count = len(target["labels"])
    flags = torch.zeros(count, dtype=torch.bool)
    for name in ("iscrowd", "difficult"):
        value = target.get(name)
        if value is not None:
            flags = flags | _plain(value).to("cpu", torch.bool).reshape(count)
    return flags


def _stride(target: Mapping[str, Any], cells: tuple[int, int]) -> tuple[float, float]:
    """Pixels per cell (y, x): from the boxes' ``canvas_size`` when they carry one, else :data:`STRIDE`."""
    canvas = getattr(target["boxes"], "canvas_size", None)
    if canvas is None:
        return float(STRIDE), float(STRIDE)
    return canvas[0] / cells[0], canvas[1] / cells[1]


def encode(targets: Sequence[Mapping[str, Any]], num_classes: int, cells: tuple[int, int],
           device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The training targets of a batch on a ``cells = (h, w)`` grid, ignored boxes left out.

    Returns:
        ``heatmap`` ``float32 [B, C, h, w]`` (1 at the centre cells, a Gaussian around them); for the ``P`` boxes kept,
        ``batch``, ``label``, ``cy``, ``cx`` (their centre cells, ``int64 [P]``), ``size`` (log width and height in cells,
        ``[P, 2]``) and ``offset`` (the centre within its cell, ``[P, 2]``, x then y).
    """
    h, w = cells
    heatmap = torch.zeros(len(targets), num_classes, h, w)
    ys, xs = torch.arange(h, dtype=torch.float32)[:, None], torch.arange(w, dtype=torch.float32)[None, :]
    batch, label, cy, cx, size, offset = [], [], [], [], [], []
    for i, target in enumerate(targets):
        keep = ~ignored(target)
        boxes = _plain(target["boxes"]).to("cpu", torch.float32).reshape(-1, 4)[keep]
        labels = _plain(target["labels"]).to("cpu", torch.int64).reshape(-1)[keep]
        sy, sx = _stride(target, cells)
        bw = ((boxes[:, 2] - boxes[:, 0]) / sx).clamp_min(1e-3)
        bh = ((boxes[:, 3] - boxes[:, 1]) / sy).clamp_min(1e-3)
        centre_x = ((boxes[:, 0] + boxes[:, 2]) / 2 / sx).clamp(0, w - 1e-3)
        centre_y = ((boxes[:, 1] + boxes[:, 3]) / 2 / sy).clamp(0, h - 1e-3)
        px, py = centre_x.floor(), centre_y.floor()
        for j in range(len(boxes)):
            sigma_x, sigma_y = max(float(bw[j]) / 6, 0.5), max(float(bh[j]) / 6, 0.5)
            blob = torch.exp(-((xs - px[j]) ** 2 / (2 * sigma_x**2) + (ys - py[j]) ** 2 / (2 * sigma_y**2)))
            heatmap[i, labels[j]] = torch.maximum(heatmap[i, labels[j]], blob)
        batch.append(torch.full((len(boxes),), i, dtype=torch.int64))
        label.append(labels)
        cy.append(py.long())
        cx.append(px.long())
        size.append(torch.stack([bw.log(), bh.log()], 1))
        offset.append(torch.stack([centre_x - px, centre_y - py], 1))
    found = {"heatmap": heatmap, "batch": torch.cat(batch), "label": torch.cat(label), "cy": torch.cat(cy), "cx": torch.cat(cx),
             "size": torch.cat(size).reshape(-1, 2), "offset": torch.cat(offset).reshape(-1, 2)}
    return {key: value.to(device) for key, value in found.items()}


def focal_loss(logits: torch.Tensor, heatmap: torch.Tensor) -> torch.Tensor:
    """CenterNet's penalty-reduced focal loss (alpha 2, beta 4), summed over cells, divided by the number of peaks (at least 1)."""
    positive = heatmap >= 1.0
    log_p, log_not_p = F.logsigmoid(logits), F.logsigmoid(-logits)
    p = log_p.exp()
    positive_loss = ((1 - p) ** 2 * log_p)[positive].sum()
    negative_loss = ((1 - heatmap) ** 4 * p**2 * log_not_p)[~positive].sum()
    return -(positive_loss + negative_loss) / positive.sum().clamp_min(1)


def detection_loss(model: Any, outputs: torch.Tensor, targets: Sequence[Mapping[str, Any]], stage: str) -> torch.Tensor:
    """The ``boxes`` kind's loss (module docstring): focal loss on the heatmap plus L1 on size and offset at the centre cells."""
    classes = outputs.shape[1] - 4
    encoded = encode(targets, classes, (outputs.shape[-2], outputs.shape[-1]), outputs.device)
    loss = focal_loss(outputs[:, :classes], encoded["heatmap"])
    if len(encoded["batch"]):
        at = outputs[encoded["batch"], :, encoded["cy"], encoded["cx"]]  # [P, C + 4]
        size_loss = F.l1_loss(at[:, classes:classes + 2], encoded["size"])
        offset_loss = F.l1_loss(at[:, classes + 2:].sigmoid(), encoded["offset"])
        loss = loss + SIZE_WEIGHT * size_loss + OFFSET_WEIGHT * offset_loss
    return loss


def decode(outputs: torch.Tensor, image_size: tuple[int, int] | None = None, k: int = TOP_K) -> list[dict[str, torch.Tensor]]:
    """The detections of a batch of head outputs: per image ``{"boxes": float32 [k, 4] XYXY pixels, "scores", "labels"}``.

    Args:
        outputs: ``[B, C + 4, h, w]`` (:class:`CenterHead`).
        image_size: ``(H, W)`` of the images in pixels; ``None``: ``h`` and ``w`` times :data:`STRIDE`.
        k: Detections per image (the highest scores among the heatmap's local maxima).
    """
    outputs = outputs.detach().float()
    n, channels, h, w = outputs.shape
    classes = channels - 4
    height, width = image_size if image_size is not None else (h * STRIDE, w * STRIDE)
    sy, sx = height / h, width / w
    heat = outputs[:, :classes].sigmoid()
    peaks = heat * (F.max_pool2d(heat, 3, stride=1, padding=1) == heat)
    scores, index = peaks.reshape(n, -1).topk(min(k, classes * h * w), dim=1)
    labels, cell = index // (h * w), index % (h * w)
    cy, cx = cell // w, cell % w
    found = []
    for i in range(n):
        at = outputs[i][classes:, cy[i], cx[i]]  # [4, k]
        bw, bh = at[0].clamp(max=8).exp() * sx, at[1].clamp(max=8).exp() * sy
        centre_x = (cx[i] + at[2].sigmoid()) * sx
        centre_y = (cy[i] + at[3].sigmoid()) * sy
        boxes = torch.stack([centre_x - bw / 2, centre_y - bh / 2, centre_x + bw / 2, centre_y + bh / 2], 1)
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
        found.append({"boxes": boxes, "scores": scores[i], "labels": labels[i]})
    return found


def metric_targets(targets: Sequence[Mapping[str, Any]], device: torch.device | str) -> list[dict[str, torch.Tensor]]:
    """The targets as ``MeanAveragePrecision`` takes them: plain tensors, ``iscrowd`` set for crowd and difficult boxes."""
    return [{"boxes": _plain(t["boxes"]).to(device, torch.float32).reshape(-1, 4),
             "labels": _plain(t["labels"]).to(device, torch.int64).reshape(-1),
             "iscrowd": ignored(t).to(device, torch.int64)} for t in targets]


def make_map(num_classes: int = 0, ignore_index: int = 0) -> Any:
    """torchmetrics' ``MeanAveragePrecision`` for boxes (XYXY), COCO's evaluation by pycocotools (the ``train`` extra's),
    else by faster-coco-eval when that is what is installed.

    Raises:
        OptionError: Neither is installed (the message says how to install it).
    """
    from importlib.util import find_spec

    from torchmetrics.detection import MeanAveragePrecision

    backend = next((name for name, module in (("pycocotools", "pycocotools"), ("faster_coco_eval", "faster_coco_eval"))
                    if find_spec(module) is not None), None)
    if backend is None:
        raise OptionError("The toy detector's metric (MeanAveragePrecision, COCO's mAP) needs pycocotools: "
                          "pip install -e '.[train]' (or pip install 'pycocotools>=2.0.8').")
    return MeanAveragePrecision(box_format="xyxy", iou_type="bbox", backend=backend)


def _image_size(outputs: torch.Tensor, targets: Sequence[Mapping[str, Any]]) -> tuple[int, int] | None:
    for target in targets:
        canvas = getattr(target["boxes"], "canvas_size", None)
        if canvas is not None:
            return int(canvas[0]), int(canvas[1])
    return None


def detection_metric(model: Any, outputs: torch.Tensor, targets: Sequence[Mapping[str, Any]], stage: str) -> None:
    """Add a batch's detections to the stage's ``MeanAveragePrecision`` (``model.map["<stage>_map"]``); logged per epoch."""
    states = getattr(model, "map", None)
    if states is None or f"{stage}_map" not in states:
        return None
    states[f"{stage}_map"].update(decode(outputs, _image_size(outputs, targets)), metric_targets(targets, outputs.device))
    return None


def detection_epoch(model: Any, stage: str) -> dict[str, torch.Tensor]:
    """The epoch's ``map_50`` and ``map`` of ``stage`` (empty when the stage's metric saw no batch); the metric is reset."""
    metric = model.map[f"{stage}_map"]
    if not metric.update_count:
        return {}
    result = metric.compute()
    metric.reset()
    return {"map_50": result["map_50"], "map": result["map"]}


def detection_expects(model: Any, outputs: torch.Tensor, targets: Any) -> str | None:
    """``None`` when ``targets`` are a list of one ``{"boxes", "labels"}`` dict per image, else what they should be."""
    fits = (isinstance(targets, (list, tuple)) and len(targets) == len(outputs)
            and all(isinstance(t, Mapping) and "boxes" in t and "labels" in t for t in targets))
    return None if fits else 'a list of one {"boxes": BoundingBoxes [N, 4], "labels": int64 [N]} dict per image'
