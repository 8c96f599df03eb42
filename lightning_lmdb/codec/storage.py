"""The storage codec: the one place where source bytes become record values and records become pixels.

Storage modes (``storage=``) and record codecs
----------------------------------------------

A **storage mode** is the builder's policy: what record it makes of each source file. A **record
codec** is how one record's value is laid out; the format records each record's codec
(``meta/codecs``), so one database can mix them.

* ``"auto"`` (the default): **per record**. Lossy sources (JPEG, lossy WebP) keep their file's bytes
  (so reduced-size JPEG decoding and batched GPU decoding apply); 16-bit PNGs keep their bytes too (the
  decoders deliberately differ on them: PIL clips, the tensor decoders scale; see
  :mod:`lightning_lmdb.codec.decoders`); every other image (8-bit and lower PNG in any mode, lossless WebP,
  GIF, BMP, TIFF, ...) is stored as **zstd-compressed RGB pixels**: exactly PIL's ``convert("RGB")``,
  what every decoder returns for such a file, at about the size of the file and many times faster to
  read back than inflating a PNG.
* ``"encoded"``: every record is the file's own bytes.
* ``"decoded"``: every record is raw RGB pixels (no decode at read time, 4-8x the files' size).

With ``resize=S``, images whose shorter side is larger than ``S`` are shrunk so it is ``S`` (aspect kept,
never upscaled, OpenCV ``INTER_AREA``) and stored re-encoded: JPEG at ``quality`` for lossy sources;
for lossless ones zstd pixels (``auto``), PNG (``encoded``) or pixels (``decoded``). An image already
that small is stored as it is. The ``encoded`` mode's PNG is written for decoding speed: without
per-row filters (zlib level 6, ``Z_FILTERED``), which decoded 1.4x faster than OpenCV's default
(filtered) PNG on resized icons, for 11 % more bytes -- unless it is over
:data:`UNFILTERED_PNG_MAX_GROWTH` times the size of the filtered one (photo-like content, where the
filters are what compresses), when the filtered PNG is kept. All are lossless: the pixels are the same.

* :func:`encode_record` (the builder): validate a source file (``validate=``, below) and return the record codec and
  value stored for it.
* :func:`decode_record` (the datasets, ``verify``, ``bench``): a stored value back to an RGB image (PIL
  image for ``decoder="pil"``, else a ``uint8 3 x H x W`` tensor sharing the decompressed memory).

Record layouts: ``pixels`` -- a 12-byte header (``<III``: height, width, channels) and the
``uint8`` pixels, row-major ``H x W x C``; ``zstd pixels`` -- the same header, then one zstd frame of
the pixels (:mod:`lightning_lmdb.codec.zstd`: content size and content checksum on) at level
:data:`ZSTD_LEVEL`, with ``C = 1`` when the image is grey (a grey or grey + alpha PNG, 1-bit included, as its
header says; a BMP, GIF, TIFF, ... whose three channels come out equal), replicated to RGB when read. The file codecs (``JPEG``, ``PNG``,
``WebP``, ``image file``) are image files' bytes, decoded by :mod:`lightning_lmdb.codec.decoders`.

**Validation** (``validate=``, :data:`VALIDATE_LEVELS`): what a build checks of each file before storing it. Every level
parses the header (format, size, mode) and refuses a decompression bomb from it (``max_pixels``) before any pixel is
decoded; a record made of pixels (``decoded``, ``zstd pixels``, a resized image) needs the file's pixels, so its file is
always decoded fully (exactly ``ImageFolder``'s RGB conversion). The levels differ on records that keep the file's bytes:

* ``"full"``: a full PIL decode of every file (the behaviour before the option existed).
* ``"reduced"`` (the default): a JPEG kept as its bytes is decoded at 1/8 scale (``Image.draft``: DCT scaling, which still
  walks the whole entropy-coded stream, so a truncated or damaged stream is found as by a full decode, at about half its
  cost, several times less on a multi-megapixel photo). Other kept files have no reduced decode and are decoded fully:
  lossy WebP (``auto``, ``encoded``), 16-bit PNG (``auto``), every file under ``encoded``.
* ``"header"``: no pixel is decoded for a kept file; a damaged one is stored and found when read: the dataset raises
  :class:`ImageDecodeError` naming the record (``on_error`` does not apply at read time).

The level never changes what is stored for a good file (a storage mode reads the pixels only when its record needs them:
:class:`StorageMode`), so it is no content option and no part of a database's name.

**Adding a storage mode** is one :class:`StorageMode` and one :func:`register_storage_mode` call; a new record
layout is one :class:`RecordCodec` and one :func:`register_record_codec` call (its id: the next free one,
``len(RECORD_CODECS)``). The library registers its own through them. The option's valid values (API, CLI,
Hydra's ``data.storage=``), the metadata check, the builder, the datasets, ``verify`` and ``bench`` all read the
registries (``options.Storage`` only documents the built-in modes). A new decoder is one
:func:`lightning_lmdb.codec.decoders.register_decoder` call.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import numpy as np
from PIL import Image

from lightning_lmdb.codec import zstd
from lightning_lmdb.codec.decoders import (
    DEFAULT_MAX_PIXELS,
    ImageDecodeError,
    decode,
    decode_opened,
    decode_pil,
    hwc_to_tensor,
    open_checked,
    returns_pil,
)
from lightning_lmdb.codec.imageinfo import ImageInfo, read_info
from lightning_lmdb.errors import OptionError, RecordError

if TYPE_CHECKING:  # torch is imported where a tensor is made (decoders.hwc_to_tensor): info and verify do without it
    import torch

__all__ = ["STORAGES", "STORAGE_MODES", "RECORD_CODECS", "DEFAULT_MAX_PIXELS", "ImageDecodeError", "RecordCodec", "RecordError",  # noqa: F822  (STORAGES: the module __getattr__)
           "StorageMode", "register_record_codec", "register_storage_mode", "unregister_record_codec", "unregister_storage_mode",
           "decode_record", "encode_record", "encode_pixels", "decode_pixels", "encode_zstd_pixels", "decode_zstd_pixels",
           "resize_pixels", "storage_mode", "Validate", "VALIDATE_LEVELS", "validate_file"]

#: JPEG quality of re-encoded lossy sources in a ``resize=`` build.
DEFAULT_QUALITY = 90
#: A resized lossless image is stored as an unfiltered PNG unless that is this much larger than OpenCV's filtered one.
UNFILTERED_PNG_MAX_GROWTH = 1.25
#: The zstd level of ``zstd pixels`` records (chosen by measurement: see docs/decoding.md), recorded in the metadata.
ZSTD_LEVEL = 1
_PIXEL_HEADER = struct.Struct("<III")
#: How a build validates a file whose record keeps its bytes (documentation and type hints; see the module docstring).
Validate = Literal["full", "reduced", "header"]
#: The valid ``validate=`` values.
VALIDATE_LEVELS: tuple[str, ...] = get_args(Validate)

def encode_pixels(pixels: np.ndarray) -> bytes:
    """Serialise an ``H x W x C`` ``uint8`` array as a ``decoded`` record value."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3:
        raise ValueError(f"Expected an H x W x C uint8 array, got shape {pixels.shape} dtype {pixels.dtype}.")
    height, width, channels = pixels.shape
    return _PIXEL_HEADER.pack(height, width, channels) + np.ascontiguousarray(pixels).tobytes()


