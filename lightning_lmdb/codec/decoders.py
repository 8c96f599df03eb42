"""Decoders: encoded image bytes to RGB pixels, with PIL, TorchCodec, OpenCV, or the fastest per record.

``decoder=`` (datasets, ``LMDBDataModule``, benchmarks) names a registered :class:`ImageDecoder`; the library registers:

* ``"pil"`` -- ``ImageFolder``'s exact pixels: PIL, then ``convert("RGB")`` exactly like
  ``torchvision.datasets.folder.pil_loader``. Returns a PIL image (the datasets' default: a drop-in for
  ``ImageFolder``).
* ``"torchcodec"`` -- ``torchcodec.decoders`` (the successor of ``torchvision.io``'s image decoding):
  a ``uint8`` ``3 x H x W`` tensor straight from the bytes, no PIL object.
* ``"opencv"`` -- ``cv2.imdecode`` after the pixel count is checked from the header, straight to RGB
  (never BGR), EXIF orientation ignored like PIL's loader; alpha dropped and grey replicated exactly
  like ``convert("RGB")``.
* ``"auto"`` -- per record, the fastest library that meets the parity policy below (measured here):
  OpenCV for JPEG (grey or colour, 8-bit), PNG and still WebP; PIL for CMYK / YCCK and 12-bit JPEGs,
  animated WebP and every other format (GIF, BMP, TIFF, ...), converted to a tensor.

**Adding a decoder** is one :class:`ImageDecoder` and one :func:`register_decoder` call (in a module of your own):
``check_decoder`` (every caller's check of ``decoder=``), ``choose`` and ``decode`` read the registry. Its parity line
goes in the entry (``parity``; :func:`parity_policy` lists them all) and its test beside it. A decoder registered at run
time exists in the process that registered it and in ``fork`` children: with spawned loader workers, register it on
import of a module the workers import (the dataset's transform's module, say), or they refuse its name saying so.

Tensor decoders read JPEG, PNG and WebP themselves and hand any other format (and anything they fail
on) to PIL, so they accept every image PIL accepts and raise the same :class:`ImageDecodeError`. Their
tensors are ``3 x H x W`` views of ``H x W x 3`` memory (channels-last strides): torchvision's v2 resize
runs its fast ``uint8`` kernel on exactly that layout (3.4x faster here than on a contiguous tensor).

**Parity policy** (``tests/test_decoders.py`` checks every line):

* ``"pil"``: equal to ``ImageFolder``, every mode and format.
* 8-bit PNG in every mode (RGB, RGBA, L, LA, palette with and without transparency, 1/2/4-bit) and
  WebP (lossy, lossless, with alpha): equal to PIL's pixels with OpenCV and TorchCodec.
* JPEG: equal to PIL's pixels here with both (the same libjpeg-turbo and integer IDCT); another build
  may differ by rounding, so the tested bound is a mean absolute difference <= 1 (of 255). Exceptions:
  CMYK JPEGs with OpenCV differ by 1 in every pixel (``"auto"`` uses PIL for them); TorchCodec applies
  the EXIF orientation (rotating the image) where PIL's loader does not (``"auto"`` never uses TorchCodec).
* 16-bit images: PIL's ``convert("RGB")`` clips 16-bit grey to 255 (most pixels come out white);
  OpenCV and TorchCodec scale them to 8 bits (``value >> 8``) instead -- deliberately different.

**Reduced-size decoding** (``decode_size=S``): the shorter side the transform will need. A JPEG whose
shorter side is at least ``2 x k x S`` (``k`` = 2, 4 or 8) is decoded at ``1/k`` scale in the DCT domain
(OpenCV ``IMREAD_REDUCED_*``, PIL ``draft()``; the two give identical pixels), and the transform resizes
from there. Such a decode has ``ceil(W / k) x ceil(H / k)`` pixels: when a side is not a multiple of ``k``, its
last column or row comes from a partly padded block and stands for less than ``k`` source pixels, so the image
spans exactly ``W / k x H / k`` of them. The decode says so (:func:`reduced_from`: the source size and ``k``), and
the default transforms (:class:`~lightning_lmdb.read.transforms.ResizedCrop`) draw their crops in source pixels and
map them, and their resize, onto that exact span (as Pillow's ``thumbnail()`` does with ``draft()``'s box);
resizing all the decoded pixels instead stretched the picture by up to ``k - 1`` source pixels (as a transform
of your own still does, unless it reads :func:`reduced_from`: pass ``decode_size=None`` to it otherwise). The margin
of 2 keeps the transform's antialiased resize doing at least a 2x reduction, so its filter, not the DCT
scaling's, shapes the result: against full decode plus the same transform, the
final tensor's mean absolute difference was 1.2 of 255 on the generated photos (3.0 without the margin;
``benchmarks/peers.py`` measures it, the tests bound it). TorchCodec has no scaled decode and ignores
it; PNG and WebP have no DCT and are decoded whole.
"""

