"""The YOLO source kind: ``images/...`` beside ``labels/...``, one ``.txt`` per image with lines ``class cx cy w h``.

**Recognised**: a folder holding both ``images/`` and ``labels/`` folders, or a ``.yaml`` / ``.yml`` file with a ``names:`` key
(Ultralytics' ``data.yaml``).

**Layout** (Ultralytics'): an image's label file has its path with the last ``images`` folder replaced by ``labels`` and the
extension by ``.txt`` (``images/train/a.jpg``: ``labels/train/a.txt``). Each line is ``class cx cy w h``: a class index and
the box's centre and size, normalised to 0-1 by the image's width and height, which are read from the image's header and
used once to convert the box to ``XYXY`` pixels. Blank lines are ignored. An image without a label file, or with an empty
one, has no boxes (a negative). Polygon (segment) lines are out of scope.

**Class names**: ``names:`` of the ``data.yaml`` (a list, or a ``{index: name}`` mapping), else a ``classes.txt`` (one name a
line) in the folder or in ``labels/``; neither is an error. The YAML is read by a small parser of its top-level keys
``path``, ``train``, ``val``, ``test`` and ``names`` (scalars, ``[...]`` / ``{...}`` flow collections, and indented ``- item``
or ``index: name`` blocks); anchors, tags and multi-line strings are not read.

**Splits**: the ``data.yaml``'s ``train:`` / ``val:`` / ``test:`` (folders of images relative to its ``path:``, itself
relative to the YAML's folder; default: the YAML's folder) put each image in the split ``train`` / ``val`` / ``test``. Given a
folder, its ``data.yaml`` (or ``dataset.yaml``) is read when present; without split keys, every image under ``images/`` is a
sample without a split. A split given as a list or a ``.txt`` of paths is refused (give folders).

**Bad input**, each naming the label file and the line: a line without 5 fields, a field that is not a number, a
coordinate outside 0-1, a class index beyond the names, a box past its image's edge by more than a pixel
(:mod:`lightning_lmdb.sources.boxcheck`); a missing or unreadable image -- ``SourceScan.special`` entries. A ``labels/``
folder whose label files match no image (a typo would make every image a negative) raises
:class:`~lightning_lmdb.errors.SourceError`; label files that match no image while others do are counted
(``target_meta["unmatched_labels"]``).

**On object storage** (:mod:`lightning_lmdb.sources.objectstore`): a prefix holding ``images/`` and ``labels/``, or a data.yaml's
URL, is read as the same layout from one listing; the label files are fetched concurrently.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_lmdb.errors import SourceError
from lightning_lmdb.remote import urls
from lightning_lmdb.remote.objects import RemoteObject
from lightning_lmdb.remote.urls import is_remote
from lightning_lmdb.sources import boxcheck
from lightning_lmdb.sources.base import Labels, SourceFile, SourceOptions, SourceScan
from lightning_lmdb.targets.boxes import Boxes

__all__ = ["DESCRIPTION", "NAME", "accepts", "classes", "has_samples", "labels", "parse_yaml", "scan"]

NAME = "yolo"
DESCRIPTION = "a YOLO folder (images/ beside labels/ with one .txt per image; names in data.yaml or classes.txt) or its data.yaml"
_YAML_NAMES = ("data.yaml", "dataset.yaml")
_SPLITS = ("train", "val", "test")
_SLACK = 1e-6


def accepts(source: object) -> bool:
    """Whether ``source`` is a folder holding ``images/`` and ``labels/``, or a YAML file with a ``names:`` key; on object
    storage, a ``.yaml`` / ``.yml`` object (by its name), or a prefix holding ``images/`` and ``labels/`` (one delimited listing)."""
    if is_remote(source):
        from lightning_lmdb.sources import objectstore

        if urls.name(source).lower().endswith((".yaml", ".yml")) and not source.endswith("/"):  # type: ignore[attr-defined]
            return True
        return objectstore.is_prefix(source) and {"images", "labels"} <= objectstore.heads(source)  # type: ignore[arg-type]
    if not isinstance(source, Path):
        return False
    if source.is_dir():
        return (source / "images").is_dir() and (source / "labels").is_dir()
    if source.suffix.lower() not in (".yaml", ".yml") or not source.is_file():
        return False
    try:
        with open(source, encoding="utf-8", errors="replace") as handle:
            head = handle.read(1 << 16)
    except OSError:
        return False
    return re.search(r"^names\s*:", head, re.MULTILINE) is not None


# --- the minimal YAML reader -----------------------------------------------------------------------------------------------


def _uncomment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _scalar(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if re.fullmatch(r"[-+]?[0-9]+", text):
        return int(text)
    return None if text in ("", "~", "null") else text


def _split_flow(text: str) -> list[str]:
    parts, quote, depth, start = [], None, 0, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def _pair(text: str) -> tuple[Any, Any]:
    key, sep, value = text.partition(":")
    if not sep:
        raise ValueError(f"{text!r} is not 'key: value'")
    return _scalar(key), _scalar(value)


def _value(text: str) -> Any:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(part) for part in _split_flow(text[1:-1])]
    if text.startswith("{") and text.endswith("}"):
        return dict(_pair(part) for part in _split_flow(text[1:-1]))
    return _scalar(text)


def parse_yaml(text: str, where: str = "the YAML") -> dict[str, Any]:
    """The top-level keys of a ``data.yaml`` (see the module docstring for what is read).

    Raises:
        SourceError: A line this reader cannot place (named).
    """
    found: dict[str, Any] = {}
    key: str | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = _uncomment(raw)
        if not line.strip() or line.strip() in ("---", "..."):
            continue
        try:
            unindented_item = line.startswith("-") and key is not None and isinstance(found[key], (list, type(None)))
            if not line[0].isspace() and not unindented_item:
                name, sep, rest = line.partition(":")
                if not sep:
                    raise ValueError("expected 'key: value'")
                key = name.strip().strip("'\"")
                found[key] = _value(rest) if rest.strip() else None
            elif key is not None:
                item = line.strip()
                if item.startswith("-"):
                    found[key] = (found[key] if isinstance(found[key], list) else []) + [_value(item[1:])]
                else:
                    k, v = _pair(item)
                    found[key] = {**(found[key] if isinstance(found[key], dict) else {}), k: v}
            else:
                raise ValueError("an indented line before any key")
        except ValueError as exc:
            raise SourceError(f"{where} line {number} ({raw.strip()!r}) cannot be read: {exc}. Write data.yaml's keys as "
                              "'key: value', names as a list or an 'index: name' block.") from None
    return found


# --- the dataset -----------------------------------------------------------------------------------------------------------


def _layout(source: Path) -> tuple[Path, Path | None, dict[str, Any]]:
    """``(dataset root, its YAML or None, the YAML's keys)``."""
    source = source.expanduser().resolve()
    if source.is_dir():
        yaml = next((source / name for name in _YAML_NAMES if (source / name).is_file()), None)
    else:
        yaml = source
    if yaml is None:
        return source, None, {}
    try:
        text = yaml.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise SourceError(f"{str(yaml)!r} is not UTF-8 text; save it as UTF-8.") from None
    keys = parse_yaml(text, repr(str(yaml)))
    if source.is_dir():
        return source, yaml, keys
    base = keys.get("path")
    if base is not None and not isinstance(base, str):
        raise SourceError(f"{str(yaml)!r}: path: {base!r} is not a folder name.")
    root = (yaml.parent / base).resolve() if base else yaml.parent
    if not root.is_dir():
        raise SourceError(f"{str(yaml)!r}: its dataset folder {str(root)!r} (path: {base!r}) does not exist; fix path:.")
    return root, yaml, keys


def _names(root: Path, yaml: Path | None, keys: dict[str, Any], shown: str | None = None) -> tuple[list[str], bytes]:
    """The class names in index order, and the bytes they were read from (``shown``: the YAML as errors name it)."""
    names = keys.get("names")
    if names is not None:
        where = repr(shown or str(yaml))
        if isinstance(names, dict):
            if sorted(names) != list(range(len(names))):
                raise SourceError(f"{where}: names: has the indices {sorted(names, key=str)}; a mapping of names gives every index "
                                  "0, 1, 2, ... its name.")
            names = [names[k] for k in range(len(names))]
        if not isinstance(names, list) or not all(isinstance(n, (str, int)) and n != "" for n in names) or not names:
            raise SourceError(f"{where}: names: {names!r} is not a list of class names (or an 'index: name' mapping).")
        names = [str(n) for n in names]
        raw = json.dumps(names).encode()
    else:
        listed = next((p for p in (root / "classes.txt", root / "labels" / "classes.txt") if p.is_file()), None)
        if listed is None:
            raise SourceError(f"{str(root)!r} names no classes: a YOLO dataset gives its class names in a data.yaml (names: [...]) "
                              "or in a classes.txt (one name a line, in index order). Add one.")
        raw = listed.read_bytes()
        names = [line.strip() for line in raw.decode("utf-8-sig", errors="replace").splitlines() if line.strip()]
        if not names:
            raise SourceError(f"{str(listed)!r} is empty: list the class names, one a line, in index order.")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SourceError(f"{shown or str(yaml or root)!r}: the class name(s) {twice} are given to several indices; give each class its "
                          "own name.")
    return names, raw


def _split_folders(root: Path, yaml: Path | None, keys: dict[str, Any]) -> list[tuple[str, Path]]:
    found = []
    for split in _SPLITS:
        value = keys.get(split)
        if value is None:
            continue
        if not isinstance(value, str) or value.lower().endswith(".txt"):
            raise SourceError(f"{str(yaml)!r}: {split}: {value!r} is not a folder of images; this reader takes one folder per split "
                              "(e.g. images/train), not lists or .txt files of paths.")
        folder = (root / value).resolve()
        if not folder.is_dir():
            raise SourceError(f"{str(yaml)!r}: {split}: {value!r} is not a folder ({str(folder)!r}); fix it (relative to {str(root)!r}).")
        found.append((split, folder))
    for (a, fa), (b, fb) in ((x, y) for i, x in enumerate(found) for y in found[i + 1:]):
        if fa == fb or fa.is_relative_to(fb) or fb.is_relative_to(fa):
            raise SourceError(f"{str(yaml)!r}: {a}: and {b}: name one folder (or one holds the other), so an image would be in two "
                              "splits; give each split its own folder.")
    if not found:
        images = root / "images"
        if not images.is_dir():
            raise SourceError(f"{str(root)!r} has no images/ folder and {str(yaml)!r} names no train: / val: folders; fix the layout.")
        found.append(("", images))
    return found


def _images(folder: Path) -> list[Path]:
    found = []
    for parent, _, names in os.walk(folder, followlinks=True):
        found += [Path(parent) / n for n in names if n.lower().endswith(boxcheck.IMG_SUFFIXES)]
    return sorted(found)


def _label_path(image: Path) -> Path | None:
    parts = image.parts
    at = max((i for i, p in enumerate(parts[:-1]) if p == "images"), default=None)
    if at is None:
        return None
    return Path(*parts[:at], "labels", *parts[at + 1:]).with_suffix(".txt")


def labels(source: Path, options: SourceOptions | None = None) -> Labels:
    """The classes (the names, or ``classes=``) and the target kind ``"boxes"``; no label file or image is read."""
    options = boxcheck.check_options(NAME, source, options)
    if is_remote(source):
        remote = _remote_layout(str(source))
        found, _ = boxcheck.given_classes(_remote_names(remote)[0], options, repr(urls.redact(remote.yaml or remote.root)))
        return Labels(found, {c: k for k, c in enumerate(found)}, "boxes")
    root, yaml, keys = _layout(source)
    found, _ = boxcheck.given_classes(_names(root, yaml, keys)[0], options, repr(str(yaml or root)))
    return Labels(found, {c: k for k, c in enumerate(found)}, "boxes")


def classes(source: Path, options: SourceOptions | None = None) -> tuple[list[str], dict[str, int]]:
    """The classes and ``class_to_idx`` (:func:`labels`)."""
    found = labels(source, options)
    return found.classes, found.class_to_idx


def has_samples(source: Path, options: SourceOptions | None = None) -> bool:
    """Whether a split folder (or ``images/``) holds at least one file named like an image."""
    if is_remote(source):
        remote = _remote_layout(str(source))
        return any(_remote_images(remote, folder) for _, folder in _remote_splits(remote))
    root, yaml, keys = _layout(source)
    return any(any(n.lower().endswith(boxcheck.IMG_SUFFIXES) for _, _, names in os.walk(folder, followlinks=True) for n in names)
               for _, folder in _split_folders(root, yaml, keys))


def scan(source: Path, options: SourceOptions | None = None) -> SourceScan:
    """Scan a YOLO dataset: every image of its split folders, its label file, its header (see the module docstring).

    Raises:
        SourceError: No class names, a bad data.yaml, no images, or a labels folder that matches no image.
        OptionError: An option a YOLO source does not take.
    """
    options = boxcheck.check_options(NAME, source, options)
    if is_remote(source):
        return _scan_remote(str(source), options)
    root, yaml, keys = _layout(source)
    names, names_raw = _names(root, yaml, keys)
    splits = _split_folders(root, yaml, keys)
    images = [(split, str(image)) for split, folder in splits for image in _images(folder)]
    if not images:
        raise SourceError(f"No images found in {str(root)!r}'s image folders: expected files ending in {', '.join(boxcheck.IMG_SUFFIXES)}.")
    label_dirs = {root / "labels"} | {p.parent for p in (_label_path(folder / "x") for _, folder in splits) if p}
    label_files = {str(p) for d in label_dirs if d.is_dir() for p in d.rglob("*.txt") if p.name != "classes.txt"}

    def label_of(image: str) -> str | None:
        label = _label_path(Path(image))
        return None if label is None else str(label)

    def read_label(label: str) -> bytes | None:
        return Path(label).read_bytes() if os.path.isfile(label) else None

    return _scan_images(root, str(root), str(yaml or root), names, names_raw, options, images, lambda path: _rel(Path(path), root),
                        label_of, read_label, boxcheck.Images(), label_files)


def _scan_images(root: Path | str, shown: str, named: str, names: list[str], names_raw: bytes, options: SourceOptions,
                 images: list[tuple[str, str]], relative: Callable[[str], str], label_of: Callable[[str], str | None],
                 read_label: Callable[[str], bytes | None], found: boxcheck.Images, label_files: set[str]) -> SourceScan:
    """The scan of a YOLO dataset, local or under a prefix (:func:`scan` and :func:`_scan_remote` give it what differs).

    Args:
        root: The dataset's root (a folder, or a URL without its trailing ``/``).
        shown: How errors name the root (a URL redacted).
        named: The data.yaml, or the root: the scan's identity (and, redacted, how a class error names the dataset).
        names: The class names; ``names_raw``: their bytes (in the digest).
        names_raw: See ``names``.
        options: The source options.
        images: ``(split, path)`` of every image, in order.
        relative: A path's name relative to the root.
        label_of: An image's label file path, or ``None`` when the image is in no ``images`` folder.
        read_label: A label file's bytes, or ``None`` when there is none.
        found: The images' sizes and headers.
        label_files: Every label file of the dataset (those no image claims are counted as unmatched).
    """
    classes_, index = boxcheck.given_classes(names, options, repr(urls.redact(named)))
    tally = boxcheck.BoxTally(clip=bool(options.clip_boxes))
    files: list[SourceFile] = []
    special: list[tuple[str, str]] = []
    used: set[str] = set()
    raws: list[bytes] = [names_raw]
    for split, image in images:
        relpath = relative(image)
        label = label_of(image)
        if label is None:
            special.append((relpath, f"{relpath!r} is in no 'images' folder, so its label file cannot be found; put the images under "
                                     "images/ and their labels under labels/"))
            continue
        size, mtime, problem = found.stat(image)
        if problem is None:
            try:
                width, height, orientation = found.header(image)
            except OSError as exc:
                problem = f"{relpath!r} {exc}"
        origin = ""
        target: Boxes | None = Boxes(image_size=(height, width)) if problem is None else None
        raw = read_label(label) if problem is None else None
        if raw is not None:
            used.add(label)
            origin = relative(label)
            raws.append(origin.encode() + b"\0" + raw)
            target, problem = _parse(raw, origin, width, height, len(names), index, tally)
        if problem is not None:
            special.append((relpath, problem))
            continue
        tally.orientation(relpath, orientation)
        files.append(SourceFile(image, relpath, target, size, mtime, split, origin, etag=found.etag(image)))  # type: ignore[arg-type]
    unmatched = len(label_files - used)
    if label_files and not used:
        listed = ", ".join(relative(p) for p in sorted(label_files)[:3])
        raise SourceError(f"None of the {len(label_files)} label files under {shown!r} ({listed}, ...) belongs to an image: an image "
                          "images/<dir>/<name>.<ext> has its label at labels/<dir>/<name>.txt. Fix the folder or file names (a typo "
                          "would make every image one without boxes).")
    identity = json.dumps({"yolo": named, "digest": boxcheck.digest(raws), "classes": classes_,
                           "clip": bool(options.clip_boxes)}, sort_keys=True, ensure_ascii=False)
    return SourceScan(root=root, classes=classes_, class_to_idx={c: k for k, c in enumerate(classes_)}, files=files,  # type: ignore[arg-type]
                      special=special, target_kind="boxes", identity=identity,
                      target_meta=tally.meta(format="yolo", unmatched_labels=unmatched))

# --- under a prefix of object storage (lightning_lmdb.sources.objectstore): the same layout, from one listing ---------------


@dataclass
class _Remote:
    root: str  # the dataset's prefix, no trailing "/"
    yaml: str | None
    keys: dict[str, Any]
    listed: dict[str, RemoteObject]  # every object under root, by URL


def _remote_layout(source: str) -> _Remote:
    """The dataset prefix of ``source`` (a prefix, or a data.yaml's URL), its YAML and keys, and one listing of the prefix."""
    from lightning_lmdb.remote import objects
    from lightning_lmdb.sources import objectstore

    is_yaml = not objectstore.is_prefix(source)
    root = urls.parent(source) if is_yaml else objectstore.root_of(source)
    listed = {item.url: item for item in objectstore.listing(root)} if not is_yaml else {}
    yaml = source if is_yaml else next((urls.join(root, n) for n in _YAML_NAMES if urls.join(root, n) in listed), None)
    if yaml is None:
        return _Remote(root, None, {}, listed)
    raw = objects.read(yaml, etag=listed[yaml].etag if yaml in listed else None)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SourceError(f"{urls.redact(yaml)!r} is not UTF-8 text; save it as UTF-8.") from None
    keys = parse_yaml(text, repr(urls.redact(yaml)))
    if is_yaml:
        base = keys.get("path")
        if base is not None and not isinstance(base, str):
            raise SourceError(f"{urls.redact(yaml)!r}: path: {base!r} is not a folder name.")
        root = objectstore.resolve(root, base) if base else root
        listed = {item.url: item for item in objectstore.listing(root)}
    return _Remote(root, yaml, keys, listed)


def _remote_names(remote: _Remote) -> tuple[list[str], bytes]:
    """:func:`_names` of a dataset under a prefix (a classes.txt read with one GET)."""
    from lightning_lmdb.remote import objects

    if remote.keys.get("names") is not None:
        return _names(Path(), None, remote.keys, urls.redact(remote.yaml or remote.root))
    listed = next((u for u in (urls.join(remote.root, "classes.txt"), urls.join(remote.root, "labels", "classes.txt"))
                   if u in remote.listed), None)
    if listed is None:
        raise SourceError(f"{urls.redact(remote.root)!r} names no classes: a YOLO dataset gives its class names in a data.yaml (names: "
                          "[...]) or in a classes.txt (one name a line, in index order). Add one.")
    raw = objects.read(listed, etag=remote.listed[listed].etag or None)
    names = [line.strip() for line in raw.decode("utf-8-sig", errors="replace").splitlines() if line.strip()]
    if not names:
        raise SourceError(f"{urls.redact(listed)!r} is empty: list the class names, one a line, in index order.")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SourceError(f"{urls.redact(listed)!r}: the class name(s) {twice} are given to several indices; give each class its own name.")
    return names, raw


def _remote_splits(remote: _Remote) -> list[tuple[str, str]]:
    """:func:`_split_folders` under a prefix: a "folder" is a prefix holding objects of the listing."""
    from lightning_lmdb.sources import objectstore

    shown = repr(urls.redact(remote.yaml or remote.root))
    found = []
    for split in _SPLITS:
        value = remote.keys.get(split)
        if value is None:
            continue
        if not isinstance(value, str) or value.lower().endswith(".txt"):
            raise SourceError(f"{shown}: {split}: {value!r} is not a folder of images; this reader takes one folder per split "
                              "(e.g. images/train), not lists or .txt files of paths.")
        folder = objectstore.resolve(remote.root, value)
        if not objectstore.under(remote.listed, folder):
            raise SourceError(f"{shown}: {split}: {value!r} is not a folder ({urls.redact(folder)!r}: no objects under it); fix it "
                              f"(relative to {urls.redact(remote.root)!r}).")
        found.append((split, folder))
    for (a, fa), (b, fb) in ((x, y) for i, x in enumerate(found) for y in found[i + 1:]):
        if fa == fb or fa.startswith(fb + "/") or fb.startswith(fa + "/"):
            raise SourceError(f"{shown}: {a}: and {b}: name one folder (or one holds the other), so an image would be in two "
                              "splits; give each split its own folder.")
    if not found:
        images = urls.join(remote.root, "images")
        if not objectstore.under(remote.listed, images):
            raise SourceError(f"{urls.redact(remote.root)!r} has no images/ prefix and {shown} names no train: / val: folders; fix "
                              "the layout.")
        found.append(("", images))
    return found


def _remote_images(remote: _Remote, folder: str) -> list[str]:
    """The URLs of the images under ``folder``, in the order :func:`_images` gives a folder's (by path component)."""
    from lightning_lmdb.sources import objectstore

    found = [url for url in objectstore.under(remote.listed, folder) if url.lower().endswith(boxcheck.IMG_SUFFIXES)]
    return sorted(found, key=lambda url: url.split("/"))


def _remote_label(url: str) -> str | None:
    scheme_bucket, _, key = url.partition("://")[2].partition("/")
    label = _label_path(Path("/", *key.split("/")))
    return None if label is None else f"{urls.scheme(url)}://{scheme_bucket}{label.as_posix()}"


def _scan_remote(source: str, options: SourceOptions) -> SourceScan:
    """:func:`scan` of a dataset under a prefix: one listing; the label files fetched concurrently, the images' headers too."""
    from lightning_lmdb.remote import objects
    from lightning_lmdb.sources import objectstore

    remote = _remote_layout(source)
    root = remote.root
    names, names_raw = _remote_names(remote)
    splits = _remote_splits(remote)
    images = [(split, image) for split, folder in splits for image in _remote_images(remote, folder)]
    if not images:
        raise SourceError(f"No images found in {urls.redact(root)!r}'s image folders: expected objects ending in "
                          f"{', '.join(boxcheck.IMG_SUFFIXES)}.")
    label_of = {image: _remote_label(image) for _, image in images}
    wanted = [label for label in dict.fromkeys(label_of.values()) if label is not None and label in remote.listed]
    fetched = dict(zip(wanted, objects.read_many([(u, remote.listed[u].etag or None, None, None) for u in wanted]), strict=True))
    found = boxcheck.Images(remote.listed, (image for image, label in label_of.items() if label is not None))
    label_dirs = {urls.join(root, "labels")} | {urls.parent(p) for p in (_remote_label(urls.join(folder, "x")) for _, folder in splits)
                                                if p}
    label_files = {u for d in label_dirs for u in objectstore.under(remote.listed, d)
                   if u.endswith(".txt") and urls.name(u) != "classes.txt"}
    return _scan_images(root, urls.redact(root), remote.yaml or root, names, names_raw, options, images,
                        lambda url: urls.relative(url, root), label_of.__getitem__, fetched.get, found, label_files)

def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def _parse(raw: bytes, where: str, width: int, height: int, count: int, index: list[int],
           tally: boxcheck.BoxTally) -> tuple[Boxes | None, str | None]:
    """The boxes of one label file, or the error naming its line."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None, f"{where} is not UTF-8 text; a YOLO label file holds lines 'class cx cy w h'"
    boxes, labels_ = [], []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        place = f"{where} line {number}"
        if len(fields) != 5:
            return None, (f"{place} has {len(fields)} fields ({line.strip()[:80]!r}), not 5: write 'class cx cy w h' (polygon lines "
                          "are not read)")
        if not re.fullmatch(r"[0-9]+", fields[0]):
            return None, f"{place}: class {fields[0]!r} is not a class index (0, 1, 2, ...)"
        cls = int(fields[0])
        if cls >= count:
            return None, f"{place}: class index {cls} is beyond the {count} class names (0..{count - 1}); fix it, or add the name"
        try:
            cx, cy, w, h = (float(v) for v in fields[1:])
        except ValueError:
            return None, f"{place}: {' '.join(fields[1:])!r} are not four numbers (cx cy w h, normalised to 0-1)"
        if not all(-_SLACK <= v <= 1 + _SLACK for v in (cx, cy, w, h)):
            return None, (f"{place}: {' '.join(fields[1:])!r} has a coordinate outside 0-1; YOLO coordinates are normalised by the "
                          "image's width and height (are these pixels?)")
        try:
            box = tally.box((cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height, width, height)
        except boxcheck.BadBox as exc:
            return None, f"{place}: {exc}"
        if box is not None:
            boxes.append(box)
            labels_.append(index[cls])
    return Boxes(tuple(boxes), tuple(labels_), image_size=(height, width)), None
