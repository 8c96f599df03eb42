"""The folder source kind: scan a folder exactly like ``torchvision.datasets.ImageFolder``.

Two layouts are accepted:

* **ImageFolder layout** -- one subfolder per class. Classes, ``class_to_idx``, the file set and the
  sample order come from copies of torchvision's ``find_classes`` / ``make_dataset`` /
  ``IMG_EXTENSIONS`` (kept equal by a test; copied so a build imports no torch), so they equal ``ImageFolder``
  on the same folder.
* **Flat folder** -- images directly in the folder and no subfolders with images: samples without
  labels (``classes == []``, every target ``-1``).

The one difference from ImageFolder's file set: only regular files (and symbolic links to them) are
images. A FIFO, socket or device named like an image would block or never end when read; it is listed
apart (``SourceScan.special``) and never opened, and the builder refuses or skips it.

**Images with masks** (segmentation): with ``SourceOptions(masks_dir=...)`` the folder is a folder of images paired with
a folder of masks (:func:`scan_pairs`), not an ImageFolder: every image below it (any depth, named like an image), sorted by
relative path, and for each the mask in ``masks_dir`` whose relative path without its extension is the image's
(``images/a/1.jpg`` with ``masks/a/1.png``). The options ``ignore_index``, ``num_classes`` and ``classes`` apply then
(:mod:`lightning_lmdb.sources.masks`). Without ``masks_dir``, a folder holding ``images/`` and ``masks/`` is an ImageFolder of two classes.
On object storage the images and ``masks_dir`` are both prefixes (``masks_dir`` a full URL), paired the same way from one listing
of each (:func:`scan_prefix_pairs`); one local and the other a URL is refused.

**Given classes**: ``SourceOptions(classes=[...])`` maps an ImageFolder's class folders through that list instead of their
sorted names (``LMDBDataModule`` maps its val and test folders through the training folder's classes this way): every class
folder must be among them, and a class without a folder has no samples.
"""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path

from lightning_lmdb.errors import NotRegularFileError, OptionError, SourceError
from lightning_lmdb.remote import urls
from lightning_lmdb.remote.objects import RemoteObject
from lightning_lmdb.remote.urls import is_remote, redact
from lightning_lmdb.sources import masks, objectstore
from lightning_lmdb.sources.base import (
    NO_TARGET,
    Labels,
    ManifestOptions,  # noqa: F401 (re-exported under its old name, as before; constructing it warns)
    PrefixFingerprint,
    SourceFile,
    SourceOptions,
    SourceScan,
    describe_kind,
    not_regular_reason,
    read_file,
)

__all__ = ["DESCRIPTION", "NAME", "NO_TARGET", "NotRegularFileError", "PrefixFingerprint", "SourceFile", "SourceOptions", "SourceScan",
           "accepts", "classes", "has_samples", "labels", "read_file", "scan", "scan_folder", "scan_pairs", "scan_prefix_pairs"]

#: The options a folder paired with its masks takes (``masks_dir`` and how the mask values are read).
_MASK_OPTIONS = ("masks_dir", "ignore_index", "num_classes", "classes", "target_kind")
#: How many unmatched files an error names.
_SHOWN = 5


#: This source kind's name and what it accepts (:mod:`lightning_lmdb.sources.base`).
NAME = "folder"
DESCRIPTION = "an image folder (ImageFolder layout: one subfolder per class, or flat; or such a prefix of object storage, s3://bucket/train/)"


#: The file name endings ImageFolder accepts (``torchvision.datasets.folder.IMG_EXTENSIONS``), compared in lower case.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# find_classes, has_file_allowed_extension and make_dataset are torchvision's (``torchvision.datasets.folder``), copied
# rather than imported: importing torchvision imports torch, 1.5-3 s of every build's start-up (and all of a short resume's)
# spent before the first file is read. tests/test_build_cost.py checks they scan exactly as torchvision's own do.


def has_file_allowed_extension(filename: str, extensions: str | tuple[str, ...]) -> bool:
    """Whether ``filename`` ends with one of ``extensions`` (lower case), as torchvision's function of that name."""
    return filename.lower().endswith(extensions if isinstance(extensions, str) else tuple(extensions))