from __future__ import annotations

import io
import re
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
from PIL import Image, UnidentifiedImageError

from lightning_lmdb.codec.imageinfo import ImageInfo, read_info
from lightning_lmdb.errors import ImageDecodeError, OptionError

if TYPE_CHECKING:
    import torch

#: The built-in decoders (documentation and type hints; the valid values of ``decoder=`` are the registry's, :data:`DECODERS`).
Decoder = Literal["pil", "torchcodec", "opencv", "auto"]
#: Default pixel limit: Pillow's own warning threshold (~89.5 megapixels).
DEFAULT_MAX_PIXELS: int = 89_478_485
#: What Pillow itself refuses by default (twice its warning threshold): with ``max_pixels=None``, a larger image is decoded by PIL.
HARD_MAX_PIXELS: int = 2 * DEFAULT_MAX_PIXELS
#: DCT scale factors of reduced-size JPEG decoding, largest first.
_REDUCTIONS = (8, 4, 2)
#: A reduced decode keeps its shorter side at least this many times ``decode_size`` (see the module docstring).
_MARGIN = 2

#: The filter that silences Pillow's DecompressionBombWarning from its own check (``PIL.Image``), as ``warnings.filters`` holds it.
_BOMB_FILTER = ("ignore", None, Image.DecompressionBombWarning, re.compile(r"PIL\.Image$"), 0)


def _silence_bomb_warning() -> None:
    """Make sure this process's warning filters hold :data:`_BOMB_FILTER` (added on the first decode, not per decode).

    Pillow's DecompressionBombWarning duplicates our pixel check (``max_pixels``): over the default limit we
    refuse the image with an error that says how to allow it; over a raised limit the caller allowed it.
    Not added on import (importing a library must leave the user's filters alone), and only for that warning
    from ``PIL.Image`` (one the user raises elsewhere still shows). Added again if the filters were reset
    since (``warnings.resetwarnings()``, leaving a ``catch_warnings()`` block). Not with ``catch_warnings()``
    around each decode, nor a filter added per decode: either resets Python's once-per-location registry,
    and every other warning (e.g. Pillow's "Palette images with Transparency") would be printed once per
    image instead of once per process.
    """
    if _BOMB_FILTER not in warnings.filters:
        warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning, module=_BOMB_FILTER[3].pattern)


@dataclass(frozen=True)
class ImageDecoder:
    """One ``decoder=`` value: how it turns an image file's bytes into RGB pixels.

    Attributes:
        name: The ``decoder=`` value.
        decode: ``(data, info, decode_size) -> uint8 3 x H x W tensor, or None`` when it cannot (PIL then decodes the image or
            names its problem); called for JPEG, PNG and WebP only (PIL decodes every other format). ``None`` for a decoder that
            only chooses (``choose``) or for PIL itself (``pil``).
        pil: It returns PIL images (``ImageFolder``'s loader); every other decoder returns tensors.
        choose: ``(info) -> the name of the decoder that decodes this image`` (``"auto"``: per record); ``None``: itself.
        available: ``() -> bool``: whether its library is installed (``None``: always).
        parity: Its line of the parity policy (what its pixels are, against PIL's).
    """

    name: str
    decode: Callable[[bytes | memoryview, ImageInfo, int | None], torch.Tensor | None] | None = None
    pil: bool = False
    choose: Callable[[ImageInfo], str] | None = None
    available: Callable[[], bool] | None = None
    parity: str = ""


