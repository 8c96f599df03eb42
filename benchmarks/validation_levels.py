"""What each build validation level (``validate=``) refuses, what the decoders then make of what it accepts, and its cost.

Usage:
    python benchmarks/validation_levels.py [--photos 300] [--large 5] [--out /tmp/validation_levels]

1. A corpus of damaged files made from three good ones (a photo-like JPEG, the same picture as a lossy WebP and as a
   PNG): truncated at several points, bytes flipped in the compressed data, a JPEG named ``.png``, an empty file, and
   decompression-bomb headers (a JPEG and a PNG declaring 50000 x 50000). Each level builds it (``storage="auto"``,
   ``on_error="skip"``); the table says per file and level whether the build refused it, and for each file a level
   accepted, what every decoder (``decoder=`` of :class:`~lightning_lmdb.LMDBImageDataset`, plus nvJPEG through
   TorchCodec where a GPU is present) gives when it is read: ``error`` (the dataset raised), ``good`` (the good file's
   pixels), ``own`` (the damaged file's own pixels: what a full PIL decode of that file gives, without an error),
   ``concealed`` (PIL raises, but these are libjpeg's error concealment of the file: PIL's pixels with
   ``LOAD_TRUNCATED_IMAGES``, the damaged rest of the image filled in), ``WRONG`` (anything else).
2. The cost of each level per image: ``encode_record`` (``storage="auto"``, the JPEGs kept as their bytes) of ``--photos``
   generated ImageNet-like JPEGs (``benchmarks/common.py``) and of ``--large`` 4000 x 3000 ones, files in memory, one
   core, the median of 3 passes.
"""

from __future__ import annotations

import argparse
import io
import platform
import shutil
import statistics
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_photo_folder, photo_pixels  # noqa: E402

from lightning_lmdb import LMDBImageDataset, build_lmdb  # noqa: E402
from lightning_lmdb.codec import decoders  # noqa: E402
from lightning_lmdb.codec.storage import VALIDATE_LEVELS, encode_record  # noqa: E402

BOMB_SIDE = 50_000


