"""Models of the A/B: a small CNN (:class:`ToyCNN`), and a model that does nothing (:class:`NoOpModel`).

Both are cheap enough that the data loader, not the model, is what a run measures; with ``NoOpModel``
(``python train.py model=noop``) an epoch takes as long as the loader needs to produce its batches.

``ToyCNN`` learns whatever target the data serves (``target_kind``, see :mod:`lightning_lmdb.targets`), with the loss and
metric registered for the kind's name in :mod:`lightning_lmdb.experiment.target_losses` (cross-entropy and accuracy for
``class``, binary cross-entropy and micro F1 for ``multilabel``, mean squared and absolute error for ``regression``, per-pixel
cross-entropy and mean IoU for ``mask``, a CenterNet-style detector and COCO's mAP for ``boxes``; ``none`` is refused: nothing
to learn). A kind of yours is one ``register_loss`` call.

For ``boxes`` (object detection) ``ToyCNN`` keeps the three blocks unpooled and puts the head of
:mod:`lightning_lmdb.experiment.detection` on them: per-class centre heatmaps at stride 4 with box size and offset, decoded
into scored boxes; ``val/map_50`` and ``val/map`` (torchmetrics' ``MeanAveragePrecision``) are logged per epoch.

For ``mask`` (segmentation) ``ToyCNN`` is fully convolutional: the same three strided blocks without the pooling, a 1x1
convolution to one logit per class, and the logits upsampled bilinearly to the input's ``H x W`` (a ``[N, C, H, W]`` output).
``train.py`` builds it without a ``model=`` override: it passes the data's ``target_kind``, ``num_outputs=num_classes`` and
``ignore_index``. The pixels whose mask value is ``ignore_index`` (255 by default, Pascal VOC's object borders) count in neither
the loss nor the metric; a batch of ignored pixels only has a loss of 0.

``stage`` is ``train``, ``val`` or ``test``; every metric is of the whole epoch (the F1 from the epoch's summed true and false
positives and negatives, the mean IoU from the epoch's summed intersections and unions per class, not an average of per-batch
scores). ``NoOpModel`` accepts every kind: it never reads the targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F

from lightning_lmdb.errors import OptionError, SourceError
from lightning_lmdb.experiment.target_losses import MeanIoU, target_loss
from lightning_lmdb.sources.masks import DEFAULT_IGNORE_INDEX
from lightning_lmdb.targets import kind_names

__all__ = ["MeanIoU", "NoOpModel", "ToyCNN"]

#: The stages whose steps log metrics.
_STAGES = ("train", "val", "test")


def _check_kind(target_kind: str) -> str:
    """``target_kind``, or an :class:`OptionError` that names it when it is not a registered target kind
    (:func:`lightning_lmdb.targets.target_kinds`)."""
    if target_kind not in kind_names():
        raise OptionError(f"target_kind={target_kind!r} is not one of {', '.join(map(repr, kind_names()))}. "
                          "Pass the data's kind (train.py passes datamodule.target_kind).")
    return target_kind


class ToyCNN(pl.LightningModule):
    """Three strided conv blocks, global average pooling and a linear head; the loss follows the target kind (module docstring).

    ``ToyCNN(num_classes=10)`` is a classifier, as it always was (and its checkpoints load as one);
    ``train.py`` passes the data's ``target_kind`` and the head's size ``num_outputs`` as well (and ``ignore_index`` for masks).
    ``ToyCNN(target_kind="mask", num_outputs=C, ignore_index=255)`` is the fully convolutional variant: no pooling, a 1x1
    convolution head, logits upsampled to the input's size.

    Args:
        num_classes: Classes of the data; the head's size when ``num_outputs`` is ``None``.
        width: Channels of the first block (doubled in each next one).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        target_kind: ``"class"``, ``"multilabel"``, ``"regression"``, ``"mask"`` or ``"boxes"`` (``"none"`` is refused: nothing
            to learn), or a kind of yours with a loss registered (:func:`lightning_lmdb.experiment.target_losses.register_loss`).
        num_outputs: Size of the head: the number of classes (``class``, ``multilabel``, ``mask``) or of values per sample
            (``regression``: ``len(datamodule.target_names)``); ``None`` for ``num_classes``.
        ignore_index: For ``mask``: the mask value of unlabelled pixels, left out of the loss and the mean IoU
            (``datamodule.ignore_index``). Unused by the other kinds (and not in their hyperparameters).

    Raises:
        OptionError: A ``target_kind`` that is not a kind, or ``regression`` without values (``num_outputs`` < 1).
        SourceError: Data without labels (``target_kind="none"``), or without classes (``class``/``multilabel``/``mask``, 0 outputs).
    """

    def __init__(self, num_classes: int = 0, width: int = 32, lr: float = 3e-3, weight_decay: float = 1e-4, target_kind: str = "class",
                 num_outputs: int | None = None, ignore_index: int = DEFAULT_IGNORE_INDEX):
        super().__init__()
        kind = _check_kind(target_kind)
        outputs = num_classes if num_outputs is None else num_outputs
        learned = target_loss(kind)
        if learned.refused is not None:
            raise SourceError(learned.refused)
        if learned.check_outputs is not None:
            learned.check_outputs(outputs, ignore_index)
        if outputs < 1:
            raise SourceError(
                f"num_classes={outputs}: the data has no classes (a flat folder?). Use a folder with one subfolder per class, "
                "or a manifest with a label column."
            )
        # ignore_index matters to masks only: the other kinds' hyperparameters (and checkpoints) stay as they were
        self.save_hyperparameters(ignore=[] if learned.uses_ignore_index else ["ignore_index"])
        self.target_kind = kind
        self.num_outputs = outputs
        self.ignore_index = ignore_index
        self._values_checked: set[str] = set()  # the stages whose first mask batch had its values checked

        def block(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))

        blocks = (block(3, width), block(width, 2 * width), block(2 * width, 4 * width))
        self.head: nn.Module
        if learned.head is not None:  # the kind's own head on the stride-8 features (boxes: CenterNet-style heatmaps)
            self.features = nn.Sequential(*blocks)
            self.head = learned.head(4 * width, outputs)
        elif learned.dense:  # fully convolutional: a logit per class at 1/8 of the input's size, upsampled in forward
            self.features = nn.Sequential(*blocks)
            self.head = nn.Conv2d(4 * width, outputs, 1)
        else:
            self.features = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1))
            self.head = nn.Linear(4 * width, outputs)
        if learned.metric_state is not None:  # one per stage, summed over the epoch; their states are not in the checkpoint
            name = learned.metric_name
            stages = [stage for stage in _STAGES if stage in learned.metric_stages]
            setattr(self, name, nn.ModuleDict({f"{stage}_{name}": learned.metric_state(outputs, ignore_index) for stage in stages}))
        self._own_head = learned.head is not None
        self._dense = learned.dense and not self._own_head

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """The head's outputs for a batch of images: class logits (``class``, ``multilabel``), values (``regression``),
        per-pixel class logits ``[N, C, H, W]`` at the images' ``H x W`` (``mask``: a dense kind), or what a kind's own head
        gives (``boxes``: ``[N, C + 4, H / 4, W / 4]``, see :mod:`lightning_lmdb.experiment.detection`)."""
        if self._own_head:
            return self.head(self.features(images))
        if self._dense:
            return F.interpolate(self.head(self.features(images)), size=images.shape[-2:], mode="bilinear", align_corners=False)
        return self.head(self.features(images).flatten(1))

    def _check_targets(self, outputs: torch.Tensor, targets: Any) -> None:
        """An :class:`OptionError` when ``targets`` are not what the target kind serves (a model built for other data)."""
        expects = target_loss(self.target_kind).expects
        expected = None if expects is None else expects(self, outputs, targets)
        if expected is None:
            return
        kind, shown = self.target_kind, (f"of dtype {targets.dtype} and shape {list(targets.shape)}" if isinstance(targets, torch.Tensor)
                                         else f"of type {type(targets).__name__}")
        raise OptionError(f"ToyCNN(target_kind={kind!r}, num_outputs={self.num_outputs}) got targets {shown}, not {expected}. Build it "
                          "with the data's target_kind and output size "
                          "(datamodule.target_kind; datamodule.num_classes, or len(datamodule.target_names) for regression).")

    def _step(self, batch: tuple[torch.Tensor, Any], stage: str) -> torch.Tensor:
        images, targets = batch
        outputs = self(images)
        self._check_targets(outputs, targets)
        learned = target_loss(self.target_kind)
        log = {"prog_bar": True, "on_step": False, "on_epoch": True, "batch_size": len(targets)}
        assert learned.loss is not None
        loss = learned.loss(self, outputs, targets, stage)
        self.log(f"{stage}/loss", loss, **log)
        if learned.metric is not None and stage in learned.metric_stages:
            value = learned.metric(self, outputs, targets, stage)
            if value is not None:
                self.log(f"{stage}/{learned.metric_name}", value, **log)
        return loss

    def _epoch_end(self, stage: str) -> None:
        """Log the epoch's values of a kind with an ``epoch_metric`` (``{stage}/map_50`` and ``{stage}/map`` for ``boxes``)."""
        learned = target_loss(self.target_kind)
        if learned.epoch_metric is None or stage not in learned.metric_stages:
            return
        for name, value in learned.epoch_metric(self, stage).items():
            self.log(f"{stage}/{name}", value, prog_bar=True)

    def on_train_epoch_end(self) -> None:
        self._epoch_end("train")

    def on_validation_epoch_end(self) -> None:
        self._epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._epoch_end("test")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)