#: The registered decoders by name (:func:`register_decoder`).
_DECODERS: dict[str, ImageDecoder] = {}
#: The valid values of ``decoder=`` (the registry's names, kept up to date by :func:`register_decoder`).


def register_decoder(entry: ImageDecoder) -> ImageDecoder:
    """Make ``entry.name`` a valid ``decoder=`` everywhere (datasets, ``LMDBDataModule``, ``bench``); one of that name is replaced.

    Returns:
        ``entry`` (undo with :func:`unregister_decoder`).

    Raises:
        OptionError: ``entry`` is not an :class:`ImageDecoder`, or has neither ``decode`` nor ``choose`` (and is not ``pil``).
    """
    if not isinstance(entry, ImageDecoder) or not entry.name or not isinstance(entry.name, str):
        raise OptionError(f"register_decoder() takes a lightning_lmdb.codec.decoders.ImageDecoder with a name, not {entry!r}.")
    if entry.decode is None and entry.choose is None and not entry.pil:
        raise OptionError(f"Decoder {entry.name!r} has neither decode nor choose: give it one "
                          "(see lightning_lmdb.codec.decoders.ImageDecoder).")
    _DECODERS[entry.name] = entry
    return entry


def unregister_decoder(name: str) -> None:
    """Remove the decoder called ``name`` (nothing happens when there is none)."""
    _DECODERS.pop(name, None)


def decoder_entry(name: Any, hint: str = "") -> ImageDecoder:
    """The registered :class:`ImageDecoder` called ``name``.

    Args:
        name: The ``decoder=`` value given.
        hint: Where to change it, appended in parentheses (e.g. ``"Hydra: data.decoder=..."``); ``""`` for none.

    Raises:
        OptionError: No such decoder, naming the value and the valid ones.
    """
    entry = _DECODERS.get(name) if isinstance(name, str) else None
    if entry is None:
        where = f" ({hint})" if hint else ""
        raise OptionError(f"decoder={name!r} is not one of {', '.join(map(repr, _DECODERS))}{where}. A decoder of your own is "
                          "registered by lightning_lmdb.codec.decoders.register_decoder() in every process that decodes (spawned loader "
                          "workers too: on import of a module they import).")
    return entry


def check_decoder(decoder: Any, hint: str = "") -> None:
    """Refuse a ``decoder`` that is not registered (:data:`DECODERS`): the one check of every caller's ``decoder=``.

    Args:
        decoder: The value given.
        hint: Where to change it, appended in parentheses (e.g. ``"Hydra: data.decoder=..."``); ``""`` for none.

    Raises:
        OptionError: Naming the value and the valid ones.
    """
    decoder_entry(decoder, hint)


def returns_pil(decoder: str) -> bool:
    """Whether ``decoder`` returns PIL images (else ``uint8 3 x H x W`` tensors)."""
    return decoder_entry(decoder).pil


def parity_policy() -> list[str]:
    """Each registered decoder's parity line, ``"name: line"`` (see the module docstring)."""
    return [f"{entry.name}: {entry.parity}" for entry in _DECODERS.values() if entry.parity]


def _too_many_pixels(name: str, width: int, height: int, limit: int) -> ImageDecodeError:
    return ImageDecodeError(
        name,
        f"{width}x{height} = {width * height:,} pixels exceeds the limit of {limit:,} "
        "(a possible decompression bomb). Raise max_pixels if the image is genuine.",
    )


