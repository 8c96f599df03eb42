"""Detection benchmark: a COCO folder served by torchvision's ``CocoDetection`` and by ``LMDBDataModule`` (raw and lmdb), same geometry.

Usage:
    pip install -e ".[bench]"
    python benchmarks/detection.py                      # 5,000 ImageNet-like JPEGs, 2 rounds
    python benchmarks/detection.py --images 1000 --rounds 1   # a quick look

**The data** (generated once under ``--dir``, then reused): ``--images`` ImageNet-like JPEGs of 256-500 px
(:func:`common.make_photo_folder`: 30-110 KB at quality 90) and a COCO ``instances.json`` beside them: 0-20 boxes an
image (uniform), each inside its image (sides 4 % to 60 % of the image's), of 10 categories with non-contiguous COCO ids
(:data:`CATEGORY_IDS`), ``iscrowd`` 0, ``area`` ``w * h``; ``file_name`` relative to the images folder (``root``).

**The loaders**, each to ``uint8 3 x S x S`` images (``--size``, default 224) stacked into batches of 64 and a list of
``B`` target dicts ``{"boxes": tv_tensors.BoundingBoxes (XYXY), "labels": int64 [N]}``, 2 workers, shuffled, persistent
workers; every batch is then finished to ``float32`` (normalised) in the training process, as
``LMDBDataModule.on_after_batch_transfer`` does on the device:

* ``CocoDetection``: ``torchvision.datasets.CocoDetection(root, annFile)`` wrapped by ``wrap_dataset_for_transforms_v2``
  (target keys ``boxes``, ``labels``; the labels stay COCO category ids), PIL decode (``Image.open(...).convert("RGB")``),
  then ``T`` -- the DataModule's training letterbox in ``transforms.v2`` on PIL images, as torchvision's detection
  references do by default (their ``backend="pil"``). ``T`` is applied by :class:`WithNegatives` rather than passed as
  ``CocoDetection(..., transforms=T)``: the wrapper gives an image without annotations a target of ``image_id`` alone, on
  which ``SanitizeBoundingBoxes`` raises; :class:`WithNegatives` gives it empty ``boxes`` / ``labels`` first (what a
  user must write too: torchvision's references drop such images from training instead). ``T``:

  - ``v2.RandomChoice([v2.Resize(None, max_size=m) for m in range(ceil(0.75 S), S + 1)])``: the longer side resized to
    ``m`` (aspect kept, PIL's antialiased bilinear), ``m`` uniform over the integers of ``[0.75 S, S]`` -- the scale jitter
    ``s ~ U[0.75, 1]`` of ``LetterboxResize`` on an integer grid; the boxes scaled with the image;
  - ``v2.RandomHorizontalFlip(0.5)``: the picture and its boxes mirrored (before the padding: within the picture, as
    ``LetterboxResize`` does);
  - :class:`PadBottomRight` (``v2.Pad`` takes a fixed padding, the letterbox's depends on the picture's size): ``F.pad``
    with ``[0, 0, S - w, S - h]``, zeros; the boxes keep their coordinates, their canvas becomes ``S x S``;
  - ``v2.ToImage()`` (PIL to a ``uint8`` tensor), ``v2.ToDtype(torch.uint8, scale=True)`` (a no-op here: already ``uint8``;
    kept so that a float-producing step could not slip in), ``v2.ClampBoundingBoxes()`` (boxes clipped to the canvas, as
    our transform clips them), ``v2.SanitizeBoundingBoxes()`` (boxes under 1 px wide or high dropped with their labels,
    as the DataModule's boxes kind does).

  The collate stacks the images and keeps the targets as a list.
* ``CocoDetection, targets by value``: the same, its collate putting the targets in the DataModule's
  :class:`~lightning_lmdb.targets.boxes.TargetBatch` (a list pickled by value): without it a worker sends each of a
  target's small tensors through a shared-memory segment of its own and a file descriptor (~0.5 ms apiece on 2 cores).
  This row shows the storage and decoder gains apart from that transport gain.
* ``LMDBDataModule raw``: ``LMDBDataModule(train_dir=instances.json, source_options={"root": images}, backend="raw",
  image_size=S, batch_size=64, num_workers=2, val_fraction=0)``'s ``train_dataloader()``: the same files through our
  decoder (``auto``, reduced-size JPEG decoding where an image allows it) and ``LetterboxResize`` (longer side ``S * s``,
  ``s ~ U[0.75, 1]``, flip p = 0.5, zero padding bottom / right, boxes clipped and those under 1 px dropped).
* ``LMDBDataModule lmdb``: the same with ``backend="lmdb"`` (default storage, ``storage="auto"``: the JPEGs kept as they
  are); its build (``prepare_data``) is timed once, apart, and reused by later runs.

Each loader runs in a fresh process (:func:`peers.run_measure`): a **cold** pass (its files -- the images, or the database
-- evicted from the page cache first with :func:`lightning_lmdb.tools.pagecache.evict`; the pass includes starting the
workers), then ``--warm-passes`` **warm** passes (median: the warm figure); each pass iterates the whole loader.
``--rounds`` repeats the three in rotated order; ratios are taken within a round (to ``CocoDetection``'s) and the
medians reported. ``memory MB``: the private anonymous memory (``Pss_Anon``) of the training process and its workers
after each warm pass (the largest). ``boxes/img``: the boxes served per image in the last pass (a check that both
sides serve the same targets).

``--profile N`` instead times, in one process, ``N`` samples of each side by stage (read, decode, transform with boxes,
target) -- where the time goes.

Writes ``detection.md`` and ``detection.json`` into ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from common import make_photo_folder  # noqa: E402
from peers import _children, _pss_anon_mb, _ratio, machine, run_measure  # noqa: E402

HERE = Path(__file__).resolve()
#: Ten COCO category ids, not contiguous (classes are served as indices 0-9 in id order by the DataModule).
CATEGORY_IDS = (1, 3, 7, 13, 18, 27, 44, 62, 77, 90)
NAMES = ("person", "car", "train", "stop sign", "dog", "backpack", "bottle", "chair", "remote", "toothbrush")
LOADERS = [("CocoDetection + v2 (PIL)", "coco"), ("CocoDetection, targets by value", "coco-by-value"), ("LMDBDataModule raw", "raw"),
           ("**LMDBDataModule lmdb**", "lmdb")]


# --- the data -----------------------------------------------------------------------------------------


def make_detection_folder(root: Path, count: int, seed: int = 0) -> tuple[Path, Path]:
    """``count`` ImageNet-like JPEGs under ``root/images`` and ``root/instances.json`` (COCO, 0-20 boxes an image); reused.

    Returns:
        ``(instances.json, images folder)``.
    """
    from PIL import Image

    images = make_photo_folder(root / "images", count, seed=seed)
    annotations = root / "instances.json"
    marker = root / ".complete"
    if marker.exists() and marker.read_text() == str(count) and annotations.exists():
        return annotations, images
    files = sorted(p for p in images.rglob("*.JPEG"))
    rng = np.random.default_rng(seed)
    entries, boxes = [], []
    for image_id, path in enumerate(files, start=1):
        with Image.open(path) as file:
            width, height = file.size
        entries.append({"id": image_id, "file_name": path.relative_to(images).as_posix(), "width": width, "height": height})
        for _ in range(int(rng.integers(0, 21))):
            w, h = rng.uniform(0.04, 0.6) * width, rng.uniform(0.04, 0.6) * height
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            boxes.append({"id": len(boxes) + 1, "image_id": image_id, "category_id": int(rng.choice(CATEGORY_IDS)),
                          "bbox": [round(x, 2), round(y, 2), round(w, 2), round(h, 2)], "area": round(w * h, 2), "iscrowd": 0})
    categories = [{"id": i, "name": n, "supercategory": "thing"} for i, n in zip(CATEGORY_IDS, NAMES)]
    annotations.write_text(json.dumps({"images": entries, "annotations": boxes, "categories": categories}))
    marker.write_text(str(count))
    return annotations, images


# --- the loaders ----------------------------------------------------------------------------------------


def _pad_class() -> type:
    import torch
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F

    class PadBottomRight(v2.Transform):
        """Pad the picture with zeros at the bottom and right to ``size x size`` (boxes unchanged, canvas ``size x size``)."""

        def __init__(self, size: int):
            super().__init__()
            self.size = size

        def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
            from torchvision.transforms.v2._utils import query_size

            height, width = query_size(flat_inputs)
            return {"padding": [0, 0, self.size - width, self.size - height]}

        def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
            return self._call_kernel(F.pad, inpt, padding=params["padding"], fill=0, padding_mode="constant")

    del torch
    return PadBottomRight


def coco_transforms(size: int) -> Any:
    """The DataModule's training letterbox as a ``transforms.v2`` pipeline on PIL images (see the module docstring)."""
    import torch
    from torchvision.transforms import v2

    return v2.Compose([
        v2.RandomChoice([v2.Resize(None, max_size=m, antialias=True) for m in range(math.ceil(0.75 * size), size + 1)]),
        v2.RandomHorizontalFlip(0.5),
        _pad_class()(size),
        v2.ToImage(),
        v2.ToDtype(torch.uint8, scale=True),
        v2.ClampBoundingBoxes(),
        v2.SanitizeBoundingBoxes(),
    ])