def find_classes(directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
    """The sorted class folders of ``directory`` and their indices, as torchvision's ``find_classes``.

    Raises:
        FileNotFoundError: ``directory`` has no subfolder.
    """
    found = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not found:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return found, {name: i for i, name in enumerate(found)}


def make_dataset(directory: str | os.PathLike[str], class_to_idx: dict[str, int], extensions: tuple[str, ...]) -> list[tuple[str, int]]:
    """``(path, class index)`` of every file named like an image in the class folders, in ImageFolder's order (torchvision's
    ``make_dataset`` with ``extensions``).

    Raises:
        ValueError: ``class_to_idx`` is empty.
        FileNotFoundError: A class folder without an image.
    """
    directory = os.path.expanduser(directory)
    if not class_to_idx:
        raise ValueError("'class_to_index' must have at least one entry to collect any samples.")
    instances = []
    available = set()
    for target_class in sorted(class_to_idx):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if has_file_allowed_extension(path, extensions):
                    instances.append((path, class_index))
                    available.add(target_class)
    empty = set(class_to_idx) - available
    if empty:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty))}. "
                                f"Supported extensions are: {', '.join(extensions)}")
    return instances


def accepts(source: object) -> bool:
    """Whether ``source`` is a folder (this source kind; see :mod:`lightning_lmdb.sources.base`), or a URL naming a prefix of object
    storage (not a manifest or annotation file: :func:`lightning_lmdb.sources.objectstore.is_prefix`; nothing is listed here)."""
    if is_remote(source):
        return objectstore.is_prefix(source)  # type: ignore[arg-type]
    return isinstance(source, Path) and source.is_dir()


def _no_options(folder: Path, options: SourceOptions | None) -> None:
    """A folder's labels are its class folders (or, with ``masks_dir``, its masks): refuse other options instead of ignoring them."""
    if options is None or options.is_default():
        return
    paired = options.masks_dir is not None
    allowed = _MASK_OPTIONS if paired else ("classes",)
    if paired and is_remote(folder) != is_remote(options.masks_dir):
        images, given_masks = redact(str(folder)), redact(str(options.masks_dir))
        raise SourceError(f"masks_dir={given_masks!r} is {'a local folder' if is_remote(folder) else 'a URL of object storage'}, but the "
                          f"images {images!r} are {'on object storage' if is_remote(folder) else 'a local folder'}: the images and "
                          "their masks must both be local folders or both be prefixes of object storage. Give masks_dir as "
                          f"{'a full URL (e.g. s3://bucket/data/masks/)' if is_remote(folder) else 'a local folder'}, or put the "
                          f"{'masks on object storage' if is_remote(folder) else 'images on object storage'} too.")
    given = ", ".join(f"{name}={value!r}" for name, value in options.as_dict().items() if name not in allowed)
    if given and paired:
        raise OptionError(f"{given}: these options read a manifest; {str(folder)!r} is an image folder paired with its masks "
                          f"(masks_dir=), which takes only {', '.join(_MASK_OPTIONS)}. Leave them unset.")
    if given:
        masked = any(getattr(options, name) is not None for name in ("ignore_index", "num_classes"))
        raise OptionError(f"{given}: these options read a manifest, but {redact(str(folder))!r} is an image folder (its labels are its "
                          f"class folders). Pass {describe_kind('manifest')} instead, or leave these options unset"
                          + (" (set masks_dir= to pair the folder with a folder of segmentation masks)." if masked else "."))


def scan(source: Path, options: SourceOptions | None = None) -> SourceScan:
    """The source-kind entry (:mod:`lightning_lmdb.sources.base`): :func:`scan_folder`, or :func:`scan_pairs` with ``masks_dir``."""
    _no_options(source, options)
    if options is not None and options.masks_dir is not None:
        return scan_pairs(source, options)
    if is_remote(source):
        return scan_prefix(source, None if options is None else options.classes)  # type: ignore[arg-type]
    return scan_folder(source, None if options is None else options.classes)


def labels(folder: Path, options: SourceOptions | None = None) -> Labels:
    """The classes and target kind: the class folders (``"class"``, or ``"none"`` for a flat folder), or with ``masks_dir``
    the mask classes known before a build (:func:`lightning_lmdb.sources.masks.mask_labels`)."""
    found, class_to_idx = classes(folder, options)
    if options is not None and options.masks_dir is not None:
        return masks.mask_labels(options)
    return Labels(found, class_to_idx, "class" if found else "none")