class Reduced(NamedTuple):
    """How a reduced-size decode relates to the image in the file (see the module docstring).

    Attributes:
        factor: The decode is at ``1 / factor`` scale (2, 4 or 8).
        height: The image's height in the file.
        width: The image's width in the file.
    """

    factor: int
    height: int
    width: int


#: Where a decode keeps its :class:`Reduced`: an attribute of its tensor, a key of its PIL image's ``info``.
_REDUCED = "lightning_lmdb_reduced"


def reduced_from(image: Any) -> Reduced | None:
    """The :class:`Reduced` of an image decoded at reduced size by this module, ``None`` for one decoded whole.

    Only the decode's own object carries it: a tensor made from it (a copy, a crop, ``.to()``) does not.
    """
    found = image.info.get(_REDUCED) if isinstance(image, Image.Image) else getattr(image, _REDUCED, None)
    return found if isinstance(found, Reduced) else None


def _mark_reduced(image: Any, reduced: Reduced | None) -> Any:
    """``image``, carrying ``reduced`` (nothing for a scale of 1) for :func:`reduced_from`."""
    if reduced is not None and reduced.factor > 1:
        if isinstance(image, Image.Image):
            image.info[_REDUCED] = reduced
        else:
            setattr(image, _REDUCED, reduced)
    return image


def reduction(info: ImageInfo, decode_size: int | None) -> int:
    """The DCT scale factor (1, 2, 4 or 8) for decoding this image when the transform needs ``decode_size``.

    The largest ``k`` with ``min(width, height) >= 2 * k * decode_size`` for an 8-bit JPEG; 1 otherwise.
    """
    if not decode_size or info.format != "jpeg" or info.bit_depth != 8:
        return 1
    short = min(info.width, info.height)
    return next((k for k in _REDUCTIONS if short >= _MARGIN * k * decode_size), 1)


def choose(info: ImageInfo, decoder: str) -> str:
    """The registered decoder (e.g. ``"pil"``, ``"torchcodec"`` or ``"opencv"``) that decodes an image with this header.

    Raises:
        OptionError: ``decoder`` is not one of :data:`DECODERS`.
    """
    entry = decoder_entry(decoder)
    if entry.pil or info.format == "other" or not info.pixels:
        return "pil"
    return entry.choose(info) if entry.choose is not None else decoder


def decode(
    data: bytes | memoryview,
    decoder: str = "pil",
    *,
    decode_size: int | None = None,
    max_pixels: int | None = None,
    name: str = "<bytes>",
) -> Image.Image | torch.Tensor:
    """Decode encoded image bytes to RGB: a PIL image for a PIL decoder (``"pil"``), else a ``uint8`` ``3 x H x W`` tensor.

    Args:
        data: The encoded file contents.
        decoder: A registered decoder: ``"pil"``, ``"torchcodec"``, ``"opencv"``, ``"auto"`` (see the module docstring) or yours.
        decode_size: The shorter side the transform needs: allows reduced-size JPEG decoding (``None``: full size).
        max_pixels: Refuse images with more pixels than this (``None``: no limit; one over :data:`HARD_MAX_PIXELS` is decoded by PIL).
        name: How to name the image in errors (usually its path).

    Raises:
        ImageDecodeError: Not an image, truncated or corrupt, or over the pixel limit.
        OptionError: ``decoder`` is not one of :data:`DECODERS`.
    """
    if decoder_entry(decoder).pil:
        return decode_pil(data, max_pixels=max_pixels, name=name, decode_size=decode_size)
    info = read_info(data)
    chosen = _DECODERS.get(choose(info, decoder))
    if chosen is not None and not chosen.pil and chosen.decode is not None:
        if max_pixels is not None and info.pixels > max_pixels:
            raise _too_many_pixels(name, info.width, info.height, max_pixels)
        if info.pixels <= HARD_MAX_PIXELS:  # a larger one (max_pixels=None): PIL's decode, not an allocation from its header
            pixels = chosen.decode(data, info, decode_size)
            if pixels is not None:
                return pixels
    # PIL: the formats the others do not read, and anything they failed on (PIL then names the problem)
    return pil_to_tensor(decode_pil(data, max_pixels=max_pixels, name=name, decode_size=decode_size))


