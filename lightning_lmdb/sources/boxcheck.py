"""The rules every detection source kind applies to its boxes (:mod:`~lightning_lmdb.sources.coco`,
:mod:`~lightning_lmdb.sources.yolo`, :mod:`~lightning_lmdb.sources.voc`, a manifest's ``boxes`` column).

A box arrives converted to ``XYXY`` pixels of the image as stored in its file (see :mod:`lightning_lmdb.targets.boxes`) and is:

* **refused** when a coordinate is not a finite number;
* **dropped and counted** (``target_meta["degenerate_dropped"]``) when its width or height is zero or negative (real COCO
  has some);
* **clipped** to the image when it crosses an edge by at most one pixel (rounding: ``target_meta["clipped"]`` counts them);
* **refused** when it crosses an edge by more than a pixel -- or clipped, and counted, under ``SourceOptions(clip_boxes=True)``
  (a box left with no area by the clip is dropped as degenerate).

A refused box makes its image a ``SourceScan.special`` entry whose reason names the file and the place (line, annotation
id, XML element): the build refuses it, or skips and records it with ``on_error="skip"``.

Each image's header is read (never its pixels) for its size and its EXIF orientation: an image whose orientation is not 1
is counted (``target_meta["exif_rotated"]``) and warned about -- it is stored and served in its stored pixel frame (as
ImageFolder reads it), and its boxes may have been drawn on the rotated view.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from lightning_lmdb.errors import OptionError, SourceError
from lightning_lmdb.remote.objects import RemoteObject
from lightning_lmdb.sources.base import SourceOptions, describe_kind, not_regular_reason

__all__ = ["BOX_OPTIONS", "IMG_SUFFIXES", "BadBox", "BoxTally", "Images", "check_options", "digest", "given_classes", "image_header",
           "stat_image"]

log = logging.getLogger(__name__)

#: The options a detection source takes (every other one is refused, naming the kind).
BOX_OPTIONS = ("root", "classes", "target_kind", "clip_boxes")
#: How far past an edge a box may reach and be clipped without ``clip_boxes`` (pixels), and the float slack on it.
EDGE_PX = 1.0
_SLACK = 1e-3
#: The file name endings of images (torchvision's ``IMG_EXTENSIONS``), compared in lower case.
IMG_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: The EXIF orientation tag.
_ORIENTATION = 0x0112


class BadBox(SourceError):
    """A box that cannot be stored: the message says what is wrong with it (the caller adds the file and place)."""


@dataclass
class BoxTally:
    """What a scan counts while it checks boxes: the ``target_meta`` of the scan."""

    clip: bool = False
    degenerate: int = 0
    clipped: int = 0
    exif: list[str] = field(default_factory=list)

    def box(self, x1: float, y1: float, x2: float, y2: float, width: int, height: int) -> tuple[float, float, float, float] | None:
        """The box to store (clipped when it may be), or ``None`` when it is degenerate (dropped, counted).

        Raises:
            BadBox: A coordinate that is not a finite number, or a box past an edge by more than a pixel without ``clip_boxes``.
        """
        box = (x1, y1, x2, y2)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box):
            raise BadBox(f"box {list(box)} has a coordinate that is not a finite number")
        if x2 <= x1 or y2 <= y1:
            self.degenerate += 1
            return None
        beyond = max(-x1, -y1, x2 - width, y2 - height)
        if beyond > EDGE_PX + _SLACK and not self.clip:
            raise BadBox(f"box {_shown(box)} (x1, y1, x2, y2 in pixels) lies {beyond:.6g} px outside the {width} x {height} image "
                         "(more than a pixel of rounding); fix the annotation, or set clip_boxes=True to clip such boxes to the image")
        if beyond > 0:
            x1, y1, x2, y2 = max(x1, 0.0), max(y1, 0.0), min(x2, float(width)), min(y2, float(height))
            if x2 <= x1 or y2 <= y1:
                self.degenerate += 1
                return None
            self.clipped += beyond > _SLACK  # float noise of a conversion (YOLO's) is no clip worth counting
        return float(x1), float(y1), float(x2), float(y2)

    def orientation(self, relpath: str, value: int) -> None:
        """Count an image whose EXIF orientation is not 1."""
        if value not in (0, 1):
            self.exif.append(relpath)

    def meta(self, **more: Any) -> dict[str, Any]:
        """The scan's ``target_meta`` (``more`` first), and a warning when images are EXIF-rotated."""
        if self.exif:
            shown = ", ".join(self.exif[:3]) + (", ..." if len(self.exif) > 3 else "")
            log.warning("%d image(s) have an EXIF orientation other than 1 (%s): they are stored and served in their stored pixel "
                        "frame, as ImageFolder reads them; check that their boxes were drawn on that frame, not on the rotated view.",
                        len(self.exif), shown)
        return {**more, "degenerate_dropped": self.degenerate, "clipped": self.clipped, "exif_rotated": len(self.exif)}


def _shown(box: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in box) + "]"