def has_samples(folder: Path, options: SourceOptions | None = None) -> bool:
    """Whether ``folder`` holds at least one file named like an image, anywhere below it; stops at the first one found.

    Cheap on a large folder (one listing of the folder and of its first class folder); a folder that
    :func:`scan_folder` accepts always has one.
    """
    if is_remote(folder):
        return has_images(folder)  # type: ignore[arg-type]
    return any(has_file_allowed_extension(name, IMG_EXTENSIONS) for _, _, files in os.walk(folder, followlinks=True) for name in files)


def classes(folder: Path, options: SourceOptions | None = None) -> tuple[list[str], dict[str, int]]:
    """The class folders, as ``ImageFolder`` finds them (none for a flat folder); one listing, no scan. With ``masks_dir``: the
    mask classes known before a build."""
    _no_options(folder, options)
    if options is not None and options.masks_dir is not None:
        found = masks.mask_labels(options)
        return found.classes, found.class_to_idx
    try:
        found, class_to_idx = (prefix_classes(folder), {}) if is_remote(folder) else find_classes(folder)  # type: ignore[arg-type]
        class_to_idx = class_to_idx or {name: k for k, name in enumerate(found)}
    except FileNotFoundError:  # a flat folder
        if is_remote(folder):
            raise
        found, class_to_idx = [], {}
    if options is not None and options.classes is not None:
        return _given_classes(folder, found, options.classes)
    return list(found), dict(class_to_idx)


def _given_classes(root: Path, found: list[str], given: tuple[str, ...] | list[str]) -> tuple[list[str], dict[str, int]]:
    """``given`` as the classes of ``root``, whose class folders are ``found``.

    Raises:
        SourceError: A class folder that is not among ``given``, or a flat folder (no class folders to map).
    """
    if not found:
        raise SourceError(f"classes={list(given)!r} names class folders, but {str(root)!r} has none (a flat folder): leave classes "
                          "unset, or put the images in one subfolder per class.")
    unknown = [name for name in found if name not in given]
    if unknown:
        raise SourceError(f"{str(root)!r} has the class folder(s) {', '.join(map(repr, unknown))}, which are not among the classes "
                          f"{list(given)!r}: add them to classes=, or move their images out.")
    return list(given), {name: k for k, name in enumerate(given)}


def scan_folder(source: str | os.PathLike[str], classes: tuple[str, ...] | list[str] | None = None) -> SourceScan:
    """Scan ``source`` as ImageFolder would (or as a flat folder of images).

    Args:
        source: The folder to scan.
        classes: The class names in index order (every class folder must be one); ``None``: the sorted class folders.

    Returns:
        The classes and the files in ImageFolder order.

    Raises:
        FileNotFoundError: ``source`` does not exist or is not a folder.
        ValueError: ``source`` holds no image with one of ``IMG_EXTENSIONS``, or a class folder that is not among ``classes``.
    """
    root = Path(source).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"Source folder {str(source)!r} does not exist or is not a folder. Pass the folder that holds your images.")
    try:
        found, class_to_idx = find_classes(root)
    except FileNotFoundError:
        found, class_to_idx = [], {}
    folders = dict(class_to_idx)  # the class folders, each with its target
    if classes is not None:
        classes, class_to_idx = _given_classes(root, found, classes)
        folders = {name: class_to_idx[name] for name in found}
    else:
        classes = found
    if classes:
        try:
            samples = make_dataset(root, folders, IMG_EXTENSIONS)
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


# --- a prefix of object storage (lightning_lmdb.sources.objectstore): the same layout, from one listing -------------------


def prefix_classes(url: str) -> list[str]:
    """The class prefixes under ``url``, sorted (ImageFolder's ``find_classes``); ``[]`` for a flat prefix. One listing."""
    root = objectstore.root_of(url)
    items = objectstore.relative_items(objectstore.listing(root), root)
    _refuse_other_layouts(root, items)
    return sorted({rel.split("/", 1)[0] for rel, _ in items if "/" in rel})