def _list_collate(batch: list[tuple[Any, dict[str, Any]]]) -> tuple[Any, list[dict[str, Any]]]:
    import torch

    return torch.stack([image for image, _ in batch]), [target for _, target in batch]


def _by_value_collate(batch: list[tuple[Any, dict[str, Any]]]) -> tuple[Any, list[dict[str, Any]]]:
    """:func:`_list_collate` with the targets in a :class:`~lightning_lmdb.targets.boxes.TargetBatch` (the DataModule's)."""
    from lightning_lmdb.targets.boxes import TargetBatch

    images, targets = _list_collate(batch)
    return images, TargetBatch(targets)


class WithNegatives:
    """``wrap_dataset_for_transforms_v2(CocoDetection(...))`` with its transforms applied here, after an image without
    annotations is given an empty target: the wrapper returns only ``{"image_id"}`` for one, and ``SanitizeBoundingBoxes``
    then raises (it finds no labels, no boxes). ``boxes`` of shape ``(0, 4)`` and empty ``labels``, as the DataModule serves."""

    def __init__(self, wrapped: Any, transforms: Any):
        self.wrapped, self.transforms = wrapped, transforms

    def __len__(self) -> int:
        return len(self.wrapped)

    def __getitem__(self, index: int) -> tuple[Any, dict[str, Any]]:
        import torch
        from torchvision import tv_tensors

        image, target = self.wrapped[index]
        if "boxes" not in target:
            target = {"boxes": tv_tensors.BoundingBoxes(torch.zeros(0, 4), format="XYXY", canvas_size=(image.height, image.width)),
                      "labels": torch.zeros(0, dtype=torch.int64)}
        return self.transforms(image, target)


