"""Zstandard frames for pixel records: Python 3.14's ``compression.zstd`` where present, else ``zstandard``.

Every frame is written with its content size and its content checksum (XXH64 of the decompressed
bytes; LMDB does not checksum its pages), and read back into a caller's writable buffer, so the pixels
are copied once: by the decompression itself. The caller sizes that buffer from its own header only once it equals the
content size the frame declares (:func:`content_size`): a damaged header is refused, never allocated.
"""

from __future__ import annotations

import io
from typing import Any

try:  # Python 3.14+
    from compression import zstd as _stdlib  # type: ignore[import-not-found]
except ImportError:
    _stdlib = None
    import zstandard as _zstandard

#: Every zstd error either library raises, for callers that turn them into the project's own.
ERRORS: tuple[type[BaseException], ...] = (_stdlib.ZstdError,) if _stdlib is not None else (_zstandard.ZstdError,)
_compressors: dict[int, Any] = {}
_decompressor: Any = None


def compress(data: bytes | memoryview, level: int) -> bytes:
    """One zstd frame of ``data`` at ``level``, with its content size and content checksum."""
    if _stdlib is not None:
        parameter = _stdlib.CompressionParameter
        return _stdlib.compress(data, options={parameter.compression_level: level, parameter.checksum_flag: 1})
    compressor = _compressors.get(level)
    if compressor is None:
        compressor = _compressors[level] = _zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    return compressor.compress(data)


_MAGIC = b"\x28\xb5\x2f\xfd"
_CHECKSUM_FLAG = 0x04  # of the frame header descriptor, the byte after the magic number


def content_size(frame: bytes | memoryview) -> int:
    """The content size ``frame``'s header declares, read before anything is decompressed or allocated.

    Callers compare it with the size their own header promises, so a damaged header never sizes an allocation.

    Raises:
        ValueError: Not a zstd frame, or one that declares no content size or no content checksum (every frame written
            here has both: the header is damaged).
    """
    head = bytes(frame[:5])
    if len(head) < 5 or head[:4] != _MAGIC:
        raise ValueError("not a zstd frame (its magic number is wrong)")
    if not head[4] & _CHECKSUM_FLAG:
        raise ValueError("the zstd frame header declares no content checksum")
    try:
        if _stdlib is not None:
            size = _stdlib.get_frame_info(frame).decompressed_size
        else:
            size = _zstandard.frame_content_size(frame)
    except ERRORS as exc:
        raise ValueError(f"the zstd frame header does not parse ({exc})") from None
    if size is None or size < 0:
        raise ValueError("the zstd frame header declares no content size")
    return int(size)


def decompress_into(frame: bytes | memoryview, out: memoryview) -> None:
    """Decompress one frame into ``out``, which it must fill exactly (the checksum is checked).

    Raises:
        ValueError: The frame holds more or fewer bytes than ``out``.
        One of :data:`ERRORS`: the frame is damaged (bad checksum, truncated, not zstd).
    """
    global _decompressor
    if _stdlib is not None:
        reader: Any = _stdlib.ZstdFile(io.BytesIO(frame))
    else:
        if _decompressor is None:
            _decompressor = _zstandard.ZstdDecompressor()
        reader = _decompressor.stream_reader(frame, read_across_frames=False)
    filled = 0
    with reader:
        while filled < len(out):
            got = reader.readinto(out[filled:])
            if not got:
                break
            filled += got
        extra = reader.read(1)
    if filled != len(out) or extra:
        raise ValueError(f"the zstd frame holds {'more' if extra else filled} bytes, the header promises {len(out)}")