def _refuse_other_layouts(root: str, items: list[tuple[str, RemoteObject]]) -> None:
    """Refuse a prefix laid out as another source kind: a YOLO folder (``images/`` beside ``labels/``) or a Pascal VOC one
    (``Annotations/`` beside ``JPEGImages/``), which their own kinds read (this folder kind sees one only when it is asked
    for directly); or a Hugging Face folder holding ``metadata.csv`` / ``metadata.jsonl``, whose URL is the manifest to pass.
    Reading any of them as an ImageFolder would serve other samples."""
    from lightning_lmdb.sources.manifest import METADATA_NAMES

    heads = {rel.split("/", 1)[0] for rel, _ in items if "/" in rel}
    for kind, layout in (("yolo", {"images", "labels"}), ("voc", {"Annotations", "JPEGImages"})):
        if layout <= heads:
            raise SourceError(f"{redact(root)}/ is laid out as {describe_kind(kind)}, not as an image folder: scan it as that kind "
                              "(scan_source / build pick it for the prefix), not as an ImageFolder.")
    found = [rel for rel, _ in items if rel in METADATA_NAMES]
    if found:
        raise SourceError(f"{redact(root)}/ holds {found[0]}: a Hugging Face image folder (a prefix) is read through its metadata file: "
                          f"pass the file itself as the source ({redact(root)}/{found[0]}).")


def has_images(url: str) -> bool:
    """Whether the prefix holds an object named like an image (one listing)."""
    return any(has_file_allowed_extension(item.url, IMG_EXTENSIONS) for item in objectstore.listing(url))


def scan_prefix(url: str, classes: tuple[str, ...] | list[str] | None = None) -> SourceScan:
    """Scan the prefix ``url`` as ImageFolder scans a folder (:mod:`lightning_lmdb.sources.objectstore`): one listing.

    Args:
        url: The prefix (``s3://bucket/train/``).
        classes: The class names in index order (every class prefix must be one); ``None``: the sorted class prefixes.

    Raises:
        FileNotFoundError: Nothing under the prefix.
        RemoteNotFoundError: No such bucket.
        SourceError: No images, a class prefix without an image, or a class prefix not among ``classes``.
    """
    root = objectstore.root_of(url)
    shown = urls.redact(root)
    items = objectstore.relative_items(objectstore.listing(root), root)
    _refuse_other_layouts(root, items)
    found = sorted({rel.split("/", 1)[0] for rel, _ in items if "/" in rel})
    class_to_idx = {name: k for k, name in enumerate(found)}
    folders = dict(class_to_idx)
    if classes is not None:
        classes, class_to_idx = _given_classes(shown, found, classes)  # type: ignore[arg-type]
        folders = {name: class_to_idx[name] for name in found}
    else:
        classes = found
    picked: list[tuple[tuple[str, str], str, object, RemoteObject]] = []
    if classes:
        available = set()
        for rel, item in items:
            head, _, rest = rel.partition("/")
            if not rest or head not in folders or not has_file_allowed_extension(rel, IMG_EXTENSIONS):
                continue
            # sorted(os.walk()) then sorted file names: by the folder's path, then the name within it
            picked.append(((posixpath.dirname(rel), posixpath.basename(rel)), rel, folders[head], item))
            available.add(head)
        empty = set(folders) - available
        if empty:
            raise SourceError(f"Found no valid file for the classes {', '.join(sorted(empty))}. Supported extensions are: "
                              f"{', '.join(IMG_EXTENSIONS)} in {shown!r}. ImageFolder refuses such a folder too: add images to each "
                              "class prefix or remove the empty ones.")
        order = {name: k for k, name in enumerate(sorted(folders))}
        picked.sort(key=lambda entry: (order[entry[1].split("/", 1)[0]], entry[0]))
    else:
        picked = sorted(((("", rel), rel, NO_TARGET, item) for rel, item in items if has_file_allowed_extension(rel, IMG_EXTENSIONS)),
                        key=lambda entry: entry[0])
    if not picked:
        raise SourceError(f"No images found in {shown!r}: expected objects ending in {', '.join(IMG_EXTENSIONS)} either under one "
                          "prefix per class (ImageFolder layout) or directly under the prefix. Check the URL.")
    files = [SourceFile(path=item.url, relpath=rel, target=target, size=item.size, mtime_ns=0, etag=item.etag)  # type: ignore[arg-type]
             for _, rel, target, item in picked]
    return SourceScan(root=root, classes=list(classes), class_to_idx=dict(class_to_idx), files=files)  # type: ignore[arg-type]



