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
decode would give it: pass a larger ``decode_size``, or ``None``, if that matters to you.) A reduced
decode's crop is drawn in the file's pixels, as for a full decode (its corner on the decode's pixel grid),
and mapped onto the decode at its exact scale (:func:`lightning_lmdb.decoders.reduced_from`), so the picture
keeps its place and proportions.
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

from lightning_lmdb.decoders import pil_to_tensor, reduced_from

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

    def params(self, height: int, width: int, align: int = 1) -> tuple[int, int, int, int, int]:
        """``(top, left, crop height, crop width, flip)`` for an image of this size (torch's RNG, so workers differ).

        Evaluation takes the whole image (the centre crop happens after the resize, as torchvision's does).

        Args:
            height: The image's height (in the file: a reduced-size decode's crops are drawn at full size).
            width: Its width.
            align: Move a random crop's top left corner up and left to multiples of this (at most ``align - 1``
                pixels; its size is kept): the pixel grid of a decode at ``1 / align`` scale (see :meth:`apply`).
        """
        if not self.train:
            return 0, 0, height, width, 0
        top, left, h, w = _random_crop(height, width, self.scale, self.ratio)
        return top - top % align, left - left % align, h, w, int(torch.rand(1).item() < self.hflip)

    def apply(self, image: torch.Tensor, params: Sequence[int], factor: int = 1) -> torch.Tensor:
        """Crop ``image`` (``3 x H x W``, any device) by ``params`` and resize it to ``size x size`` (antialiased), flip.

        Evaluation: resize the shorter side to :attr:`min_input_side`, then cut the centre ``size x size``.

        Args:
            image: The decoded image.
            params: ``(top, left, crop height, crop width, flip)`` in the pixels of the image in the file.
            factor: ``image`` is a reduced-size decode at ``1 / factor`` scale; ``top`` and ``left`` must then be
                multiples of ``factor`` (``params(..., align=factor)``). See :func:`_resized_box`.

        Raises:
            ValueError: ``top`` or ``left`` is not a multiple of ``factor``.
        """
        top, left, h, w, flip = (int(p) for p in params)
        if top % factor or left % factor:
            raise ValueError(f"A crop of a decode at 1/{factor} scale must start at a multiple of {factor}, not at ({top}, {left}): "
                             f"draw it with params(height, width, align={factor}).")
        if not self.train:
            short, long = sorted((h, w))
            side, other = self.min_input_side, int(self.min_input_side * long / short)  # torchvision's Resize(int) sizes
            resized = _resized_box(image, (top, left, h, w), [side, other] if h <= w else [other, side], factor)
            return F.center_crop_image(resized, [self.size, self.size])
        out = _resized_box(image, (top, left, h, w), [self.size, self.size], factor)
        return out.flip(-1) if flip else out

    def __call__(self, image: Any) -> torch.Tensor:
        if isinstance(image, Image.Image):
            image = pil_to_tensor(image)
        elif not isinstance(image, torch.Tensor):
            raise TypeError(f"ResizedCrop takes a uint8 3 x H x W tensor or a PIL image, not {type(image).__name__}.")
        reduced = reduced_from(image)
        if reduced is not None:  # a reduced-size decode: the crop is drawn on the image in the file, on the decode's pixel grid
            return self.apply(image, self.params(reduced.height, reduced.width, align=reduced.factor), reduced.factor)
        return self.apply(image, self.params(image.shape[-2], image.shape[-1]))


def _resized_box(image: torch.Tensor, box: tuple[int, int, int, int], size: list[int], factor: int) -> torch.Tensor:
    """The ``(top, left, height, width)`` box of the image in the file, resized to ``size``, from ``image``: its decode at ``1/factor``.

    ``factor`` 1: crop and resize (torchvision's pixels). Otherwise decoded pixel ``i`` covers the file's pixels
    ``[factor * i, factor * (i + 1))`` -- the last one, of a padded block, fewer -- so the box (``top`` and ``left``
    multiples of ``factor``) spans exactly ``height / factor x width / factor`` decoded pixels from ``top / factor,
    left / factor``. The resize maps its output onto that span, its scales given rather than taken from the whole
    decoded pixels the span touches: those hold up to ``factor - 1`` padding pixels too, and resizing all of them
    stretched the picture.
    """
    top, left, height, width = box
    if factor == 1:
        return _resize(image[..., top : top + height, left : left + width], size)
    top, left = top // factor, left // factor
    rows, cols = -(-height // factor), -(-width // factor)  # every decoded pixel the span touches
    return _resize(image[..., top : top + rows, left : left + cols], size, (size[0] * factor / height, size[1] * factor / width))


def _resize(image: torch.Tensor, size: list[int], scales: tuple[float, float] | None = None) -> torch.Tensor:
    """torchvision's antialiased bilinear resize of a ``3 x H x W`` image to ``size`` (height, width).

    On the CPU the ``uint8`` kernel is called directly: its output is then a contiguous ``3 x h x w`` tensor,
    where torchvision keeps the decoders' channels-last layout -- and stacking 64 channels-last images into
    a batch cost 10 us an image more than stacking contiguous ones (a strided gather), for the same pixels.

    ``scales`` (output pixels per input pixel, height and width): map the output onto the first ``size / scales``
    input pixels rather than onto all of them. ``interpolate`` takes a size or scales, its kernel both.
    """
    native = image.device.type == "cpu" and image.dtype == torch.uint8
    if scales is None:
        if native:
            return interpolate(image[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0]
        return F.resize_image(image, size, antialias=True)
    pixels = image if native or image.is_floating_point() else image.float()  # off the CPU, uint8 in float as torchvision does
    out = torch.ops.aten._upsample_bilinear2d_aa(pixels[None], size, False, *scales)[0]
    return out if out.dtype == image.dtype else out.round_().clamp_(0, 255).to(image.dtype)


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