def _jpeg_scan_start(data: bytes) -> int:
    """Where a JPEG's entropy-coded data starts (after its first SOS segment)."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + struct.unpack_from(">H", data, sos + 2)[0]


def _flip(data: bytes, at: int, count: int) -> bytes:
    """``data`` with ``count`` bytes from ``at`` XORed with 0x55 (no 0xFF made or unmade: no marker appears or vanishes)."""
    out = bytearray(data)
    for i in range(at, at + count):
        if out[i] != 0xFF and out[i] ^ 0x55 != 0xFF:
            out[i] ^= 0x55
    return bytes(out)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def corpus() -> tuple[dict[str, tuple[str, bytes, str]], dict[str, np.ndarray]]:
    """``{name: (extension, bytes, the good file it came from)}`` and each good file's pixels (PIL, RGB)."""
    pixels = photo_pixels(np.random.default_rng(0), 480, 360)
    good: dict[str, bytes] = {}
    for kind, fmt, params in (("jpeg", "JPEG", {"quality": 90}), ("webp", "WEBP", {"quality": 80}), ("png", "PNG", {})):
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, fmt, **params)
        good[kind] = buffer.getvalue()
    jpeg, webp, png = good["jpeg"], good["webp"], good["png"]
    scan = _jpeg_scan_start(jpeg)
    sof = jpeg.index(b"\xff\xc0")
    jpeg_bomb = bytearray(jpeg)
    struct.pack_into(">HH", jpeg_bomb, sof + 5, BOMB_SIDE, BOMB_SIDE)
    ihdr = struct.pack(">IIBBBBB", BOMB_SIDE, BOMB_SIDE, 8, 2, 0, 0, 0)
    png_bomb = png[:8] + _png_chunk(b"IHDR", ihdr) + png[8 + 25:]
    idat = png.index(b"IDAT") + 4
    files = {
        "jpeg good": ("jpg", jpeg, "jpeg"),
        "jpeg truncated 25%": ("jpg", jpeg[: len(jpeg) // 4], "jpeg"),
        "jpeg truncated 50%": ("jpg", jpeg[: len(jpeg) // 2], "jpeg"),
        "jpeg truncated 90%": ("jpg", jpeg[: len(jpeg) * 9 // 10], "jpeg"),
        "jpeg truncated 99%": ("jpg", jpeg[: len(jpeg) * 99 // 100], "jpeg"),
        "jpeg without EOI (-2 bytes)": ("jpg", jpeg[:-2], "jpeg"),
        "jpeg 1 byte flipped (scan 50%)": ("jpg", _flip(jpeg, (scan + len(jpeg)) // 2, 1), "jpeg"),
        "jpeg 64 bytes flipped (scan 50%)": ("jpg", _flip(jpeg, (scan + len(jpeg)) // 2, 64), "jpeg"),
        "jpeg 64 bytes flipped (scan 10%)": ("jpg", _flip(jpeg, scan + (len(jpeg) - scan) // 10, 64), "jpeg"),
        "jpeg named .png": ("png", jpeg, "jpeg"),
        "jpeg bomb header 50000x50000": ("jpg", bytes(jpeg_bomb), "bomb"),
        "zero bytes .jpg": ("jpg", b"", "none"),
        "webp good (lossy)": ("webp", webp, "webp"),
        "webp truncated 50%": ("webp", webp[: len(webp) // 2], "webp"),
        "webp 64 bytes flipped (50%)": ("webp", _flip(webp, len(webp) // 2, 64), "webp"),
        "png good": ("png", png, "png"),
        "png truncated 50%": ("png", png[: len(png) // 2], "png"),
        "png 64 bytes flipped (IDAT 50%)": ("png", _flip(png, (idat + len(png)) // 2, 64), "png"),
        "png bomb header 50000x50000": ("png", png_bomb, "bomb"),
    }
    references = {kind: np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) for kind, data in good.items()}
    return files, references


def _own_pixels(data: bytes) -> np.ndarray | None:
    """What a full PIL decode of ``data`` gives, or ``None`` when it raises."""
    try:
        return np.asarray(decoders.decode_pil(data, name="own"))
    except decoders.ImageDecodeError:
        return None


def _concealed_pixels(data: bytes) -> np.ndarray | None:
    """What libjpeg's error concealment makes of ``data`` (PIL with ``LOAD_TRUNCATED_IMAGES``), or ``None``."""
    from PIL import ImageFile

    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    except Exception:  # noqa: BLE001 - no concealed pixels either
        return None
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False


def _classify(pixels: np.ndarray, good: np.ndarray | None, own: np.ndarray | None, concealed: np.ndarray | None) -> str:
    def same(a: np.ndarray | None) -> bool:
        return a is not None and a.shape == pixels.shape and float(np.abs(a.astype(np.int16) - pixels).mean()) <= 1.0

    return "good" if same(good) else "own" if same(own) else "**concealed**" if same(concealed) else "**WRONG**"


def _as_array(image: object) -> np.ndarray:
    if isinstance(image, Image.Image):
        return np.asarray(image)
    return image.permute(1, 2, 0).cpu().numpy()  # type: ignore[attr-defined]


def _nvjpeg(value: bytes) -> np.ndarray | str:
    import torch
    from torchcodec.decoders import decode_jpeg

    try:
        return decode_jpeg(torch.frombuffer(bytearray(value), dtype=torch.uint8), mode="RGB", device="cuda").permute(1, 2, 0).cpu().numpy()
    except Exception as exc:  # noqa: BLE001 - whatever nvJPEG raises is the answer
        return f"error ({type(exc).__name__})"


def table(out: Path) -> list[str]:
    """The corpus table, as Markdown lines."""
    files, references = corpus()
    src = out / "corpus"
    shutil.rmtree(src, ignore_errors=True)
    names = {}
    for i, (name, (extension, data, _)) in enumerate(files.items()):
        path = src / "c" / f"f{i:02d}.{extension}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        names[f"c/{path.name}"] = name
    decoder_names = [d for d in ("pil", "opencv", "torchcodec", "auto") if (decoders.decoder_entry(d).available or (lambda: True))()]
    gpu = False
    try:
        import torch

        gpu = torch.cuda.is_available() and (decoders.decoder_entry("torchcodec").available or (lambda: False))()
    except ImportError:
        pass
    readers = [*decoder_names, *(["nvjpeg"] if gpu else [])]
    results: dict[str, dict[str, str]] = {name: {} for name in files}
    for level in VALIDATE_LEVELS:
        db = out / f"{level}.lmdb"
        build_lmdb(src, db, storage="auto", on_error="skip", validate=level, workers=0, progress=False, overwrite=True)
        datasets = {d: LMDBImageDataset(db, decoder=d) for d in decoder_names}
        paths = list(datasets["pil"].paths)
        for row, relpath in enumerate(paths):
            name = names[relpath]
            _, data, origin = files[name]
            good, own, concealed = references.get(origin), _own_pixels(data), _concealed_pixels(data)
            cells = []
            for decoder in readers:
                if decoder == "nvjpeg":
                    answer = _nvjpeg(data) if data[:2] == b"\xff\xd8" else "n/a"
                    cells.append(answer if isinstance(answer, str) else _classify(answer, good, own, concealed))
                    continue
                try:
                    cells.append(_classify(_as_array(datasets[decoder][row][0]), good, own, concealed))
                except Exception as exc:  # noqa: BLE001 - the dataset's error is the answer
                    cells.append(f"error ({type(exc).__name__})")
            results[name][level] = "accepted: " + ", ".join(f"{d} {c}" for d, c in zip(readers, cells))
        for name in files:
            results[name].setdefault(level, "**refused**")
    lines = ["| file | " + " | ".join(VALIDATE_LEVELS) + " |", "|---|" + "---|" * len(VALIDATE_LEVELS)]
    lines += [f"| {name} | " + " | ".join(results[name][level] for level in VALIDATE_LEVELS) + " |" for name in files]
    return lines


def _ms_per_image(datas: list[bytes], level: str) -> float:
    passes = []
    for _ in range(3):
        start = time.perf_counter()
        for data in datas:
            encode_record(data, "auto", validate=level)
        passes.append((time.perf_counter() - start) / len(datas) * 1e3)
    return statistics.median(passes)


def timings(out: Path, count: int, large: int) -> list[str]:
    """ms per image of ``encode_record`` at each level on ``count`` ImageNet-like JPEGs and ``large`` 12-megapixel ones."""
    folder = make_photo_folder(out / "photos", count)
    small = [p.read_bytes() for p in sorted(folder.rglob("*.JPEG"))]
    rng = np.random.default_rng(1)
    big = []
    for _ in range(large):
        buffer = io.BytesIO()
        Image.fromarray(photo_pixels(rng, 4000, 3000)).save(buffer, "JPEG", quality=90)
        big.append(buffer.getvalue())
    lines = [f"| validate | {len(small)} ImageNet-like JPEGs (256-500 px), ms / image | {len(big)} photos 4000x3000, ms / image |",
             "|---|---:|---:|"]
    for level in VALIDATE_LEVELS:
        lines.append(f"| {level} | {_ms_per_image(small, level):.3f} | {_ms_per_image(big, level) if big else float('nan'):.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=300)
    parser.add_argument("--large", type=int, default=5, help="12-megapixel JPEGs to time too")
    parser.add_argument("--out", type=Path, default=Path("/tmp/validation_levels"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.machine()}, {platform.processor() or platform.system()}, Python {platform.python_version()}")
    print("\n".join(table(args.out)))
    print()
    print("\n".join(timings(args.out, args.photos, args.large)))


if __name__ == "__main__":
    main()