def coco_dataset(payload: dict[str, Any]) -> WithNegatives:
    """``CocoDetection`` wrapped for ``transforms.v2`` (target keys ``boxes`` and ``labels``) and :class:`WithNegatives`."""
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    wrapped = wrap_dataset_for_transforms_v2(CocoDetection(payload["images"], payload["annotations"]), target_keys=("boxes", "labels"))
    return WithNegatives(wrapped, coco_transforms(payload["size"]))


def datamodule(payload: dict[str, Any], backend: str) -> Any:
    from lightning_lmdb import LMDBDataModule

    return LMDBDataModule(train_dir=payload["annotations"], source_options={"root": payload["images"]}, backend=backend,
                          image_size=payload["size"], batch_size=payload["batch_size"], num_workers=payload["workers"],
                          val_fraction=0, cache_dir=payload["cache_dir"])


def make_loader(payload: dict[str, Any]) -> tuple[Any, list[str]]:
    """The DataLoader of one row and the files a cold pass evicts."""
    from torch.utils.data import DataLoader

    if payload["kind"].startswith("coco"):
        dataset = coco_dataset(payload)
        loader = DataLoader(dataset, batch_size=payload["batch_size"], shuffle=True, num_workers=payload["workers"],
                            persistent_workers=True, collate_fn=_by_value_collate if payload["kind"] == "coco-by-value" else _list_collate)
        root = Path(payload["images"])
        return loader, [str(root / image["file_name"]) for image in dataset.wrapped._dataset.coco.dataset["images"]]
    dm = datamodule(payload, payload["kind"])
    dm.prepare_data()
    dm.setup("fit")
    return dm.train_dataloader(), dm.cached_files()


