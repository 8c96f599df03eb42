"""The loss and metric ``ToyCNN`` (:mod:`lightning_lmdb.experiment.toy_model`) trains each target kind with, keyed by the kind's
name: :func:`register_loss` adds one (the library's kinds are registered below), :func:`target_loss` finds one.

They live here, beside the training code, not in the target kinds (:mod:`lightning_lmdb.targets`): the library core never
imports training code. A target kind of your own that ``train.py``'s toy model should learn is one :func:`register_loss` call.

============== ================================ ============================= ==============================================
kind           batch targets                    loss                          metric (besides ``{stage}/loss``)
============== ================================ ============================= ==============================================
``class``      ``int64`` ``[N]``                cross-entropy                 ``{stage}/acc``: top-1 accuracy
``multilabel`` ``float32`` multi-hot ``[N, C]`` binary cross-entropy (logits) ``{stage}/f1``: micro F1, logits above 0 positive
``regression`` ``float32`` ``[N, K]``           mean squared error            ``{stage}/mae``: mean absolute error
``mask``       ``int64`` ``[N, H, W]``          per-pixel cross-entropy,      ``{stage}/miou``: mean IoU over the classes
                                                ``ignore_index`` left out     present (:class:`MeanIoU`)
``boxes``      a list of ``{"boxes", "labels"}`` CenterNet: focal loss on class   ``val/map_50``, ``val/map`` (and ``test/``):
               dicts (one per image)            heatmaps, L1 on size/offset   ``MeanAveragePrecision`` (COCO's mAP)
``none``       ``-1``                           refused: nothing to learn
============== ================================ ============================= ==============================================

A kind whose model is neither a pooled classifier nor a per-pixel one gives its own head (``head=``, e.g. ``boxes``: the
CenterNet-style head of :mod:`lightning_lmdb.experiment.detection`); a metric too costly to compute per batch, or with
several values, is updated per step and computed once per epoch (``epoch_metric=``, e.g. mAP), in the stages it names
(``metric_stages=``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F
from torchmetrics import Metric
from torchmetrics.classification import MultilabelF1Score

from lightning_lmdb.errors import OptionError
from lightning_lmdb.experiment import detection
from lightning_lmdb.sources.masks import DEFAULT_IGNORE_INDEX

#: ``loss(model, outputs, targets, stage)``: the batch's loss (a scalar tensor).
LossFn = Callable[[Any, torch.Tensor, Any, str], torch.Tensor]
#: ``metric(model, outputs, targets, stage)``: what to log as ``{stage}/{metric_name}`` -- a tensor, or a torchmetrics ``Metric``
#: updated with the batch (its epoch's value is logged).
MetricFn = Callable[[Any, torch.Tensor, Any, str], Any]


@dataclass(frozen=True)
class TargetLoss:
    """How ``ToyCNN`` learns one target kind.

    Attributes:
        kind: The target kind's name (:func:`lightning_lmdb.targets.target_kind`).
        loss: The loss (:data:`LossFn`).
        metric: The metric (:data:`MetricFn`); ``None``: the loss alone is logged.
        metric_name: Logged as ``{stage}/{metric_name}``; with ``metric_state``, also the model's attribute holding the states.
        dense: A fully convolutional head (per-pixel logits ``[N, C, H, W]`` at the input's size) rather than a pooled linear one.
        metric_state: ``metric_state(num_outputs, ignore_index)``: a ``Metric`` per stage, summed over the epoch (the model keeps
            them as ``model.<metric_name>["<stage>_<metric_name>"]``).
        expects: ``expects(model, outputs, targets)``: ``None`` when the batch's targets fit, else what they should be (the error
            names it).
        check_outputs: ``check_outputs(num_outputs, ignore_index)`` raises when the head's size cannot fit the kind.
        uses_ignore_index: ``ignore_index`` is one of the model's hyperparameters (masks).
        refused: Why the kind cannot be learned (``none``): ``ToyCNN`` raises a ``SourceError`` with it.
        head: ``head(in_channels, num_outputs)``: the kind's own head, an ``nn.Module`` taking the backbone's unpooled
            stride-8 features ``[N, in_channels, H / 8, W / 8]``; ``ToyCNN`` returns its output as it is (``None``: a pooled
            linear head, or the per-pixel one of a ``dense`` kind).
        epoch_metric: ``epoch_metric(model, stage)``: the epoch's values ``{name: tensor}``, logged as ``{stage}/{name}`` at
            the stage's epoch end (the ``metric`` then only updates ``metric_state`` per step and returns ``None``).
        metric_stages: The stages whose steps update and log the metric (e.g. ``("val", "test")`` for a costly one).
    """

    kind: str
    loss: LossFn | None
    metric: MetricFn | None = None
    metric_name: str = "metric"
    dense: bool = False
    metric_state: Callable[[int, int], Metric] | None = None
    expects: Callable[[Any, torch.Tensor, Any], str | None] | None = None
    check_outputs: Callable[[int, int], None] | None = None
    uses_ignore_index: bool = False
    refused: str | None = None
    head: Callable[[int, int], Any] | None = None
    epoch_metric: Callable[[Any, str], dict[str, torch.Tensor]] | None = None
    metric_stages: tuple[str, ...] = ("train", "val", "test")


_LOSSES: dict[str, TargetLoss] = {}


def register_loss(kind: str, loss: LossFn | None, metric: MetricFn | None = None, **how: Any) -> TargetLoss:
    """Register (or replace) the loss and metric ``ToyCNN`` trains target kind ``kind`` with.

    Args:
        kind: The target kind's name.
        loss: ``loss(model, outputs, targets, stage)``.
        metric: ``metric(model, outputs, targets, stage)``, logged as ``{stage}/{metric_name}``.
        how: The other fields of :class:`TargetLoss` (``metric_name``, ``dense``, ``metric_state``, ``expects``, ``head``,
            ``epoch_metric``, ``metric_stages``, ...).
    """
    entry = TargetLoss(kind, loss, metric, **how)
    _LOSSES[kind] = entry
    return entry


def unregister_loss(kind: str) -> None:
    """Remove the loss of ``kind`` (nothing if it has none)."""
    _LOSSES.pop(kind, None)


def target_loss(kind: str) -> TargetLoss:
    """The loss registered for target kind ``kind``.

    Raises:
        OptionError: None is (the message names the kind, those that have one, and :func:`register_loss`).
    """
    entry = _LOSSES.get(kind)
    if entry is None:
        raise OptionError(f"ToyCNN has no loss for target_kind={kind!r}; the kinds it learns are {', '.join(map(repr, _LOSSES))}. "
                          "Register one with lightning_lmdb.experiment.target_losses.register_loss(kind, loss, metric).")
    return entry


class MeanIoU(Metric):
    """Mean intersection over union of a segmentation, from the intersections and unions per class summed over the updates.

    Pixels whose target is ``ignore_index`` are left out (whatever was predicted there). Per class ``c``, over all updates:
    intersection = pixels predicted ``c`` whose target is ``c``; union = pixels predicted ``c`` or whose target is ``c``. The
    mean is over the classes present, those with a union above 0 (in the targets or in the predictions: a class predicted but
    never labelled has an IoU of 0); ``nan`` when every pixel was ignored. The counts are summed across processes (DDP).

    Args:
        num_classes: The classes; targets (other than ``ignore_index``) and predictions are ``0 .. num_classes - 1``.
        ignore_index: The target value of unlabelled pixels.
    """

    full_state_update = False
    intersection: torch.Tensor
    union: torch.Tensor

    def __init__(self, num_classes: int, ignore_index: int = DEFAULT_IGNORE_INDEX):
        super().__init__()
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self.add_state("intersection", torch.zeros(num_classes, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("union", torch.zeros(num_classes, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, predicted: torch.Tensor, targets: torch.Tensor) -> None:
        """Add a batch: ``predicted`` class ids and ``targets`` of the same shape (e.g. ``[N, H, W]``), integers.

        Counted with fixed-size scatters (no boolean indexing), so an update never waits for the device.
        """
        valid = (targets != self.ignore_index).flatten()
        predicted = torch.where(valid, predicted.flatten(), 0)
        targets = torch.where(valid, targets.flatten(), 0)
        ones = valid.to(torch.int64)
        hits = ones * (predicted == targets)

        def per_class(ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
            return torch.zeros(self.num_classes, dtype=torch.int64, device=ids.device).scatter_add_(0, ids, weights)

        intersection = per_class(targets, hits)
        self.intersection += intersection
        self.union += per_class(predicted, ones) + per_class(targets, ones) - intersection

    def compute(self) -> torch.Tensor:
        """The mean IoU over the classes present (``nan`` when none is)."""
        present = self.union > 0
        if not bool(present.any()):
            return torch.tensor(float("nan"), device=self.union.device)
        return (self.intersection[present].float() / self.union[present].float()).mean()


# --- the library's kinds ------------------------------------------------------------------------------------------------------


def _same_shape(model: Any, outputs: torch.Tensor, targets: Any) -> str | None:
    return None if targets.shape == outputs.shape else f"float32 [N, {model.num_outputs}]"


def _floats(targets: torch.Tensor) -> torch.Tensor:
    return targets if targets.is_floating_point() else targets.float()


def _class_expects(model: Any, outputs: torch.Tensor, targets: Any) -> str | None:
    return None if targets.ndim == 1 and not targets.is_floating_point() else "int64 [N]"


def _mask_expects(model: Any, outputs: torch.Tensor, targets: Any) -> str | None:
    n, _, h, w = outputs.shape
    if targets.shape == (n, h, w) and not targets.is_floating_point() and targets.dtype != torch.bool:
        return None
    return f"int64 [N, H, W] = {[n, h, w]}, the images' size"


def _mask_loss(model: Any, outputs: torch.Tensor, targets: Any, stage: str) -> torch.Tensor:
    targets = targets.long()
    _check_mask_values(model, targets, stage)
    labelled = (targets != model.ignore_index).sum()
    # the mean over the labelled pixels (F.cross_entropy's mean), 0 rather than nan for a batch without any
    return F.cross_entropy(outputs, targets, ignore_index=model.ignore_index, reduction="sum") / labelled.clamp_min(1)


def _check_mask_values(model: Any, masks: torch.Tensor, stage: str) -> None:
    """An :class:`OptionError` when a mask value is neither a class nor ``ignore_index`` (checked on a stage's first batch only:
    the check waits for the device)."""
    if stage in model._values_checked:
        return
    model._values_checked.add(stage)
    bad = ((masks < 0) | (masks >= model.num_outputs)) & (masks != model.ignore_index)
    if bool(bad.any()):
        values = sorted(set(masks[bad].unique().tolist()))[:10]
        raise OptionError(f"ToyCNN(target_kind='mask', num_outputs={model.num_outputs}, ignore_index={model.ignore_index}) got mask "
                          f"values {values}: neither a class (0 .. {model.num_outputs - 1}) nor the ignore value. Build it with "
                          "num_outputs=datamodule.num_classes and ignore_index=datamodule.ignore_index.")


def _mask_metric(model: Any, outputs: torch.Tensor, targets: Any, stage: str) -> Metric:
    miou = model.miou[f"{stage}_miou"]
    miou.update(outputs.detach().argmax(1), targets.long())
    return miou


def _multilabel_metric(model: Any, outputs: torch.Tensor, targets: Any, stage: str) -> Metric:
    f1 = model.f1[f"{stage}_f1"]
    f1.update((outputs.detach() > 0).int(), (_floats(targets) > 0.5).int())
    return f1


def _regression_outputs(outputs: int, ignore_index: int) -> None:
    if outputs < 1:
        raise OptionError(f"num_outputs={outputs}: a regression head needs one output per target value (K >= 1). "
                          "Pass num_outputs=len(datamodule.target_names).")


def _mask_outputs(outputs: int, ignore_index: int) -> None:
    if outputs < 1:
        from lightning_lmdb.errors import SourceError

        raise SourceError(f"num_outputs={outputs}: the masks have no classes (no value below ignore_index={ignore_index}). "
                          "Pass the number of classes (Hydra: data.source_options.num_classes=...), or check the masks' values.")


register_loss("class", lambda model, outputs, targets, stage: F.cross_entropy(outputs, targets),
              lambda model, outputs, targets, stage: (outputs.argmax(1) == targets).float().mean(), metric_name="acc",
              expects=_class_expects)
register_loss("multilabel", lambda model, outputs, targets, stage: F.binary_cross_entropy_with_logits(outputs, _floats(targets)),
              _multilabel_metric, metric_name="f1", expects=_same_shape,
              metric_state=lambda outputs, ignore: MultilabelF1Score(num_labels=outputs, average="micro", threshold=0.5,
                                                                    validate_args=False))
register_loss("regression", lambda model, outputs, targets, stage: F.mse_loss(outputs, _floats(targets)),
              lambda model, outputs, targets, stage: (outputs.detach() - _floats(targets)).abs().mean(), metric_name="mae",
              expects=_same_shape, check_outputs=_regression_outputs)
register_loss("mask", _mask_loss, _mask_metric, metric_name="miou", dense=True, metric_state=MeanIoU, expects=_mask_expects,
              check_outputs=_mask_outputs, uses_ignore_index=True)
register_loss("none", None, refused="target_kind='none': the data has no labels (a flat folder, or a manifest without a label "
              "column), so there is nothing to learn. Use a folder with one subfolder per class, or a manifest with a label column "
              "(Hydra: data.source_options.label_column=...); model=noop runs on unlabelled data.")
register_loss("boxes", detection.detection_loss, detection.detection_metric, metric_name="map", head=detection.make_head,
              metric_state=detection.make_map, epoch_metric=detection.detection_epoch, metric_stages=("val", "test"),
              expects=detection.detection_expects)
