"""Default image transforms (torchvision v2): the same for both backends, so an A/B differs only in storage."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchvision.transforms import v2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def train_transform(
    image_size: int = 224,
    *,
    scale: Sequence[float] = (0.08, 1.0),
    hflip: float = 0.5,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> v2.Compose:
    """Random resized crop, horizontal flip, to float tensor, normalise.

    Args:
        image_size: Output side in pixels.
        scale: Area range of the random crop.
        hflip: Probability of a horizontal flip.
        mean: Per-channel mean for normalisation.
        std: Per-channel standard deviation for normalisation.
    """
    return v2.Compose(
        [
            v2.ToImage(),
            v2.RandomResizedCrop(image_size, scale=tuple(scale), antialias=True),
            v2.RandomHorizontalFlip(hflip),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(list(mean), list(std)),
        ]
    )


def eval_transform(
    image_size: int = 224,
    *,
    resize_ratio: float = 256 / 224,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> v2.Compose:
    """Resize the short side, centre crop, to float tensor, normalise (deterministic).

    Args:
        image_size: Output side in pixels.
        resize_ratio: Short side before cropping, as a multiple of ``image_size``.
        mean: Per-channel mean for normalisation.
        std: Per-channel standard deviation for normalisation.
    """
    return v2.Compose(
        [
            v2.ToImage(),
            v2.Resize(round(image_size * resize_ratio), antialias=True),
            v2.CenterCrop(image_size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(list(mean), list(std)),
        ]
    )
