"""Default image transforms and the batch finish: the same for both backends, so an A/B differs only in storage.

The defaults are :class:`ResizedCrop` -- torchvision's ``RandomResizedCrop`` + horizontal flip for
training, ``Resize`` + ``CenterCrop`` for evaluation -- calling torchvision's own kernels (one crop and
one antialiased resize) on the decoder's ``uint8`` tensor directly, without v2's per-call dispatch
(~50 us a sample here, a tenth of a small PNG's whole decode). The same object draws a crop from a
size alone, which is what lets the batched GPU decode apply per-sample crops
(:mod:`lightning_lmdb.read.batchdecode`).

They **stay in uint8**: workers send ``uint8`` batches (4x less data through the DataLoader's shared
memory and the host-to-device copy than ``float32``), and :func:`finish_batch` converts them to float
and normalises them on the training device (``LMDBDataModule.on_after_batch_transfer`` does it).
``normalize=True`` gives the classic float pipeline in the workers instead.

Each default transform has ``min_input_side``: the shorter side a decoded image needs so that a
full-image crop is only ever downscaled -- what ``LMDBDataModule`` passes as ``decode_size`` for
reduced-size decoding. (A small random crop is then enlarged from fewer source pixels than a full
decode would give it: pass a larger ``decode_size``, or ``None``, if that matters to you.) A reduced
decode's crop is drawn in the file's pixels, as for a full decode (its corner on the decode's pixel grid),
and mapped onto the decode at its exact scale (:func:`lightning_lmdb.codec.decoders.reduced_from`), so the picture
keeps its place and proportions.

**Segmentation masks** (target kind ``"mask"``) are transformed with their image: ``ResizedCrop(image, mask)``
returns ``(image, mask)``, the mask cropped, resized and flipped by the same parameters with nearest-neighbour
interpolation (:meth:`ResizedCrop.apply_mask`: each output pixel takes the mask value at its centre, mapped
as the image's resize maps it; no value is invented). The mask is always at the image's size in the file,
so a reduced-size decode of the image keeps it aligned: the crop is drawn in the file's pixels and applied
to the mask at full resolution. A transform of yours for mask data takes and returns ``(image, mask)``
(a ``torchvision.transforms.v2`` pipeline does, the mask a ``tv_tensors.Mask``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.nn.functional import interpolate
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from lightning_lmdb.codec.decoders import pil_to_tensor, reduced_from
from lightning_lmdb.sources.masks import DEFAULT_IGNORE_INDEX

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ResizedCrop:
    """A crop drawn per sample, then an antialiased resize to ``size x size`` and an optional horizontal flip.

    Callable on a decoded image -- a ``uint8`` ``3 x H x W`` tensor, or a PIL image (converted first) -- and
    returns a ``uint8`` ``3 x size x size`` tensor; :meth:`params` draws the same geometry from a size alone
    (the batched path). Called as ``crop(image, mask)`` (a segmentation sample) it returns ``(image, mask)``,
    the mask given the same geometry with nearest-neighbour interpolation (:meth:`apply_mask`).

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

    def apply_mask(self, mask: torch.Tensor, params: Sequence[int], fill: int = DEFAULT_IGNORE_INDEX) -> torch.Tensor:
        """The geometry of :meth:`apply` with ``params``, given to a segmentation mask (``H x W``, any dtype, the image's size in the file).

        Nearest-neighbour: output pixel ``r`` takes the mask value at its centre, mapped into the crop as the image's
        resize maps it (source row ``top + floor((r + 1/2) * h / resized height)``), so no value is invented and the
        mask stays on the image's pixels: within half an output pixel, where the image's antialiased resize blends
        neighbouring pixels over about one output pixel either side of an edge. Works on any device.

        Args:
            mask: The mask, at the full size of the image in the file (also with a reduced-size decode of the image).
            params: ``(top, left, crop height, crop width, flip)``, as :meth:`apply` takes them (with ``factor`` 1).
            fill: The value of pixels outside the image (only an evaluation crop larger than its resized image has them,
                with ``resize_ratio < 1``): the ignore index.

        Returns:
            ``size x size``, the dtype of ``mask`` (a ``tv_tensors.Mask`` for one).
        """
        top, left, h, w, flip = (int(p) for p in params)
        resized, offsets = self._resized(h, w)
        rows = _nearest(top, h, resized[0], self.size, offsets[0], mask.device)
        cols = _nearest(left, w, resized[1], self.size, offsets[1], mask.device)
        if flip:
            cols = cols.flip(0)
        out = mask.as_subclass(torch.Tensor).index_select(-2, rows.clamp(min=0)).index_select(-1, cols.clamp(min=0))
        if bool((rows < 0).any()) or bool((cols < 0).any()):
            if not torch.iinfo(out.dtype).min <= fill <= torch.iinfo(out.dtype).max:  # an 8-bit mask, an ignore index beyond it
                out = out.to(torch.int64)
            out[..., rows < 0, :] = fill
            out[..., cols < 0] = fill
        return tv_tensors.Mask(out) if isinstance(mask, tv_tensors.Mask) else out

    def map_points(self, points: torch.Tensor, params: Sequence[int]) -> torch.Tensor:
        """The geometry of :meth:`apply` with ``params``, given to points: ``N x 2`` ``(x, y)`` in the pixels of the image in its file
        (continuous: pixel ``(c, r)`` spans ``[c, c + 1) x [r, r + 1)``), mapped to the output's (``x`` mirrored by a flip).

        Points the crop leaves out come back outside ``[0, size)``: what to do with them is the caller's (a target kind's).
        Boxes are two points each. The result is ``float32``.
        """
        top, left, h, w, flip = (int(p) for p in params)
        resized, offsets = self._resized(h, w)
        out = points.to(torch.float32).clone()
        out[..., 0] = (out[..., 0] - left) * (resized[1] / w) - offsets[1]
        out[..., 1] = (out[..., 1] - top) * (resized[0] / h) - offsets[0]
        if flip:
            out[..., 0] = self.size - out[..., 0]
        return out

    def output_bounds(self, params: Sequence[int]) -> tuple[int, int]:
        """``(height, width)`` of the picture in the output (the boxes of a detection sample are clipped to it): the whole
        ``size x size`` output."""
        return self.size, self.size

    def _resized(self, h: int, w: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The size a ``h x w`` crop is resized to, and where the output starts in it (evaluation: the centre crop's offsets)."""
        if self.train:
            return (self.size, self.size), (0, 0)
        short, long = sorted((h, w))
        side, other = self.min_input_side, int(self.min_input_side * long / short)
        resized = (side, other) if h <= w else (other, side)
        return resized, (_centre_offset(resized[0], self.size), _centre_offset(resized[1], self.size))

    def _drawn(self, image: Any) -> tuple[torch.Tensor, tuple[int, int, int, int, int], int, tuple[int, int]]:
        """``(image as a tensor, params, factor, size in its file)``: the geometry drawn for ``image``."""
        if isinstance(image, Image.Image):
            image = pil_to_tensor(image)
        elif not isinstance(image, torch.Tensor):
            raise TypeError(f"ResizedCrop takes a uint8 3 x H x W tensor or a PIL image, not {type(image).__name__}.")
        reduced = reduced_from(image)
        if reduced is not None:  # a reduced-size decode: the crop is drawn on the image in the file, on the decode's pixel grid
            return image, self.params(reduced.height, reduced.width, align=reduced.factor), reduced.factor, tuple(reduced[1:])
        return image, self.params(image.shape[-2], image.shape[-1]), 1, (int(image.shape[-2]), int(image.shape[-1]))

    def joint(self, image: Any, target: Any, geometry: Callable[..., Any], **context: Any) -> tuple[torch.Tensor, Any]:
        """``(image, target)`` transformed together: the image as :meth:`__call__` does, the target by
        ``geometry(target, self, params, size, **context)`` (a target kind's :meth:`~lightning_lmdb.targets.TargetKind.geometry`)
        with the same ``params`` and the image's ``size`` in its file."""
        image, params, factor, size = self._drawn(image)
        return self.apply(image, params, factor), geometry(target, self, params, size, **context)

    def __call__(self, image: Any, mask: torch.Tensor | None = None, *, fill: int = DEFAULT_IGNORE_INDEX) -> Any:
        """The transformed image; with ``mask`` (``H x W``, the size of the image in the file), ``(image, mask)``.

        Raises:
            TypeError: ``image`` is neither a tensor nor a PIL image.
            ValueError: ``mask`` is not ``H x W`` of the image's size.
        """
        image, params, factor, size = self._drawn(image)
        out = self.apply(image, params, factor)
        if mask is None:
            return out
        if mask.ndim != 2 or tuple(mask.shape) != tuple(size):
            raise ValueError(f"A mask of shape {tuple(mask.shape)} for an image of {size[0]} x {size[1]} pixels (in its file): "
                             "a mask must be H x W, the size of its image.")
        return out, self.apply_mask(mask, params, fill)


@dataclass(frozen=True)
class LetterboxResize(ResizedCrop):
    """The whole image resized, its aspect kept, into the top left of a ``size x size`` output padded with zeros; for
    training with scale jitter and a horizontal flip. The default transforms of detection data (target kind ``"boxes"``):
    every object stays whole, where a random crop would cut boxes (and drop the objects it leaves out).

    Training: the longer side becomes ``size * s``, ``s`` drawn uniformly from ``scale`` per sample, then the picture is
    flipped with probability ``hflip`` (within its own width: it stays at the top left). Evaluation: the longer side becomes
    ``size`` (``s = 1``), no flip. The picture's rows and columns are the image's resized by the same antialiased resize as
    :class:`ResizedCrop`'s, so a point ``(x, y)`` of the image in its file lands on ``(x * w' / W, y * h' / H)``, ``h' x w'``
    the picture's size (:meth:`output_bounds`).

    ``params`` are ``(0, 0, H, W, flip, L)``: the whole image, the flip, and ``L``, the side in the file's pixels that
    ``size`` output pixels span (``L = ceil(max(H, W) / s)``): ints, so the batched device decode ships them as it does a crop.

    Args:
        size: Output side.
        train: Scale jitter and flip (``True``) or a plain fit (``False``).
        scale: Range of the longer side's scale ``s`` (training).
        hflip: Probability of a horizontal flip (training).
    """

    scale: tuple[float, float] = (0.75, 1.0)

    @property
    def min_input_side(self) -> int:
        """The shorter side a decode needs: ``size`` (the picture's sides are at most ``size``, so it is only downscaled)."""
        return self.size

    def params(self, height: int, width: int, align: int = 1) -> tuple[int, ...]:  # type: ignore[override]
        """``(0, 0, height, width, flip, L)`` for an image of this size in its file (torch's RNG, so workers differ)."""
        if not self.train:
            return 0, 0, height, width, 0, max(height, width)
        s = float(torch.empty(1).uniform_(self.scale[0], self.scale[1]).item())
        side = max(math.ceil(max(height, width) / s), max(height, width))
        return 0, 0, height, width, int(torch.rand(1).item() < self.hflip), side

    def output_bounds(self, params: Sequence[int]) -> tuple[int, int]:
        """``(h', w')``, the picture's size in the output: the image's sides times ``size / L``, rounded (at least 1)."""
        _, _, h, w, _, side = (int(p) for p in params)
        return max(1, round(h * self.size / side)), max(1, round(w * self.size / side))

    def apply(self, image: torch.Tensor, params: Sequence[int], factor: int = 1) -> torch.Tensor:
        """The image (``3 x H x W``, any device; a reduced-size decode at ``1 / factor`` of its file) resized to its picture,
        flipped when drawn, in the top left of a zero ``size x size`` output of its dtype."""
        _, _, h, w, flip, _ = (int(p) for p in params)
        rows, cols = self.output_bounds(params)
        picture = _resized_box(image, (0, 0, h, w), [rows, cols], factor)
        if flip:
            picture = picture.flip(-1)
        out = picture.new_zeros((*picture.shape[:-2], self.size, self.size))
        out[..., :rows, :cols] = picture
        return out

    def apply_mask(self, mask: torch.Tensor, params: Sequence[int], fill: int = DEFAULT_IGNORE_INDEX) -> torch.Tensor:
        """The geometry of :meth:`apply` given to a mask (``H x W``, nearest-neighbour), its padding ``fill``."""
        _, _, h, w, flip, _ = (int(p) for p in params)
        rows, cols = self.output_bounds(params)
        r = _nearest(0, h, rows, rows, 0, mask.device)
        c = _nearest(0, w, cols, cols, 0, mask.device)
        if flip:
            c = c.flip(0)
        picture = mask.as_subclass(torch.Tensor).index_select(-2, r).index_select(-1, c)
        dtype = picture.dtype if torch.iinfo(picture.dtype).min <= fill <= torch.iinfo(picture.dtype).max else torch.int64
        out = torch.full((*picture.shape[:-2], self.size, self.size), fill, dtype=dtype, device=mask.device)
        out[..., :rows, :cols] = picture
        return tv_tensors.Mask(out) if isinstance(mask, tv_tensors.Mask) else out

    def map_points(self, points: torch.Tensor, params: Sequence[int]) -> torch.Tensor:
        """Points ``(x, y)`` of the image in its file (``N x 2``) where :meth:`apply` puts them: scaled by the picture's size over
        the image's, ``x`` mirrored within the picture by a flip. ``float32``."""
        _, _, h, w, flip, _ = (int(p) for p in params)
        rows, cols = self.output_bounds(params)
        out = points.to(torch.float32).clone()
        out[..., 0] = out[..., 0] * (cols / w)
        out[..., 1] = out[..., 1] * (rows / h)
        if flip:
            out[..., 0] = cols - out[..., 0]
        return out


def whole_image(transform: Any) -> Any:
    """A default transform (a :class:`ResizedCrop`, or the defaults' ``v2.Compose`` starting with one) as the
    :class:`LetterboxResize` of the same size and stage -- what the DataModule serves a target kind that keeps the image whole
    (``TargetKind.keeps_whole``: boxes); any other transform as it is."""
    crop = joint_crop(transform)
    if crop is None or isinstance(crop, LetterboxResize):
        return transform
    whole = LetterboxResize(crop.size, train=crop.train, hflip=crop.hflip if crop.train else 0.0)
    if crop is transform:
        return whole
    compose = v2.Compose([whole, *transform.transforms[1:]])
    compose.min_input_side = whole.min_input_side
    return compose


def _centre_offset(length: int, crop: int) -> int:
    """Where torchvision's ``center_crop`` of ``crop`` pixels starts in ``length`` (negative: it pads ``-offset`` pixels first)."""
    return int(round((length - crop) / 2.0)) if length >= crop else -((crop - length) // 2)


def _nearest(start: int, length: int, resized: int, out: int, offset: int, device: torch.device) -> torch.Tensor:
    """The source index of each of ``out`` output pixels: the span ``[start, start + length)`` resized to ``resized`` pixels,
    output pixel ``r`` being resized pixel ``r + offset``; ``-1`` where that is outside the resized span (padding).

    Resized pixel ``j``'s centre lies in source pixel ``start + floor((2j + 1) * length / (2 * resized))`` (integer arithmetic:
    exact, as ``interpolate(mode="nearest-exact")``).
    """
    j = torch.arange(out, dtype=torch.int64, device=device) + offset
    index = start + torch.div((2 * j + 1) * length, 2 * resized, rounding_mode="floor").clamp_(0, length - 1)
    return torch.where((j >= 0) & (j < resized), index, torch.full_like(index, -1))


def image_size(image: Any) -> tuple[int, int]:
    """``(height, width)`` of a decoded image in its file (a reduced-size decode's :func:`~lightning_lmdb.codec.decoders.reduced_from`)."""
    reduced = reduced_from(image)
    if reduced is not None:
        return reduced.height, reduced.width
    return (image.height, image.width) if isinstance(image, Image.Image) else (int(image.shape[-2]), int(image.shape[-1]))


def mask_tensor(values: np.ndarray, dtype: torch.dtype | None = torch.int64) -> torch.Tensor:
    """A stored mask (``H x W`` ``uint8`` / ``uint16``, :func:`lightning_lmdb.sources.masks.decode_mask`) as a tensor of ``dtype``
    (``None``: the most compact one torch indexes, ``uint8`` or ``int32``)."""
    if dtype is None:
        dtype = torch.uint8 if values.dtype == np.uint8 else torch.int32
    if not values.flags.writeable:  # PIL's array of a mask file: torch warns about sharing read-only memory
        values = values.copy()
    return torch.from_numpy(values).to(dtype) if values.dtype == np.uint8 else torch.from_numpy(values.astype(np.int32)).to(dtype)


def transform_pair(transform: Callable[..., Any] | None, image: Any, values: np.ndarray,
                   fill: int = DEFAULT_IGNORE_INDEX) -> tuple[Any, torch.Tensor]:
    """A segmentation sample transformed together: ``(image, mask)``, the mask an ``int64`` ``h x w`` tensor.

    Args:
        transform: ``None`` (the image as decoded, the mask as stored), a :class:`ResizedCrop` or the defaults' ``v2.Compose``
            starting with one (:func:`joint_crop`: its mask path, on the mask's compact dtype), or any callable that takes and
            returns ``(image, mask)`` -- a ``torchvision.transforms.v2`` pipeline -- called as
            ``transform(image, tv_tensors.Mask(mask))`` with an ``int64`` mask.
        image: The decoded image.
        values: Its mask, ``H x W`` (the size of the image in its file), as stored.
        fill: The ignore index: the value of pixels a crop adds outside the image.

    Raises:
        TypeError: ``transform`` did not return a pair whose second item is a tensor.
    """
    if transform is None:
        return image, mask_tensor(values)
    crop = joint_crop(transform)
    if crop is not None:  # the defaults (a crop, then v2 steps that leave a mask as it is: ToDtype, Normalize)
        image, mask = crop(image, mask_tensor(values, None), fill=fill)
        for step in () if crop is transform else transform.transforms[1:]:  # type: ignore[union-attr]
            image, mask = step(image, tv_tensors.Mask(mask))
        return image, mask.as_subclass(torch.Tensor).to(torch.int64)
    mask = tv_tensors.Mask(mask_tensor(values))
    try:
        pair = transform(image, mask)
    except TypeError as exc:
        if _takes_two(transform, image, mask):
            raise
        raise TypeError(_PAIR.format(f"{_named(transform)} does not take two arguments ({exc})")) from exc
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[1], torch.Tensor)):
        raise TypeError(_PAIR.format(f"{_named(transform)} returned {type(pair).__name__}"))
    return pair[0], pair[1].as_subclass(torch.Tensor).to(torch.int64)


_PAIR = ("A transform of mask data takes and returns (image, mask); {}. Make it a torchvision.transforms.v2 pipeline (it gets "
         "the mask as a tv_tensors.Mask), or a callable of (image, mask) returning both.")


def _named(transform: Any) -> str:
    return getattr(transform, "__qualname__", type(transform).__qualname__)


def _takes_two(transform: Any, *args: Any) -> bool:
    """Whether ``transform`` can be called with ``args`` (by its signature; ``True`` when it has none to read)."""
    try:
        inspect.signature(transform).bind(*args)
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin)
        return True
    return True


def joint_crop(transform: Any) -> ResizedCrop | None:
    """The :class:`ResizedCrop` that decides ``transform``'s geometry -- itself, or the first step of a ``v2.Compose`` (the
    defaults with ``normalize=True``) -- else ``None`` (a transform of yours: it never sees a reduced-size decode of a mask's image)."""
    if isinstance(transform, ResizedCrop):
        return transform
    steps = getattr(transform, "transforms", None)
    return steps[0] if isinstance(transform, v2.Compose) and steps and isinstance(steps[0], ResizedCrop) else None


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
    for dim, (n, scale) in enumerate(zip(size, scales, strict=True), start=-2):
        if pixels.shape[dim] == n and scale != 1:  # the kernel copies a side of the output's size, whatever its scale: one more
            pixels = torch.cat([pixels, pixels.narrow(dim, n - 1, 1)], dim)  # pixel (given no weight: the span ends before it)
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

    Called as ``t(image, mask)`` it returns ``(image, mask)``, the mask cropped and flipped alike (nearest-neighbour).

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

    Called as ``t(image, mask)`` it returns ``(image, mask)``, the mask resized and cropped alike (nearest-neighbour).

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
