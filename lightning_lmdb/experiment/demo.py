"""Deterministic demo datasets: an image folder that exercises the traps real folders hold, and a small segmentation set.

:func:`make_demo_dataset` writes an ImageFolder layout (``root/class_00/...``) of small synthetic
images. Each class has its own stripe orientation and stripe colour, plus per-image random
background, phase, period and noise, so a small CNN learns it in an epoch or two, also from the
grayscale images. Files cycle through every variant a loader must handle: JPEG and PNG
(extensions ``.jpg``, ``.jpeg``, ``.JPG``, ``.png``), modes RGB, L, LA, P with a transparent
palette entry, RGBA, CMYK (JPEG) and 16-bit grayscale ``I;16`` (PNG), sides of 40-96 px, and
some non-ASCII file names (``café_0001.jpg``, ``猫_0005.png``).

Each image has its own ``numpy`` generator seeded with ``(seed, class, index)``; Pillow's encoders
are deterministic, so the same arguments give byte-identical files. Generation goes into a
temporary sibling directory; the completion marker (:data:`MARKER_NAME`, recording the arguments)
is written last and the directory is then renamed into place, so an interrupted run never leaves
something that looks complete.

:func:`make_segmentation_demo` writes a segmentation set the same way (deterministic, atomic, idempotent):
``images/seg_NNNN.{png,jpg}`` (RGB, PNG and JPEG alternating), ``masks/seg_NNNN.png`` (index PNGs, grey ``L`` and
Pascal VOC-palette ``P`` modes) and the manifest ``train.csv`` (columns ``path,mask,split``, paths relative to it).
Each image holds one to four filled shapes, each in one of its shape's two colours (:data:`SHAPE_COLOURS`: reds for
circles, greens for squares, blues for triangles, so a small model learns the set in a few epochs, as it learns the
class demo), on a noisy gradient background; its mask holds each shape's id (:data:`SHAPES`: circle 1, square 2, triangle 3) on its
pixels, background 0, and around half of the shapes a 2-pixel :data:`IGNORE_INDEX` (255) band on their outline (one pixel
inside, one outside), as Pascal VOC marks object borders. Shapes never overlap or touch: the image is cut into a 2 x 2
grid and a shape (with its band) stays inside its cell. Train it with::

    python -m lightning_lmdb.experiment.demo --segmentation data/demo_segmentation     # prints .../train.csv
    python train.py data=lmdb data.train_dir=data/demo_segmentation/train.csv
    python train.py -m data=raw,lmdb data.train_dir=data/demo_segmentation/train.csv  # its A/B

:func:`make_detection_demo` writes a detection set the same way, in COCO's layout: ``images/det_NNNN.jpg`` (RGB JPEGs,
sides of ``size - size // 8`` to ``size + size // 8`` pixels) and one annotation file per split, ``instances_train.json``
and ``instances_val.json`` (every fifth image in ``val``), whose ``file_name`` entries are relative to the demo's root.
Each image holds 0 to ``max_objects`` shapes on a textured grey background (low-frequency blotches, faint stripes and
noise; about one image in ten has none, a negative): each class of :data:`DETECTION_CLASSES` is one shape in one
saturated colour (:data:`DETECTION_COLOURS`), 14 to 40 pixels across, and shapes never overlap (2 pixels apart at least).
Each annotation's ``bbox`` (``[x, y, w, h]``, COCO's) is the tight box of its shape's pixels and ``area`` their count;
the category ids are not contiguous (:data:`DETECTION_CATEGORY_IDS`), as COCO's are not. Train it with::

    python train.py data=lmdb demo.kind=detection           # generated in data/demo_detection on first use
    python train.py -m data=raw,lmdb demo.kind=detection    # its A/B
"""

from __future__ import annotations

import argparse
import colorsys
import csv
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from lightning_lmdb.errors import OptionError

Box = tuple[int, int, int, int]