def scan_pairs(source: str | os.PathLike[str], options: SourceOptions) -> masks.MaskScan:
    """Scan a folder of images paired with the folder of their masks, ``options.masks_dir`` (see the module docstring).

    Raises:
        FileNotFoundError: ``source`` does not exist or is not a folder.
        SourceError: ``masks_dir`` is not a folder, or one of the two folders holds the other; no images; images or masks
            without their pair, or several files of one folder with one name but for the extension (the first few named).
        OptionError: As :func:`lightning_lmdb.sources.masks.mask_scan`.
    """
    if is_remote(source):
        return scan_prefix_pairs(str(source), options)
    root = Path(source).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"Source folder {str(source)!r} does not exist or is not a folder. Pass the folder that holds your images.")
    masks_root = Path(str(options.masks_dir)).expanduser().resolve()
    if not masks_root.is_dir():
        raise SourceError(f"masks_dir={options.masks_dir!r} is not a folder ({str(masks_root)!r}); pass the folder that holds the masks "
                          f"of the images in {str(root)!r}.")
    if masks_root == root or masks_root.is_relative_to(root) or root.is_relative_to(masks_root):
        raise SourceError(f"The images folder {str(root)!r} and masks_dir {str(masks_root)!r} are one or hold each other: the masks would "
                          "be scanned as images. Keep them side by side, e.g. data/images and data/masks.")
    images, mask_files = _image_files(root), _image_files(masks_root)
    if not images:
        raise SourceError(f"No images found in {str(root)!r}: expected files ending in {', '.join(IMG_EXTENSIONS)} (at any depth). "
                          "Check the path.")
    by_stem = _paired(str(root), str(masks_root), images, mask_files)
    files, special = [], []
    for relpath in images:
        path, mask_rel = str(root / relpath), by_stem[_stem(relpath)]
        mask = str(masks_root / mask_rel)
        size, mtime, problem = _stat(path, "")
        mask_size, mask_mtime, mask_problem = _stat(mask, f"its mask {mask_rel!r} ")
        if problem or mask_problem:
            special.append((relpath, problem or mask_problem or ""))
            continue
        files.append(SourceFile(path, relpath, NO_TARGET, size, mtime, mask=mask, mask_size=mask_size, mask_mtime_ns=mask_mtime))
    return masks.mask_scan(root, files, special, options, {"masks_dir": str(masks_root)})


def _paired(root: str, masks_root: str, images: list[str], mask_files: list[str]) -> dict[str, str]:
    """Each mask's relative path by its stem, every image (relative paths ``images`` under ``root``) having one and every mask
    (``mask_files`` under ``masks_root``) an image; the two roots as errors name them.

    Raises:
        SourceError: Images or masks without their pair, or several files of one folder with one stem (the first few named).
    """
    by_stem = _by_stem(masks_root, mask_files)
    stems = _by_stem(root, images)
    alone = [rel for rel in images if _stem(rel) not in by_stem], [rel for rel in mask_files if _stem(rel) not in stems]
    if any(alone):
        said = [f"{len(found)} {what} ({_shown(found)})" for found, what in zip(alone, (f"image(s) in {root!r} without a mask in "
                f"{masks_root!r}", f"mask(s) in {masks_root!r} without an image in {root!r}"), strict=True) if found]
        raise SourceError(f"{'; '.join(said)}. An image's mask has its path relative to masks_dir without the extension (images/a/1.jpg "
                          "pairs with masks/a/1.png): add or rename the missing files, or remove the extra ones.")
    return by_stem