def decode_pixels(value: bytes | memoryview) -> np.ndarray:
    """Parse a ``decoded`` record value into an ``H x W x C`` ``uint8`` array (a copy).

    Raises:
        RecordError: The value's length does not match its header.
    """
    height, width, channels = _header(value, "Decoded")
    expected = _PIXEL_HEADER.size + height * width * channels
    if len(value) != expected:
        raise RecordError(f"Decoded record holds {len(value)} bytes, its header promises {expected}: the database is damaged.")
    return np.frombuffer(value, dtype=np.uint8, offset=_PIXEL_HEADER.size).reshape(height, width, channels).copy()


def _header(value: bytes | memoryview, kind: str) -> tuple[int, int, int]:
    if len(value) < _PIXEL_HEADER.size:
        raise RecordError(f"{kind} record holds {len(value)} bytes, less than its {_PIXEL_HEADER.size}-byte header: "
                          "the database is damaged.")
    return _PIXEL_HEADER.unpack_from(value)


def encode_zstd_pixels(pixels: np.ndarray, level: int = ZSTD_LEVEL, *, grey: bool | None = None) -> bytes:
    """Serialise ``H x W x 3`` ``uint8`` RGB pixels as a ``zstd pixels`` record value (one channel when grey).

    Args:
        pixels: The RGB pixels.
        level: The zstd level.
        grey: Whether the three channels are equal, when the caller knows (a grey PNG); ``None``: compare them.
    """
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"Expected an H x W x 3 uint8 array, got shape {pixels.shape} dtype {pixels.dtype}.")
    if grey is None:
        red, green, blue = pixels[..., 0], pixels[..., 1], pixels[..., 2]
        grey = np.array_equal(red, green) and np.array_equal(green, blue)
    if grey:
        pixels = pixels[..., :1]
    height, width, channels = pixels.shape
    return _PIXEL_HEADER.pack(height, width, channels) + zstd.compress(np.ascontiguousarray(pixels).data, level)