MARKER_NAME = ".demo_complete.json"
DEMO_VERSION = 1
_PARTIAL = ".partial-"
# (mode, file extension); RGB JPEG repeats because it dominates real folders.
_VARIANTS: tuple[tuple[str, str], ...] = (
    ("RGB", ".jpg"), ("L", ".png"), ("CMYK", ".jpg"), ("RGBA", ".png"), ("RGB", ".jpeg"),
    ("P", ".png"), ("L", ".jpg"), ("LA", ".png"), ("RGB", ".JPG"), ("I;16", ".png"),
    ("RGB", ".png"),
)
_NON_ASCII = ("café", "猫", "ñandú", "Ünïcødé")

SEGMENTATION_VERSION = 1
#: The manifest of the segmentation demo, in its root (pass its path as ``data.train_dir``).
SEGMENTATION_MANIFEST = "train.csv"
#: The segmentation demo's shapes; a shape's mask value is its position here plus one (background is 0).
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
#: The mask value of the segmentation demo's unlabelled outline bands.
IGNORE_INDEX = 255
#: The colours the segmentation demo fills each shape of :data:`SHAPES` with (one of two per shape), before the noise.
SHAPE_COLOURS: tuple[tuple[tuple[int, int, int], ...], ...] = (
    ((230, 60, 50), (240, 150, 60)),   # circle: red, orange
    ((60, 200, 80), (50, 190, 170)),   # square: green, teal
    ((60, 110, 235), (170, 80, 220)),  # triangle: blue, purple
)
#: The segmentation demo's shapes are at least this many pixels across.
_MIN_SHAPE = 8
#: Standard deviation of the segmentation demo's pixel noise.
_SEG_NOISE = 10.0


DETECTION_VERSION = 1
#: The detection demo's annotation file of each split, in its root.
DETECTION_ANNOTATIONS = {"train": "instances_train.json", "val": "instances_val.json"}
#: The detection demo's classes (COCO categories, in category id order).
DETECTION_CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "diamond")
#: Their COCO category ids (not contiguous, as COCO's are not).
DETECTION_CATEGORY_IDS: tuple[int, ...] = (1, 3, 4, 8)
#: The colour each detection class is filled with (before the pixel noise): red, green, blue, yellow.
DETECTION_COLOURS: tuple[tuple[int, int, int], ...] = ((225, 45, 45), (45, 200, 60), (50, 90, 235), (235, 205, 35))
#: The detection demo's shapes are this many pixels across, at least and at most.
_DETECTION_SIDES = (14, 40)


def make_demo_dataset(root: str | os.PathLike[str], *, num_classes: int = 10,
                      images_per_class: int = 200, seed: int = 0) -> Path:
    """Write the demo ImageFolder at ``root`` (class folders directly inside) unless complete.

    Args:
        root: Dataset directory; must not exist, be empty, or hold a complete demo dataset
            made with the same arguments.
        num_classes: Number of class folders ``class_00``, ``class_01``, ...
        images_per_class: Images per class.
        seed: Seed of the image content; same arguments give byte-identical files.

    Returns:
        ``root`` as a ``Path`` (usable with ``torchvision.datasets.ImageFolder``).

    Raises:
        ValueError: A count is below 1.
        FileExistsError: ``root`` holds something else, or a demo made with other arguments.
    """
    if num_classes < 1 or images_per_class < 1:
        raise OptionError(f"num_classes={num_classes} and images_per_class={images_per_class} "
                         "must both be >= 1.")
    root = Path(root)
    params = {"version": DEMO_VERSION, "num_classes": num_classes,
              "images_per_class": images_per_class, "seed": seed}
    return _write_once(root, params, lambda out: _generate(out, num_classes, images_per_class, seed))


