"""The Pascal VOC source kind: ``Annotations/*.xml`` beside ``JPEGImages/``.

**Recognised**: a folder holding both ``Annotations/`` and ``JPEGImages/`` (e.g. ``VOCdevkit/VOC2012``).

**Read**: per XML, ``filename`` (the image in ``JPEGImages/``; without it the XML's name with ``.jpg``), ``size`` (``width``,
``height``: must be the image file's) and per ``object`` its ``name``, ``bndbox`` (``xmin``, ``ymin``, ``xmax``, ``ymax``)
and ``difficult`` (kept per box, 0 when absent). VOC's ``bndbox`` is 1-based and inclusive: it is stored as
``xmin - 1, ymin - 1, xmax, ymax`` in ``XYXY`` pixels (:mod:`lightning_lmdb.targets.boxes`). The classes are the sorted object
names (as ImageFolder sorts its folders), or ``classes=`` in index order. An XML without objects is an image without boxes.

**Splits**: ``ImageSets/Main/train.txt``, ``val.txt`` and ``test.txt`` (one image id a line; the per-class lists and
``trainval.txt`` are not read): when any exists, the samples are the ids they list, in that order, each in its split (an
XML listed by none is not a sample: ``target_meta["unlisted"]`` counts them); without them, every XML, sorted by name,
without a split.

**Bad input**, each naming the XML (and the object and element): a file that is not XML, or that holds a DTD or entity
declaration (refused, never expanded), one without ``size`` or an object without ``name`` / ``bndbox`` or with a
coordinate that is not a number, a box outside its image (:mod:`lightning_lmdb.sources.boxcheck`), a missing image, an
id listed by a split file without its XML or by two split files -- ``SourceScan.special`` entries (the build refuses them,
or skips and records them with ``on_error="skip"``).

**On object storage** (:mod:`lightning_lmdb.sources.objectstore`): a prefix holding ``Annotations/`` and ``JPEGImages/`` is read
as the same layout from one listing; the XMLs are fetched concurrently.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_lmdb.errors import SourceError
from lightning_lmdb.remote import urls
from lightning_lmdb.remote.objects import RemoteObject
from lightning_lmdb.remote.urls import is_remote
from lightning_lmdb.sources import boxcheck
from lightning_lmdb.sources.base import Labels, SourceFile, SourceOptions, SourceScan
from lightning_lmdb.targets.boxes import Boxes

__all__ = ["DESCRIPTION", "NAME", "accepts", "classes", "has_samples", "labels", "scan"]

NAME = "voc"
DESCRIPTION = "a Pascal VOC folder (Annotations/*.xml beside JPEGImages/)"
_SPLITS = ("train", "val", "test")


def accepts(source: object) -> bool:
    """Whether ``source`` is a folder holding ``Annotations/`` and ``JPEGImages/`` (or such a prefix of object storage: one
    delimited listing)."""
    if is_remote(source):
        from lightning_lmdb.sources import objectstore

        return objectstore.is_prefix(source) and {"Annotations", "JPEGImages"} <= objectstore.heads(source)  # type: ignore[arg-type]
    return isinstance(source, Path) and (source / "Annotations").is_dir() and (source / "JPEGImages").is_dir()


@dataclass
class _Xml:
    """One parsed annotation: its image, size, objects ``(name, (xmin, ymin, xmax, ymax) 1-based, difficult, place)``, or its error."""

    xml: str  # relpath of the XML
    image: str = ""  # relpath of the image
    split: str = ""
    size: tuple[int, int] = (0, 0)
    objects: list[tuple[str, tuple[float, float, float, float], int, str]] = field(default_factory=list)
    raw: bytes = b""
    error: str | None = None


def _listed(root: Path | _Remote) -> tuple[list[tuple[str, str]], list[tuple[str, str]], int]:
    """``([(id, split)], special, unlisted count)`` of the ImageSets split files, or every XML without a split."""
    if isinstance(root, _Remote):
        xmls = root.xml_stems()
        found: list[tuple[str, Any]] = [(split, f"ImageSets/Main/{split}.txt") for split in _SPLITS
                                        if root.has(f"ImageSets/Main/{split}.txt")]
    else:
        sets = root / "ImageSets" / "Main"
        xmls = sorted(p.stem for p in (root / "Annotations").glob("*.xml"))
        found = [(split, sets / f"{split}.txt") for split in _SPLITS if (sets / f"{split}.txt").is_file()]
    if not found:
        return [(stem, "") for stem in xmls], [], 0
    listed: list[tuple[str, str]] = []
    special: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    if isinstance(root, _Remote):
        texts = root.texts([path for _, path in found])
    else:
        texts = [path.read_text(encoding="utf-8-sig", errors="replace") for _, path in found]
    for (split, _), text in zip(found, texts, strict=True):
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            if not fields:
                continue
            stem = fields[0]
            if stem in seen:
                special.append((f"Annotations/{stem}.xml", f"ImageSets/Main/{split}.txt line {number}: image id {stem!r} is listed by "
                                                           f"{seen[stem]}.txt already; list each image in one split"))
                continue
            seen[stem] = split
            listed.append((stem, split))
    return listed, special, len(set(xmls) - set(seen))


def _declares_dtd(raw: bytes) -> bool:
    """Whether an XML file holds a DTD or an entity declaration (looked for in its UTF-16 text too, which expat reads)."""
    texts = [raw]
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        texts.append(raw.decode("utf-16", errors="replace").encode())
    return any(b"<!DOCTYPE" in text or b"<!ENTITY" in text for text in texts)


def _text(node: ET.Element, name: str) -> str | None:
    child = node.find(name)
    return None if child is None or child.text is None else child.text.strip()


def _parse(root: Path | _Remote, stem: str, split: str) -> _Xml:
    rel = f"Annotations/{stem}.xml"
    found = _Xml(rel, f"JPEGImages/{stem}.jpg", split)
    try:
        found.raw = root.read(rel) if isinstance(root, _Remote) else (root / rel).read_bytes()
    except OSError:
        found.error = f"{rel} is missing; add the annotation of image id {stem!r}, or remove it from its ImageSets file"
        return found
    if _declares_dtd(found.raw):
        found.error = f"{rel} holds a DTD or entity declaration (<!DOCTYPE / <!ENTITY), which is refused, never expanded; remove it"
        return found
    try:
        tree = ET.fromstring(found.raw)
    except ET.ParseError as exc:
        found.error = f"{rel} is not XML ({exc}); fix or remove it"
        return found
    filename = _text(tree, "filename")
    if filename:
        found.image = f"JPEGImages/{filename}"
    size = tree.find("size")
    try:
        if size is None:
            raise ValueError
        found.size = (int(float(_text(size, "width") or "")), int(float(_text(size, "height") or "")))
    except ValueError:
        found.error = f"{rel} <size> is missing or lacks a <width> / <height> number; add the image's size"
        return found
    for k, obj in enumerate(tree.iter("object")):
        name, box = _text(obj, "name"), obj.find("bndbox")
        place = f"{rel} <object> {k} ({name!r})"
        if not name:
            found.error = f"{rel} <object> {k} has no <name>; add its class name"
            return found
        if box is None:
            found.error = f"{place} has no <bndbox>; add it (xmin, ymin, xmax, ymax) or remove the object"
            return found
        try:
            coords = tuple(float(_text(box, c) or "") for c in ("xmin", "ymin", "xmax", "ymax"))
        except ValueError:
            found.error = f"{place} <bndbox> lacks a number among xmin, ymin, xmax, ymax; fix it"
            return found
        difficult = _text(obj, "difficult") or "0"
        if difficult not in ("0", "1"):
            found.error = f"{place} <difficult> is {difficult!r}, not 0 or 1"
            return found
        found.objects.append((name, coords, int(difficult), place))  # type: ignore[arg-type]
    return found


def _read(source: Path | str) -> tuple[Path | _Remote, list[_Xml], list[tuple[str, str]], int]:
    root: Path | _Remote = _Remote.of(source) if is_remote(source) else Path(source).expanduser().resolve()
    listed, special, unlisted = _listed(root)
    if isinstance(root, _Remote):  # the XMLs, many small objects: fetched at once
        root.fetch([f"Annotations/{stem}.xml" for stem, _ in listed])
    return root, [_parse(root, stem, split) for stem, split in listed], special, unlisted


class _Remote:
    """A VOC layout under a prefix of object storage: one listing; its files read with their listed ETags as ``If-Match``."""

    def __init__(self, root: str, listed: dict[str, RemoteObject]) -> None:
        self.root = root
        self.listed = listed
        self._fetched: dict[str, bytes] = {}

    @classmethod
    def of(cls, source: str) -> _Remote:
        from lightning_lmdb.sources import objectstore

        root = objectstore.root_of(source)
        return cls(root, {item.url: item for item in objectstore.listing(root)})

    def __str__(self) -> str:
        return urls.redact(self.root)

    def url(self, rel: str) -> str:
        return urls.join(self.root, rel)

    def has(self, rel: str) -> bool:
        return self.url(rel) in self.listed

    def xml_stems(self) -> list[str]:
        """The names (without ``.xml``) of the objects directly under ``Annotations/``, sorted."""
        inside = self.url("Annotations") + "/"
        return sorted(url[len(inside):-len(".xml")] for url in self.listed
                      if url.startswith(inside) and url.endswith(".xml") and "/" not in url[len(inside):])

    def fetch(self, rels: list[str]) -> None:
        """Fetch the listed objects among ``rels`` concurrently (:func:`lightning_lmdb.remote.objects.read_many`)."""
        from lightning_lmdb.remote import objects

        wanted = [rel for rel in dict.fromkeys(rels) if self.has(rel) and rel not in self._fetched]
        found = objects.read_many([(self.url(rel), self.listed[self.url(rel)].etag or None, None, None) for rel in wanted])
        self._fetched.update(zip(wanted, found, strict=True))

    def read(self, rel: str) -> bytes:
        """A fetched object's bytes.

        Raises:
            FileNotFoundError: It is not in the listing.
        """
        if rel not in self._fetched:
            self.fetch([rel])
        if rel not in self._fetched:
            raise FileNotFoundError(self.url(rel))
        return self._fetched[rel]

    def texts(self, rels: list[str]) -> list[str]:
        self.fetch(rels)
        return [self.read(rel).decode("utf-8-sig", errors="replace") for rel in rels]


def _names(xmls: list[_Xml]) -> list[str]:
    return sorted({obj[0] for x in xmls if x.error is None for obj in x.objects})


def labels(source: Path, options: SourceOptions | None = None) -> Labels:
    """The classes (the sorted object names, or ``classes=``) and the target kind ``"boxes"``; every XML is parsed, no image read."""
    options = boxcheck.check_options(NAME, source, options)
    root, xmls, _, _ = _read(source)
    found, _ = boxcheck.given_classes(_names(xmls), options, repr(str(root)))
    return Labels(found, {c: k for k, c in enumerate(found)}, "boxes")


def classes(source: Path, options: SourceOptions | None = None) -> tuple[list[str], dict[str, int]]:
    """The classes and ``class_to_idx`` (:func:`labels`)."""
    found = labels(source, options)
    return found.classes, found.class_to_idx


def has_samples(source: Path, options: SourceOptions | None = None) -> bool:
    """Whether the folder lists at least one annotation."""
    return bool(_listed(_Remote.of(source) if is_remote(source) else source.expanduser().resolve())[0])  # type: ignore[arg-type]


def scan(source: Path, options: SourceOptions | None = None) -> SourceScan:
    """Scan a VOC folder: parse every listed XML, read each image's header (see the module docstring).

    Raises:
        SourceError: No annotations.
        OptionError: An option a VOC source does not take.
    """
    options = boxcheck.check_options(NAME, source, options)
    root, xmls, special, unlisted = _read(source)
    if not xmls:
        shown = str(root) + "/Annotations" if isinstance(root, _Remote) else str(root / "Annotations")
        raise SourceError(f"No annotations found in {shown!r} (or listed by ImageSets/Main/{{train,val,test}}.txt).")
    path_of = root.url if isinstance(root, _Remote) else (lambda rel: str(root / rel))  # type: ignore[operator]
    if isinstance(root, _Remote):  # the images' headers, fetched at once
        found = boxcheck.Images(root.listed, (path_of(x.image) for x in xmls if x.error is None))
    else:
        found = boxcheck.Images()
    names = _names(xmls)
    classes_, index = boxcheck.given_classes(names, options, repr(str(root)))
    class_of = {name: index[k] for k, name in enumerate(names)}
    tally = boxcheck.BoxTally(clip=bool(options.clip_boxes))
    files: list[SourceFile] = []
    seen: dict[str, str] = {}
    for x in xmls:
        problem = x.error
        if problem is None and x.image in seen:
            problem = f"{x.xml}: its image {x.image!r} is the image of {seen[x.image]} already; each image has one annotation"
        seen.setdefault(x.image, x.xml)
        if problem is None:
            size, mtime, problem = found.stat(path_of(x.image))
        if problem is None:
            try:
                width, height, orientation = found.header(path_of(x.image))
            except OSError as exc:
                problem = f"{x.image!r} {exc}"
            else:
                if (width, height) != x.size:
                    problem = (f"{x.xml} <size> says {x.size[0]} x {x.size[1]}, the image file is {width} x {height}; fix <size> (are its "
                               "boxes drawn on another version of the image?)")
        boxes, labels_, difficult = [], [], []
        for name, (x1, y1, x2, y2), hard, place in (x.objects if problem is None else ()):
            try:
                box = tally.box(x1 - 1, y1 - 1, x2, y2, width, height)
            except boxcheck.BadBox as exc:
                problem = f"{place} <bndbox>: {exc}"
                break
            if box is not None:
                boxes.append(box)
                labels_.append(class_of[name])
                difficult.append(hard)
        if problem is not None:
            special.append((x.image if x.error is None else x.xml, problem if problem.startswith(x.xml) else f"{x.xml}: {problem}"))
            continue
        tally.orientation(x.image, orientation)
        target = Boxes(tuple(boxes), tuple(labels_), difficult=tuple(difficult), image_size=(height, width))
        files.append(SourceFile(path_of(x.image), x.image, target, size, mtime, x.split, x.xml,  # type: ignore[arg-type]
                                etag=found.etag(path_of(x.image))))
    where: Any = root.root if isinstance(root, _Remote) else root
    identity = json.dumps({"voc": str(where), "digest": boxcheck.digest(x.xml.encode() + b"\0" + x.raw for x in xmls), "classes": classes_,
                           "clip": bool(options.clip_boxes)}, sort_keys=True, ensure_ascii=False)
    return SourceScan(root=where, classes=classes_, class_to_idx={c: k for k, c in enumerate(classes_)}, files=files, special=special,
                      target_kind="boxes", identity=identity, target_meta=tally.meta(format="voc", unlisted=unlisted))
