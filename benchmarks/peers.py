"""Peers benchmark: ImageFolder, LitData, WebDataset and each lightning_lmdb mode, same folder, same output tensors.

Usage:
    pip install -e ".[bench]"
    python benchmarks/peers.py          # 10,000 ImageNet-like JPEGs, 5,000 mixed-mode PNGs, 5,000 small PNG icons
    python benchmarks/peers.py --photos 2000 --pngs 1000 --icons 1000 --rounds 1  # a quick look
    python benchmarks/peers.py --photos 0 --pngs 5000 --icons 0 --rounds 3 --latency-ms 0 0.5 2   # on emulated network storage

No photo corpus can be downloaded here, so the three folders are generated (``benchmarks/common.py``): 256-500 px
photo-like JPEGs of 30-110 KB; 48-256 px icon-like PNGs (shapes, gradients, mild noise); and small flat
icons, 16-256 px (most 24-64), PNGs of about 2 KB (median) -- the last two in RGBA, RGB, grey, grey + alpha,
palette and palette-with-transparency modes. Every loader produces the same tensors: RGB, the shorter side
resized to 73 and the centre 64 x 64 kept (ImageNet's evaluation geometry at 64 px), ``float32`` in the
training process; 2 DataLoader workers, batches of 256 (ImageNet's; ``--batch-size``), shuffled, one
intra-op thread in the training process (otherwise its idle OpenMP threads spin on the cores the
workers need).

* ``ImageFolder``: torchvision's, with PIL ``Resize`` + ``CenterCrop`` + ``ToTensor`` (float in the workers).
* ``LitData``: ``optimize`` (each file's bytes, ``litdata.Image``) + ``StreamingDataset`` /
  ``StreamingDataLoader``; its decoder (``torchvision.io``) gives a tensor; v2 resize and crop.
* ``WebDataset``: 100 MB tar shards, a 1,000-sample shuffle buffer, PIL decode (``pilrgb``), the PIL transforms.
* ``lightning_lmdb``: ``LMDBImageDataset`` on one database per storage mode (each row names the one it reads):

  - **the default** (``lmdb auto, decode_size (default)``): ``storage="auto"`` (lossy files kept as they are,
    every other image stored as zstd-compressed RGB pixels), the ``auto`` decoder, ``decode_size`` 73 (what the
    DataModule's ``decode_size="auto"`` gives its evaluation transform);
  - ``lmdb encoded storage, DECODER[, decode_size]``: ``storage="encoded"`` (every record the file's bytes, the
    default before ``auto``) read with each decoder, without and with ``decode_size``: the decoders compared
    on the same file bytes;
  - ``lmdb decoded storage`` (raw pixels), and ``resize=80`` builds with ``auto`` and ``decoded`` storage;
  - ``raw files, auto, decode_size``: ``RawImageDataset`` (the default decoder on the files themselves).

  Workers send ``uint8``; the training process finishes (float, normalise), as
  ``LMDBDataModule.on_after_batch_transfer`` does on a GPU.

Each table row also gives the store's build time and its size twice: ``size MB``, its apparent bytes (the
files' sizes), and ``on disk MB``, the disk blocks allocated to them (``st_blocks``: a small file's last block
is mostly empty, so a folder of 2 KB icons takes far more disk than its bytes); a folder's heading gives
the default database's apparent bytes over the files'.

Each loader runs in a fresh process: a **cold** pass (its files evicted from the page cache first, the
eviction checked with ``mincore``; it includes starting the workers, whose decoders are imported and
initialised before any sample), then ``--warm-passes`` **warm** passes (default 3; their median is the
row's warm figure) with the same (persistent) workers; each pass is timed whole, from ``iter(loader)``
to the last batch. ``--rounds`` repeats every loader and every
ceiling in rotated order and reports the medians (this machine is shared and noisy: single runs vary
by 10-20 %). ``memory`` is the private anonymous memory (``Pss_Anon``) of the training process
and its workers after each warm pass (the largest) -- not RSS, which counts the shared, reclaimable page cache
of a memory-mapped database. The **decode-only ceiling** of a decoder is 2 processes decoding (each record by its codec) and
transforming record bytes already in memory: what the loader would reach with no loader at all; it is
measured for ImageFolder, each decoder on the ``encoded`` database, and the default.

It writes ``peers.md`` (the tables), ``peers.png`` (the chart) and ``peers.json`` (every measurement; ``--report-from``
writes the tables and chart again from it) into ``--out``, and prints the tables. Below each folder's tables: how far
the final tensors of reduced-size decoding and of the ``resize=80`` (``auto``) database are from a full decode of
the files.

``--latency-ms`` instead runs ImageFolder, LitData, lightning_lmdb's default path and the raw files through
a latency mount (:mod:`lightning_lmdb.tools.netfs`) of each value: every store is read through a fresh mount of its
folder (cold: nothing cached on the client, the disk's copies evicted), the dataset's construction is timed
apart (``setup``: ImageFolder's scan, the database's open), and LitData's chunk copy to a local cache (what it
does for remote storage) is timed on a fresh mount too. It writes ``peers_netfs.md`` and ``peers_netfs.json``.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import multiprocessing
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from common import folder_bytes, make_icon_folder, make_photo_folder, make_png_folder, median_file_bytes  # noqa: E402

HERE = Path(__file__).resolve()
SIZE, SIDE = 64, 73  # output side; the shorter side before the centre crop (round(64 * 256 / 224))
DEFAULT = ("**lmdb auto, decode_size (default)**", "lmdb", {"storage": "auto", "decoder": "auto", "decode_size": SIDE})
#: (label, kind, options) of every loader, in table order. An ``lmdb`` row reads the database built with its ``storage``
#: (and ``resize``) option: :func:`_store_of` names it, :func:`build_stores` builds every one the rows name.
LOADERS: list[tuple[str, str, dict[str, Any]]] = [
    ("ImageFolder (PIL)", "imagefolder", {}),
    ("LitData (torchvision.io)", "litdata", {}),
    ("WebDataset (PIL)", "wds", {}),
    *((f"lmdb encoded storage, {decoder}{', decode_size' if size else ''}", "lmdb",
       {"storage": "encoded", "decoder": decoder, **({"decode_size": size} if size else {})})
      for decoder, size in (("pil", None), ("pil", SIDE), ("torchcodec", None), ("opencv", None), ("opencv", SIDE), ("auto", None),
                            ("auto", SIDE))),
    DEFAULT,
    ("lmdb decoded storage", "lmdb", {"storage": "decoded", "decoder": "auto"}),
    ("lmdb resize=80 auto storage", "lmdb", {"storage": "auto", "decoder": "auto", "decode_size": SIDE, "resize": 80}),
    ("lmdb resize=80 decoded storage", "lmdb", {"storage": "decoded", "decoder": "auto", "resize": 80}),
    ("raw files, auto, decode_size", "raw", {"decoder": "auto", "decode_size": SIDE}),
]
#: The rows of the network-storage table (``--latency-ms``): the peers' default paths, LitData's local cache, ours, the files.
NETFS_LOADERS: list[tuple[str, str, dict[str, Any]]] = [
    ("ImageFolder (PIL)", "imagefolder", {}),
    ("LitData (torchvision.io)", "litdata", {}),
    DEFAULT,
    ("raw files, auto, decode_size", "raw", {"decoder": "auto", "decode_size": SIDE}),
]
#: The lmdb rows with a decode-only ceiling, by (storage, decoder, decode_size): each decoder on the files' bytes, and the default.
CEILINGS = [("encoded", decoder, size) for decoder, size in (("pil", None), ("pil", SIDE), ("torchcodec", None), ("opencv", None),
                                                             ("opencv", SIDE), ("auto", None), ("auto", SIDE))] + [("auto", "auto", SIDE)]


# --- the stores ---------------------------------------------------------------------------------------


def _peer_available(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def _lmdb_builds() -> dict[str, dict[str, Any]]:
    """``{store name: its build options}`` of every database a row of :data:`LOADERS` reads."""
    return {_store_of(kind, options): {key: options[key] for key in ("storage", "resize") if key in options}
            for _, kind, options in LOADERS if kind == "lmdb"}


def _store(path: Path, files: list[str], seconds: float | None) -> dict[str, Any]:
    """A store's record: ``bytes`` (apparent: the files' sizes) and ``disk_bytes`` (the disk blocks allocated to them)."""
    stats = [os.stat(f) for f in files]
    return {"path": str(path), "files": files, "seconds": seconds, "bytes": sum(st.st_size for st in stats),
            "disk_bytes": sum(st.st_blocks * 512 for st in stats)}


def build_stores(source: Path, root: Path, workers: int, rebuild: bool, peers: bool) -> dict[str, dict[str, Any]]:
    """Build (or reuse) every store of ``source`` under ``root``.

    Returns:
        ``{store: {"path", "files", "seconds", "bytes", "disk_bytes"}}`` (see :func:`_store`); ``files`` is the source folder.
    """
    from lightning_lmdb.build.writer import build
    from lightning_lmdb.sources.folder import scan_folder

    root.mkdir(parents=True, exist_ok=True)
    record = root / "builds.json"
    builds = json.loads(record.read_text()) if record.exists() and not rebuild else {}
    scan = scan_folder(source)
    stores = {"files": _store(source, [f.path for f in scan.files], None)}
    for name, options in _lmdb_builds().items():
        path = root / f"{name}.lmdb"
        report = build(source, path, workers=workers, progress=False, overwrite=rebuild, **options)
        if report.action != "up-to-date" or name not in builds:
            builds[name] = report.seconds
        stores[name] = _store(path, [str(path)], builds[name])
    targets = [f.target for f in scan.files]
    if peers and _peer_available("litdata"):
        out = root / "litdata"
        if "litdata" not in builds or not (out / "index.json").exists():
            builds["litdata"] = _build_litdata([f.path for f in scan.files], targets, out, workers)
        stores["litdata"] = _store(out, sorted(str(p) for p in out.glob("*.bin")), builds["litdata"])
    if peers and _peer_available("webdataset"):
        out = root / "wds"
        if "wds" not in builds or not list(out.glob("*.tar")):
            builds["wds"] = _build_wds([f.path for f in scan.files], targets, out)
        stores["wds"] = _store(out, sorted(str(p) for p in out.glob("*.tar")), builds["wds"])
    record.write_text(json.dumps(builds))
    return stores


def _litdata_item(item: tuple[str, int]) -> dict[str, Any]:
    import litdata

    path, target = item
    return {"image": litdata.Image(path=path), "target": target}


def _build_litdata(paths: list[str], targets: list[int], out: Path, workers: int) -> float:
    from litdata import optimize

    started = time.perf_counter()
    optimize(fn=_litdata_item, inputs=list(zip(paths, targets)), output_dir=str(out), chunk_bytes="64MB", num_workers=workers,
             mode="overwrite", verbose=False)
    return time.perf_counter() - started


def _build_wds(paths: list[str], targets: list[int], out: Path) -> float:
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.tar"):
        old.unlink()
    started = time.perf_counter()
    with wds.ShardWriter(str(out / "shard-%05d.tar"), maxsize=100e6, verbose=0) as sink:
        for i, (path, target) in enumerate(zip(paths, targets)):
            with open(path, "rb") as handle:
                ext = "png" if path.lower().endswith(".png") else "jpg"
                sink.write({"__key__": f"{i:08d}", ext: handle.read(), "cls": str(target).encode()})
    return time.perf_counter() - started


# --- one loader, in its own process -------------------------------------------------------------------


def _pil_transform() -> Any:
    from torchvision import transforms as T

    return T.Compose([T.Resize(SIDE), T.CenterCrop(SIZE), T.ToTensor()])


def _tensor_transform() -> Any:
    import torch
    from torchvision.transforms import v2

    return v2.Compose([v2.Resize(SIDE, antialias=True), v2.CenterCrop(SIZE), v2.ToDtype(torch.float32, scale=True)])


class _LitTransform:
    def __init__(self) -> None:
        self.transform = _tensor_transform()

    def __call__(self, item: dict[str, Any]) -> tuple[Any, int]:
        return self.transform(item["image"]), item["target"]


def _warm_up_worker(worker_id: int) -> None:
    """Import and initialise every decoder a row uses before any sample, so no row's pass pays for imports."""
    import cv2
    import torchcodec.decoders
    import torchvision.io  # noqa: F401  (LitData's decoder)
    from PIL import Image

    tiny = io.BytesIO()
    Image.new("RGB", (8, 8)).save(tiny, format="JPEG")
    cv2.imdecode(np.frombuffer(tiny.getvalue(), np.uint8), cv2.IMREAD_COLOR)
    torchcodec.decoders.decode_jpeg(tiny.getvalue())
    Image.open(io.BytesIO(tiny.getvalue())).convert("RGB")


