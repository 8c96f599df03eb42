"""Sources on object storage (``s3://bucket/prefix``): an image folder under a prefix, and the objects a manifest lists.

**Listing, not a request per file.** A prefix is listed once (:func:`lightning_lmdb.remote.objects.list_objects`: every
object's key, size and ETag), and that listing is the scan: no HEAD per object. The objects a manifest lists are found the
same way, one listing per distinct prefix holding them (:func:`stat_many`), not one request per row.

**ImageFolder layout under a prefix** (:func:`scan_prefix`): a class is the first path component of a key under the prefix
(``s3://b/train/cat/1.jpg`` is class ``cat``), images are the keys ending in one of ImageFolder's extensions, and classes,
sample order and errors are those of a local folder (:mod:`lightning_lmdb.sources.folder`): a "folder" of object storage is
the common prefix of its keys. Objects directly under the prefix with no class prefix of their own make a flat folder
(unlabelled) when there are no class prefixes.

**What a file of such a scan holds**: its URL as ``path``, its key relative to the prefix as ``relpath``, its size and ETag
(``mtime_ns`` 0): the database's fingerprint, hence its staleness, follows the objects' sizes and ETags, and a build fetches each
object only while it still has the listed ETag (``If-Match``: :func:`lightning_lmdb.sources.base.read_file`).

**Detection sources** (:mod:`~lightning_lmdb.sources.coco`, :mod:`~lightning_lmdb.sources.yolo`,
:mod:`~lightning_lmdb.sources.voc`): a COCO JSON at a URL, a YOLO or Pascal VOC layout under a prefix. Each is scanned as its
local kind, from one listing: its annotation files are read with one GET each (``If-Match`` their listed ETag; a COCO JSON's
ETag from one HEAD; YOLO's label files and VOC's XMLs, being many, fetched concurrently), each image's header (its size and
EXIF orientation, which the box checks need) with one ranged GET of its first bytes (concurrently, ``If-Match`` its listed
ETag), and the images themselves by the build as any object. A prefix is recognised as a YOLO or VOC layout by one delimited
listing of its top-level "folders" (:func:`heads`).

**Segmentation masks**: a manifest's mask column (its mask objects found by the same listings as its images: :func:`stat_many`),
or an images prefix paired with a masks prefix (``masks_dir`` a URL: :func:`lightning_lmdb.sources.folder.scan_prefix_pairs`,
one listing of each). Each mask's size and ETag go in its :class:`~lightning_lmdb.sources.base.SourceFile` (``mask_size``,
``mask_etag``): the fingerprint follows them, and the build fetches each mask ``If-Match`` its ETag, with its chunk's images
(:func:`lightning_lmdb.build.readers._fetched`). A mask object missing from the listing has no ETag: the build reports it for its
row. A local ``masks_dir`` with an images prefix (or a URL with a local folder) is refused.
"""

from __future__ import annotations

import posixpath
import time

from lightning_lmdb.errors import SourceError
from lightning_lmdb.remote import objects, urls

#: The names that make a URL a file rather than a prefix (a manifest, a COCO JSON, a YOLO data.yaml).
FILE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson", ".json", ".yaml", ".yml")


def is_prefix(url: str) -> bool:
    """Whether the URL names a prefix (a "folder": ``s3://b/train`` or ``s3://b/train/``), not a manifest or annotation file."""
    return url.endswith("/") or not urls.name(url).lower().endswith(FILE_SUFFIXES)


def root_of(url: str) -> str:
    """The prefix without its trailing ``/`` (what the relative paths are relative to)."""
    return url.rstrip("/")


def listing(url: str) -> list[objects.RemoteObject]:
    """Every object under the prefix ``url`` (one listing), folder markers (keys ending in ``/``) left out.

    Raises:
        RemoteNotFoundError: No such bucket.
        FileNotFoundError: Nothing under the prefix (the message names it, redacted).
    """
    root = root_of(url)
    found = [item for item in objects.list_objects(root + "/") if not item.url.endswith("/")]
    if not found:
        raise FileNotFoundError(f"Source {urls.redact(root)}/ holds no objects (no such prefix in the bucket). Check the URL: a source "
                                "on object storage is a prefix of images (ImageFolder layout, e.g. s3://bucket/train/) or a manifest.")
    return found


#: How long :func:`heads` remembers a prefix's folders (a source's kind is asked several times in one call).
_HEADS_SECONDS = 2.0
_HEADS: dict[str, tuple[float, frozenset[str]]] = {}


def heads(url: str) -> frozenset[str]:
    """The names of the "folders" directly under the prefix ``url`` (one delimited listing, remembered for two seconds); none
    when it cannot be listed (the kind that takes the prefix reports why)."""
    from lightning_lmdb.remote import fs

    root = root_of(url)
    found = _HEADS.get(root)
    if found is not None and time.monotonic() - found[0] < _HEADS_SECONDS:
        return found[1]
    try:
        filesystem, path = fs.filesystem(root), root.split("://", 1)[1]
        entries = filesystem.ls(path, detail=True, refresh=True)
        filesystem.invalidate_cache(path)  # nothing else answers from this listing (an ETag read later is never a cached one)
        names = frozenset(posixpath.basename(entry["name"].rstrip("/")) for entry in entries if entry.get("type") == "directory")
    except Exception:  # noqa: BLE001 -- any failure: no layout recognised; the folder kind's listing reports it
        names = frozenset()
    _HEADS[root] = (time.monotonic(), names)
    return names


def resolve(url: str, relative: str) -> str:
    """``relative`` (``.``, ``..`` and ``/`` as in a path) taken from the prefix ``url``, without a trailing ``/``.

    Raises:
        SourceError: It leads above the bucket.
    """
    bucket, key = urls.bucket_key(url)
    joined = posixpath.normpath(posixpath.join("/" + key, relative))
    if joined.startswith("//"):
        joined = joined[1:]
    out = f"{urls.scheme(url)}://{bucket}{joined}".rstrip("/")
    return out


def under(listed: dict[str, objects.RemoteObject], prefix: str) -> dict[str, objects.RemoteObject]:
    """The objects of ``listed`` below the prefix ``prefix``."""
    inside = prefix.rstrip("/") + "/"
    return {url: item for url, item in listed.items() if url.startswith(inside)}


def relative_items(items: list[objects.RemoteObject], root: str) -> list[tuple[str, objects.RemoteObject]]:
    return [(urls.relative(item.url, root), item) for item in items]


def stat_many(targets: list[str]) -> dict[str, objects.RemoteObject]:
    """The size and ETag of each object of ``targets`` that exists, by URL: one listing per distinct prefix holding them (a
    prefix inside another listed one is not listed again), never one request per object.

    Raises:
        RemoteNotFoundError: No such bucket.
    """
    parents = sorted({urls.parent(url).rstrip("/") + "/" for url in targets})
    listed: list[str] = []
    for parent in parents:  # sorted: a prefix comes before the prefixes inside it
        if not any(parent.startswith(outer) for outer in listed):
            listed.append(parent)
    found: dict[str, objects.RemoteObject] = {}
    for parent in listed:
        found.update((item.url, item) for item in objects.list_objects(parent))
    wanted = set(targets)
    return {url: item for url, item in found.items() if url in wanted}


def refuse(what: str, where: str) -> SourceError:
    """The error for a feature not supported on object storage yet."""
    return SourceError(f"{what} is not supported for {urls.scheme(where)}:// sources yet ({urls.redact(where)}): copy the data to a "
                       "local folder, or leave it out.")
