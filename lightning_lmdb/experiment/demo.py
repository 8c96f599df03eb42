"""Deterministic demo image folder that exercises the traps real folders hold.

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
"""

from __future__ import annotations

import colorsys
import json
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from lightning_lmdb.errors import OptionError

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
    if _is_complete(root, params):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(root)
    tmp = root.with_name(f".{root.name}{_PARTIAL}{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _generate(tmp, num_classes, images_per_class, seed)
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


def _is_complete(root: Path, params: dict[str, int]) -> bool:
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