def decode_pil(
    data: bytes | memoryview, *, max_pixels: int | None = DEFAULT_MAX_PIXELS, name: str = "<bytes>", decode_size: int | None = None
) -> Image.Image:
    """Decode encoded image bytes to a fully loaded RGB PIL image, exactly as ``ImageFolder``'s loader does.

    The pixel count is checked from the header before any pixel is decoded, so a decompression bomb
    (a tiny file that expands to gigabytes) is refused cheaply.

    Args:
        data: The encoded file contents.
        max_pixels: Refuse images with more pixels than this; ``None`` for no limit (Pillow's own, twice
            ``PIL.Image.MAX_IMAGE_PIXELS``, is lifted for this image alone, never changed; a WebP or TIFF that Pillow checks
            again as it opens or loads is still held to it).
        name: How to name the image in errors (usually its path).
        decode_size: Allow a reduced-size JPEG decode (``draft()``) whose shorter side stays >= twice this.

    Raises:
        ImageDecodeError: Not an image, truncated or corrupt, or over ``max_pixels``.
    """
    with open_checked(data, max_pixels=max_pixels, name=name) as img:
        return decode_opened(img, name=name, decode_size=decode_size)


def decode_opened(img: Image.Image, *, name: str = "<bytes>", decode_size: int | None = None) -> Image.Image:
    """:func:`decode_pil` of an image :func:`open_checked` opened (its header checked, no pixel decoded yet): the caller
    that needs the header first opens the file once. The caller still closes ``img``.

    Raises:
        ImageDecodeError: Truncated or corrupt.
    """
    width, height = img.size
    reduced = None
    if decode_size and img.format == "JPEG":  # the largest 1/k scale that keeps both sides >= 2 * decode_size
        drafted = img.draft(None, (_MARGIN * decode_size, _MARGIN * decode_size))
        if drafted is not None:  # its box: the image's exact span, (0, 0, width / k, height / k)
            reduced = Reduced(round(width / drafted[1][2]), height, width)
    try:
        return _mark_reduced(img.convert("RGB"), reduced)
    except Image.DecompressionBombError as exc:
        raise ImageDecodeError(name, f"{exc} Pillow's own limit for this format (2 x PIL.Image.MAX_IMAGE_PIXELS) applies even "
                                     "with max_pixels=None: convert the image to PNG, or raise PIL.Image.MAX_IMAGE_PIXELS in "
                                     "your script.") from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageDecodeError(name, f"corrupt or truncated image ({exc}). Remove or replace the file.") from exc


def open_checked(data: bytes | memoryview, *, max_pixels: int | None = DEFAULT_MAX_PIXELS, name: str = "<bytes>") -> Image.Image:
    """Open encoded image bytes with PIL and check their pixel count, decoding no pixel: the header parse alone.

    What every decode starts with (:func:`decode_pil`), and all a build's ``validate="header"`` does
    (:func:`lightning_lmdb.codec.storage.encode_record`): the format is recognised, the size and mode read from the
    header, and a decompression bomb refused from it. The caller closes the image (``with``).

    Raises:
        ImageDecodeError: Empty, not an image in a format Pillow reads, or over ``max_pixels`` (or Pillow's own limit).
    """
    if not len(data):
        raise ImageDecodeError(name, "the file is empty. Remove it or replace it with the image.")
    _silence_bomb_warning()
    pillows = Image.MAX_IMAGE_PIXELS
    try:  # Pillow's own limit (2 x MAX_IMAGE_PIXELS, checked as it opens) must not refuse what max_pixels allows
        stricter = pillows is not None and (max_pixels is None or max_pixels > 2 * pillows)
        img = _open_unchecked(data) if stricter else Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:  # a format that checks again itself (WebP as it opens, TIFF as it loads)
        raise ImageDecodeError(name, f"{exc} Pillow's own limit for this format (2 x PIL.Image.MAX_IMAGE_PIXELS) applies even with "
                                     "max_pixels=None: convert the image to PNG, or raise PIL.Image.MAX_IMAGE_PIXELS in your "
                                     "script.") from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageDecodeError(name, "not an image in a format Pillow can read. Remove or replace the file.") from exc
    width, height = img.size
    if max_pixels is not None and width * height > max_pixels:
        img.close()
        raise _too_many_pixels(name, width, height, max_pixels)
    return img