def measure(payload: dict[str, Any]) -> dict[str, Any]:
    """A cold pass, then ``warm_passes`` warm passes of one loader (in a fresh process)."""
    import torch

    from lightning_lmdb.read.transforms import finish_batch
    from lightning_lmdb.store.envs import close_all
    from lightning_lmdb.tools.pagecache import evict, resident_fraction

    torch.set_num_threads(1)
    started = time.perf_counter()
    loader, files = make_loader(payload)
    result: dict[str, Any] = {"setup_s": time.perf_counter() - started}
    sample = files[:: max(1, len(files) // 64)]
    passes, memory, iterator = [], 0.0, None
    for regime in ["cold"] + ["warm"] * payload["warm_passes"]:
        if regime == "cold":
            close_all()
            evict(files, sync=True)
            result["cold_cached"] = max(resident_fraction(f) for f in sample)
        count, boxes, started = 0, 0, time.perf_counter()
        iterator = iter(loader)
        for images, targets in iterator:
            images = finish_batch(images)
            count += len(images)
            boxes += sum(len(t["boxes"]) for t in targets)
        passes.append(count / (time.perf_counter() - started))
        if regime == "warm":
            memory = max(memory, _pss_anon_mb([os.getpid(), *_children(os.getpid())]))
    result |= {"cold": passes[0], "warm_passes": passes[1:], "warm": statistics.median(passes[1:]), "memory_mb": memory,
               "images": count, "boxes_per_image": boxes / max(1, count)}
    del iterator, loader
    return result


# --- where the time goes (--profile) ---------------------------------------------------------------------


def profile(payload: dict[str, Any], count: int) -> dict[str, dict[str, float]]:
    """Microseconds a sample by stage, in this process, over the first ``count`` images (files in the page cache)."""
    import io

    import torch
    from PIL import Image

    from lightning_lmdb.read.transforms import LetterboxResize

    torch.set_num_threads(1)
    out: dict[str, dict[str, float]] = {}

    def timed(name: str, fn: Any, items: list[Any]) -> list[Any]:
        started = time.perf_counter()
        done = [fn(item) for item in items]
        out.setdefault(side, {})[name] = (time.perf_counter() - started) / len(items) * 1e6
        return done

    # CocoDetection: its own __getitem__ in pieces -- read, PIL decode, the v2 target conversion, the transform
    side = "CocoDetection"
    whole = coco_dataset(payload)
    wrapped = whole.wrapped
    coco = wrapped._dataset
    ids = coco.ids[:count]
    paths = [os.path.join(coco.root, coco.coco.loadImgs(i)[0]["file_name"]) for i in ids]
    data = timed("read", lambda p: Path(p).read_bytes(), paths)
    images = timed("decode", lambda b: Image.open(io.BytesIO(b)).convert("RGB"), data)
    targets = timed("target (COCO lists -> BoundingBoxes)",
                    lambda pair: wrapped._wrapper(pair[0], (pair[1], coco._load_target(coco.ids[pair[0]])))[1],
                    list(enumerate(images)))
    pipeline = coco_transforms(payload["size"])
    timed("transform + sanitize (v2)", lambda pair: pipeline(pair[0], pair[1]), [(i, t) for i, t in zip(images, targets) if "boxes" in t])
    timed("whole __getitem__", whole.__getitem__, list(range(count)))

    # ours: the raw dataset's pieces, and its whole __getitem__; the lmdb dataset's whole __getitem__
    for backend in ("raw", "lmdb"):
        side = f"LMDBDataModule {backend}"
        dm = datamodule(payload, backend)
        dm.prepare_data()
        dm.setup("fit")
        dataset = dm.datasets["train"]
        if backend == "raw":
            from lightning_lmdb.codec.decoders import decode

            letterbox = LetterboxResize(payload["size"], train=True)
            data = timed("read", lambda p: Path(p).read_bytes(), paths)
            decoded = timed("decode (full, auto)", lambda b: decode(b, "auto"), data)

            timed("transform, image alone (LetterboxResize)", letterbox, decoded)
        timed("whole __getitem__", dataset.__getitem__, list(range(count)))
    return out


# --- the report -------------------------------------------------------------------------------------------


def report(result: dict[str, Any], machine_text: str, command: str) -> str:
    rows = result["rows"]
    base = rows[LOADERS[0][0]]
    lines = [f"Machine: {machine_text}.", "", f"`{command}`", "",
             f"{result['description']}; {result['settings']} ({len(base)} rounds). x CocoDetection: the median over the rounds of "
             "each round's ratio (its range in brackets).", "",
             "| loader | build s | cold img/s | cold x CocoDetection | warm img/s | warm x CocoDetection | memory MB | setup s "
             "| boxes/img |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, kind in LOADERS:
        runs = rows[label]
        ratios = {key: [r[key] / b[key] for r, b in zip(runs, base)] for key in ("cold", "warm")}
        build = f"{result['build_s']:.1f}" if kind == "lmdb" else "-"
        lines.append(f"| {label} | {build} | {statistics.median(r['cold'] for r in runs):.0f} | {_ratio(ratios['cold'])} | "
                     f"{statistics.median(r['warm'] for r in runs):.0f} | {_ratio(ratios['warm'])} | "
                     f"{max(r['memory_mb'] for r in runs):.0f} | {statistics.median(r['setup_s'] for r in runs):.2f} | "
                     f"{statistics.median(r['boxes_per_image'] for r in runs):.2f} |")
    if result.get("database_mb"):
        lines += ["", f"Database: {result['database_mb']:.0f} MB for {result['files_mb']:.0f} MB of JPEGs."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=2, help="repetitions of every loader (rotated order); medians reported")
    parser.add_argument("--warm-passes", type=int, default=3)
    parser.add_argument("--size", type=int, default=224, help="output side S")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/lightning_lmdb_detection"), help="generated data and databases")
    parser.add_argument("--out", type=Path, default=HERE.parent / "results")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="instead: time N samples of each side by stage")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(json.loads(sys.stdin.read()))), flush=True)
        return
    root = args.dir / f"detection_{args.images}"
    annotations, images = make_detection_folder(root, args.images)
    payload = {"annotations": str(annotations), "images": str(images), "size": args.size, "batch_size": args.batch_size,
               "workers": args.workers, "warm_passes": args.warm_passes, "cache_dir": str(root / "cache")}
    if args.profile:
        for side, stages in profile(payload, args.profile).items():
            print(side + ": " + ", ".join(f"{name} {us:.0f} us" for name, us in stages.items()))
        return
    # the lmdb build, once: timed here, recorded, reused by later runs
    record = root / "build.json"
    dm = datamodule(payload, "lmdb")
    database = dm.database_path("train")
    if not database.exists() or not record.exists():
        started = time.perf_counter()
        dm.prepare_data()
        record.write_text(json.dumps({"seconds": time.perf_counter() - started}))
    build_s = json.loads(record.read_text())["seconds"]
    database_mb = sum(f.stat().st_size for f in ([database] if database.is_file() else database.rglob("*")) if f.is_file()) / 1e6
    files_mb = sum(p.stat().st_size for p in images.rglob("*.JPEG")) / 1e6
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in LOADERS}
    for round_ in range(args.rounds):
        shift = round_ % len(LOADERS)
        for label, kind in LOADERS[shift:] + LOADERS[:shift]:
            r = run_measure({**payload, "label": label, "kind": kind}, script=HERE)
            rows[label].append(r)
            warn = f"  (eviction failed: {r['cold_cached']:.0%} still cached)" if r["cold_cached"] > 0.05 else ""
            print(f"round {round_}: {label:28s} cold {r['cold']:6.0f}/s  warm {r['warm']:6.0f}/s  memory {r['memory_mb']:5.0f} MB  "
                  f"boxes/img {r['boxes_per_image']:.2f}{warn}", flush=True)
    result = {"rows": rows, "build_s": build_s, "database_mb": database_mb, "files_mb": files_mb,
              "description": f"{args.images:,} ImageNet-like JPEGs (256-500 px), 0-20 boxes each, COCO instances.json",
              "settings": (f"{args.workers} workers, batches of {args.batch_size}, letterbox to {args.size}x{args.size} "
                           "(longer side x U[0.75, 1], flip 0.5, zero pad bottom/right), uint8 batches finished to float in the "
                           "training process")}
    command = "python benchmarks/detection.py" + "".join(f" --{k.replace('_', '-')} {v}" for k, v in
                                                        (("images", args.images), ("rounds", args.rounds)))
    text = report(result, machine(), command)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "detection.json").write_text(json.dumps({"machine": machine(), "command": command, **result}, indent=1))
    (args.out / "detection.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