def decode_zstd_pixels(value: bytes | memoryview) -> np.ndarray:
    """Parse a ``zstd pixels`` record value into a writable ``H x W x 3`` ``uint8`` RGB array.

    Raises:
        RecordError: The frame is damaged (its checksum, its length, not zstd) or its header is impossible or disagrees with the
            frame's declared content size (checked before the pixels are allocated).
    """
    height, width, channels = _header(value, "Compressed-pixel")
    if channels not in (1, 3):
        raise RecordError(f"Compressed-pixel record has {channels} channels (1 or 3 are written): the database is damaged.")
    frame = memoryview(value)[_PIXEL_HEADER.size:]
    try:  # the header is checked against the frame before it sizes an allocation
        declared = zstd.content_size(frame)
    except ValueError as exc:
        raise RecordError(f"Compressed-pixel record is damaged ({exc}).") from None
    if declared != height * width * channels:
        raise RecordError(f"Compressed-pixel record's header says {height}x{width}x{channels} pixels ({height * width * channels} bytes) "
                          f"but its zstd frame holds {declared} bytes: the database is damaged.")
    pixels = np.empty((height, width, channels), dtype=np.uint8)
    try:
        zstd.decompress_into(frame, pixels.reshape(-1).data)
    except (ValueError, *zstd.ERRORS) as exc:
        raise RecordError(f"Compressed-pixel record is damaged ({exc}).") from None
    return np.repeat(pixels, 3, axis=2) if channels == 1 else pixels


def resized_size(width: int, height: int, side: int) -> tuple[int, int] | None:
    """``(width, height)`` of an image shrunk so its shorter side is ``side`` (aspect kept); ``None`` when already that small."""
    short = min(height, width)
    if short <= side:
        return None
    return max(1, round(width * side / short)), max(1, round(height * side / short))


def resize_pixels(pixels: np.ndarray, side: int) -> np.ndarray:
    """Shrink ``H x W x 3`` pixels so the shorter side is ``side`` (aspect kept; returned as is when already that small)."""
    size = resized_size(pixels.shape[1], pixels.shape[0], side)
    if size is None:
        return pixels
    import cv2

    return cv2.resize(pixels, size, interpolation=cv2.INTER_AREA)


def _encode_image(pixels: np.ndarray, lossy: bool, quality: int) -> bytes:
    import cv2

    bgr = cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
    if lossy:
        return _imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    unfiltered = _imencode(".png", bgr, [cv2.IMWRITE_PNG_COMPRESSION, 6, cv2.IMWRITE_PNG_FILTER, cv2.IMWRITE_PNG_FILTER_NONE,
                                          cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_FILTERED])
    filtered = _imencode(".png", bgr, [])
    return unfiltered if len(unfiltered) <= UNFILTERED_PNG_MAX_GROWTH * len(filtered) else filtered