def make_segmentation_demo(root: str | os.PathLike[str], *, count: int = 200, size: int = 64, seed: int = 0) -> Path:
    """Write the segmentation demo at ``root`` unless complete; return its manifest's path (see the module docstring).

    Args:
        root: Dataset directory; must not exist, be empty, or hold a complete segmentation demo made with the same arguments.
        count: Image and mask pairs (every fifth, ``seg_0004``, ``seg_0009``, ..., is in the ``val`` split, the rest ``train``).
        size: Typical side in pixels: each image's height and width are drawn from ``size - size // 4`` to ``size + size // 4``.
        seed: Seed of the content; the same arguments give byte-identical files.

    Returns:
        ``root / "train.csv"``: the manifest (columns ``path,mask,split``), e.g. for ``data.train_dir``.

    Raises:
        OptionError: ``count`` below 1 or ``size`` below 32.
        FileExistsError: ``root`` holds something else, or a demo made with other arguments.
    """
    if count < 1 or size < 32:
        raise OptionError(f"count={count} and size={size}: a segmentation demo needs count >= 1 and size >= 32 (pixels).")
    root = Path(root)
    params = {"version": SEGMENTATION_VERSION, "kind": "segmentation", "count": count, "size": size, "seed": seed}
    return _write_once(root, params, lambda out: _generate_segmentation(out, count, size, seed)) / SEGMENTATION_MANIFEST


def make_detection_demo(root: str | os.PathLike[str], *, count: int = 300, size: int = 112, max_objects: int = 5,
                        seed: int = 0) -> Path:
    """Write the detection demo at ``root`` in COCO's layout unless complete; return ``root`` (see the module docstring).

    Args:
        root: Dataset directory; must not exist, be empty, or hold a complete detection demo made with the same arguments.
        count: Images (every fifth, ``det_0004``, ``det_0009``, ..., in ``instances_val.json``, the rest in ``instances_train.json``).
        size: Typical side in pixels: each image's height and width are drawn from ``size - size // 8`` to ``size + size // 8``.
        max_objects: Shapes per image, at most (each image draws 0 to ``max_objects``; fewer when they do not fit).
        seed: Seed of the content; the same arguments give byte-identical files.

    Returns:
        ``root``: ``root / "instances_train.json"`` is ``data.train_dir``, ``root / "instances_val.json"`` ``data.val_dir``,
        with ``root`` as the images' folder (``data.source_options.root``).

    Raises:
        OptionError: ``count`` below 1, ``size`` below 64, or ``max_objects`` below 0.
        FileExistsError: ``root`` holds something else, or a demo made with other arguments.
    """
    if count < 1 or size < 64 or max_objects < 0:
        raise OptionError(f"count={count}, size={size} and max_objects={max_objects}: a detection demo needs count >= 1, "
                          "size >= 64 (pixels) and max_objects >= 0.")
    params = {"version": DETECTION_VERSION, "kind": "detection", "count": count, "size": size, "max_objects": max_objects,
              "seed": seed}
    return _write_once(Path(root), params, lambda out: _generate_detection(out, count, size, max_objects, seed))


