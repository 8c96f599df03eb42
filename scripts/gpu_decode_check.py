"""On a CUDA GPU: the batched nvJPEG decode is correct under stress, and how fast it is against the CPU decoders.

    python scripts/gpu_decode_check.py [--images 512] [--batch 256] [--cpu-workers 8]

1. **Stream ordering** (TorchCodec PR 1634): nvJPEG's hardware path could write its outputs before work
   already queued on the caller's stream had run, silently corrupting tensors the decoder never saw.
   Reductions over freshly freed "victim" tensors are queued behind a long kernel; then a batch is
   decoded, through TorchCodec directly (is this version affected?) and through
   :meth:`lightning_lmdb.read.batchdecode.DeferredImages.decode` (which synchronises the stream first: must
   never be). The sums are exact integers, wrong only if the decode wrote early.
2. **Correctness**: the GPU batch equals the same batch decoded on the CPU within the JPEG bound.
3. **Throughput** (photo-like JPEGs, 256-500 px, crop + resize to 224): the batched GPU path vs one CPU
   process with each decoder, and vs ``--cpu-workers`` processes with OpenCV (the CPU's best).

Prints one line per measurement; exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from common import photo_pixels  # noqa: E402
from PIL import Image  # noqa: E402

from lightning_lmdb.codec.decoders import decode  # noqa: E402
from lightning_lmdb.read.batchdecode import Collate, Deferred, defer  # noqa: E402
from lightning_lmdb.read.transforms import train_transform  # noqa: E402


def jpegs(count: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        width, height = (int(v) for v in rng.integers(256, 501, 2))
        buffer = io.BytesIO()
        Image.fromarray(photo_pixels(rng, width, height)).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def stress(blobs: list[bytes], rounds: int) -> tuple[int, int, int]:
    """(rounds where TorchCodec alone corrupted queued work, where our decode did, rounds where a freed block was reused)."""
    from torchcodec.decoders import decode_jpeg

    crop = train_transform(224)
    images, _ = Collate(crop)([(defer(b, crop), 0) for b in blobs])
    sources = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    bad_raw = bad_ours = reused = 0
    for _ in range(rounds):
        for label in ("raw", "ours"):
            num_bytes = 3 * 500 * 500
            values = (1, 2, 3, 4)
            victims = [torch.full((num_bytes,), v, dtype=torch.uint8, device="cuda") for v in values]
            pointers = {v.data_ptr() for v in victims}
            torch.cuda.synchronize()
            torch.cuda._sleep(200_000_000)  # keep the stream busy (~100 ms)
            total = torch.zeros((), dtype=torch.float64, device="cuda")
            for victim in victims:
                total = total + victim.sum(dtype=torch.float64)
            victims.clear()  # freed while their reductions are still queued
            if label == "raw":
                out = decode_jpeg(sources, mode="RGB", device="cuda")
                reused += any(o.data_ptr() in pointers for o in out)
            else:
                images.decode("cuda")
            torch.cuda.synchronize()
            wrong = float(total) != float(sum(v * num_bytes for v in values))
            bad_raw += wrong and label == "raw"
            bad_ours += wrong and label == "ours"
    return bad_raw, bad_ours, reused


def _cpu_worker(args: tuple[list[bytes], str]) -> int:
    blobs, decoder = args
    torch.set_num_threads(1)
    crop = train_transform(224)
    for data in blobs:
        crop(decode(data, decoder))
    return len(blobs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--cpu-workers", type=int, default=8)
    parser.add_argument("--stress-rounds", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check")
        return 1
    import torchcodec

    print(f"GPU {torch.cuda.get_device_name(0)}; torch {torch.__version__}; torchcodec {torchcodec.__version__}")
    blobs = jpegs(args.images)
    failed = False

    bad_raw, bad_ours, reused = stress(blobs[: args.batch], args.stress_rounds)
    print(f"stream ordering: TorchCodec alone corrupted queued work in {bad_raw}/{args.stress_rounds} rounds "
          f"(a freed block was handed to it in {reused}); through lightning_lmdb {bad_ours}/{args.stress_rounds}")
    failed |= bad_ours > 0

    crop = train_transform(224)
    torch.manual_seed(0)
    samples = [(defer(b, crop), 0) for b in blobs[: args.batch]]
    assert all(isinstance(s[0], Deferred) for s in samples)
    images, _ = Collate(crop)(samples)
    on_gpu, on_cpu = images.decode("cuda").cpu(), images.decode("cpu")
    mad = (on_gpu.int() - on_cpu.int()).abs().float().mean().item()
    print(f"GPU vs CPU batch: mean absolute difference {mad:.2f} of 255 (bound 2)")
    failed |= mad > 2.0

    batches = [Collate(crop)([(defer(b, crop), 0) for b in blobs[i : i + args.batch]])[0] for i in range(0, len(blobs), args.batch)]
    for _ in range(2):  # warm-up: nvJPEG handles, allocator
        batches[0].decode("cuda")
    torch.cuda.synchronize()
    started = time.perf_counter()
    for batch in batches:
        batch.decode("cuda")
    torch.cuda.synchronize()
    gpu_rate = len(blobs) / (time.perf_counter() - started)
    print(f"GPU batched decode + crop + resize: {gpu_rate:,.0f} img/s (batches of {args.batch}, one process)")
    for decoder in ("pil", "torchcodec", "opencv", "auto"):
        started = time.perf_counter()
        _cpu_worker((blobs[:128], decoder))
        print(f"CPU, one process, {decoder}: {128 / (time.perf_counter() - started):,.0f} img/s")
    chunks = [blobs[i :: args.cpu_workers] for i in range(args.cpu_workers)]
    with multiprocessing.get_context("fork").Pool(args.cpu_workers) as pool:
        pool.map(_cpu_worker, [(c[:4], "opencv") for c in chunks])  # warm-up
        started = time.perf_counter()
        pool.map(_cpu_worker, [(c, "opencv") for c in chunks])
        cpu_rate = len(blobs) / (time.perf_counter() - started)
    print(f"CPU, {args.cpu_workers} processes, opencv: {cpu_rate:,.0f} img/s; GPU / CPU = {gpu_rate / cpu_rate:.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