def _imencode(extension: str, bgr: np.ndarray, params: list[int]) -> bytes:
    import cv2

    ok, buffer = cv2.imencode(extension, bgr, params)
    if not ok:  # pragma: no cover - OpenCV reports failure only for unsupported input
        raise ValueError("OpenCV could not encode the resized image.")
    return buffer.tobytes()


def _encode_file(data: bytes, image: Image.Image, resize: int | None, quality: int, info: ImageInfo | None = None) -> tuple[int, bytes]:
    """``encoded``: the file's own bytes; resized, re-encoded (JPEG for lossy sources, PNG for lossless ones).

    ``info``: the file's header facts, when the caller has read them already.
    """
    info = info or read_info(data)
    if resize is None or min(image.size) <= resize:
        return _FILE_CODECS.get(info.format, FILE), data
    return (JPEG if info.lossy else PNG), _encode_image(resize_pixels(np.asarray(image), resize), info.lossy, quality)


def _encode_decoded(data: bytes, image: Image.Image, resize: int | None, quality: int) -> tuple[int, bytes]:
    """``decoded``: the RGB pixels (resized when asked)."""
    pixels = np.asarray(image)
    return PIXELS, encode_pixels(pixels if resize is None else resize_pixels(pixels, resize))


def _encode_auto(data: bytes, image: Image.Image, resize: int | None, quality: int) -> tuple[int, bytes]:
    """``auto``: lossy sources and unresized 16-bit PNGs as files (:func:`_encode_file`), every other image as zstd pixels."""
    info = read_info(data)
    small = resize is None or min(image.size) <= resize
    if info.lossy or (small and info.format == "png" and info.bit_depth > 8):
        return _encode_file(data, image, resize, quality, info)
    pixels = np.asarray(image)
    return ZSTD_PIXELS, encode_zstd_pixels(pixels if small else resize_pixels(pixels, resize), ZSTD_LEVEL, grey=_grey(info))


def _grey(info: ImageInfo) -> bool | None:
    """Whether an image's RGB pixels are grey, known from its header where that is cheap (PNG, WebP); else ``None``.

    A PNG of colour type 0 or 4 (grey, grey + alpha) is grey; any other PNG, and every WebP, is taken as colour
    (a colour file of grey content then stays three channels: correct, a little larger). Other formats (BMP,
    GIF, TIFF, ...) have their channels compared.
    """
    if info.format == "png":
        return info.channels in (1, 2) and not info.palette
    return False if info.format == "webp" else None


def _decode_file(value: bytes | memoryview, decoder: str, decode_size: int | None, name: str) -> Image.Image | torch.Tensor:
    return decode(value, decoder, decode_size=decode_size, name=name)


def _to_image(pixels: np.ndarray, decoder: str) -> Image.Image | torch.Tensor:
    return Image.fromarray(pixels) if returns_pil(decoder) else hwc_to_tensor(pixels)


@dataclass(frozen=True)
class RecordCodec:
    """How one record's value is laid out, and how it is read back.

    Attributes:
        id: Its number in ``meta/codecs`` (its index in :data:`RECORD_CODECS`).
        name: How ``info`` names it.
        decode: ``(record value, decoder, decode_size, name) -> RGB image`` (PIL for ``decoder="pil"``, else a
            ``uint8 3 x H x W`` tensor).
        file_bytes: The value is an image file's bytes: batched GPU decoding and reduced-size JPEG decoding
            apply, and ``verify`` compares an unresized record with its file byte for byte.
        self_checked: Decoding the value checks it whole (``zstd pixels``: the frame's content checksum, its header against the
            frame's content size), so a dataset need not check the record's stored checksum first.
    """

    id: int
    name: str
    decode: Callable[[bytes | memoryview, str, int | None, str], Image.Image | torch.Tensor]
    file_bytes: bool
    self_checked: bool = False


#: Every record codec, by id (the format stores the id: append new ones, never renumber): :func:`register_record_codec`.
RECORD_CODECS: tuple[RecordCodec, ...] = ()


