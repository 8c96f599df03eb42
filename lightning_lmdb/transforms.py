"""Default image transforms and the batch finish: the same for both backends, so an A/B differs only in storage.

The defaults are :class:`ResizedCrop` -- torchvision's ``RandomResizedCrop`` + horizontal flip for
training, ``Resize`` + ``CenterCrop`` for evaluation -- calling torchvision's own kernels (one crop and
one antialiased resize) on the decoder's ``uint8`` tensor directly, without v2's per-call dispatch
(~50 us a sample here, a tenth of a small PNG's whole decode). The same object draws a crop from a
size alone, which is what lets the batched GPU decode apply per-sample crops
(:mod:`lightning_lmdb.batchdecode`).

They **stay in uint8**: workers send ``uint8`` batches (4x less data through the DataLoader's shared
memory and the host-to-device copy than ``float32``), and :func:`finish_batch` converts them to float
and normalises them on the training device (``LMDBDataModule.on_after_batch_transfer`` does it).
``normalize=True`` gives the classic float pipeline in the workers instead.

Each default transform has ``min_input_side``: the shorter side a decoded image needs so that a
full-image crop is only ever downscaled -- what ``LMDBDataModule`` passes as ``decode_size`` for
reduced-size decoding. (A small random crop is then enlarged from fewer source pixels than a full
decode would give it: pass a larger ``decode_size``, or ``None``, if that matters to you.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from torch.nn.functional import interpolate
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ResizedCrop:
    """A crop drawn per sample, then an antialiased resize to ``size x size`` and an optional horizontal flip.

    Callable on a decoded image -- a ``uint8`` ``3 x H x W`` tensor, or a PIL image (converted first) -- and
    returns a ``uint8`` ``3 x size x size`` tensor; :meth:`params` draws the same geometry from a size alone
    (the batched path).

    Args:
        size: Output side.
        train: ``True``: ``RandomResizedCrop(size, scale, ratio)`` then a flip with probability ``hflip``.
            ``False``: ``Resize(round(size * resize_ratio))`` + ``CenterCrop(size)`` (torchvision's pixels exactly).
        scale: Area range of the random crop.
        ratio: Aspect-ratio range of the random crop.
        hflip: Probability of a horizontal flip (training).
        resize_ratio: Shorter side before the centre crop, as a multiple of ``size`` (evaluation).
    """

    size: int
    train: bool = True
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    resize_ratio: float = 256 / 224

    @property
    def min_input_side(self) -> int:
        """The shorter side a decoded image needs so that a full-image crop is only ever downscaled."""
        return self.size if self.train else round(self.size * self.resize_ratio)

    def params(self, height: int, width: int) -> tuple[int, int, int, int, int]:
        """``(top, left, crop height, crop width, flip)`` for an image of this size (torch's RNG, so workers differ).

        Evaluation takes the whole image (the centre crop happens after the resize, as torchvision's does).
        """
        if not self.train:
            return 0, 0, height, width, 0
        top, left, h, w = _random_crop(height, width, self.scale, self.ratio)
        return top, left, h, w, int(torch.rand(1).item() < self.hflip)

    def apply(self, image: torch.Tensor, params: Sequence[int]) -> torch.Tensor:
        """Crop ``image`` (``3 x H x W``, any device) by ``params`` and resize it to ``size x size`` (antialiased), flip.

        Evaluation: resize the shorter side to :attr:`min_input_side`, then cut the centre ``size x size``.
        """
        top, left, h, w, flip = (int(p) for p in params)
        crop = image[..., top : top + h, left : left + w]
        if not self.train:
            short, long = sorted((h, w))
            side, other = self.min_input_side, int(self.min_input_side * long / short)  # torchvision's Resize(int) sizes
            return F.center_crop_image(_resize(crop, [side, other] if h <= w else [other, side]), [self.size, self.size])
        out = _resize(crop, [self.size, self.size])
        return out.flip(-1) if flip else out

    def __call__(self, image: Any) -> torch.Tensor:
        if isinstance(image, Image.Image):
            from lightning_lmdb.decoders import pil_to_tensor

            image = pil_to_tensor(image)
        elif not isinstance(image, torch.Tensor):
            raise TypeError(f"ResizedCrop takes a uint8 3 x H x W tensor or a PIL image, not {type(image).__name__}.")
        return self.apply(image, self.params(image.shape[-2], image.shape[-1]))


def _resize(image: torch.Tensor, size: list[int]) -> torch.Tensor:
    """torchvision's antialiased bilinear resize of a ``3 x H x W`` image to ``size`` (height, width).

    On the CPU the ``uint8`` kernel is called directly: its output is then a contiguous ``3 x h x w`` tensor,
    where torchvision keeps the decoders' channels-last layout -- and stacking 64 channels-last images into
    a batch cost 10 us an image more than stacking contiguous ones (a strided gather), for the same pixels.
    """
    if image.device.type == "cpu" and image.dtype == torch.uint8:
        return interpolate(image[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    return F.resize_image(image, size, antialias=True)


def _random_crop(height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``, from a size instead of an image."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1]).item())
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            left = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return top, left, h, w
    in_ratio = width / height  # fallback: the central crop of the nearest allowed aspect ratio
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def train_transform(
    image_size: int = 224,
    *,
    scale: Sequence[float] = (0.08, 1.0),
    hflip: float = 0.5,
    normalize: bool = False,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> Callable[[Any], torch.Tensor]:
    """Random resized crop and horizontal flip, as ``uint8`` (or, with ``normalize``, a normalised float tensor).

    Args:
        image_size: Output side in pixels.
        scale: Area range of the random crop.
        hflip: Probability of a horizontal flip.
        normalize: Also convert to float and normalise (in the worker) instead of leaving it to :func:`finish_batch`.
        mean: Per-channel mean for normalisation.
        std: Per-channel standard deviation for normalisation.
    """
    crop = ResizedCrop(image_size, train=True, scale=(float(scale[0]), float(scale[1])), hflip=hflip)
    return _normalized(crop, mean, std) if normalize else crop


def eval_transform(
    image_size: int = 224,
    *,
    resize_ratio: float = 256 / 224,
    normalize: bool = False,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> Callable[[Any], torch.Tensor]:
    """``Resize(round(image_size * resize_ratio))`` + ``CenterCrop(image_size)``, as ``uint8`` (or a normalised float tensor).

    Args:
        image_size: Output side in pixels.
        resize_ratio: Short side before cropping, as a multiple of ``image_size``.
        normalize: Also convert to float and normalise (in the worker) instead of leaving it to :func:`finish_batch`.
        mean: Per-channel mean for normalisation.
        std: Per-channel standard deviation for normalisation.
    """
    crop = ResizedCrop(image_size, train=False, resize_ratio=resize_ratio)
    return _normalized(crop, mean, std) if normalize else crop


def _normalized(crop: ResizedCrop, mean: Sequence[float], std: Sequence[float]) -> v2.Compose:
    compose = v2.Compose([crop, v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))])
    compose.min_input_side = crop.min_input_side
    return compose


def finish_batch(images: torch.Tensor, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """``uint8`` ``N x 3 x H x W`` images to normalised ``float32`` on their own device: ``(x / 255 - mean) / std``.

    Raises:
        ValueError: ``images`` is not a ``uint8`` batch of 3-channel images.
    """
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != len(mean):
        raise ValueError(f"finish_batch takes uint8 N x {len(mean)} x H x W images, not {images.dtype} of shape {tuple(images.shape)}.")
    key = (images.device, tuple(mean), tuple(std))
    constants = _FINISH.get(key)
    if constants is None:
        std_ = torch.tensor(std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
        mean_ = torch.tensor(mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
        constants = _FINISH[key] = (1.0 / (255.0 * std_), -mean_ / std_)
    scale, shift = constants
    return images.float().mul_(scale).add_(shift)


_FINISH: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}  # (device, mean, std) -> (scale, shift)
