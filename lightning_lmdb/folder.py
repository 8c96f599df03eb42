"""The folder source kind: scan a folder exactly like ``torchvision.datasets.ImageFolder``.

Two layouts are accepted:

* **ImageFolder layout** -- one subfolder per class. Classes, ``class_to_idx``, the file set and the
  sample order come from torchvision's own ``find_classes`` / ``make_dataset`` /
  ``IMG_EXTENSIONS``, so they equal ``ImageFolder`` on the same folder.
* **Flat folder** -- images directly in the folder and no subfolders with images: samples without
  labels (``classes == []``, every target ``-1``).

The one difference from ImageFolder's file set: only regular files (and symbolic links to them) are
images. A FIFO, socket or device named like an image would block or never end when read; it is listed
apart (``SourceScan.special``) and never opened, and the builder refuses or skips it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, has_file_allowed_extension, make_dataset

from lightning_lmdb.errors import NotRegularFileError, OptionError, SourceError
from lightning_lmdb.sources import NO_TARGET, ManifestOptions, PrefixFingerprint, SourceFile, SourceScan, not_regular_reason, read_file

__all__ = ["NO_TARGET", "NotRegularFileError", "PrefixFingerprint", "SourceFile", "ManifestOptions", "SourceScan", "accepts", "classes",
           "has_samples", "read_file", "scan", "scan_folder"]


def accepts(source: object) -> bool:
    """Whether ``source`` is a folder (this source kind; see :mod:`lightning_lmdb.sources`)."""
    return isinstance(source, Path) and source.is_dir()


def _no_options(folder: Path, options: ManifestOptions | None) -> None:
    """A folder's labels are its class folders: refuse manifest options instead of ignoring them."""
    if options is not None and not options.is_default():
        given = ", ".join(f"{name}={value!r}" for name, value in options.as_dict().items())
        raise OptionError(f"{given}: these options read a manifest, but {str(folder)!r} is an image folder (its labels are its class "
                          "folders). Pass a manifest (.csv, .tsv, .jsonl) instead, or leave these options unset.")


def scan(source: Path, options: ManifestOptions | None = None) -> SourceScan:
    """The source-kind entry (:mod:`lightning_lmdb.sources`): :func:`scan_folder`."""
    _no_options(source, options)
    return scan_folder(source)


def has_samples(folder: Path, options: ManifestOptions | None = None) -> bool:
    """Whether ``folder`` holds at least one file named like an image, anywhere below it; stops at the first one found.

    Cheap on a large folder (one listing of the folder and of its first class folder); a folder that
    :func:`scan_folder` accepts always has one.
    """
    return any(has_file_allowed_extension(name, IMG_EXTENSIONS) for _, _, files in os.walk(folder, followlinks=True) for name in files)


def classes(folder: Path, options: ManifestOptions | None = None) -> tuple[list[str], dict[str, int]]:
    """The class folders, as ``ImageFolder`` finds them (none for a flat folder); one listing, no scan."""
    _no_options(folder, options)
    try:
        found, class_to_idx = find_classes(folder)
    except FileNotFoundError:  # a flat folder
        return [], {}
    return list(found), dict(class_to_idx)


def scan_folder(source: str | os.PathLike[str]) -> SourceScan:
    """Scan ``source`` as ImageFolder would (or as a flat folder of images).

    Args:
        source: The folder to scan.

    Returns:
        The classes and the files in ImageFolder order.

    Raises:
        FileNotFoundError: ``source`` does not exist or is not a folder.
        ValueError: ``source`` holds no image with one of ``IMG_EXTENSIONS``.
    """
    root = Path(source).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"Source folder {str(source)!r} does not exist or is not a folder. Pass the folder that holds your images.")
    try:
        classes, class_to_idx = find_classes(root)
    except FileNotFoundError:
        classes, class_to_idx = [], {}
    if classes:
        try:
            samples = make_dataset(root, class_to_idx, IMG_EXTENSIONS)
        except FileNotFoundError as exc:
            raise SourceError(
                f"{exc} in {str(root)!r}. ImageFolder refuses such a folder too: add images to each class folder "
                "or remove the empty ones."
            ) from exc
    else:
        samples = sorted(
            (entry.path, NO_TARGET)
            for entry in os.scandir(root)
            # Not is_file(): like make_dataset's os.walk, keep FIFOs, devices and dangling links, reported below.
            if not entry.is_dir() and has_file_allowed_extension(entry.name, IMG_EXTENSIONS)
        )
    if not samples:
        raise SourceError(
            f"No images found in {str(root)!r}: expected files ending in {', '.join(IMG_EXTENSIONS)} either in one "
            "subfolder per class (ImageFolder layout) or directly in the folder. Check the path."
        )
    files, special = [], []
    for path, target in samples:
        relpath = Path(path).relative_to(root).as_posix()
        try:
            st = os.stat(path)
            size, mtime_ns = st.st_size, st.st_mtime_ns
        except OSError:  # e.g. a dangling symlink: the builder reports it when it fails to read it
            size, mtime_ns = 0, 0
        else:
            if not stat.S_ISREG(st.st_mode):
                special.append((relpath, not_regular_reason(st.st_mode)))
                continue
        files.append(SourceFile(path=path, relpath=relpath, target=target, size=size, mtime_ns=mtime_ns))
    return SourceScan(root=root, classes=list(classes), class_to_idx=dict(class_to_idx), files=files, special=special)


