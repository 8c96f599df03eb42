"""The COCO source kind: a COCO detection JSON (``instances_*.json``) and its images folder.

**Recognised**: a ``.json`` file (any case; JSON Lines manifests are ``.jsonl`` / ``.ndjson``) whose text starts with ``{`` and
names the keys ``"images"``, ``"annotations"`` and ``"categories"`` (a file over a MiB: ``"images"`` or ``"annotations"``
in its first MiB). Any other ``.json`` is left to the other kinds (none takes it: "not a known source").

**Images folder**: ``SourceOptions(root=...)``; without it, the first of these folders that holds one of the first listed
images: ``<json dir>/images/<split>``, ``<json dir>/../images/<split>``, ``<json dir>/../<split>`` (COCO 2017:
``annotations/instances_train2017.json`` beside ``train2017/``), ``<json dir>/images``, ``<json dir>`` -- where ``<split>``
is the JSON's name without ``instances_`` and ``.json`` (``instances_val2017.json``: ``val2017``). ``file_name`` is relative
to it and must stay inside it.

**Read**: ``images`` (``id``, ``file_name``, optionally ``width`` / ``height``, which must be the file's), ``annotations``
(``id``, ``image_id``, ``category_id``, ``bbox`` ``[x, y, w, h]`` in pixels -> ``XYXY``, ``iscrowd``, ``area``; segmentations
are not read), ``categories`` (``id``, ``name``). The classes are the categories in id order (ids need not be contiguous):
``target_meta["category_ids"]`` holds their ids in class order, each box keeps its ``category_id`` and ``area`` (COCO's, else
``w * h``) and ``iscrowd``, each image its ``image_id`` (:class:`~lightning_lmdb.targets.boxes.Boxes`). Images without
annotations are kept (no boxes). Samples are in the order of ``images``.

**Splits**: one JSON per split -- ``train_dir="instances_train.json"``, ``val_dir="instances_val.json"`` -- each its own source.

**Bad input** (:mod:`lightning_lmdb.sources.boxcheck` for the box rules), each naming the JSON and the image id / annotation
id: a category id not in ``categories``, an annotation for an image id that does not exist, an image id or ``file_name``
listed twice, a missing image file, a malformed ``bbox``, a box outside its image -- ``SourceScan.special`` entries (the
build refuses them, or skips and records them with ``on_error="skip"``). A file that is not JSON, lacks a key, or whose
``categories`` are malformed raises :class:`~lightning_lmdb.errors.SourceError`.

**On object storage** (:mod:`lightning_lmdb.sources.objectstore`): a ``.json`` URL is a COCO JSON, read with one GET; its images
prefix is found among the same candidates (``root=`` a URL), from one listing of the JSON's prefix's parent.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_lmdb.errors import SourceError
from lightning_lmdb.remote import objects, urls
from lightning_lmdb.remote.urls import is_remote
from lightning_lmdb.sources import boxcheck
from lightning_lmdb.sources.base import Labels, SourceFile, SourceOptions, SourceScan
from lightning_lmdb.targets.boxes import Boxes

__all__ = ["DESCRIPTION", "NAME", "accepts", "classes", "has_samples", "labels", "scan"]

NAME = "coco"
DESCRIPTION = "a COCO detection JSON (.json with images, annotations, categories; its images folder as root=)"
_HEAD = 1 << 20
_KEYS = (b'"images"', b'"annotations"', b'"categories"')
_PROBES = 5


def accepts(source: object) -> bool:
    """Whether ``source`` is a COCO JSON (see the module docstring; reads at most its first MiB), or a URL of a ``.json`` object
    (named so: nothing is requested here; its scan reads it)."""
    if is_remote(source):
        return not source.endswith("/") and urls.name(source).lower().endswith(".json")  # type: ignore[attr-defined]
    if not isinstance(source, Path) or source.suffix.lower() != ".json" or not source.is_file():
        return False
    try:
        with open(source, "rb") as handle:
            head = handle.read(_HEAD + 1)
    except OSError:
        return False
    if not head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        return False
    if len(head) <= _HEAD:
        return all(key in head for key in _KEYS)
    return _KEYS[0] in head or _KEYS[1] in head


@dataclass
class _Coco:
    path: Path | str  # a URL on object storage
    name: str
    classes: list[str]
    category_ids: list[int]
    images: list[Any]
    annotations: list[Any]
    digest: str


_CACHE: dict[str, tuple[tuple[Any, ...], _Coco]] = {}


def _load(source: Path) -> _Coco:
    """The parsed JSON of ``source`` (remembered while its size and mtime are unchanged; an object's while its ETag is: one
    HEAD, then one GET with that ETag as ``If-Match``)."""
    path: Path | str
    if is_remote(source):
        from lightning_lmdb.remote import objects

        path, item = str(source), objects.stat(str(source))
        key: tuple[Any, ...] = (item.size, item.etag)
        found = _CACHE.get(path)
        if found is not None and found[0] == key:
            return found[1]
        where, file_name = repr(urls.redact(path)), urls.name(path)
        data = objects.read(path, etag=item.etag or None)
    else:
        path = source.expanduser().resolve()
        st = path.stat()
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        found = _CACHE.get(str(path))
        if found is not None and found[0] == key:
            return found[1]
        where, file_name = repr(str(path)), path.name
        data = path.read_bytes()
    try:
        raw = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise SourceError(f"{where} is not UTF-8 text; save the COCO JSON as UTF-8.") from None
    except (ValueError, RecursionError) as exc:
        why = f"line {exc.lineno} column {exc.colno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise SourceError(f"{where} is not JSON ({why}); fix the file.") from None
    if not isinstance(raw, dict):
        raise SourceError(f"{where} is a JSON {type(raw).__name__}, not a COCO object with images, annotations and categories.")
    missing = [key for key in ("images", "annotations", "categories") if not isinstance(raw.get(key), list)]
    if missing:
        raise SourceError(f"{where} lacks the list(s) {', '.join(map(repr, missing))}: a COCO detection JSON has images, annotations "
                          "and categories (an image-info file without annotations is not a detection source).")
    ids: dict[int, str] = {}
    for i, category in enumerate(raw["categories"]):
        cid = category.get("id") if isinstance(category, dict) else None
        name = category.get("name") if isinstance(category, dict) else None
        if isinstance(cid, bool) or not isinstance(cid, int) or not isinstance(name, str) or not name:
            raise SourceError(f"{where} categories[{i}] is {category!r}: each category is {{\"id\": <integer>, \"name\": <text>}}.")
        if cid in ids:
            raise SourceError(f"{where} categories[{i}]: category id {cid} is listed twice ({ids[cid]!r} and {name!r}); keep one.")
        ids[cid] = name
    order = sorted(ids)
    names = [ids[cid] for cid in order]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise SourceError(f"{where}: the category name(s) {twice} are used by several category ids; give each category its own name.")
    coco = _Coco(path, file_name, names, order, raw["images"], raw["annotations"], boxcheck.digest([data]))
    _CACHE.clear()
    _CACHE[str(path)] = (key, coco)
    return coco


def labels(source: Path, options: SourceOptions | None = None) -> Labels:
    """The classes (the categories in id order, or ``classes=``) and the target kind ``"boxes"``; the JSON is parsed, no image read."""
    options = boxcheck.check_options(NAME, source, options)
    coco = _load(source)
    found, _ = boxcheck.given_classes(coco.classes, options, _shown(coco))
    return Labels(found, {c: k for k, c in enumerate(found)}, "boxes")


def classes(source: Path, options: SourceOptions | None = None) -> tuple[list[str], dict[str, int]]:
    """The classes and ``class_to_idx`` (:func:`labels`)."""
    found = labels(source, options)
    return found.classes, found.class_to_idx


def has_samples(source: Path, options: SourceOptions | None = None) -> bool:
    """Whether the JSON lists at least one image."""
    return bool(_load(source).images)


def _shown(coco: _Coco) -> str:
    return repr(urls.redact(coco.path)) if isinstance(coco.path, str) else repr(str(coco.path))


def _split_name(json_path: Path | str) -> str:
    stem = Path(urls.name(json_path) if isinstance(json_path, str) else json_path.name).stem
    return stem[len("instances_"):] if stem.startswith("instances_") else stem


def _remote_images_root(coco: _Coco, options: SourceOptions) -> tuple[str, dict[str, objects.RemoteObject]]:
    """The images prefix of a COCO JSON on object storage, found as :func:`_images_root` finds a folder, and its listing by URL:
    one listing of ``root=``, or of the JSON's prefix's parent (which holds every candidate)."""
    from lightning_lmdb.sources import objectstore

    json_url = str(coco.path)
    if options.root is not None:
        if not is_remote(options.root):
            raise SourceError(f"root={options.root!r} is a local folder, but the COCO JSON {_shown(coco)} is on object storage; pass the "
                              "URL of the prefix that holds its images as root=.")
        root = objectstore.root_of(str(options.root))
        return root, {item.url: item for item in objectstore.listing(root)}
    here, split = urls.parent(json_url), _split_name(json_url)
    above = urls.parent(here)
    listed = {item.url: item for item in objectstore.listing(above)}
    candidates = [urls.join(here, "images", split), urls.join(above, "images", split), urls.join(above, split), urls.join(here, "images"),
                  here]
    names = [image.get("file_name") for image in coco.images[:_PROBES] if isinstance(image, dict)]
    names = [name for name in names if isinstance(name, str) and name]
    for folder in candidates:
        inside = folder.rstrip("/") + "/"
        if any(url.startswith(inside) for url in listed) and (not names or any(urls.join(folder, name) in listed for name in names)):
            return folder.rstrip("/"), {url: item for url, item in listed.items() if url.startswith(inside)}
    tried = ", ".join(repr(urls.redact(folder)) for folder in candidates)
    raise SourceError(f"No images prefix found for {_shown(coco)}: none of {tried} holds its first images ({names[:3]}). "
                      "Pass the URL of the prefix that holds them as root= (CLI --root, Hydra data.source_options.root).")


def _images_root(coco: _Coco, options: SourceOptions) -> Path:
    if options.root is not None:
        root = Path(options.root).expanduser().resolve()
        if not root.is_dir():
            raise SourceError(f"root={options.root!r} is not a folder ({str(root)!r}); pass the folder that holds the images of "
                              f"{str(coco.path)!r}.")
        return root
    here, split = coco.path.parent, _split_name(coco.path)
    candidates = [here / "images" / split, here.parent / "images" / split, here.parent / split, here / "images", here]
    names = [image.get("file_name") for image in coco.images[:_PROBES] if isinstance(image, dict)]
    names = [name for name in names if isinstance(name, str) and name]
    for folder in candidates:
        if folder.is_dir() and (not names or any((folder / name).is_file() for name in names)):
            return folder.resolve()
    tried = ", ".join(repr(str(folder)) for folder in candidates)
    raise SourceError(f"No images folder found for {str(coco.path)!r}: none of {tried} holds its first images ({names[:3]}). "
                      "Pass the folder that holds them as root= (CLI --root, Hydra data.source_options.root).")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def scan(source: Path, options: SourceOptions | None = None) -> SourceScan:
    """Scan a COCO JSON: parse it, check every image and annotation, read each image's header (see the module docstring).

    Raises:
        SourceError: The JSON as a whole cannot be read, or no images folder is found.
        OptionError: An option a COCO source does not take.
    """
    options = boxcheck.check_options(NAME, source, options)
    coco = _load(source)
    listed: dict[str, objects.RemoteObject] | None = None
    if isinstance(coco.path, str):
        root, listed = _remote_images_root(coco, options)
        shown_root, prefix = urls.redact(root), root + "/"
    else:
        root = _images_root(coco, options)  # type: ignore[assignment]
        shown_root, prefix = str(root), str(root) + os.sep
    classes_, index = boxcheck.given_classes(coco.classes, options, _shown(coco))
    class_of = {cid: index[k] for k, cid in enumerate(coco.category_ids)}
    name = coco.name
    tally = boxcheck.BoxTally(clip=bool(options.clip_boxes))
    special: list[tuple[str, str]] = []
    images: dict[int, tuple[int, dict[str, Any]]] = {}  # image id -> its index in images, the image
    by_name: dict[str, int] = {}
    images_listed: list[tuple[int, str, dict[str, Any]]] = []  # (image id, relpath, image), in the JSON's order
    for i, image in enumerate(coco.images):
        iid = image.get("id") if isinstance(image, dict) else None
        file_name = image.get("file_name") if isinstance(image, dict) else None
        if isinstance(iid, bool) or not isinstance(iid, int) or not isinstance(file_name, str) or not file_name:
            special.append((f"{name} images[{i}]", f"{name} images[{i}] is not {{\"id\": <integer>, \"file_name\": <text>, ...}}: "
                                                   f"{str(image)[:200]}; fix the entry"))
            continue
        relpath = os.path.normpath(file_name).replace(os.sep, "/")
        if os.path.isabs(file_name) or relpath == ".." or relpath.startswith("../"):
            special.append((file_name, f"{name} image id {iid}: file_name {file_name!r} leads out of the images folder {shown_root!r}; "
                                       "write it relative to that folder, or set root= to a folder that holds it"))
            continue
        if iid in images:
            special.append((relpath, f"{name} image id {iid} is listed twice (images[{images[iid][0]}] and images[{i}]); give each "
                                     "image its own id"))
            continue
        if relpath in by_name:
            special.append((relpath, f"{name} image id {iid}: file_name {file_name!r} is listed already by image id {by_name[relpath]}; "
                                     "list each image once"))
            images[iid] = (i, image)  # its annotations are not an unknown image's
            continue
        images[iid], by_name[relpath] = (i, image), iid
        images_listed.append((iid, relpath, image))
    per_image: dict[int, list[dict[str, Any]]] = {}
    for j, ann in enumerate(coco.annotations):
        aid = ann.get("id", f"#{j}") if isinstance(ann, dict) else f"#{j}"
        iid = ann.get("image_id") if isinstance(ann, dict) else None
        place = f"{name} annotation id {aid} (annotations[{j}])"
        if not isinstance(ann, dict):
            special.append((f"{name} annotations[{j}]", f"{place} is not a JSON object; fix the entry"))
        elif iid not in images:
            special.append((f"{name} annotation id {aid}", f"{place}: its image_id {iid!r} is not the id of any image in images; fix "
                                                          "the image_id, or remove the annotation"))
        else:
            per_image.setdefault(iid, []).append({**ann, "_place": place})
    files: list[SourceFile] = []
    found = boxcheck.Images(listed, (prefix + relpath for _, relpath, _ in images_listed) if listed is not None else ())
    for iid, relpath, image in images_listed:
        path = prefix + relpath
        origin = f"{name} image id {iid}"
        size, mtime, problem = found.stat(path)
        if problem is None:
            try:
                width, height, orientation = found.header(path)
            except OSError as exc:
                problem = f"{relpath!r} {exc}"
            else:
                said = (image.get("width"), image.get("height"))
                if said != (None, None) and said != (width, height):
                    problem = (f"the JSON gives its size as {said[0]} x {said[1]}, the file is {width} x {height}; fix width / height "
                               "(are its boxes drawn on another version of the image?)")
        if problem is None:
            target, problem = _target(per_image.get(iid, []), iid, width, height, class_of, tally)
        if problem is not None:
            special.append((relpath, f"{origin}: {problem}"))
            continue
        tally.orientation(relpath, orientation)
        files.append(SourceFile(path, relpath, target, size, mtime, "", origin, etag=found.etag(path)))  # type: ignore[arg-type]
    identity = json.dumps({"coco": name, "digest": coco.digest, "classes": classes_, "root": str(root), "clip": bool(options.clip_boxes)},
                          sort_keys=True, ensure_ascii=False)
    return SourceScan(root=root, classes=classes_, class_to_idx={c: k for k, c in enumerate(classes_)}, files=files, special=special,
                      target_kind="boxes", identity=identity,
                      target_meta=tally.meta(format="coco", category_ids=_ids_in_class_order(coco, classes_)))


def _ids_in_class_order(coco: _Coco, classes_: list[str]) -> list[int | None]:
    """The category id of each class (``None`` for a class of ``classes=`` this JSON has no category for)."""
    by_name = dict(zip(coco.classes, coco.category_ids))
    return [by_name.get(name) for name in classes_]


def _target(anns: list[dict[str, Any]], iid: int, width: int, height: int, class_of: dict[int, int],
            tally: boxcheck.BoxTally) -> tuple[Boxes | None, str | None]:
    boxes, labels_, crowd, area, cids = [], [], [], [], []
    for ann in anns:
        place, cid, bbox = ann["_place"], ann.get("category_id"), ann.get("bbox")
        if cid not in class_of or isinstance(cid, bool):
            return None, f"{place}: category_id {cid!r} is not among the categories' ids {sorted(class_of)}; fix it, or add the category"
        if not isinstance(bbox, list) or len(bbox) != 4 or not all(_number(v) for v in bbox):
            return None, f"{place}: bbox {bbox!r} is not [x, y, width, height] (four numbers, pixels)"
        iscrowd = ann.get("iscrowd", 0)
        if iscrowd not in (0, 1) or isinstance(iscrowd, float):
            return None, f"{place}: iscrowd {iscrowd!r} is not 0 or 1"
        x, y, w, h = (float(v) for v in bbox)
        try:
            box = tally.box(x, y, x + w, y + h, width, height)
        except boxcheck.BadBox as exc:
            return None, f"{place}: {exc}"
        if box is None:
            continue
        given_area = ann.get("area")
        boxes.append(box)
        labels_.append(class_of[cid])
        crowd.append(int(iscrowd))
        area.append(float(given_area) if _number(given_area) else w * h)
        cids.append(int(cid))
    return Boxes(tuple(boxes), tuple(labels_), iscrowd=tuple(crowd), area=tuple(area), category_ids=tuple(cids), image_id=iid,
                 image_size=(height, width)), None