def _open_unchecked(data: bytes | memoryview) -> Image.Image:
    """``Image.open`` without the decompression-bomb check it makes once the header is read (the caller checks ``max_pixels``
    itself, before any pixel is decoded): the format plugins tried in Pillow's order, as ``Image.open`` tries them.

    Pillow's limit is a process-wide setting (``PIL.Image.MAX_IMAGE_PIXELS``); lifting it for one image by changing it would
    lift it for every thread of the process meanwhile, so it is left alone.

    Raises:
        PIL.UnidentifiedImageError: No plugin reads it.
    """
    fp, prefix = io.BytesIO(data), bytes(data[:16])
    for load_plugins in (Image.preinit, Image.init):
        load_plugins()
        for format_id in list(Image.ID):
            factory, accept = Image.OPEN[format_id]
            accepted = not accept or accept(prefix)
            if not accepted or isinstance(accepted, str):  # a str: why it cannot (Image.open warns it)
                continue
            fp.seek(0)
            try:
                return factory(fp, "")
            except (SyntaxError, IndexError, TypeError, struct.error):  # not this format after all, as Image.open
                continue
    raise UnidentifiedImageError("cannot identify image file")


def pil_to_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB PIL image as a ``uint8`` ``3 x H x W`` tensor (a channels-last view of its own copy of the pixels).

    A reduced-size decode's tensor carries its :class:`Reduced` on (:func:`reduced_from`).
    """
    return _mark_reduced(hwc_to_tensor(np.array(image.convert("RGB") if image.mode != "RGB" else image)), reduced_from(image))


def hwc_to_tensor(pixels: np.ndarray) -> torch.Tensor:
    """An ``H x W x 3`` ``uint8`` array as a ``3 x H x W`` tensor sharing its memory (channels-last strides)."""
    import torch  # here, not at the top: the CLI's info and verify read records without torch

    return torch.from_numpy(pixels).permute(2, 0, 1)


# --- OpenCV -------------------------------------------------------------------------------------------

_cv2 = None
_CV2_FLAGS: dict[int, tuple[int, bool]] = {}  # reduction -> (imdecode flags, output is BGR)


def _opencv_flags(k: int) -> tuple[int, bool]:
    global _cv2
    if not _CV2_FLAGS:
        import cv2

        _cv2 = cv2
        rgb = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.11 decodes straight to RGB
        colour = cv2.IMREAD_COLOR if rgb is None else rgb
        for factor, flag in ((1, cv2.IMREAD_COLOR), (2, cv2.IMREAD_REDUCED_COLOR_2), (4, cv2.IMREAD_REDUCED_COLOR_4),
                             (8, cv2.IMREAD_REDUCED_COLOR_8)):
            _CV2_FLAGS[factor] = ((flag & ~cv2.IMREAD_COLOR) | colour | cv2.IMREAD_IGNORE_ORIENTATION, rgb is None)
    return _CV2_FLAGS[k]


def _opencv(data: bytes | memoryview, info: ImageInfo, decode_size: int | None) -> torch.Tensor | None:
    """OpenCV's RGB pixels, or ``None`` when it cannot (PIL then decodes or names the problem)."""
    if info.format == "jpeg" and not has_end_marker(data):
        return None  # a truncated JPEG: OpenCV would fill the rest with grey and say nothing
    k = reduction(info, decode_size)
    flags, bgr = _opencv_flags(k)
    try:
        pixels = _cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flags)  # type: ignore[union-attr]
    except _cv2.error:  # type: ignore[union-attr]
        return None
    if pixels is None or pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.shape[:2] != (-(-info.height // k), -(-info.width // k)):
        return None
    if bgr:
        pixels = _cv2.cvtColor(pixels, _cv2.COLOR_BGR2RGB)  # type: ignore[union-attr]
    return _mark_reduced(hwc_to_tensor(pixels), Reduced(k, info.height, info.width))


def has_end_marker(data: bytes | memoryview) -> bool:
    """A JPEG's end-of-image marker in its last 4 KB (files often carry padding or trailers after it)."""
    tail = bytes(data[-4096:])
    return b"\xff\xd9" in tail


# --- TorchCodec ---------------------------------------------------------------------------------------

_TORCHCODEC: dict[str, object] = {}  # format -> TorchCodec's decoder of it (imported on first use)


def _torchcodec(data: bytes | memoryview, info: ImageInfo) -> torch.Tensor | None:
    """TorchCodec's RGB pixels, or ``None`` when it cannot (PIL then decodes or names the problem)."""
    if not _TORCHCODEC:
        from torchcodec import decoders as tc

        _TORCHCODEC.update(jpeg=tc.decode_jpeg, png=tc.decode_png, webp=tc.decode_webp)
    if info.format == "jpeg" and not has_end_marker(data):
        return None
    try:
        pixels = _TORCHCODEC[info.format](bytes(data), mode="RGB")  # type: ignore[operator]
    except (RuntimeError, ValueError):
        return None
    if pixels.ndim == 4:  # an animated WebP: its first frame, as PIL gives
        pixels = pixels[0]
    return pixels if pixels.ndim == 3 and pixels.shape[0] == 3 else None


# --- The built-in decoders ----------------------------------------------------------------------------


def _auto(info: ImageInfo) -> str:
    """``"auto"``'s choice: OpenCV, except where it breaks the parity policy (PIL there)."""
    if info.format == "jpeg" and (info.channels not in (1, 3) or info.bit_depth != 8):
        return "pil"  # CMYK / YCCK (OpenCV differs by 1), 12-bit
    if info.format == "webp" and info.animated:
        return "pil"
    return "opencv"


def _importable(module: str) -> Callable[[], bool]:
    def available() -> bool:
        import importlib.util

        return importlib.util.find_spec(module) is not None

    return available


register_decoder(ImageDecoder("pil", pil=True, parity="equal to ImageFolder, every mode and format."))
register_decoder(ImageDecoder("torchcodec", lambda data, info, size: _torchcodec(data, info), available=_importable("torchcodec"),
                              parity="8-bit PNG and WebP equal to PIL's pixels; JPEG mean absolute difference <= 1 (equal here), EXIF "
                                     "orientation applied; 16-bit scaled to 8 bits (PIL clips)."))
register_decoder(ImageDecoder("opencv", _opencv, available=_importable("cv2"),
                              parity="8-bit PNG and WebP equal to PIL's pixels; JPEG mean absolute difference <= 1 (equal here), CMYK "
                                     "JPEGs differ by 1; 16-bit scaled to 8 bits (PIL clips)."))
register_decoder(ImageDecoder("auto", choose=_auto, available=_importable("cv2"),
                              parity="OpenCV's pixels where they meet the policy, PIL's elsewhere (CMYK / YCCK and 12-bit JPEGs, "
                                     "animated WebP, every other format)."))


def __getattr__(name: str) -> Any:
    if name == "DECODERS":  # the registered decoders' names, derived from the registry on each access
        return tuple(_DECODERS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
