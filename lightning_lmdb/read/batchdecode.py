"""Decode a whole batch of JPEGs at once on the training device (nvJPEG through TorchCodec), crops drawn in the workers.

With ``LMDBDataModule(decode_device="cuda")`` the DataLoader workers do not decode JPEGs: for each
JPEG record they ship its encoded bytes plus the sample's crop and flip, drawn from the size in its
header (:func:`~lightning_lmdb.codec.imageinfo.read_info`, no decode). Every other record (PNG, WebP,
CMYK or 12-bit JPEG, decoded storage, an EXIF-rotated JPEG) is decoded and cropped in the worker as
usual, so a batch can mix both (:class:`Collate`). In the training process, before the batch moves to
the device (``on_before_batch_transfer``: TorchCodec's ``decode_jpeg`` takes CPU-side bytes), the
JPEGs of the batch are decoded in one batched call on the device, each cropped, resized and flipped
there, and put back in their places: the batch leaves as one ``uint8`` ``N x 3 x S x S`` tensor on
the device, finished (float, normalised) by ``on_after_batch_transfer`` like any other.

A segmentation sample's mask (target kind ``"mask"``) is not deferred: the worker that draws its image's crop applies
the same crop, resize and flip to the mask (:meth:`~lightning_lmdb.read.transforms.ResizedCrop.apply_mask`, nearest-neighbour)
and the mask travels as the sample's target, so the batch is ``(images, masks)``, aligned, the masks ``int64 N x S x S``.

The geometry is the datasets' :class:`~lightning_lmdb.read.transforms.ResizedCrop` (the default transforms):
``RandomResizedCrop`` + horizontal flip for training (the crop drawn per sample: batch-wide v2 transforms
would give every image of the batch the same crop), ``Resize`` + ``CenterCrop`` for evaluation. ``decode_device="cpu"`` runs the same
batched path on the CPU: how the tests exercise it without a GPU.

nvJPEG's hardware engine could write its outputs before work already queued on the caller's stream
had run (corrupting unrelated tensors; fixed in TorchCodec PR 1634): :meth:`DeferredImages.decode`
synchronises the stream before each batched decode, whatever TorchCodec version is installed, which
costs no wall time because the decode synchronises it afterwards anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils.data import default_collate

from lightning_lmdb.codec.decoders import DEFAULT_MAX_PIXELS, has_end_marker
from lightning_lmdb.codec.imageinfo import read_info
from lightning_lmdb.read.transforms import ResizedCrop
from lightning_lmdb.targets import TargetKind


class Deferred(NamedTuple):
    """One sample left for the batched decode: its JPEG bytes, its crop ``(top, left, h, w, flip)`` and its ``(height, width)``
    (``(0, 0)``: not given)."""

    data: torch.Tensor
    params: tuple[int, int, int, int, int]
    size: tuple[int, int] = (0, 0)


def defer(value: bytes | memoryview, transform: ResizedCrop) -> Deferred | None:
    """The sample as a :class:`Deferred` when the batched decoder takes it, else ``None`` (decode it here).

    nvJPEG takes 8-bit grey or colour JPEGs; CMYK / YCCK, 12-bit, EXIF-rotated (PIL's loader ignores the
    orientation, TorchCodec would apply it), over-limit images and JPEGs without their end marker (truncated: the CPU
    decode raises naming the record, where nvJPEG might fill the rest in) stay on the CPU path.
    """
    info = read_info(value)
    if info.format != "jpeg" or info.channels not in (1, 3) or info.bit_depth != 8 or info.orientation != 1:
        return None
    if not has_end_marker(value):  # truncated (a validate="header" build keeps it): the worker's decode names the record
        return None
    if not 0 < info.pixels <= DEFAULT_MAX_PIXELS:
        return None
    data = torch.frombuffer(bytearray(value), dtype=torch.uint8)
    return Deferred(data, transform.params(info.height, info.width), (info.height, info.width))


@dataclass
class DeferredImages:
    """The images of a batch: some decoded in the workers, the rest JPEG bytes for one batched decode.

    Attributes:
        transform: The geometry (output side ``transform.size``).
        count: Images in the batch.
        decoded: The worker-decoded images (``n x 3 x S x S`` uint8), or ``None``.
        decoded_at: Their positions in the batch.
        data: The deferred JPEGs' bytes, concatenated (uint8).
        offsets: Where each deferred JPEG starts in ``data`` (and one past the last).
        params: Their crops, ``m x 5`` (top, left, h, w, flip).
        deferred_at: Their positions in the batch.
    """

    transform: ResizedCrop
    count: int
    decoded: torch.Tensor | None
    decoded_at: torch.Tensor
    data: torch.Tensor
    offsets: torch.Tensor
    params: torch.Tensor
    deferred_at: torch.Tensor

    def __len__(self) -> int:
        return self.count

    def pin_memory(self) -> DeferredImages:
        """Pinned copies (the DataLoader's ``pin_memory=True``); the JPEG bytes stay where they are (decoded from the host)."""
        decoded = self.decoded.pin_memory() if self.decoded is not None else None
        return DeferredImages(self.transform, self.count, decoded, self.decoded_at, self.data, self.offsets, self.params, self.deferred_at)

    def decode(self, device: torch.device | str) -> torch.Tensor:
        """Decode the deferred JPEGs in one batched call on ``device``, crop, resize and flip each there; return the batch.

        Returns:
            ``count x 3 x S x S`` ``uint8`` on ``device``, in sample order.
        """
        from torchcodec.decoders import decode_jpeg

        device = torch.device(device)
        size = self.transform.size
        out = torch.empty((self.count, 3, size, size), dtype=torch.uint8, device=device)
        if self.decoded is not None:
            out[self.decoded_at.to(device)] = self.decoded.to(device, non_blocking=True)
        if len(self.deferred_at):
            offsets = self.offsets.tolist()
            sources = [self.data[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
            if device.type == "cuda":  # TorchCodec PR 1634: nvJPEG's hardware path may write before queued work has run
                torch.cuda.current_stream(device).synchronize()
            images = decode_jpeg(sources, mode="RGB", device=device)
            for image, params, at in zip(images, self.params.tolist(), self.deferred_at.tolist()):
                out[at] = self.transform.apply(image, params)
        return out


@dataclass(frozen=True)
class Collate:
    """``default_collate``, except that a batch holding :class:`Deferred` images becomes ``(DeferredImages, targets)`` (the targets
    of a segmentation set: its masks, already transformed in the workers), and that the targets of a ``kind`` are collated by
    it (:meth:`lightning_lmdb.targets.TargetKind.collate`: a list for a kind of variable length).

    Args:
        transform: The geometry of the loader's dataset (what :meth:`DeferredImages.decode` applies); ``None``: no batched decode.
        kind: The target kind whose :meth:`~lightning_lmdb.targets.TargetKind.collate` makes the batch's targets; ``None``:
            ``default_collate``.
    """

    transform: ResizedCrop | None = None
    kind: TargetKind | None = None

    def _targets(self, targets: list[Any]) -> Any:
        return default_collate(targets) if self.kind is None else self.kind.collate(targets)

    def __call__(self, samples: list[tuple[Any, Any]]) -> Any:
        if not any(isinstance(sample[0], Deferred) for sample in samples):
            if self.kind is None:
                return default_collate(samples)
            return [default_collate([sample[0] for sample in samples]), self._targets([sample[1] for sample in samples])]
        assert self.transform is not None, "a Deferred image needs the transform of the batched decode"
        decoded = [(i, s[0]) for i, s in enumerate(samples) if not isinstance(s[0], Deferred)]
        deferred = [(i, s[0]) for i, s in enumerate(samples) if isinstance(s[0], Deferred)]
        offsets = torch.zeros(len(deferred) + 1, dtype=torch.int64)
        offsets[1:] = torch.tensor([len(d.data) for _, d in deferred], dtype=torch.int64).cumsum(0)
        images = DeferredImages(
            transform=self.transform,
            count=len(samples),
            decoded=torch.stack([image for _, image in decoded]) if decoded else None,
            decoded_at=torch.tensor([i for i, _ in decoded], dtype=torch.int64),
            data=torch.cat([d.data for _, d in deferred]),
            offsets=offsets,
            params=torch.tensor([d.params for _, d in deferred], dtype=torch.int64),
            deferred_at=torch.tensor([i for i, _ in deferred], dtype=torch.int64),
        )
        return images, self._targets([sample[1] for sample in samples])