def register_record_codec(codec: RecordCodec) -> RecordCodec:
    """Register a record layout: its ``id`` must be the next free one (``len(RECORD_CODECS)``), or that of the codec of its name.

    Returns:
        ``codec`` (undo with :func:`unregister_record_codec`).

    Raises:
        OptionError: Another id (ids are stored in databases: never renumbered).
    """
    global RECORD_CODECS
    same = codec.id < len(RECORD_CODECS) and RECORD_CODECS[codec.id].name == codec.name
    if not same and codec.id != len(RECORD_CODECS):
        raise OptionError(f"Record codec {codec.name!r} has id {codec.id}; the next free id is {len(RECORD_CODECS)} (databases store "
                          "the ids: a codec is appended, never renumbered).")
    RECORD_CODECS = (*RECORD_CODECS[:codec.id], codec, *RECORD_CODECS[codec.id + 1:])
    return codec


def unregister_record_codec(codec: RecordCodec) -> None:
    """Remove the last registered record codec, ``codec`` (a test's own; an earlier one would renumber the rest)."""
    global RECORD_CODECS
    if RECORD_CODECS and RECORD_CODECS[-1] is codec:
        RECORD_CODECS = RECORD_CODECS[:-1]


for _codec in (
    RecordCodec(0, "image file", _decode_file, file_bytes=True),  # a file of another format (GIF, BMP, TIFF, ...), or unknown
    RecordCodec(1, "pixels", lambda value, decoder, size, name: _to_image(decode_pixels(value), decoder), file_bytes=False),
    RecordCodec(2, "zstd pixels", lambda value, decoder, size, name: _to_image(decode_zstd_pixels(value), decoder), file_bytes=False,
                self_checked=True),
    RecordCodec(3, "JPEG", _decode_file, file_bytes=True),
    RecordCodec(4, "PNG", _decode_file, file_bytes=True),
    RecordCodec(5, "WebP", _decode_file, file_bytes=True),
):
    register_record_codec(_codec)
FILE, PIXELS, ZSTD_PIXELS, JPEG, PNG, WEBP = range(6)
_FILE_CODECS = {"jpeg": JPEG, "png": PNG, "webp": WEBP}


@dataclass(frozen=True)
class StorageMode:
    """One storage mode: what record the builder makes of each source file.

    Attributes:
        name: The ``storage=`` value.
        encode: ``(file bytes, the file decoded to RGB by PIL, resize, quality) -> (record codec id, value)``. Below
            ``validate="full"`` the image is decoded only when the mode reads more of it than its ``size`` (its pixels,
            ``np.asarray(image)``, or any other attribute; it is then no ``Image.Image`` instance but behaves as one): a
            mode whose record keeps the file's bytes should read ``size`` alone, and its files get the level's check.
        default_codec: The codec of every record of a database written before ``meta/codecs`` existed; ``None``
            for a mode that came with it (its databases always say each record's codec).
    """

    name: str
    encode: Callable[[bytes, Image.Image, int | None, int], tuple[int, bytes]]
    default_codec: int | None


#: Every storage mode, by name (the first is the default): :func:`register_storage_mode`.
STORAGE_MODES: dict[str, StorageMode] = {}
#: The valid ``storage=`` values (the registry's names).


def register_storage_mode(mode: StorageMode) -> StorageMode:
    """Make ``mode.name`` a valid ``storage=`` everywhere (``build_lmdb``, ``LMDBDataModule``, ``lightning-lmdb build --storage``,
    Hydra's ``data.storage=``); one of that name is replaced.

    Returns:
        ``mode`` (undo with :func:`unregister_storage_mode`).

    Raises:
        OptionError: ``mode`` is not a :class:`StorageMode`, or its ``default_codec`` is no registered record codec.
    """
    if not isinstance(mode, StorageMode) or not mode.name or not isinstance(mode.name, str):
        raise OptionError(f"register_storage_mode() takes a lightning_lmdb.codec.storage.StorageMode with a name, not {mode!r}.")
    if mode.default_codec is not None and not 0 <= mode.default_codec < len(RECORD_CODECS):
        raise OptionError(f"Storage mode {mode.name!r}'s default_codec={mode.default_codec} is no registered record codec.")
    STORAGE_MODES[mode.name] = mode
    return mode