def make_loader(kind: str, options: dict[str, Any], store: dict[str, Any], workers: int, batch_size: int) -> Any:
    """The DataLoader of one row of :data:`LOADERS`."""
    from torch.utils.data import DataLoader

    settings = {"batch_size": batch_size, "num_workers": workers, "persistent_workers": workers > 0, "worker_init_fn": _warm_up_worker}
    if kind == "imagefolder":
        from torchvision.datasets import ImageFolder

        return DataLoader(ImageFolder(store["path"], _pil_transform()), shuffle=True, **settings)
    if kind == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset

        return StreamingDataLoader(StreamingDataset(store["path"], shuffle=True, transform=_LitTransform()), **settings)
    if kind == "wds":
        import webdataset as wds

        dataset = (wds.WebDataset(store["files"], shardshuffle=len(store["files"]), empty_check=False).shuffle(1000)
                   .decode("pilrgb").to_tuple("jpg;png", "cls").map_tuple(_pil_transform(), int))
        return DataLoader(dataset, **settings)
    from lightning_lmdb import LMDBImageDataset, RawImageDataset
    from lightning_lmdb.read.transforms import eval_transform

    decoding = {"decoder": options["decoder"], "decode_size": options.get("decode_size")}
    if kind == "raw":
        dataset = RawImageDataset(store["path"], eval_transform(SIZE), **decoding)
    else:
        dataset = LMDBImageDataset(store["path"], eval_transform(SIZE), **decoding)
    return DataLoader(dataset, shuffle=True, **settings)