def _images(batch: Any) -> torch.Tensor | None:
    """The first tensor of a batch: the images of an ``(images, targets)`` pair (whatever the targets), or the batch itself."""
    if isinstance(batch, torch.Tensor):
        return batch
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    return next((item for item in items if isinstance(item, torch.Tensor)), None)


class NoOpModel(pl.LightningModule):
    """Stands in for an infinitely fast accelerator: each step reads one value per sample of the batch, and that is all.

    The loss is ``0 * (one element of each image) + 0 * w`` with one parameter ``w``, so the batch is consumed
    (on a GPU its copy and the step are ordered on the stream), the optimizer has something to step and nothing
    changes. Nothing is logged per step (``self.log`` would cost more than the step); validation and test
    steps touch their batch the same way.

    Training on the CPU, it keeps the training process to one intra-op thread while it runs (restored after):
    an accelerator leaves the CPU to the loader, but torch's idle OpenMP threads would spin on the cores
    the loader's workers need (on 2 cores that took half the training process's CPU time).

    Args:
        num_classes: Classes of the data (kept in the hyperparameters only; any value, 0 for a flat folder).
        lr: SGD learning rate (the gradient is zero, so it does not matter).
        target_kind: The data's target kind, any of them (kept in the hyperparameters only: the targets are never read).
        num_outputs: The output size a real model would have (kept in the hyperparameters only).
        ignore_index: The masks' ignore value (``mask`` data; kept in the hyperparameters only).

    Raises:
        OptionError: A ``target_kind`` that is not a registered target kind (:func:`lightning_lmdb.targets.target_kinds`).
    """

    def __init__(self, num_classes: int = 0, lr: float = 0.0, target_kind: str = "class", num_outputs: int | None = None,
                 ignore_index: int = DEFAULT_IGNORE_INDEX):
        super().__init__()
        _check_kind(target_kind)
        self.save_hyperparameters()
        self.w = nn.Parameter(torch.zeros(1))

    def on_fit_start(self) -> None:
        self._threads = torch.get_num_threads()
        if self.device.type == "cpu":
            torch.set_num_threads(1)

    def teardown(self, stage: str) -> None:
        if getattr(self, "_threads", None):
            torch.set_num_threads(self._threads)
            self._threads = None

    def _touch(self, batch: Any) -> torch.Tensor:
        images = _images(batch)
        loss = self.w.sum() * 0.0
        if images is not None and images.ndim and images.numel():
            loss = loss + images.reshape(len(images), -1)[:, 0].float().sum() * 0.0
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._touch(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._touch(batch)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._touch(batch)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self._touch(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