def unregister_storage_mode(name: str) -> None:
    """Remove the storage mode called ``name`` (nothing happens when there is none)."""
    STORAGE_MODES.pop(name, None)


register_storage_mode(StorageMode("auto", _encode_auto, default_codec=None))
register_storage_mode(StorageMode("encoded", _encode_file, default_codec=FILE))
register_storage_mode(StorageMode("decoded", _encode_decoded, default_codec=PIXELS))


def storage_mode(name: str) -> StorageMode:
    """The :class:`StorageMode` called ``name``.

    Raises:
        RecordError: No such storage mode (a database from a newer version of lightning_lmdb, or of a mode not registered here).
    """
    try:
        return STORAGE_MODES[name]
    except KeyError:
        raise RecordError(f"Storage {name!r} is not one of {', '.join(map(repr, STORAGE_MODES))}: the database was built by a newer "
                          "lightning_lmdb (upgrade it) or with a storage mode of your own (register_storage_mode() it first).") from None


def record_codec(codec: int) -> RecordCodec:
    """The :class:`RecordCodec` numbered ``codec``.

    Raises:
        RecordError: No such codec (a database from a newer version of lightning_lmdb, or damaged).
    """
    if not 0 <= codec < len(RECORD_CODECS):
        raise RecordError(f"Record codec {codec} is unknown to this lightning_lmdb (it knows 0 to {len(RECORD_CODECS) - 1}): "
                          "the database was built by a newer version (upgrade) or is damaged (rebuild it).")
    return RECORD_CODECS[codec]


def encode_record(
    data: bytes,
    storage: str,
    *,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    name: str = "<bytes>",
    resize: int | None = None,
    quality: int = DEFAULT_QUALITY,
    validate: Validate = "full",
) -> tuple[int, bytes]:
    """Validate a source file's bytes (``validate``: see the module docstring) and return the record stored for it.

    Args:
        data: The file's bytes.
        storage: A storage mode of :data:`STORAGE_MODES`.
        max_pixels: Refuse larger images (decompression bombs); ``None`` for no limit.
        name: How to name the file in errors.
        resize: Shrink images whose shorter side is larger than this (``None``: keep the size).
        quality: JPEG quality of re-encoded lossy sources (with ``resize``).
        validate: ``"full"`` (this function's default: a full decode), ``"reduced"`` (a build's default) or ``"header"``: how
            a file whose record keeps its bytes is checked; a record made of pixels always has its file decoded fully.

    Returns:
        ``(codec, value)``: the record codec's id (:data:`RECORD_CODECS`) and the value (the same for every level).

    Raises:
        ImageDecodeError: Not a decodable image (as far as ``validate`` looks), or over ``max_pixels``.
        OptionError: ``validate`` is not one of :data:`VALIDATE_LEVELS`.
    """
    mode = storage_mode(storage)
    if validate == "full":
        return mode.encode(data, decode_pil(data, max_pixels=max_pixels, name=name), resize, quality)
    check_validate(validate)
    with open_checked(data, max_pixels=max_pixels, name=name) as opened:  # the header, the bomb check: no pixel decoded
        image = _PixelsOnDemand(data, opened.size, max_pixels, name, opened)
        codec, value = mode.encode(data, cast(Image.Image, image), resize, quality)
        if image.decoded is None and validate == "reduced":  # the record kept the file's bytes: the reduced check
            _check_reduced(opened, name)
    return codec, value


def check_validate(validate: Any) -> None:
    """Refuse a ``validate`` that is not one of :data:`VALIDATE_LEVELS`, naming it and the valid ones.

    Raises:
        OptionError: Not a level.
    """
    if validate not in VALIDATE_LEVELS:
        raise OptionError(f"validate={validate!r} is not one of {', '.join(map(repr, VALIDATE_LEVELS))}.")