def _store_of(kind: str, options: dict[str, Any]) -> str:
    """The store a row reads: ``files``, ``litdata``, ``wds``, or ``lmdb-STORAGE[-resizeS]``."""
    if kind in ("imagefolder", "raw"):
        return "files"
    if kind in ("litdata", "wds"):
        return kind
    return f"lmdb-{options['storage']}" + (f"-resize{options['resize']}" if options.get("resize") else "")


def _ceiling_name(kind: str, options: dict[str, Any]) -> str | None:
    """The decode-only ceiling a row is paired with (``None``: none): ImageFolder's, and the lmdb rows of :data:`CEILINGS`."""
    if kind == "imagefolder":
        return "ImageFolder (PIL)"
    if kind != "lmdb" or options.get("resize") or (options["storage"], options["decoder"], options.get("decode_size")) not in CEILINGS:
        return None
    size = options.get("decode_size")
    return f"{options['storage']} storage, {options['decoder']}" + (f", decode_size {size}" if size else "")


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (every thread's, from ``/proc``)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _pss_anon_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                total += sum(int(line.split()[1]) for line in handle if line.startswith("Pss_Anon:"))
        except OSError:
            pass
    return total / 1024


def measure(kind: str, options: dict[str, Any], store: dict[str, Any], workers: int, batch_size: int,
            warm_passes: int = 3, finish_device: str = "cpu") -> dict[str, Any]:
    """A cold pass, then ``warm_passes`` warm passes (their median: ``warm``) of one loader (in a fresh process: :func:`run_measure`).

    Every batch ends as ``float32`` on ``finish_device``: moved there first, then finished if it is ``uint8``.
    """
    import torch

    from lightning_lmdb.read.transforms import finish_batch
    from lightning_lmdb.store.envs import close_all
    from lightning_lmdb.tools.pagecache import evict, resident_fraction

    torch.set_num_threads(1)
    started = time.perf_counter()
    loader = make_loader(kind, options, store, workers, batch_size)  # ImageFolder's scan, the database's open, LitData's index
    result: dict[str, Any] = {"setup_s": time.perf_counter() - started}
    files = store.get("disk_files", store["files"])  # through a latency mount: evict the disk's copies (the mount is fresh)
    sample = random.Random(0).sample(files, min(64, len(files)))
    iterator = None
    passes, memory = [], 0.0
    for regime in ["cold"] + ["warm"] * warm_passes:
        if regime == "cold":
            close_all()
            evict(files, sync=True)  # fsync first: pages of a store written moments ago are dirty and would stay
            result["cold_cached"] = max(resident_fraction(f) for f in sample)
        count, started = 0, time.perf_counter()
        iterator = iter(loader)  # the cold pass starts the workers (fork, and _warm_up_worker's imports): timed, like an epoch
        for images, _ in iterator:
            if finish_device != "cpu":
                images = images.to(finish_device)
            if images.dtype == torch.uint8:
                images = finish_batch(images)
            count += len(images)
        if finish_device.startswith("cuda"):
            torch.cuda.synchronize()
        passes.append(count / (time.perf_counter() - started))
        # Memory between warm passes (untimed, workers alive): a sampler thread during the passes walked the page
        # tables of each process's mapped database and slowed the LMDB rows by ~10 % (ImageFolder maps nothing).
        if regime == "warm":
            memory = max(memory, _pss_anon_mb([os.getpid(), *_children(os.getpid())]))
    result["cold"], result["warm_passes"] = passes[0], passes[1:]
    result["warm"] = statistics.median(passes[1:])
    result["memory_mb"] = memory
    del iterator, loader
    result["rss_main_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def ceiling(kind: str, decoder: str | None, decode_size: int | None, store: dict[str, Any], workers: int) -> float:
    """Samples/s of ``workers`` forked processes decoding + transforming record bytes already in memory (each by its codec)."""
    import torch

    from lightning_lmdb.store import envs
    from lightning_lmdb.store import format as fmt
    from lightning_lmdb.store.database import load_meta

    if kind == "imagefolder":
        blobs = [(-1, Path(p).read_bytes()) for p in store["files"]]
    else:
        codecs = load_meta(store["path"]).codecs
        opened = envs.shared(store["path"])
        with opened.env.begin() as txn:
            blobs = [(int(codecs[i]), txn.get(fmt.record_key(i), db=opened.records)) for i in range(len(codecs))]
        envs.close_all()
    random.Random(0).shuffle(blobs)
    context = multiprocessing.get_context("fork")
    barrier, queue = context.Barrier(workers), context.Queue()

    from PIL import Image

    from lightning_lmdb.codec.storage import decode_record
    from lightning_lmdb.read.transforms import eval_transform

    pil_transform, tensor_transform = _pil_transform(), eval_transform(SIZE)

    def step(codec: int, data: bytes) -> Any:
        if kind == "imagefolder":
            return pil_transform(Image.open(io.BytesIO(data)).convert("RGB"))
        return tensor_transform(decode_record(data, codec, decoder=decoder, decode_size=decode_size))

    def work(part: int) -> None:
        try:
            torch.set_num_threads(1)
            mine = blobs[part::workers]
            for codec, data in mine[:20]:  # imports and first-call costs are not decoding
                step(codec, data)
            barrier.wait()
            started = time.perf_counter()
            for codec, data in mine:
                step(codec, data)
            queue.put(time.perf_counter() - started)
        except BaseException as exc:  # report it, and free the others from the barrier: the parent must not wait forever
            barrier.abort()
            queue.put(f"{type(exc).__name__}: {exc}")

    processes = [context.Process(target=work, args=(part,)) for part in range(workers)]
    for process in processes:
        process.start()
    results = [queue.get() for _ in processes]
    for process in processes:
        process.join()
    errors = [r for r in results if isinstance(r, str)]
    if errors:  # the first cause, not the barrier it broke for the others
        cause = next((e for e in errors if not e.startswith("BrokenBarrierError")), errors[0])
        raise RuntimeError(f"the decode-only ceiling of {store['path']} failed: {cause}")
    return len(blobs) / max(results)


def run_measure(payload: dict[str, Any], script: Path = HERE) -> dict[str, Any]:
    """Run ``script --child`` (this one's: :func:`measure` or :func:`ceiling`) in a fresh Python process with ``payload`` on its
    standard input; return the last JSON line it prints."""
    done = subprocess.run([sys.executable, str(script), "--child"], input=json.dumps(payload), capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"measuring {payload.get('label')} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def _child(payload: dict[str, Any]) -> None:
    result = measure(payload["kind"], payload["options"], payload["store"], payload["workers"], payload["batch_size"],
                     payload.get("warm_passes", 3), payload.get("finish_device", "cpu"))
    paired = payload.get("ceiling")
    if paired:  # the same decode and transform with bytes already in memory, right after (a noisy machine drifts)
        result["ceiling"] = ceiling(paired["kind"], paired.get("decoder"), paired.get("decode_size"), paired["store"],
                                    payload["workers"])
    print(json.dumps(result), flush=True)


# --- the reduced-size and resize bounds ---------------------------------------------------------------


def bounds(stores: dict[str, dict[str, Any]], limit: int = 500) -> dict[str, float]:
    """Mean absolute difference (0-255) of the final tensors against a full decode of the files' bytes (the ``encoded`` store):
    reduced-size decoding of those bytes, and the ``resize=80`` (``auto``) store's records, each read by its codec."""
    import numpy as np

    from lightning_lmdb.codec.decoders import decode
    from lightning_lmdb.codec.storage import decode_record
    from lightning_lmdb.read.transforms import eval_transform
    from lightning_lmdb.store import envs
    from lightning_lmdb.store import format as fmt
    from lightning_lmdb.store.database import load_meta

    transform = eval_transform(SIZE)
    out: dict[str, list[float]] = {"reduced": [], "resize80": []}
    files, resized_store = stores["lmdb-encoded"]["path"], stores["lmdb-auto-resize80"]["path"]
    codecs = load_meta(resized_store).codecs
    with envs.reading(files) as full, envs.reading(resized_store) as small:
        with full.env.begin() as a, small.env.begin() as b:
            for i in range(min(limit, len(codecs))):
                data, resized = a.get(fmt.record_key(i), db=full.records), b.get(fmt.record_key(i), db=small.records)
                reference = transform(decode(data, "opencv")).numpy().astype(np.int16)
                reduced = transform(decode(data, "opencv", decode_size=SIDE)).numpy().astype(np.int16)
                shrunk = transform(decode_record(resized, int(codecs[i]), decoder="opencv", decode_size=SIDE)).numpy().astype(np.int16)
                out["reduced"].append(float(np.abs(reduced - reference).mean()))
                out["resize80"].append(float(np.abs(shrunk - reference).mean()))
    return ({f"{key}_mean": statistics.fmean(v) for key, v in out.items()} | {f"{key}_max": max(v) for key, v in out.items()}
            | {"images": len(out["reduced"])})


# --- the report ---------------------------------------------------------------------------------------


def machine() -> str:
    import cv2
    import PIL
    import torch
    import torchvision

    versions = [f"torch {torch.__version__}", f"torchvision {torchvision.__version__}", f"Pillow {PIL.__version__}",
                f"OpenCV {cv2.__version__}"]
    for name in ("torchcodec", "litdata", "webdataset"):
        try:
            versions.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            pass
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{len(os.sched_getaffinity(0))} cores ({cpu}), {memory:.0f} GiB RAM, Python {platform.python_version()}; " + ", ".join(versions)


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _paired(rows: dict[str, list[dict[str, Any]]], label: str, key: str) -> list[float]:
    """This row's ``key`` over ImageFolder's in the same round, one ratio a round (a shared machine drifts between rounds)."""
    base = rows["ImageFolder (PIL)"]
    return [r[key] / b[key] for r, b in zip(rows[label], base)]


def _ratio(values: list[float]) -> str:
    text = f"{statistics.median(values):.2f}x"
    return text + (f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else "")


def _row_store(result: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The store a measured row read: as recorded with the results (``row_stores``), else as :data:`LOADERS` names it now."""
    name = result.get("row_stores", {}).get(label) or next((_store_of(kind, options) for row, kind, options in LOADERS if row == label),
                                                           None)
    return result["stores"].get(name) if name else None


def _mb(store: dict[str, Any] | None, key: str) -> str:
    if store is None or store.get(key) is None:
        return "?"
    mb = store[key] / 1e6
    return f"{mb:.3g}" if mb < 100 else f"{mb:.0f}"


def _header(folder: str, result: dict[str, Any]) -> str:
    """A folder's heading: what it holds, the rounds, and the default database's size against the files' (apparent bytes)."""
    stores = result["stores"]
    text = f"### {folder}: {result['description']} ({len(result['rows']['ImageFolder (PIL)'])} rounds)"
    default = stores.get(_store_of(DEFAULT[1], DEFAULT[2]))
    if default:
        text += f"; the default database (storage=\"auto\") is {default['bytes'] / stores['files']['bytes']:.2f}x the files' bytes"
    return text


def report(results: dict[str, dict[str, Any]], machine_text: str, settings: str) -> str:
    lines = [f"Machine: {machine_text}.", settings, "x ImageFolder: the median over the rounds of each round's ratio to ImageFolder "
             "(its range in brackets). size MB: the store's apparent bytes (the files' sizes); on disk MB: the disk blocks allocated "
             "to them (st_blocks; a file's last block is partly empty, a sparse file's holes take none).", ""]
    for folder, result in results.items():
        rows = result["rows"]
        lines += [_header(folder, result), "",
                  "| loader | build s | size MB | on disk MB | cold img/s | cold x ImageFolder | warm img/s | warm x ImageFolder "
                  "| memory MB |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for label in rows:
            store = _row_store(result, label)
            cold, warm, memory = (_median(rows[label], key) for key in ("cold", "warm", "memory_mb"))
            built = "?" if store is None else "-" if store["seconds"] is None else f"{store['seconds']:.1f}"
            lines.append(f"| {label} | {built} | {_mb(store, 'bytes')} | {_mb(store, 'disk_bytes')} | {cold:.0f} | "
                         f"{_ratio(_paired(rows, label, 'cold'))} | {warm:.0f} | {_ratio(_paired(rows, label, 'warm'))} | {memory:.0f} |")
        cached = max(r.get("cold_cached", 0.0) for rs in rows.values() for r in rs)
        lines += ["", f"Cold passes: at most {cached:.0%} of any sampled file was still cached after eviction.", "",
                  "| decode-only ceiling (bytes in RAM, 2 processes) | img/s | x ImageFolder's ceiling | its loader warm / ceiling |",
                  "|---|---:|---:|---:|"]
        ceilings = {name: _median(rows[label], "ceiling") for name, label in result["ceiling_rows"].items()}
        for name, label in result["ceiling_rows"].items():
            paired = [r["warm"] / r["ceiling"] for r in rows[label]]
            lines.append(f"| {name} | {ceilings[name]:.0f} | {ceilings[name] / ceilings['ImageFolder (PIL)']:.2f}x | {_ratio(paired)} |")
        b = result["bounds"]
        lines += ["", f"Final tensor vs full decode + the same transform, mean absolute difference (0-255) over the first "
                  f"{b.get('images', 500)} images: reduced-size decoding {b['reduced_mean']:.2f} (worst image {b['reduced_max']:.2f}); "
                  f"resize=80 auto storage {b['resize80_mean']:.2f} (worst {b['resize80_max']:.2f}).", ""]
    return "\n".join(lines)


def chart(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(7 * len(results), 6), squeeze=False)
    for ax, (folder, result) in zip(axes[0], results.items()):
        rows = result["rows"]
        labels = list(rows)
        y = list(range(len(labels)))
        for offset, regime in ((-0.2, "cold"), (0.2, "warm")):
            ratios = [_paired(rows, label, regime) for label in labels]
            medians = [statistics.median(r) for r in ratios]
            spread = [[m - min(r) for m, r in zip(medians, ratios)], [max(r) - m for m, r in zip(medians, ratios)]]
            ax.barh([v + offset for v in y], medians, height=0.4, label=regime, xerr=spread, capsize=2)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(y, [label.strip("*") for label in labels])
        ax.invert_yaxis()
        ax.set_xlabel("throughput, x ImageFolder")
        ax.set_title(f"{folder} ({result['description']})", fontsize=9)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=10_000, help="ImageNet-like JPEGs (0: skip)")
    parser.add_argument("--pngs", type=int, default=5_000, help="mixed-mode PNGs (0: skip)")
    parser.add_argument("--icons", type=int, default=5_000, help="small mixed-mode PNG icons (0: skip)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of every loader (rotated order); medians reported")
    parser.add_argument("--finish-device", default="cpu",
                        help="where every batch ends as float (cuda: uint8 batches finished there, as on_after_batch_transfer does)")
    parser.add_argument("--warm-passes", type=int, default=3, help="warm passes of a loader per round (median: its warm figure)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_peers"), help="generated folders and stores")
    parser.add_argument("--out", type=Path, default=HERE.parent / "results", help="where peers.md and peers.png go")
    parser.add_argument("--only", nargs="*", default=None, help="measure only loaders whose label contains one of these")
    parser.add_argument("--no-peers", action="store_true", help="skip LitData and WebDataset")
    parser.add_argument("--rebuild", action="store_true", help="rebuild every store")
    parser.add_argument("--report-from", nargs="+", type=Path, default=None, metavar="JSON",
                        help="write peers.md / peers.png from the peers.json of earlier runs (their folders merged) and exit")
    parser.add_argument("--latency-ms", nargs="+", type=float, default=None, metavar="MS",
                        help="instead: ImageFolder, LitData and lightning_lmdb through a latency mount of MS per request (e.g. 0 0.5 2)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one measurement, its payload on stdin
    args = parser.parse_args(argv)
    if args.child:
        _child(json.loads(sys.stdin.read()))
        return
    if args.report_from:
        saved = [json.loads(path.read_text()) for path in args.report_from]
        _write(args.out, {folder: result for run in saved for folder, result in run["results"].items()}, saved[-1]["machine"],
               saved[-1]["settings"])
        return
    folders = {}
    if args.photos:
        folders["photos"] = (make_photo_folder(args.dir / f"photos_{args.photos}", args.photos),
                             f"{args.photos:,} ImageNet-like JPEGs, 256-500 px")
    if args.pngs:
        folders["pngs"] = (make_png_folder(args.dir / f"pngs_{args.pngs}", args.pngs), f"{args.pngs:,} mixed-mode PNGs, 48-256 px")
    if args.icons:
        icons = make_icon_folder(args.dir / f"icons_{args.icons}", args.icons)
        folders["icons"] = (icons, f"{args.icons:,} small mixed-mode PNG icons, 16-256 px (median {median_file_bytes(icons) / 1e3:.1f} KB)")
    if args.latency_ms:
        run_netfs(folders, args)
        return
    results: dict[str, dict[str, Any]] = {}
    for folder, (source, description) in folders.items():
        stores = build_stores(source, args.dir / f"{source.name}_stores", args.workers, args.rebuild, not args.no_peers)
        loaders = [(label, kind, options) for label, kind, options in LOADERS if _store_of(kind, options) in stores
                   and (label == "ImageFolder (PIL)" or not args.only or any(o in label for o in args.only))]
        rows: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in loaders}
        ceiling_rows = {}  # ceiling name -> the row it is paired with
        jobs = []
        for label, kind, options in loaders:
            store = stores[_store_of(kind, options)]
            payload = {"what": "loader", "label": label, "kind": kind, "options": options, "store": store, "workers": args.workers,
                       "batch_size": args.batch_size, "warm_passes": args.warm_passes, "finish_device": args.finish_device}
            name = _ceiling_name(kind, options)
            if name:
                payload["ceiling"] = {"kind": kind, "decoder": options.get("decoder"), "decode_size": options.get("decode_size"),
                                      "store": store}
                ceiling_rows[name] = label
            jobs.append((label, payload))
        for round_ in range(args.rounds):
            shift = round_ * max(1, len(jobs) // args.rounds)
            for label, payload in jobs[shift:] + jobs[:shift]:
                r = run_measure(payload)
                rows[label].append(r)
                paired = f"  ceiling {r['ceiling']:7.0f}/s ({r['warm'] / r['ceiling']:.2f})" if "ceiling" in r else ""
                warn = f"  (eviction failed: {r['cold_cached']:.0%} still cached)" if r["cold_cached"] > 0.05 else ""
                print(f"{folder} round {round_}: {label:44s} cold {r['cold']:7.0f}/s  warm {r['warm']:7.0f}/s{paired}{warn}", flush=True)
        results[folder] = {"rows": rows, "description": description, "ceiling_rows": ceiling_rows, "bounds": bounds(stores),
                           "row_stores": {label: _store_of(kind, options) for label, kind, options in loaders},
                           "stores": {name: {k: v for k, v in store.items() if k != "files"} for name, store in stores.items()}}
    settings = (f"{args.workers} workers, batches of {args.batch_size}; output {SIZE}x{SIZE} float (shorter side {SIDE}, centre crop)"
                f"{'' if args.finish_device == 'cpu' else f' on {args.finish_device}'}.")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers.json").write_text(json.dumps({"machine": machine(), "settings": settings, "results": results}, indent=1))
    _write(args.out, results, machine(), settings)


# --- on emulated network storage (--latency-ms) ---------------------------------------------------------


def _mounted_store(store: dict[str, Any], latency_ms: float, mountpoint: Path) -> tuple[dict[str, Any], Any]:
    """``store`` served through a fresh latency mount (a fresh client: nothing cached); the disk's files kept for eviction."""
    from lightning_lmdb.tools import netfs

    real = Path(store["path"])
    folder = real if real.is_dir() else real.parent
    mount = netfs.mount(folder, mountpoint, latency_ms=latency_ms)
    return ({**store, "path": str(mount.through(real)), "files": [str(mount.through(f)) for f in store["files"]],
             "disk_files": store["files"]}, mount)


def _copy_cost(store: dict[str, Any], latency_ms: float, work: Path) -> dict[str, float]:
    """Seconds and MB of copying ``store``'s files to the local disk through a fresh mount, their disk copies evicted first."""
    import shutil

    from lightning_lmdb.tools.pagecache import evict

    evict(store["files"], sync=True)
    mounted, mount = _mounted_store(store, latency_ms, work / "mnt")
    try:
        started = time.perf_counter()
        shutil.copytree(mounted["path"], work / "copy")
        seconds = time.perf_counter() - started
    finally:
        mount.close()
    copied = folder_bytes(work / "copy")[0] / 1e6
    shutil.rmtree(work / "copy")
    return {"copy_s": seconds, "copy_mb": copied}


def run_netfs(folders: dict[str, tuple[Path, str]], args: argparse.Namespace) -> None:
    """The :data:`NETFS_LOADERS` through a latency mount of each ``--latency-ms``; writes ``peers_netfs.md`` / ``.json``."""
    import shutil
    import tempfile

    results: dict[str, dict[str, Any]] = {}
    for folder, (source, description) in folders.items():
        stores = build_stores(source, args.dir / f"{source.name}_stores", args.workers, args.rebuild, not args.no_peers)
        loaders = [row for row in NETFS_LOADERS if _store_of(row[1], row[2]) in stores
                   and (row[0] == "ImageFolder (PIL)" or not args.only or any(o in row[0] for o in args.only))]
        rows: dict[str, list[dict[str, Any]]] = {f"{label} @ {ms:g}": [] for ms in args.latency_ms for label, _, _ in loaders}
        work = Path(tempfile.mkdtemp(prefix="peers-netfs-"))
        try:
            for round_ in range(args.rounds):
                shift = round_ % len(loaders)
                for ms in args.latency_ms:
                    for label, kind, options in loaders[shift:] + loaders[:shift]:
                        store, mount = _mounted_store(stores[_store_of(kind, options)], ms, work / "mnt")
                        try:
                            r = run_measure({"label": label, "kind": kind, "options": options, "store": store, "workers": args.workers,
                                             "batch_size": args.batch_size, "warm_passes": args.warm_passes})
                        finally:
                            mount.close()
                        if kind == "litdata":  # from remote storage LitData first copies the chunks to a local cache
                            r |= _copy_cost(stores["litdata"], ms, work)
                        rows[f"{label} @ {ms:g}"].append(r)
                        print(f"{folder} round {round_} {ms:g} ms: {label:48s} setup {r['setup_s']:6.2f} s  cold {r['cold']:6.0f}/s  "
                              f"warm {r['warm']:6.0f}/s", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results[folder] = {"rows": rows, "description": description, "latencies": args.latency_ms,
                           "labels": [label for label, _, _ in loaders]}
    settings = (f"{args.workers} workers, batches of {args.batch_size}; output {SIZE}x{SIZE} float (shorter side {SIDE}, centre crop); "
                "every store read through a fresh latency mount (lightning_lmdb.tools.netfs) of its folder.")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers_netfs.json").write_text(json.dumps({"machine": machine(), "settings": settings, "results": results}, indent=1))
    text = netfs_report(results, machine(), settings)
    (args.out / "peers_netfs.md").write_text(text + "\n")
    print(text)


def netfs_report(results: dict[str, dict[str, Any]], machine_text: str, settings: str) -> str:
    """One table per folder: each loader at each latency, setup time, cold and warm throughput against ImageFolder's."""
    lines = [f"Machine: {machine_text}.", settings,
             "setup: building the dataset object (ImageFolder's scan of the folder, opening the database, LitData's index); "
             "cold: the first pass, through a fresh mount of the store with the disk's copies evicted, workers started; warm: a "
             "second pass (the mount keeps file contents, every lookup and open is still a round trip). "
             "x ImageFolder: median of each round's ratio (range).", ""]
    for folder, result in results.items():
        rows = result["rows"]
        first = rows[f"ImageFolder (PIL) @ {result['latencies'][0]:g}"]
        lines += [f"### {folder}: {result['description']} ({len(first)} rounds)", "",
                  "| loader | ms per request | setup s | cold img/s | cold x ImageFolder | warm img/s | warm x ImageFolder |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for ms in result["latencies"]:
            base = rows[f"ImageFolder (PIL) @ {ms:g}"]
            for label in result["labels"]:
                runs = rows[f"{label} @ {ms:g}"]
                ratios = {key: [r[key] / b[key] for r, b in zip(runs, base)] for key in ("cold", "warm")}
                lines.append(f"| {label} | {ms:g} | {_median(runs, 'setup_s'):.2f} | {_median(runs, 'cold'):.0f} | "
                             f"{_ratio(ratios['cold'])} | {_median(runs, 'warm'):.0f} | {_ratio(ratios['warm'])} |")
        copies = {ms: rows[f"LitData (torchvision.io) @ {ms:g}"] for ms in result["latencies"]
                  if f"LitData (torchvision.io) @ {ms:g}" in rows}
        if copies:
            mb = max(r["copy_mb"] for runs in copies.values() for r in runs)
            took = ", ".join(f"{_median(runs, 'copy_s'):.1f} s at {ms:g} ms" for ms, runs in copies.items())
            lines += ["", f"LitData reads a mounted folder in place (the rows above). From remote storage (s3://, ...) it first copies "
                      f"its chunks to a local cache: {mb:.0f} MB, the whole dataset, on every node's disk; copying them through a fresh "
                      f"mount (their disk pages evicted) took {took}, within its first epoch, and it then reads the local copy at "
                      "local-disk speed."]
        lines.append("")
    return "\n".join(lines)


def _write(out: Path, results: dict[str, dict[str, Any]], machine_text: str, settings: str) -> None:
    text = report(results, machine_text, settings)
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers.md").write_text(text + "\n")
    chart(results, out / "peers.png")
    print(text)
    print(f"\nwritten: {out / 'peers.md'}, {out / 'peers.png'}")


if __name__ == "__main__":
    main()
    # Exit without the interpreter's final garbage collections over torch's ~340,000 objects (~0.7 s of every process's exit,
    # each loader's child included); nothing is left to collect: the loaders' workers and the ceilings' processes are joined.
    gc.freeze()
