"""What an encoded image is, read from its first bytes: format, size, channels, bit depth, EXIF orientation.

The decoders (:mod:`lightning_lmdb.codec.decoders`) choose a library per record from this, check the pixel
count before OpenCV allocates anything (``cv2.imdecode`` allocated 1.2 GB for a 388 KB PNG bomb), pick a
DCT scale for reduced-size JPEG decoding, and the GPU path draws each sample's crop from the size
without decoding it. Parsing touches only the headers (a few hundred bytes for a JPEG's markers, the
chunks before a PNG's image data), never the pixels: a few microseconds a record.

Formats read: JPEG (SOF marker: size, components, precision; APP1 Exif: orientation; APP14 Adobe), PNG
(IHDR: size, bit depth, colour type; tRNS before IDAT) and WebP (VP8 / VP8L / VP8X: size, alpha,
animation). Anything else is ``format="other"`` with no size: the caller decodes it with PIL.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

#: JPEG start-of-frame markers (baseline, extended, progressive, lossless; Huffman and arithmetic), not DHT/JPG/DAC.
_SOF_MARKERS = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: PNG colour type -> channels before any RGB conversion.
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


@dataclass(frozen=True)
class ImageInfo:
    """The header facts of one encoded image.

    Attributes:
        format: ``"jpeg"``, ``"png"``, ``"webp"`` or ``"other"``.
        width: Pixels across (``0`` when unknown).
        height: Pixels down (``0`` when unknown).
        channels: Components as stored: JPEG 1 (grey), 3 (YCbCr/RGB) or 4 (CMYK/YCCK); PNG 1 (grey or
            palette), 2 (grey + alpha), 3, 4; WebP 3 or 4 (``0`` when unknown).
        bit_depth: Bits per sample (JPEG precision 8 or 12, PNG 1-16; ``8`` for WebP).
        orientation: EXIF orientation tag (1-8; ``1`` when absent). PIL's ``ImageFolder`` loader ignores it.
        palette: A PNG palette image (colour type 3).
        transparency: A PNG with a ``tRNS`` chunk, or a WebP with alpha.
        progressive: A progressive (or other non-baseline) JPEG.
        animated: An animated WebP.
        lossy: Lossy compression (JPEG, lossy WebP): what a re-encode of it should use too.
    """

    format: str
    width: int = 0
    height: int = 0
    channels: int = 0
    bit_depth: int = 8
    orientation: int = 1
    palette: bool = False
    transparency: bool = False
    progressive: bool = False
    animated: bool = False
    lossy: bool = False

    @property
    def pixels(self) -> int:
        """``width * height`` (0 when unknown)."""
        return self.width * self.height


UNKNOWN = ImageInfo("other")


def read_info(data: bytes | memoryview) -> ImageInfo:
    """Parse the header of encoded image bytes; never raises (damaged or unknown input gives ``format="other"``).

    Args:
        data: The encoded file contents (a ``bytes`` object or a buffer such as an LMDB value).
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    try:
        if view[:3] == b"\xff\xd8\xff":
            return _jpeg(view)
        if view[:8] == _PNG_SIGNATURE:
            return _png(view)
        if view[:4] == b"RIFF" and view[8:12] == b"WEBP":
            return _webp(view)
    except (struct.error, IndexError, ValueError):
        pass
    return UNKNOWN


def _jpeg(data: bytes | memoryview) -> ImageInfo:
    pos, size = 2, len(data)
    orientation = 1
    while pos + 4 <= size:
        if data[pos] != 0xFF:
            return UNKNOWN
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        (length,) = struct.unpack_from(">H", data, pos + 2)
        body = pos + 4
        if marker == 0xE1 and data[body : body + 6] == b"Exif\0\0":
            orientation = _exif_orientation(bytes(data[body + 6 : body + length - 2]))
        elif marker in _SOF_MARKERS:
            precision, height, width, components = struct.unpack_from(">BHHB", data, body)
            return ImageInfo("jpeg", width, height, components, precision, orientation, progressive=marker not in (0xC0, 0xC1),
                             lossy=True)
        elif marker == 0xDA:  # start of scan before any frame header: damaged
            return UNKNOWN
        pos = body + length - 2
    return UNKNOWN


def _exif_orientation(tiff: bytes) -> int:
    """Tag 0x0112 of IFD0 of a TIFF-structured Exif block (1 when absent or unreadable)."""
    try:
        endian = {b"II": "<", b"MM": ">"}[tiff[:2]]
        (ifd,) = struct.unpack_from(endian + "I", tiff, 4)
        (entries,) = struct.unpack_from(endian + "H", tiff, ifd)
        for i in range(entries):
            tag, kind, _, value = struct.unpack_from(endian + "HHIH", tiff, ifd + 2 + 12 * i)
            if tag == 0x0112 and kind == 3:
                return value if 1 <= value <= 8 else 1
    except (KeyError, struct.error):
        pass
    return 1


def _png(data: bytes | memoryview) -> ImageInfo:
    length, kind = struct.unpack_from(">I4s", data, 8)
    if kind != b"IHDR":
        return UNKNOWN
    width, height, depth, colour = struct.unpack_from(">IIBB", data, 16)
    channels = _PNG_CHANNELS.get(colour)
    if channels is None:
        return UNKNOWN
    pos, transparency = 8 + 12 + length, False
    while pos + 8 <= len(data):  # the chunks before the image data: PLTE, tRNS, text, ...
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind in (b"IDAT", b"IEND"):
            break
        transparency = transparency or kind == b"tRNS"
        pos += 12 + length
    return ImageInfo("png", width, height, channels, depth, palette=colour == 3, transparency=transparency or colour in (4, 6))


def _webp(data: bytes | memoryview) -> ImageInfo:
    kind = bytes(data[12:16])
    if kind == b"VP8 ":  # lossy: a key frame's start code, then 14-bit width and height
        if data[23:26] != b"\x9d\x01\x2a":
            return UNKNOWN
        width, height = struct.unpack_from("<HH", data, 26)
        return ImageInfo("webp", width & 0x3FFF, height & 0x3FFF, 3, lossy=True)
    if kind == b"VP8L":  # lossless: a signature byte, then 14-bit width-1, height-1, alpha hint
        if data[20] != 0x2F:
            return UNKNOWN
        (bits,) = struct.unpack_from("<I", data, 21)
        alpha = bool(bits >> 28 & 1)
        return ImageInfo("webp", (bits & 0x3FFF) + 1, (bits >> 14 & 0x3FFF) + 1, 4 if alpha else 3, transparency=alpha)
    if kind == b"VP8X":  # extended: flags, then 24-bit canvas width-1 and height-1
        flags = data[20]
        width = int.from_bytes(bytes(data[24:27]), "little") + 1
        height = int.from_bytes(bytes(data[27:30]), "little") + 1
        alpha = bool(flags & 0x10)
        pos, lossy = 30, False
        while pos + 8 <= len(data) and not lossy:  # the chunks after VP8X: ALPH, VP8 (lossy) or VP8L, ANIM, ...
            kind, length = bytes(data[pos : pos + 4]), int.from_bytes(bytes(data[pos + 4 : pos + 8]), "little")
            lossy = kind == b"VP8 "
            pos += 8 + length + (length & 1)
        return ImageInfo("webp", width, height, 4 if alpha else 3, transparency=alpha, animated=bool(flags & 0x02), lossy=lossy)
    return UNKNOWN
