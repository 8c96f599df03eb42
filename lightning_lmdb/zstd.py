"""Zstandard frames for pixel records: Python 3.14's ``compression.zstd`` where present, else ``zstandard``.

Every frame is written with its content size and its content checksum (XXH64 of the decompressed
bytes; LMDB does not checksum its pages), and read back into a caller's writable buffer, so the pixels
are copied once: by the decompression itself.
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