def scan_prefix_pairs(url: str, options: SourceOptions) -> masks.MaskScan:
    """Scan a prefix of images paired with the prefix of their masks, ``options.masks_dir`` (a URL), as :func:`scan_pairs` scans two
    folders: one listing of each prefix (every object's size and ETag, no request per object), paired by relative key without
    the extension.

    Raises:
        FileNotFoundError: Nothing under the images prefix.
        RemoteNotFoundError: No such bucket.
        SourceError: Nothing under the masks prefix, or one of the two prefixes holds the other; no images; images or masks
            without their pair, or several objects of one prefix with one name but for the extension (the first few named).
        OptionError: As :func:`lightning_lmdb.sources.masks.mask_scan`; ``masks_dir`` carries credentials (``s3://KEY:SECRET@...``).
    """
    urls.refuse_user_info(str(options.masks_dir), "masks_dir")  # it is stored with the database: never with credentials
    root, masks_root = objectstore.root_of(url), objectstore.root_of(str(options.masks_dir))
    shown, masks_shown = redact(root), redact(masks_root)
    if masks_root == root or masks_root.startswith(root + "/") or root.startswith(masks_root + "/"):
        raise SourceError(f"The images prefix {shown!r} and masks_dir {masks_shown!r} are one or hold each other: the masks would be "
                          "scanned as images. Keep them side by side, e.g. s3://bucket/data/images/ and s3://bucket/data/masks/.")
    images = {rel: item for rel, item in objectstore.relative_items(objectstore.listing(root), root)
              if has_file_allowed_extension(rel, IMG_EXTENSIONS)}
    try:
        listed_masks = objectstore.listing(masks_root)
    except FileNotFoundError:
        raise SourceError(f"masks_dir={masks_shown!r} holds no objects; pass the prefix that holds the masks of the images in "
                          f"{shown!r}.") from None
    mask_items = {rel: item for rel, item in objectstore.relative_items(listed_masks, masks_root)
                  if has_file_allowed_extension(rel, IMG_EXTENSIONS)}
    if not images:
        raise SourceError(f"No images found in {shown!r}: expected objects ending in {', '.join(IMG_EXTENSIONS)} (at any depth). "
                          "Check the URL.")
    by_stem = _paired(shown, masks_shown, sorted(images), sorted(mask_items))
    files = []
    for relpath in sorted(images):
        image, mask = images[relpath], mask_items[by_stem[_stem(relpath)]]
        files.append(SourceFile(image.url, relpath, NO_TARGET, image.size, 0, mask=mask.url, mask_size=mask.size, etag=image.etag,
                                mask_etag=mask.etag))
    return masks.mask_scan(root, files, [], options, {"masks_dir": masks_shown})  # type: ignore[arg-type]


def _image_files(folder: Path) -> list[str]:
    """The relative paths (``/`` separators) of every file named like an image below ``folder``, sorted."""
    found = []
    for parent, _, names in os.walk(folder, followlinks=True):
        prefix = Path(parent).relative_to(folder).as_posix()
        found += [name if prefix == "." else f"{prefix}/{name}" for name in names if has_file_allowed_extension(name, IMG_EXTENSIONS)]
    return sorted(found)


def _stem(relpath: str) -> str:
    return os.path.splitext(relpath)[0]


def _by_stem(folder: Path | str, relpaths: list[str]) -> dict[str, str]:
    """Each relative path by its stem (the path without its extension).

    Raises:
        SourceError: Several files with one stem (``a/1.png`` and ``a/1.bmp``): which is whose pair is unclear.
    """
    found: dict[str, list[str]] = {}
    for relpath in relpaths:
        found.setdefault(_stem(relpath), []).append(relpath)
    twice = [names for names in found.values() if len(names) > 1]
    if twice:
        shown = "; ".join(" and ".join(names) for names in twice[:_SHOWN]) + (" ..." if len(twice) > _SHOWN else "")
        raise SourceError(f"{str(folder)!r} holds files with one name but for the extension ({shown}): an image and its mask are paired "
                          "by the name without the extension, so which pair they belong to is unclear. Rename or remove one of each.")
    return {stem: names[0] for stem, names in found.items()}


def _shown(relpaths: list[str]) -> str:
    return ", ".join(relpaths[:_SHOWN]) + (f", ... ({len(relpaths)} in all)" if len(relpaths) > _SHOWN else "")


def _stat(path: str, what: str) -> tuple[int, int, str | None]:
    """``(size, mtime_ns, None)`` of a file (``0, 0`` when unreadable, e.g. a dangling link: the build reports it), or
    ``(0, 0, reason)`` for a FIFO, socket, device or folder (``what`` starts the reason)."""
    try:
        st = os.stat(path)
    except OSError:
        return 0, 0, None
    return st.st_size, st.st_mtime_ns, (None if stat.S_ISREG(st.st_mode) else f"{what}{not_regular_reason(st.st_mode)}")