def _write_once(root: Path, params: dict[str, int | str], generate: Callable[[Path], None]) -> Path:
    """Run ``generate`` into a temporary sibling of ``root`` and rename it into place with its marker, unless complete."""
    if _is_complete(root, params):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(root)
    tmp = root.with_name(f".{root.name}{_PARTIAL}{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        generate(tmp)
        (tmp / MARKER_NAME).write_text(json.dumps(params, indent=2) + "\n", encoding="utf-8")
        if root.is_dir() and not any(root.iterdir()):
            root.rmdir()
        os.rename(tmp, root)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_complete(root, params):  # another process finished first
            return root
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root


def _is_complete(root: Path, params: dict[str, int | str]) -> bool:
    """True if ``root`` holds a finished demo made with ``params``; raise if it holds other data."""
    marker = root / MARKER_NAME
    if marker.is_file():
        found = json.loads(marker.read_text(encoding="utf-8"))
        if found != params:
            raise FileExistsError(
                f"{root} holds a demo dataset made with {found}, not {params}. "
                "HINT: pass another root, or delete this one to regenerate.")
        return True
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(
            f"{root} exists and is not a complete demo dataset (no {MARKER_NAME}). "
            "HINT: pass another root, or delete this one.")
    return False


def _remove_stale_partials(root: Path) -> None:
    """Delete temp dirs left by interrupted runs whose process is gone."""
    for path in root.parent.glob(f".{root.name}{_PARTIAL}*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _generate(out: Path, num_classes: int, images_per_class: int, seed: int) -> None:
    width = max(2, len(str(num_classes - 1)))
    for cls in range(num_classes):
        class_dir = out / f"class_{cls:0{width}d}"
        class_dir.mkdir()
        for i in range(images_per_class):
            mode, ext = _VARIANTS[(cls * images_per_class + i) % len(_VARIANTS)]
            stem = _NON_ASCII[(i // 4) % len(_NON_ASCII)] if i % 4 == 1 else "img"
            rng = np.random.default_rng((seed, cls, i))
            rgb = _pixels(rng, cls, num_classes)
            _save(rgb, mode, class_dir / f"{stem}_{i:04d}{ext}", rng)


def _pixels(rng: np.random.Generator, cls: int, num_classes: int) -> np.ndarray:
    """RGB uint8 image: class-coloured stripes at a class angle over a random background."""
    h, w = (int(v) for v in rng.integers(40, 97, size=2))
    colour = np.array(colorsys.hsv_to_rgb(cls / num_classes, 0.85, 0.95)) * 255.0
    angle = np.pi * cls / num_classes
    period = rng.uniform(8.0, 14.0)
    yy, xx = np.mgrid[0:h, 0:w]
    wave = np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / period
                  + rng.uniform(0.0, 2 * np.pi))
    background = rng.integers(0, 80, size=3).astype(np.float64)
    img = np.where((wave > 0)[..., None], colour, background)
    img += rng.normal(0.0, 18.0, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _save(rgb: np.ndarray, mode: str, path: Path, rng: np.random.Generator) -> None:
    """Encode ``rgb`` as ``mode`` to ``path`` (format from the extension)."""
    image = Image.fromarray(rgb, mode="RGB")
    h, w = rgb.shape[:2]
    alpha = Image.fromarray(np.linspace(255, 64, w, dtype=np.uint8)[None, :].repeat(h, 0))
    if mode in ("L", "CMYK"):
        image = image.convert(mode)
    elif mode in ("LA", "RGBA"):
        image = image.convert(mode[:-1])
        image.putalpha(alpha)
    elif mode == "P":
        image = image.quantize(colors=32)
    elif mode == "I;16":
        gray = np.asarray(image.convert("L"), dtype=np.uint16) * 256
        gray += rng.integers(0, 256, size=gray.shape, dtype=np.uint16)
        image = Image.fromarray(gray)
    if path.suffix.lower() == ".png":
        extra = {"transparency": 0} if mode == "P" else {}
        image.save(path, format="PNG", **extra)
    else:
        image.save(path, format="JPEG", quality=90)


def segmentation_sample(index: int, size: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Image ``index`` of the segmentation demo before encoding: ``H x W x 3`` RGB ``uint8``, and its ``H x W`` ``uint8`` mask.

    Mask values: 0 background, a shape's id (:data:`SHAPES`), :data:`IGNORE_INDEX` on the outline band of some shapes.
    """
    rng = np.random.default_rng((seed, index))
    low, high = size - size // 4, size + size // 4
    h, w = (int(v) for v in rng.integers(low, high + 1, size=2))
    yy, xx = np.mgrid[0:h, 0:w]
    base = rng.integers(0, 90, size=3).astype(np.float64)
    slope = rng.uniform(-20.0, 20.0, size=(2, 3))
    image = base + (yy / h)[..., None] * slope[0] + (xx / w)[..., None] * slope[1]
    mask = np.zeros((h, w), dtype=np.uint8)
    cells = [(top, left) for top in (0, h // 2) for left in (0, w // 2)]
    chosen = [cell for cell in cells if rng.random() < 0.6] or [cells[int(rng.integers(len(cells)))]]
    for top, left in chosen:
        cell_h, cell_w = h // 2, w // 2
        room = min(cell_h, cell_w) - 4  # 2 pixels of margin each side: the band and a gap to the next cell's shape
        side = int(rng.integers(max(_MIN_SHAPE, room // 2), room + 1))
        y = top + 2 + int(rng.integers(0, cell_h - 4 - side + 1))
        x = left + 2 + int(rng.integers(0, cell_w - 4 - side + 1))
        shape = int(rng.integers(1, len(SHAPES) + 1))
        region = np.zeros((h, w), dtype=bool)
        region[y:y + side, x:x + side] = _shape(SHAPES[shape - 1], side)
        colours = SHAPE_COLOURS[shape - 1]
        image[region] = colours[int(rng.integers(len(colours)))]
        mask[region] = shape
        if rng.random() < 0.5:  # Pascal VOC-like: the outline is not labelled
            mask[_grow(region) & ~_shrink(region)] = IGNORE_INDEX
    image += rng.normal(0.0, _SEG_NOISE, size=image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), mask


def _shape(name: str, side: int) -> np.ndarray:
    """A filled ``side x side`` shape, sampled at the pixel centres: a disc, a square, or a triangle pointing up."""
    y, x = np.mgrid[0:side, 0:side] + 0.5
    centre = side / 2
    if name == "circle":
        return (x - centre) ** 2 + (y - centre) ** 2 <= centre**2
    if name == "square":
        return np.ones((side, side), dtype=bool)
    if name == "diamond":
        return np.abs(x - centre) + np.abs(y - centre) <= centre
    return np.abs(x - centre) <= y / 2  # apex at the top centre, base along the bottom row


def _grow(region: np.ndarray) -> np.ndarray:
    """``region`` with every pixel next to it (8-neighbourhood) added."""
    padded = np.pad(region, 1)
    h, w = region.shape
    return np.logical_or.reduce([padded[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)])


def _shrink(region: np.ndarray) -> np.ndarray:
    """``region`` without its pixels next to the outside (8-neighbourhood)."""
    return ~_grow(~region)


def detection_sample(index: int, size: int = 112, max_objects: int = 5,
                     seed: int = 0) -> tuple[np.ndarray, list[tuple[int, Box, int]]]:
    """Image ``index`` of the detection demo before encoding: ``H x W x 3`` RGB ``uint8``, and its objects as
    ``(class index, (x1, y1, x2, y2), area)``: the tight box of the shape's pixels (``x2``, ``y2`` exclusive) and their count."""
    rng = np.random.default_rng((seed, index, 7))
    low, high = size - size // 8, size + size // 8
    h, w = (int(v) for v in rng.integers(low, high + 1, size=2))
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.full((h, w, 3), float(rng.integers(70, 160)))
    for _ in range(3):  # low-frequency grey blotches
        cy, cx, radius = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(size / 6, size / 2)
        image += rng.uniform(-40, 40) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * radius**2))[..., None]
    angle, period = rng.uniform(0, np.pi), rng.uniform(5.0, 12.0)
    image += 12.0 * np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / period)[..., None]
    image += rng.uniform(-12, 12, size=3)  # a slight tint, still far from the shapes' colours
    wanted = 0 if rng.random() < 0.1 else int(rng.integers(1, max_objects + 1)) if max_objects else 0
    taken = np.zeros((h, w), dtype=bool)
    objects: list[tuple[int, Box, int]] = []
    for _ in range(wanted * 10):
        if len(objects) == wanted:
            break
        side = int(rng.integers(_DETECTION_SIDES[0], min(_DETECTION_SIDES[1], min(h, w) // 2) + 1))
        y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        if taken[max(0, y - 2):y + side + 2, max(0, x - 2):x + side + 2].any():
            continue
        label = int(rng.integers(len(DETECTION_CLASSES)))
        region = np.zeros((h, w), dtype=bool)
        region[y:y + side, x:x + side] = _shape(DETECTION_CLASSES[label], side)
        image[region] = DETECTION_COLOURS[label]
        taken[y:y + side, x:x + side] = True
        rows, cols = np.nonzero(region)
        objects.append((label, (int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1), len(rows)))
    image += rng.normal(0.0, 6.0, size=image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), objects


def _generate_detection(out: Path, count: int, size: int, max_objects: int, seed: int) -> None:
    (out / "images").mkdir()
    categories = [{"id": cid, "name": name, "supercategory": "shape"} for cid, name in zip(DETECTION_CATEGORY_IDS, DETECTION_CLASSES)]
    files: dict[str, dict[str, list[dict[str, object]]]] = {
        split: {"images": [], "annotations": [], "categories": categories} for split in DETECTION_ANNOTATIONS}
    annotation_id = 1
    for index in range(count):
        rgb, objects = detection_sample(index, size, max_objects, seed)
        name = f"images/det_{index:04d}.jpg"
        Image.fromarray(rgb).save(out / name, format="JPEG", quality=92)
        split = files["val" if index % 5 == 4 else "train"]
        image_id = index + 1
        split["images"].append({"id": image_id, "file_name": name, "height": rgb.shape[0], "width": rgb.shape[1]})
        for label, (x1, y1, x2, y2), area in objects:
            split["annotations"].append({"id": annotation_id, "image_id": image_id, "category_id": DETECTION_CATEGORY_IDS[label],
                                         "bbox": [x1, y1, x2 - x1, y2 - y1], "area": area, "iscrowd": 0})
            annotation_id += 1
    for split, file_name in DETECTION_ANNOTATIONS.items():
        (out / file_name).write_text(json.dumps(files[split], indent=1) + "\n", encoding="utf-8")


def _voc_palette() -> list[int]:
    """Pascal VOC's colour map (index 255, the ignore value, in cream), flattened for ``Image.putpalette``."""
    palette = []
    for index in range(256):
        r = g = b = 0
        value = index
        for bit in range(8):
            r |= ((value >> 0) & 1) << (7 - bit)
            g |= ((value >> 1) & 1) << (7 - bit)
            b |= ((value >> 2) & 1) << (7 - bit)
            value >>= 3
        palette += [r, g, b]
    palette[3 * 255:] = [224, 224, 192]
    return palette


def _generate_segmentation(out: Path, count: int, size: int, seed: int) -> None:
    (out / "images").mkdir()
    (out / "masks").mkdir()
    palette = _voc_palette()
    rows = []
    for index in range(count):
        rgb, values = segmentation_sample(index, size, seed)
        stem = f"seg_{index:04d}"
        image_name = f"images/{stem}{'.png' if index % 2 else '.jpg'}"
        if index % 2:
            Image.fromarray(rgb).save(out / image_name, format="PNG")
        else:
            Image.fromarray(rgb).save(out / image_name, format="JPEG", quality=90)
        if index % 3 == 2:  # a palette mask: its indices are the ids, its colours only for viewing
            mask = Image.frombytes("P", (values.shape[1], values.shape[0]), values.tobytes())
            mask.putpalette(palette)
        else:
            mask = Image.fromarray(values)  # mode L
        mask.save(out / "masks" / f"{stem}.png", format="PNG")
        rows.append({"path": image_name, "mask": f"masks/{stem}.png", "split": "val" if index % 5 == 4 else "train"})
    with open(out / SEGMENTATION_MANIFEST, "w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["path", "mask", "split"])
        writer.writeheader()
        writer.writerows(rows)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m lightning_lmdb.experiment.demo [--segmentation | --detection] ROOT``: write a demo there, print what to train on."""
    parser = argparse.ArgumentParser(prog="python -m lightning_lmdb.experiment.demo", description=main.__doc__)
    parser.add_argument("root", help="the dataset directory (created; reused when complete with the same arguments)")
    parser.add_argument("--segmentation", action="store_true", help="the segmentation demo; prints its manifest's path")
    parser.add_argument("--detection", action="store_true", help="the detection demo (COCO JSON per split); prints its root")
    parser.add_argument("--count", type=int, default=None, help="segmentation: image and mask pairs (default 200); detection: images "
                        "(default 300)")
    parser.add_argument("--size", type=int, default=None, help="typical image side in pixels (segmentation: default 64; detection: 112)")
    parser.add_argument("--num-classes", type=int, default=10, help="class folders (default 10)")
    parser.add_argument("--images-per-class", type=int, default=200, help="images per class folder (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.detection:
            made = make_detection_demo(args.root, count=300 if args.count is None else args.count,
                                       size=112 if args.size is None else args.size, seed=args.seed)
        elif args.segmentation:
            made = make_segmentation_demo(args.root, count=200 if args.count is None else args.count,
                                          size=64 if args.size is None else args.size, seed=args.seed)
        else:
            made = make_demo_dataset(args.root, num_classes=args.num_classes, images_per_class=args.images_per_class, seed=args.seed)
    except (OptionError, OSError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    print(made)


if __name__ == "__main__":
    main()
