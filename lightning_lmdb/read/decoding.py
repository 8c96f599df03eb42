"""How a dataset turns its records into pixels: the decoder, reduced-size decoding and the deferred batched JPEG decode.

:class:`DecodingChoice` holds the choice of :class:`~lightning_lmdb.read.dataset.LMDBImageDataset` and
:class:`~lightning_lmdb.read.raw.RawImageDataset` (and of each of their views); :mod:`lightning_lmdb.codec.decoders`
does the decoding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_lmdb.codec.decoders import check_decoder
from lightning_lmdb.errors import OptionError
from lightning_lmdb.read.batchdecode import Deferred, defer
from lightning_lmdb.read.transforms import ResizedCrop

_Choice = TypeVar("_Choice", bound="DecodingChoice")


def check_decoding(decoder: str, decode_size: int | None) -> None:
    """Raise :class:`OptionError` for an unknown ``decoder`` or a ``decode_size`` that is not a positive integer (or None)."""
    check_decoder(decoder)
    if decode_size is not None and (isinstance(decode_size, bool) or not isinstance(decode_size, int) or decode_size < 1):
        raise OptionError(f"decode_size={decode_size!r} must be a positive integer (the shorter side the transform needs), or None.")


class DecodingChoice:
    """How records become pixels; a dataset (view) that mixes this in sets its ``transform``.

    Attributes:
        decoder: How records become pixels (see :mod:`lightning_lmdb.codec.decoders`); change with :meth:`set_decoding`.
        decode_size: The shorter side the transform needs (reduced-size JPEG decoding), or ``None``.
        defer_jpeg: Hand 8-bit JPEGs to the batched device decode as bytes and a drawn crop
            (:mod:`lightning_lmdb.read.batchdecode`; the transform must be a ``ResizedCrop``).
    """

    decoder: str = "pil"
    decode_size: int | None = None
    defer_jpeg: bool = False
    transform: Callable[[Any], Any] | None

    def set_decoding(self: _Choice, decoder: str | None = None, decode_size: int | None = None, *, defer_jpeg: bool = False) -> _Choice:
        """Choose how this dataset (view) decodes: ``decoder`` (unchanged when ``None``), ``decode_size``, ``defer_jpeg``.

        Returns:
            ``self``.

        Raises:
            ValueError: An unknown decoder or a bad size; ``defer_jpeg`` without a ``ResizedCrop`` transform.
        """
        decoder = self.decoder if decoder is None else decoder
        check_decoding(decoder, decode_size)
        if defer_jpeg and not isinstance(self.transform, ResizedCrop):
            raise OptionError(
                f"defer_jpeg=True needs a lightning_lmdb.read.transforms.ResizedCrop transform (the batched decode applies its crops), "
                f"not {type(self.transform).__name__}."
            )
        self.decoder, self.decode_size, self.defer_jpeg = decoder, decode_size, defer_jpeg
        return self

    def _deferred(self, data: bytes | memoryview) -> Deferred | None:
        """The sample left to the batched device decode, when this view defers JPEGs and the record is one it takes."""
        return defer(data, self.transform) if self.defer_jpeg and isinstance(self.transform, ResizedCrop) else None