def validate_file(data: bytes | memoryview, validate: Validate, *, max_pixels: int | None = DEFAULT_MAX_PIXELS,
                  name: str = "<bytes>") -> None:
    """Check a file's bytes as ``validate`` checks a file whose record keeps its bytes (the module docstring).

    ``"header"``: the header parse and the pixel-count check; ``"reduced"``: those, then a JPEG decoded at 1/8 scale
    (``Image.draft``, the whole entropy-coded stream walked), any other format decoded fully; ``"full"``: a full decode.

    Raises:
        ImageDecodeError: Not an image, over ``max_pixels``, or (``reduced``, ``full``) truncated or corrupt.
        OptionError: ``validate`` is not one of :data:`VALIDATE_LEVELS`.
    """
    check_validate(validate)
    if validate == "full":
        decode_pil(data, max_pixels=max_pixels, name=name).close()
        return
    with open_checked(data, max_pixels=max_pixels, name=name) as image:
        if validate == "reduced":
            _check_reduced(image, name)


def _check_reduced(image: Image.Image, name: str) -> None:
    """``validate="reduced"`` of ``image``, opened from ``data`` by :func:`open_checked` (its header checked): a JPEG decoded
    at 1/8 scale (``Image.draft``: every entropy-coded byte walked), any other format decoded fully.

    Raises:
        ImageDecodeError: Truncated or corrupt.
    """
    if image.format != "JPEG":
        decode_opened(image, name=name).close()
        return
    width, height = image.size
    image.draft("RGB", (max(1, width // 8), max(1, height // 8)))
    try:
        image.load()
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageDecodeError(name, f"corrupt or truncated image ({exc}). Remove or replace the file.") from exc


class _PixelsOnDemand:
    """A file's RGB image (:func:`decode_pil`: a full decode), decoded the first time a storage mode reads more than its size.

    What :func:`encode_record` hands a storage mode below ``validate="full"``: a mode that keeps the file's bytes reads only
    ``size`` and no pixel is decoded; one that reads the pixels (``np.asarray(image)``, any other attribute) gets exactly
    the image ``"full"`` gives it. ``decoded`` says which happened.
    """

    def __init__(self, data: bytes, size: tuple[int, int], max_pixels: int | None, name: str,
                 opened: Image.Image | None = None) -> None:
        self.size = size
        self.decoded: Image.Image | None = None
        self._data, self._max_pixels, self._name, self._opened = data, max_pixels, name, opened

    def image(self) -> Image.Image:
        """The decoded RGB image (decoded on the first call: from the image :func:`open_checked` gave, when given it)."""
        if self.decoded is None:
            self.decoded = (decode_pil(self._data, max_pixels=self._max_pixels, name=self._name) if self._opened is None
                            else decode_opened(self._opened, name=self._name))
        return self.decoded

    @property
    def __array_interface__(self) -> dict[str, Any]:  # np.asarray(image)
        return self.image().__array_interface__

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_") and attribute != "__array__":
            raise AttributeError(attribute)
        return getattr(self.image(), attribute)


def decode_record(
    value: bytes | memoryview, codec: int, *, name: str = "<record>", decoder: str = "pil", decode_size: int | None = None
) -> Image.Image | torch.Tensor:
    """Turn a stored record value into an RGB image: a PIL image for ``decoder="pil"``, else a ``uint8`` ``3 x H x W`` tensor.

    Args:
        value: The record value as stored by the builder.
        codec: Its record codec's id (``meta.codecs[i]``).
        name: How to name the record in errors.
        decoder: ``"pil"``, ``"torchcodec"``, ``"opencv"`` or ``"auto"`` (see :mod:`lightning_lmdb.codec.decoders`).
        decode_size: The shorter side the transform needs (reduced-size JPEG decoding; ignored for pixels).

    Raises:
        ImageDecodeError: A file record that does not decode.
        RecordError: A pixel record that is damaged, or an unknown codec.
    """
    return record_codec(codec).decode(value, decoder, decode_size, name)


def __getattr__(name: str) -> Any:
    if name == "STORAGES":  # the registered storage modes' names, derived from the registry on each access
        return tuple(STORAGE_MODES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
