"""Sources: what a database is built from, scanned through one entry point, :func:`scan_source`.

Every consumer (the builder, the raw datasets, the DataModule's backends, ``verify``) calls
:func:`scan_source` and reads the :class:`SourceScan` it returns: the classes and the target kind, and
per sample a file path, a path relative to the source's root, a typed target (see :data:`Target`), an
optional split name, a size and a modification time.

**Adding a source kind** is one module (or object) plus one :func:`register_source_kind` call. It satisfies
:class:`SourceKind`:

* ``NAME``: a short name (default: a module's last dotted name component), and ``DESCRIPTION``: what it accepts,
  e.g. ``"an image folder (ImageFolder layout or flat)"`` -- every "not a known source" message and the CLI help list the
  registered kinds by it (optionally ``PATHS = False`` for a kind that never accepts a path: the CLI's help and the
  message about a path leave it out);
* ``accepts(source) -> bool``: is this source of my kind (cheap: no scan; ``source`` is a
  ``pathlib.Path`` for anything path-like, else the object as given);
* ``scan(source, options) -> SourceScan``: the full scan (the builder and the raw datasets);
* ``has_samples(source, options) -> bool``: a cheap check that it lists at least one image
  (``LMDBDataModule`` refuses an empty source at construction, before any build);
* ``classes(source, options) -> (classes, class_to_idx)``: the classes, as cheaply as the kind allows
  (``LMDBDataModule.num_classes`` before ``setup``);
* optionally ``labels(source, options) -> Labels``: the classes and the target kind, as cheaply as the kind allows,
  for a kind whose targets are not only classes (without it, the target kind is ``"class"`` when there are classes,
  else ``"none"``); :func:`labels_of` asks it;

(``options`` is a :class:`SourceOptions`: how any source is read). The kinds are tried in their order of registration (``before=`` puts one
earlier): the library registers :mod:`lightning_lmdb.sources.manifest` (a CSV / TSV / JSON Lines file, or a folder holding
``metadata.csv`` / ``metadata.jsonl``), then the detection formats :mod:`lightning_lmdb.sources.coco` (a COCO JSON),
:mod:`lightning_lmdb.sources.yolo` (a YOLO folder or its ``data.yaml``) and :mod:`lightning_lmdb.sources.voc` (a Pascal VOC
folder) -- before the folder kind, which would take a YOLO or VOC folder for an ImageFolder --, then
:mod:`lightning_lmdb.sources.folder` (an ImageFolder-layout or flat folder), then
:mod:`lightning_lmdb.sources.dataset` (a map-style ``Dataset``). :func:`kind_of` remembers each source's kind (a path's
while it is unchanged, an object's while it lives); a registration forgets them all.

A kind registered at run time exists in the process that registered it (and in ``fork`` children): a build or a
loader whose workers are spawned needs it registered on import of a module those processes import (or given as a
module path, ``register_source_kind("my_package.my_kind")``, imported where it is first needed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import stat
import time
import warnings
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from lightning_lmdb.deprecated import renamed_class
from lightning_lmdb.errors import NotRegularFileError, OptionError
from lightning_lmdb.remote.urls import is_remote, redact
from lightning_lmdb.targets.base import NO_TARGET, Target, kind_names, unknown_kind  # noqa: F401  (NO_TARGET, Target: re-exported)

#: What a sample's target is: ``"class"`` (an index into the classes), ``"multilabel"`` (a set of class indices, served as a
#: float32 multi-hot tensor), ``"regression"`` (K numbers, served as a float32 tensor), ``"none"`` (no label: ``-1``) or
#: ``"mask"`` (a segmentation mask per sample, served as an ``int64`` ``H x W`` tensor: :mod:`lightning_lmdb.sources.masks`) -- the
#: library's kinds; any kind registered with :func:`lightning_lmdb.targets.register_target_kind` is accepted too
#: (:data:`TARGET_KINDS`: the registered ones).
TargetKind = Literal["class", "multilabel", "regression", "none", "mask"]


@dataclass(frozen=True)
class SourceOptions:
    """How a source is read: where its images are, which of its columns (or fields) hold the targets, and what kind of targets
    they are. Every source kind takes these options and uses the ones that apply to it: a manifest most of them, an image
    folder ``masks_dir`` (the rest are left unset), a packed ``Dataset`` ``target_kind``, ``classes`` and ``version``; the
    source kinds to come add theirs here (detection's box columns, object storage's ``storage_options``).

    Formerly ``ManifestOptions`` (a deprecated alias, kept for one release: constructing it warns).

    Attributes:
        root: The folder a manifest's relative image paths are relative to (and must stay inside); ``None``: the
            manifest's own folder. For a COCO JSON: its images folder (``None``: found beside it, see
            :mod:`lightning_lmdb.sources.coco`).
        path_column: The image column; ``None``: ``path``, else Hugging Face's ``file_name``.
        label_column: The target column (several, comma-separated or a list, for a regression target of K numbers);
            ``None``: ``label`` when the manifest has it, else no target.
        split_column: The split column (``train`` / ``val`` / ``test`` per row); ``None``: ``split`` when present.
        target_kind: One of :data:`TARGET_KINDS` (the registered kinds); ``None`` infers it from the values (names or integers: class;
            lists: multi-label; other numbers: regression).
        label_sep: Splits a CSV label cell into several labels (a multi-label target), e.g. ``"|"``.
        classes: The class names in index order; ``None``: the sorted names found (as ``ImageFolder`` sorts folders).
        version: A packed ``Dataset``'s version, chosen by you: its database is rebuilt when this (or its length) changes.
        mask_column: A manifest's segmentation-mask column (a second image path per row); ``None``: ``mask`` when present.
        masks_dir: For an image folder: the folder of its masks, matched by relative path without the extension
            (``images/a/1.jpg`` with ``masks/a/1.png``); ``None``: the folder has no masks.
        ignore_index: The mask value of unlabelled pixels (kept as is, not a class); ``None``: 255.
        num_classes: The number of mask classes; ``None``: the largest mask value below ``ignore_index`` plus one.
        clip_boxes: Detection sources: clip a box that crosses its image's edge by more than a pixel to the image, instead of
            refusing it (:mod:`lightning_lmdb.sources.boxcheck`); ``None`` / ``False``: refused (a pixel or less is always clipped).

    Raises:
        OptionError: A value of the wrong type, or a ``target_kind`` that is not one of :data:`TARGET_KINDS`.
    """

    root: str | None = None
    path_column: str | None = None
    label_column: str | tuple[str, ...] | None = None
    split_column: str | None = None
    target_kind: str | None = None
    label_sep: str | None = None
    classes: tuple[str, ...] | None = None
    version: str | int | None = None
    mask_column: str | None = None
    masks_dir: str | None = None
    ignore_index: int | None = None
    num_classes: int | None = None
    clip_boxes: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.label_column, (list, tuple)):
            object.__setattr__(self, "label_column", tuple(self.label_column))
            if not self.label_column or not all(isinstance(c, str) and c for c in self.label_column):
                raise OptionError(f"label_column={list(self.label_column)!r} must name one or more columns.")
        elif isinstance(self.label_column, str) and "," in self.label_column:
            object.__setattr__(self, "label_column", tuple(c.strip() for c in self.label_column.split(",")))
        if self.classes is not None:
            if isinstance(self.classes, str) or not all(isinstance(c, str) and c for c in self.classes):
                raise OptionError(f"classes={self.classes!r} must be a list of class names.")
            object.__setattr__(self, "classes", tuple(self.classes))
            if len(set(self.classes)) != len(self.classes):
                raise OptionError(f"classes={list(self.classes)!r} names a class twice.")
        if self.target_kind is not None and self.target_kind not in kind_names():  # the registry: a registered kind is accepted
            raise OptionError(unknown_kind(self.target_kind).replace(". A kind", " (or None to infer it). A kind", 1))
        for name, least in (("ignore_index", 0), ("num_classes", 1)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise OptionError(f"{name}={value!r} must be an integer >= {least}, or None.")
        if self.clip_boxes is not None and not isinstance(self.clip_boxes, bool):
            raise OptionError(f"clip_boxes={self.clip_boxes!r} must be True, False or None.")
        for name in ("root", "path_column", "split_column", "label_sep", "mask_column", "masks_dir"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (str, os.PathLike)) or value == ""):
                raise OptionError(f"{name}={value!r} must be a non-empty string, or None.")
        for name in ("root", "masks_dir"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, os.fspath(getattr(self, name)))

    def is_default(self) -> bool:
        """Whether every field is left at its default (a folder takes no options)."""
        return self == SourceOptions()

    @classmethod
    def of(cls, value: SourceOptions | Mapping[str, Any] | None) -> SourceOptions:
        """``value`` as options: itself, a mapping of fields (e.g. a Hydra ``data.source_options`` node), or the defaults for ``None``.

        Raises:
            OptionError: A key that is not a field (named, with the valid ones), or a bad value.
        """
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise OptionError(f"source option(s) {', '.join(map(repr, unknown))} unknown; the options are {', '.join(fields)}.")
        return cls(**{k: (tuple(v) if isinstance(v, list) or type(v).__name__ == "ListConfig" else v) for k, v in value.items()})

    def as_dict(self) -> dict[str, Any]:
        """The options that are set, as plain JSON values (what a database records of how its source was read)."""
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in dataclasses.asdict(self).items() if value is not None}


#: The old name of :class:`SourceOptions` (it configures every source kind, not only manifests): reading it is silent, so
#: ``from lightning_lmdb.sources.base import ManifestOptions`` keeps working; constructing it warns.
ManifestOptions = renamed_class(SourceOptions, "ManifestOptions")




@runtime_checkable
class SourceKind(Protocol):
    """What a source kind provides (see the module docstring); a module or any object with these members.

    ``NAME`` is optional (a module's last name component by default); ``labels(source, options) -> Labels`` is optional.
    """

    DESCRIPTION: str

    def accepts(self, source: Any) -> bool: ...

    def scan(self, source: Any, options: SourceOptions) -> SourceScan: ...

    def has_samples(self, source: Any, options: SourceOptions) -> bool: ...

    def classes(self, source: Any, options: SourceOptions) -> tuple[list[str], dict[str, int]]: ...


#: The registered source kinds in the order they are tried: a kind, or the module path of one not imported yet.
_KINDS: list[Any] = []
#: :func:`kind_of`'s answers: a path's (by its text, with its stat's identity) and a live object's (by ``id``).
_PATH_KINDS: dict[str, tuple[tuple[int, int, int, int], Any]] = {}
_OBJECT_KINDS: dict[int, tuple[weakref.ref, Any]] = {}
_MEMBERS = ("DESCRIPTION", "accepts", "scan", "has_samples", "classes")


def kind_name(kind: Any) -> str:
    """A source kind's name: its ``NAME``, else a module's last dotted name component (or the text of a module path)."""
    if isinstance(kind, str):
        return kind.rpartition(".")[2]
    return getattr(kind, "NAME", None) or getattr(kind, "__name__", type(kind).__name__).rpartition(".")[2]


def _checked(kind: Any) -> Any:
    missing = [name for name in _MEMBERS if not hasattr(kind, name)]
    if missing:
        raise OptionError(f"Source kind {kind_name(kind)!r} lacks {', '.join(missing)}: a source kind defines DESCRIPTION, accepts, "
                          "scan, has_samples and classes (see lightning_lmdb.sources.base.SourceKind).")
    return kind


def register_source_kind(kind: Any, *, before: str | None = None) -> Any:
    """Register a source kind: a module, an object, or a module's dotted path (imported when first needed).

    Args:
        kind: The kind (see :class:`SourceKind`). One with the name of a registered kind replaces it in its place.
        before: Try it before the kind of this name (e.g. ``"folder"``); ``None``: after every kind registered.

    Returns:
        ``kind``, so the call can decorate or be undone with :func:`unregister_source_kind`.

    Raises:
        OptionError: ``kind`` lacks a member of :class:`SourceKind`, or ``before`` names no registered kind.
    """
    if not isinstance(kind, str):
        _checked(kind)
    names = [kind_name(k) for k in _KINDS]
    if before is not None and before not in names:
        raise OptionError(f"before={before!r} names no registered source kind; they are {', '.join(map(repr, names))}.")
    name = kind_name(kind)
    if name in names and before is None:
        _KINDS[names.index(name)] = kind
    else:
        if name in names:
            del _KINDS[names.index(name)]
        at = len(_KINDS) if before is None else [kind_name(k) for k in _KINDS].index(before)
        _KINDS.insert(at, kind)
    _forget()
    return kind


def unregister_source_kind(kind: Any) -> None:
    """Remove a registered source kind (the kind, or its name); nothing happens when it is not registered."""
    name = kind if isinstance(kind, str) else kind_name(kind)
    _KINDS[:] = [k for k in _KINDS if kind_name(k) != name]
    _forget()


def _forget() -> None:
    _PATH_KINDS.clear()
    _OBJECT_KINDS.clear()


def source_kinds() -> tuple[Any, ...]:
    """The registered source kinds, in the order they are tried (each imported and checked on the first call)."""
    for i, kind in enumerate(_KINDS):
        if isinstance(kind, str):
            _KINDS[i] = _checked(importlib.import_module(kind))
    return tuple(_KINDS)


def describe_kinds(paths_only: bool = False) -> str:
    """The registered kinds' descriptions as one phrase, e.g. ``"a CSV ... manifest (...); an image folder (...); or a map-style
    Dataset (...)"``: what every "not a known source" message lists.

    Args:
        paths_only: Leave out the kinds that never accept a path (``PATHS = False``: a ``Dataset``), e.g. for the CLI.
    """
    described = [kind.DESCRIPTION for kind in source_kinds() if not paths_only or getattr(kind, "PATHS", True)]
    if not described:
        return "nothing (no source kind is registered)"
    return "; ".join(described[:-1]) + "; or " + described[-1] if len(described) > 1 else described[0]


def describe_kind(name: str) -> str:
    """The ``DESCRIPTION`` of the registered kind called ``name`` (``"a <name>"`` when none is)."""
    for i, kind in enumerate(_KINDS):
        if kind_name(kind) == name:
            if isinstance(kind, str):  # only this kind is imported (the CLI's help imports no folder kind, hence no torch)
                _KINDS[i] = kind = _checked(importlib.import_module(kind))
            return kind.DESCRIPTION
    return f"a {name}"


def __getattr__(name: str) -> Any:
    if name == "TARGET_KINDS":  # the registered target kinds' names, derived from the registry on each access
        return kind_names()
    if name == "SOURCE_KINDS":
        warnings.warn("lightning_lmdb.sources.base.SOURCE_KINDS is deprecated: read source_kinds(), add one with register_source_kind().",
                      DeprecationWarning, stacklevel=2)
        return tuple(getattr(kind, "__name__", kind_name(kind)) for kind in source_kinds())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _as_source(source: Any) -> Any:
    """A path-like source as a ``Path``; a URL (``s3://bucket/prefix``) stays its string (a ``Path`` would make it ``s3:/``)."""
    if is_remote(source):
        return source
    return Path(source).expanduser() if isinstance(source, (str, os.PathLike)) else source


#: A path modified this recently has its kind asked again each time: file times are coarse (a few ms), so a folder that
#: gains a ``metadata.csv`` within one tick of the last look would keep its mtime (as git's "racy" index entries).
_RACY_NS = 2_000_000_000


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    """What :func:`kind_of` remembers a path's kind by: its type, inode, device and modification time (``None``: missing, or
    modified within :data:`_RACY_NS`: not remembered)."""
    try:
        st = path.stat()
    except (OSError, ValueError):
        return None
    if time.time_ns() - st.st_mtime_ns < _RACY_NS:
        return None
    return st.st_mode, st.st_ino, st.st_dev, st.st_mtime_ns


def kind_of(source: Any) -> Any | None:
    """The first registered source kind that accepts ``source``; ``None`` if none does.

    The answer is remembered: a path's while its type, inode and modification time are unchanged (a folder that gains a
    ``metadata.csv`` changes its mtime), an object's while it lives; a missing path's, or one modified in the last two
    seconds, is never remembered.
    """
    given = _as_source(source)
    if isinstance(given, Path):
        key, identity = os.fspath(given), _identity(given)
        found = _PATH_KINDS.get(key)
        if found is not None and identity is not None and found[0] == identity:
            return found[1]
        kind = _first(given)
        if identity is not None:
            _PATH_KINDS[key] = (identity, kind)
        return kind
    found = _OBJECT_KINDS.get(id(given))
    if found is not None and found[0]() is given:
        return found[1]
    kind, key = _first(given), id(given)
    try:
        ref = weakref.ref(given, lambda _: _OBJECT_KINDS.pop(key, None))
    except TypeError:  # a list, a tuple ...: not remembered
        return kind
    _OBJECT_KINDS[key] = (ref, kind)
    return kind


def _first(given: Any) -> Any | None:
    return next((kind for kind in source_kinds() if kind.accepts(given)), None)


@dataclass(frozen=True)
class Labels:
    """What a source's targets are, without its samples (:func:`labels_of`)."""

    classes: list[str]
    class_to_idx: dict[str, int]
    target_kind: str
    target_names: list[str] = field(default_factory=list)


def labels_of(source: Any, options: SourceOptions | None = None) -> Labels:
    """The classes and target kind of ``source``, as cheaply as its kind allows (no image is looked at).

    Raises:
        FileNotFoundError: ``source`` is of no known kind.
    """
    kind = _kind_or_raise(source)
    given, options = _as_source(source), options or SourceOptions()
    if hasattr(kind, "labels"):
        return kind.labels(given, options)
    classes, class_to_idx = kind.classes(given, options)
    return Labels(list(classes), dict(class_to_idx), "class" if classes else "none")


def _kind_or_raise(source: Any) -> Any:
    kind = kind_of(source)
    if kind is None:
        reason = unknown_reason(source)
        what = "" if reason.startswith("does not exist") else "is not a known source: "
        raise FileNotFoundError(f"Source {redact(str(source))!r} {what}{reason} Pass the folder that holds your images, or a manifest "
                                "listing them.")
    return kind


def unknown_reason(source: Any) -> str:
    """Why no kind accepts ``source``: a sentence that lists what the registered kinds accept (:func:`describe_kinds`), either
    ``"does not exist; a source is one of: ..."`` (to follow the path's name) or ``"it is a file that is none of: ..."``."""
    given = _as_source(source)
    if is_remote(given):
        return (f"is a URL of object storage that is none of: {describe_kinds(paths_only=True)}. Under {given.split('://', 1)[0]}:// a "
                "source is a prefix (an ImageFolder-layout or flat folder of images, e.g. s3://bucket/train/; a YOLO or Pascal VOC "
                "layout), a CSV / TSV / JSON Lines manifest, a COCO JSON or a YOLO data.yaml.")
    if not isinstance(given, Path):
        what = f"it is a {type(given).__name__}, which is none of"
    elif not given.exists():
        what = "does not exist; a source is one of"
    else:
        what = f"it is a {'file' if given.is_file() else 'folder' if given.is_dir() else 'path'} that is none of"
    return f"{what}: {describe_kinds(paths_only=isinstance(given, Path))}."


def scan_source(source: Any, options: SourceOptions | None = None) -> SourceScan:
    """Scan ``source`` with the first registered source kind that accepts it (:func:`kind_of`).

    Args:
        source: A folder, a manifest file, or whatever another source kind accepts.
        options: How to read it (default :class:`SourceOptions`).

    Raises:
        FileNotFoundError: ``source`` is of no registered kind (the message lists what each accepts).
        SourceError: ``source`` holds no images, or a manifest is malformed (the kind's own message).
    """
    return _kind_or_raise(source).scan(_as_source(source), options or SourceOptions())


@dataclass(frozen=True)
class SourceFile:
    """One image file of a scanned source.

    Attributes:
        path: Absolute path of the file (an object's URL on object storage).
        relpath: Path relative to the source root, with ``/`` separators (an absolute path for a manifest row that
            names one outside the root).
        target: The sample's :data:`Target`: a class index, ``NO_TARGET`` for a source without labels, a tuple of class
            indices (multi-label) or of floats (regression).
        size: File size in bytes at scan time.
        mtime_ns: Modification time in nanoseconds at scan time.
        split: The split the source puts it in (a manifest's split column), ``""`` when it says none.
        origin: Where the source lists it, for error messages (e.g. ``"labels.csv line 7"``); ``""`` for a folder.
        mask: Absolute path of its segmentation mask file (target kind ``"mask"``), ``""`` without one.
        mask_size: The mask file's size in bytes at scan time.
        mask_mtime_ns: The mask file's modification time in nanoseconds at scan time.
        etag: An object's ETag as its listing gave it (object storage: ``path`` is a URL, ``mtime_ns`` is 0, and the size
            with the ETag say whether it changed; it is fetched only while it still has this ETag); ``""`` for a local file.
        mask_etag: The mask object's ETag as its listing gave it (its ``mask`` a URL: ``mask_mtime_ns`` is 0, and ``mask_size`` with
            this ETag say whether it changed; it is fetched only while it still has it); ``""`` for a local mask, without one, or
            for a mask object the listing did not find (the build reports it).
    """

    path: str
    relpath: str
    target: Target
    size: int
    mtime_ns: int
    split: str = ""
    origin: str = ""
    mask: str = ""
    mask_size: int = 0
    mask_mtime_ns: int = 0
    etag: str = ""
    mask_etag: str = ""


@dataclass(frozen=True)
class SourceScan:
    """The result of scanning a source.

    Attributes:
        root: The resolved source (the folder the relative paths are relative to); on object storage its URL, a string
            (``s3://bucket/train``, no trailing ``/``: :mod:`lightning_lmdb.sources.objectstore`).
        classes: Class names in index order (empty without labels).
        class_to_idx: Class name to index.
        files: Samples in the source's order (ImageFolder order for a folder, the rows' order for a manifest).
        special: ``(relpath, reason)`` of entries that cannot be samples: files named like images that are not regular
            files, manifest rows with a bad label or path (the reason names the row). The builder refuses them, or
            skips and records them with ``on_error="skip"``.
        target_kind: One of :data:`TARGET_KINDS`; ``None``: ``"class"`` with classes, else ``"none"``.
        target_names: The K names of a regression target (its columns).
        identity: Text that says how the source was read (a manifest's columns, kind and classes), folded into the
            fingerprint; ``""`` for a folder.
        split_names: The split names the files carry, in order of first appearance (``[]`` when the source has no
            splits); computed from ``files`` when not given.
        targets_from_records: The targets are known only once each sample is read (a packed ``Dataset``): the readers
            return them with the records, and ``files``' targets are placeholders.
        target_meta: What the source says of its targets as a whole, as JSON values, stored in the database's header
            by the target kind (e.g. detection: COCO's category ids in class order, the degenerate boxes dropped).
    """

    root: Path
    classes: list[str]
    class_to_idx: dict[str, int]
    files: list[SourceFile]
    special: list[tuple[str, str]] = field(default_factory=list)
    target_kind: str | None = None
    target_names: list[str] = field(default_factory=list)
    identity: str = ""
    split_names: list[str] | None = None
    targets_from_records: bool = False
    target_meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.target_kind is None:
            object.__setattr__(self, "target_kind", "class" if self.classes else "none")
        if self.split_names is None:  # kept by dataclasses.replace: a shard's range of the files has the whole scan's splits
            object.__setattr__(self, "split_names", list(dict.fromkeys(f.split for f in self.files if f.split)))

    def split_indices(self, files: list[SourceFile]) -> Any:
        """``files``' splits as ``uint8`` indices into :attr:`split_names` (a database's ``meta/splits``); ``None`` without splits."""
        if not self.split_names:
            return None
        import numpy as np

        index = {name: i for i, name in enumerate(self.split_names)}
        return np.array([index[f.split] for f in files], dtype=np.uint8)

    @property
    def total_bytes(self) -> int:
        """Sum of the file sizes (masks included)."""
        return sum(f.size + f.mask_size for f in self.files)

    def fingerprint(self, stop: int | None = None) -> str:
        """A digest of relative paths, targets, sizes and mtimes of ``files[:stop]``.

        Any file added, removed, renamed, relabelled or modified changes it.
        """
        return PrefixFingerprint(self.files, self.identity, self.root).advance(len(self.files) if stop is None else stop)


class PrefixFingerprint:
    """Fingerprints of growing prefixes of a file list, computed incrementally (each file hashed once).

    A file's split is hashed only when it has one, and ``identity`` only when given, so a folder's
    fingerprints are those of earlier versions (its databases stay current). A mask is hashed by its path
    relative to ``root`` when it lies inside it (like the images: moving the whole set keeps it current).
    """

    def __init__(self, files: list[SourceFile], identity: str = "", root: Path | None = None):
        self._files, self._done, self._digest = files, 0, hashlib.sha256()
        self._root = None if root is None else f"{root}{os.sep}"
        if identity:
            self._digest.update(f"{identity}\0".encode("utf-8", "surrogatepass"))

    def advance(self, stop: int) -> str:
        """The fingerprint of ``files[:stop]``; ``stop`` must not decrease between calls."""
        for f in self._files[self._done : stop]:
            split = f"\0{f.split}" if f.split else ""
            where = f.mask[len(self._root):] if self._root and f.mask.startswith(self._root) else f.mask
            mask = f"\0{where}\0{f.mask_size}\0{f.mask_mtime_ns}" if f.mask else ""
            etag = f"\0etag {f.etag}" if f.etag else ""  # an object's; a local file has none (its fingerprint is as before)
            if f.mask_etag:  # a mask object's, likewise
                etag += f"\0mask etag {f.mask_etag}"
            self._digest.update(f"{f.relpath}\0{f.target}\0{f.size}\0{f.mtime_ns}{split}{mask}{etag}\n".encode("utf-8", "surrogatepass"))
        self._done = max(self._done, stop)
        return self._digest.copy().hexdigest()


def not_regular_reason(mode: int) -> str:
    kind = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device", stat.S_IFDIR: "a folder"}.get(stat.S_IFMT(mode), "not a regular file")
    return f"is {kind}, not an image file; it is never opened (reading it could block forever). Remove it or rename it."


def read_file(path: str | os.PathLike[str], etag: str | None = None) -> bytes:
    """Read a whole image file, refusing anything but a regular file without ever blocking on it; or an object.

    The file is opened with ``O_NONBLOCK`` (so a FIFO does not wait for a writer) and checked with
    ``fstat`` before any read. A URL (``s3://bucket/key``) is one GET of the object
    (:func:`lightning_lmdb.remote.objects.read`), with ``etag`` (the one its listing gave) as its ``If-Match`` precondition.

    Raises:
        NotRegularFileError: A FIFO, socket, device or folder.
        RemoteChangedError: The object's ETag is no longer ``etag`` (it changed since the scan listed it).
        OSError: It cannot be opened or read (:class:`~lightning_lmdb.errors.RemoteError` for an object).
    """
    if is_remote(path):
        from lightning_lmdb.remote import objects

        return objects.read(path, etag=etag or None)  # type: ignore[arg-type]
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(os.fspath(path), not_regular_reason(st.st_mode))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


register_source_kind("lightning_lmdb.sources.manifest")
register_source_kind("lightning_lmdb.sources.coco")
register_source_kind("lightning_lmdb.sources.yolo")
register_source_kind("lightning_lmdb.sources.voc")
register_source_kind("lightning_lmdb.sources.folder")
register_source_kind("lightning_lmdb.sources.dataset")