def image_header(path: str | IO[bytes]) -> tuple[int, int, int]:
    """``(width, height, exif_orientation)`` of an image file (or of its bytes), from its header alone (its pixels are not decoded).

    Raises:
        OSError: It cannot be opened, or it is not an image PIL can read.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            width, height = image.size
            try:
                orientation = int(image.getexif().get(_ORIENTATION, 1))
            except Exception:  # a damaged EXIF block: the image is still read in its stored frame
                orientation = 1
    except UnidentifiedImageError as exc:
        raise OSError(f"is not an image file PIL can read ({exc})") from None
    return width, height, orientation


def stat_image(path: str) -> tuple[int, int, str | None]:
    """``(size, mtime_ns, None)`` of an image file, or ``(0, 0, reason)`` when it is missing or not a regular file."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return 0, 0, "the image file is missing; add it, or remove its annotation"
    if not stat.S_ISREG(st.st_mode):
        return 0, 0, not_regular_reason(st.st_mode)
    return st.st_size, st.st_mtime_ns, None


#: How much of an object's start is fetched for its header (an image's size and EXIF come first in its file).
HEAD_BYTES = 1 << 16


class Images:
    """The size and header of a detection source's images: local files (:func:`stat_image`, :func:`image_header`, each when
    asked), or objects of one listing (object storage: ``listed`` by URL), whose headers are fetched at once, concurrently.

    An object's header is read from its first :data:`HEAD_BYTES` (one ranged GET with its listed ETag as ``If-Match``); an image
    whose header reaches past them is fetched whole. A PNG whose EXIF chunk follows its pixels is read as orientation 1.
    """

    def __init__(self, listed: dict[str, RemoteObject] | None = None, wanted: Iterable[str] = ()) -> None:
        self.listed = listed
        self._headers: dict[str, tuple[int, int, int] | OSError] = {}
        if listed is not None:
            self._fetch([listed[url] for url in dict.fromkeys(wanted) if url in listed])

    def _fetch(self, items: list[RemoteObject]) -> None:
        import io

        from lightning_lmdb.remote import objects

        heads = objects.read_many([(item.url, item.etag or None, 0, min(item.size, HEAD_BYTES)) for item in items])
        whole = []
        for item, head in zip(items, heads, strict=True):
            try:
                self._headers[item.url] = image_header(io.BytesIO(head))
            except OSError as exc:
                if item.size <= HEAD_BYTES:
                    self._headers[item.url] = exc
                else:
                    whole.append(item)
        for item, data in zip(whole, objects.read_many([(item.url, item.etag or None, None, None) for item in whole]), strict=True):
            try:
                self._headers[item.url] = image_header(io.BytesIO(data))
            except OSError as exc:
                self._headers[item.url] = exc

    def stat(self, path: str) -> tuple[int, int, str | None]:
        """``(size, mtime_ns, None)`` or ``(0, 0, reason)`` (:func:`stat_image`; an object: its listed size, ``mtime_ns`` 0)."""
        if self.listed is None:
            return stat_image(path)
        item = self.listed.get(path)
        return (0, 0, "the image file is missing; add it, or remove its annotation") if item is None else (item.size, 0, None)

    def header(self, path: str) -> tuple[int, int, int]:
        """:func:`image_header` of the image.

        Raises:
            OSError: It is not an image PIL can read.
        """
        if self.listed is None:
            return image_header(path)
        found = self._headers[path]
        if isinstance(found, OSError):
            raise found
        return found

    def etag(self, path: str) -> str:
        """The object's listed ETag; ``""`` for a local file."""
        item = None if self.listed is None else self.listed.get(path)
        return "" if item is None else item.etag


def check_options(name: str, source: Path, options: SourceOptions | None) -> SourceOptions:
    """``options`` (the defaults for ``None``), refusing those a detection source does not read.

    Raises:
        OptionError: An option other than :data:`BOX_OPTIONS`, or a ``target_kind`` other than ``"boxes"``.
    """
    options = options or SourceOptions()
    given = ", ".join(f"{k}={v!r}" for k, v in options.as_dict().items() if k not in BOX_OPTIONS)
    if given:
        raise OptionError(f"{given}: {str(source)!r} is {describe_kind(name)}, which takes only {', '.join(BOX_OPTIONS)}; leave the "
                          "others unset.")
    if options.target_kind not in (None, "boxes"):
        raise OptionError(f"target_kind={options.target_kind!r}: {str(source)!r} is {describe_kind(name)}, whose targets are boxes; "
                          "leave target_kind unset (or 'boxes').")
    return options


def given_classes(found: Sequence[str], options: SourceOptions, where: str) -> tuple[list[str], list[int]]:
    """The classes of a source whose own class names are ``found`` (in its index order), and per found class its index.

    With ``classes=`` (e.g. the DataModule maps a val source through the train source's classes) every found class must be
    among them, in any order; without, the found classes are the classes.

    Raises:
        SourceError: A found class that ``classes=`` does not list.
    """
    if options.classes is None:
        return list(found), list(range(len(found)))
    given = list(options.classes)
    unknown = [name for name in found if name not in given]
    if unknown:
        raise SourceError(f"{where} has the class(es) {', '.join(map(repr, unknown))}, which are not among classes={given!r}: add them "
                          "to classes=, or remove their boxes.")
    return given, [given.index(name) for name in found]


def digest(parts: Iterable[bytes]) -> str:
    """A short SHA-256 of annotation bytes (a scan's ``identity``: an edited annotation changes the fingerprint)."""
    found = hashlib.sha256()
    for part in parts:
        found.update(hashlib.sha256(part).digest())
    return found.hexdigest()[:32]
