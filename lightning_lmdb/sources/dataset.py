"""The Dataset source kind: any map-style dataset packed as it is, e.g. ``build_lmdb(my_dataset, "train.lmdb", version=1)``.

**What it accepts.** Any object with ``__len__`` and ``__getitem__`` (a ``torch.utils.data.Dataset``, a Hugging Face
``datasets.Dataset``, a list ...) that is not a path, a string, bytes or a mapping. ``dataset[i]`` for ``i`` in
``range(len(dataset))`` is one sample:

* ``(image, target)``, or a mapping with an ``image`` (or ``img``) key and an optional ``label`` (or ``labels``) key
  (Hugging Face style); any other value is an image without a target.
* The image: a path (``str`` / ``os.PathLike``, read as a file is), the bytes of an encoded image file, a PIL image, a
  ``uint8`` ``H x W`` or ``H x W x C`` numpy array, a ``uint8`` ``C x H x W`` (or ``H x W``) torch tensor (C: 1 to 4),
  or a Hugging Face undecoded image (``{"bytes": ..., "path": ...}``). Pixels (PIL, arrays, tensors) are encoded
  losslessly as PNG and then stored like a PNG file, so every storage mode applies: ``auto`` stores the exact pixels,
  ``encoded`` the PNG, ``decoded`` the pixels. What a dataset built from it serves is the image converted to RGB
  (``PIL.Image.convert("RGB")``). Another dtype than ``uint8`` is a bad sample (the message says how to convert it).
* The target: an ``int`` (a class index), a ``str`` (a class name), a list / tuple of them (multi-label), a ``float``
  or a list / tuple of floats, or a 0-d / 1-d float tensor or array (regression), a 0-d integer tensor (an int), or
  ``None`` (no target).

**Reading.** By the builder's reader processes (the dataset reaches them through the pool's initializer: inherited
with ``fork``, pickled once per reader otherwise) or in the building process with ``workers=0``. A sample whose
``__getitem__`` raises, whose image does not decode or whose target is malformed is a bad sample: ``on_error="raise"``
names its index (a :class:`~lightning_lmdb.errors.BuildError`), ``"skip"`` leaves it out, recorded as ``"17"``.

**Targets** are known only once the samples are read (``SourceScan.targets_from_records``): each record's target is
committed with it (its progress entry), so a killed build resumes with the targets of the records it had committed. The
kind is ``target_kind=`` when given, else the first sample's decides (int or name: ``class``; a list: ``multilabel``; a
float or float list / tensor: ``regression``; ``None``: ``none``); a later target that does not fit it is a bad sample
(set ``target_kind=`` when the first sample misleads). The classes are ``classes=`` when given, else the dataset's
``classes`` attribute (torchvision datasets), else the names of a Hugging Face dataset's ``features["label"]``, else the
sorted names found (names) or ``"0"`` .. ``"N"`` (indices, N the largest). A regression target of K numbers gets the
names ``value0`` .. ``value{K-1}``. :func:`labels` knows them before a build, as cheaply as it can.

**When it is rebuilt: its identity** (:func:`identity`, deterministic in every process: no ``hash()``, ``id()`` or
``repr``). Its database records, and the DataModule names its cached database by, the dataset's class and length, the
indices of a ``Subset`` (of a ``Subset`` ..., and the parts of a ``ConcatDataset``, recursively), a hash of the bytes of
:data:`IDENTITY_SAMPLES` samples at fixed positions (image and target, as a build reads them; the first read twice), and your
``version=`` (and ``target_kind`` / the classes). So two folds of one dataset (two ``Subset`` objects of one length) are two databases,
and an edit that changes one of those samples rebuilds; another edit of the same length does not: change ``version`` when the
data changes (a dataset without one warns once). A dataset that returns other bytes when a sample is read again (random
transforms) warns and is known by its class, length, indices and version alone. A database built from a dataset before its
samples and indices entered the identity is rebuilt once (the DataModule's cached one under a new name: delete the old one).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import sys
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from lightning_lmdb.codec.storage import DEFAULT_MAX_PIXELS, ImageDecodeError, encode_record
from lightning_lmdb.errors import BuildError, LightningLMDBError, NotRegularFileError, OptionError, SourceError
from lightning_lmdb.sources.base import NO_TARGET, Labels, SourceFile, SourceOptions, SourceScan, Target, read_file
from lightning_lmdb.targets import Boxes, target_kind

__all__ = ["DESCRIPTION", "DatasetScan", "NAME", "PATHS", "FoundTargets", "RecordTargets", "accepts", "classes", "dataset_of",
           "has_samples", "identity", "labels", "read_sample", "sample_image", "sample_parts", "scan"]

#: The keys of a mapping sample that hold its image, then its target (the first one present is used).
IMAGE_KEYS = ("image", "img")
LABEL_KEYS = ("label", "labels")
#: PIL modes written to PNG as they are (others are converted to RGB first: what a dataset serves anyway).
_PNG_MODES = frozenset({"1", "L", "LA", "P", "RGB", "RGBA"})
#: Class indices without ``classes=`` are refused from this size on (is it the label?).
_MAX_INDEX_CLASSES = 1_000_000
_OPTIONS_FOR_MANIFESTS = ("root", "path_column", "label_column", "split_column", "label_sep", "mask_column", "masks_dir", "ignore_index")
_SET_KIND = "set target_kind= ('class', 'multilabel', 'regression' or 'none') if that is wrong"
#: How many samples' bytes enter a dataset's :func:`identity` (at fixed positions spread over it; the first is read twice).
IDENTITY_SAMPLES = 4
#: The dataset classes already warned (once per process) that they have no ``version``.
_UNVERSIONED_WARNED: set[str] = set()
#: The samples' digest of each dataset object seen (by ``id``, checked by a weak reference and its length): read once per process.
_SAMPLE_DIGESTS: dict[int, tuple[weakref.ref[Any], int, str | None]] = {}


@dataclass(frozen=True)
class DatasetScan(SourceScan):
    """A scanned map-style dataset: one :class:`~lightning_lmdb.sources.base.SourceFile` per index (relpath ``"17"``, a
    placeholder target), the targets coming with the records (``targets_from_records``).

    Attributes:
        dataset: The dataset itself (what the readers read).
        given_kind: ``target_kind=`` as given (``None``: the first sample decides); ``target_kind`` of the scan is provisional.
    """

    dataset: Any = field(default=None, repr=False, compare=False)
    given_kind: str | None = None


#: This source kind's name and what it accepts (:mod:`lightning_lmdb.sources.base`).
NAME = "datasource"
DESCRIPTION = "a map-style Dataset (any object with len() and [i], e.g. a torch or Hugging Face Dataset)"
#: It never accepts a path (the CLI's help and the message about a path that is no source leave it out).
PATHS = False


def accepts(source: object) -> bool:
    """Whether ``source`` is a map-style dataset: it has ``__len__`` and ``__getitem__`` and is no path, text, bytes or mapping."""
    if isinstance(source, (str, bytes, bytearray, memoryview, os.PathLike, Mapping)):
        return False
    return hasattr(type(source), "__len__") and hasattr(type(source), "__getitem__")


def scan(source: Any, options: SourceOptions | None = None) -> DatasetScan:
    """The source-kind entry (:mod:`lightning_lmdb.sources.base`): one file per index, nothing read yet.

    Raises:
        SourceError: The dataset has no length or no samples, or is an ``IterableDataset``.
        OptionError: A manifest-only option, or ``classes`` with ``target_kind`` ``"regression"`` / ``"none"``.
    """
    options = options or SourceOptions()
    count = _length(source)
    if count == 0:
        raise SourceError(f"The dataset {_name(source)} is empty (len() is 0): nothing to build.")
    given = _given_classes(source, options)
    name = _name(source)
    known = json.dumps({"dataset": json.loads(identity(source, options.version)), "target_kind": options.target_kind, "classes": given},
                       sort_keys=True, ensure_ascii=False)
    files = [SourceFile(f"{name}[{i}]", str(i), NO_TARGET, 0, 0) for i in range(count)]
    return DatasetScan(root=Path(f"<dataset {name}>"), classes=list(given or []), class_to_idx={c: k for k, c in enumerate(given or [])},
                       files=files, target_kind=options.target_kind, identity=known, targets_from_records=True, dataset=source,
                       given_kind=options.target_kind)


def identity(source: Any, version: Any = None) -> str:
    """What tells the dataset ``source`` from another, as JSON text: the same in every process and run for the same data.

    Its class and length, the indices of a ``Subset`` and the parts of a ``ConcatDataset`` (recursively), a digest of the
    bytes (image and target) of :data:`IDENTITY_SAMPLES` samples at fixed positions (``None`` when the first of them read twice
    differs: random transforms; a warning says so), and ``version``. The samples are read once per dataset object and process.
    Without a ``version`` it warns, once per dataset class and process, that other edits of the same length go unseen.
    """
    name = _name(source)
    if version is None and name not in _UNVERSIONED_WARNED:
        _UNVERSIONED_WARNED.add(name)
        warnings.warn(f"The dataset {name} has no version: its database is rebuilt when its length, its indices or one of the "
                      f"{IDENTITY_SAMPLES} samples hashed for its identity change, not on another edit of the same length. Pass "
                      "version= (LMDBDataModule: source_options={'version': 1}, Hydra: data.source_options.version=1) and change it "
                      "when its data changes.", stacklevel=2)
    return json.dumps({"structure": _structure(source), "samples": _samples_digest(source), "version": version}, sort_keys=True,
                      ensure_ascii=False, default=str)


def _structure(source: Any) -> dict[str, Any]:
    """Class and length, and recursively a ``Subset``'s indices (a digest) and dataset, or a ``ConcatDataset``'s parts."""
    node: dict[str, Any] = {"class": f"{type(source).__module__}.{type(source).__qualname__}", "length": _length_or_none(source)}
    inner, indices = getattr(source, "dataset", None), getattr(source, "indices", None)
    if inner is not None and indices is not None:  # a torch Subset (or any view of that shape)
        try:
            node["indices"] = hashlib.blake2b(np.asarray(indices, dtype=np.int64).tobytes(), digest_size=16).hexdigest()
        except (TypeError, ValueError):
            node["indices"] = None
        node["of"] = _structure(inner)
    parts = getattr(source, "datasets", None)
    if isinstance(parts, (list, tuple)) and hasattr(source, "cumulative_sizes"):  # a torch ConcatDataset
        node["parts"] = [_structure(part) for part in parts]
    return node


def _length_or_none(source: Any) -> int | None:
    try:
        return len(source)
    except TypeError:
        return None


def _samples_digest(source: Any) -> str | None:
    """A digest of the bytes of :data:`IDENTITY_SAMPLES` samples at fixed positions, read once per dataset object and process;
    ``None`` (with a warning) when the first one reads differently twice."""
    count = len(source)
    cached = _SAMPLE_DIGESTS.get(id(source))
    if cached is not None and cached[0]() is source and cached[1] == count:
        return cached[2]
    taken = min(IDENTITY_SAMPLES, count)
    positions = sorted({(count - 1) * j // max(taken - 1, 1) for j in range(taken)})
    digests = [_sample_digest(source, position) for position in positions]
    found: str | None = hashlib.blake2b(b"".join(digests), digest_size=16).hexdigest()
    if _sample_digest(source, positions[0]) != digests[0]:
        found = None
    if found is None:
        warnings.warn(f"The dataset {_name(source)} returned other bytes when dataset[{positions[0]}] was read again (random "
                      "transforms?): its database is known by its class, length, indices and version alone, and holds what one read "
                      "returned. Pack it without its random transforms (give them to the DataModule as train_transform=), and "
                      "change version= when its data changes.", stacklevel=3)
    try:
        _SAMPLE_DIGESTS[id(source)] = (weakref.ref(source), count, found)
    except TypeError:  # no weak reference to it (a list): read again next time
        pass
    return found


def _sample_digest(source: Any, index: int) -> bytes:
    """The digest of ``source[index]``'s image and target, as a build reads them (the error's type for a bad sample)."""
    digest = hashlib.blake2b(digest_size=16)
    try:
        image, target = sample_parts(source[index])
        found = sample_image(image)
        if isinstance(found, Image.Image):
            digest.update(f"{found.mode} {found.size} {found.getpalette() if found.mode == 'P' else ''}".encode())
            found = found.tobytes()
        digest.update(found)
        digest.update(json.dumps(_plain_target(target)).encode())
    except Exception as exc:  # noqa: BLE001 - a bad sample is the build's to report; here it is known by its error's type
        digest.update(f"error {type(exc).__module__}.{type(exc).__qualname__}".encode())
    return digest.digest()


def has_samples(source: Any, options: SourceOptions | None = None) -> bool:
    """Whether the dataset has at least one sample (its length)."""
    return _length(source) > 0


def classes(source: Any, options: SourceOptions | None = None) -> tuple[list[str], dict[str, int]]:
    """The classes known without reading a sample: ``classes=``, the dataset's ``classes``, a Hugging Face label's names
    (none when they are found only in the samples: see :func:`labels`)."""
    given = _given_classes(source, options or SourceOptions()) or []
    return list(given), {c: k for k, c in enumerate(given)}


def labels(source: Any, options: SourceOptions | None = None, *, read_all: bool = True,
           max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Labels | None:
    """The classes and target kind of a database built from the dataset ``source``, as cheaply as they can be known.

    The kind is ``target_kind=``, else the first good sample's (one sample read, as a build's first record decides); a
    regression target's names come from that sample's length; the classes are ``classes=`` or the dataset's own
    (:func:`classes`). Classes found only in the samples (names, or indices without ``classes``) need every sample read
    once, in this process, as a build reads them (bad samples left out): done with ``read_all``, else ``None`` is returned.

    Raises:
        BuildError: Every sample is bad (``read_all``, when the classes are found only in the samples).
    """
    options = options or SourceOptions()
    given = classes(source, options)[0]
    fitting = RecordTargets(options.target_kind, given or None)
    if fitting.kind in (None, "regression"):
        for i in range(len(source)):
            _, value, _, raw = read_sample(source, (i, str(i), "check", max_pixels, None, 0))
            if value is not None and fitting.check(raw) is None:
                break
    kind = fitting.kind or "none"
    if kind in ("none", "regression"):
        return Labels([], {}, kind, [f"value{k}" for k in range(fitting.width or 0)] if kind == "regression" else [])
    if given:
        return Labels(given, {c: k for k, c in enumerate(given)}, kind)
    if not read_all:
        return None
    found = scan(source, options)
    fitting = RecordTargets.of(found)
    raws = []
    for i in range(len(source)):
        _, value, _, raw = read_sample(source, (i, str(i), "check", max_pixels, None, 0))
        if value is not None and fitting.check(raw) is None:
            raws.append(raw)
    if not raws:
        raise BuildError(f"Every sample of {str(found.root)!r} is bad: no classes to find. Fix the dataset's samples "
                         f"(lightning-lmdb build reports each one's reason), or pass classes= in source_options.")
    done = RecordTargets.of(found).finish(raws)
    return Labels(list(done.classes), {c: k for k, c in enumerate(done.classes)}, done.kind, list(done.target_names))


def dataset_of(scan: SourceScan) -> Any | None:
    """The dataset a scan's samples are read from (``None``: the scan lists files)."""
    return scan.dataset if isinstance(scan, DatasetScan) else None


def _name(source: Any) -> str:
    return type(source).__qualname__


def _length(source: Any) -> int:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(source, torch.utils.data.IterableDataset):
        raise SourceError(f"{_name(source)} is an IterableDataset: it has no random access, so it cannot be packed (or resumed). "
                          "Pack a map-style dataset (with __len__ and __getitem__), or write its images to a folder first.")
    try:
        return len(source)
    except TypeError as exc:
        raise SourceError(f"The dataset {_name(source)} has no length ({exc}); a map-style dataset defines __len__.") from None


def _given_classes(source: Any, options: SourceOptions) -> list[str] | None:
    """``classes=``, else the dataset's own class names (``classes`` attribute, Hugging Face label names), else ``None``."""
    unused = [f"{name}={getattr(options, name)!r}" for name in _OPTIONS_FOR_MANIFESTS if getattr(options, name) is not None]
    if unused:
        raise OptionError(f"{', '.join(unused)}: these options read a manifest; they do not apply to a dataset ({_name(source)}). "
                          "Leave them unset.")
    if options.target_kind is not None and target_kind(options.target_kind).in_record:
        raise OptionError(f"target_kind={options.target_kind!r} does not apply to a dataset ({_name(source)}) yet; pack segmentation data "
                          "from a manifest "
                          "with a mask column or an images folder with masks_dir=.")
    if options.classes is not None:
        if options.target_kind in ("regression", "none"):
            raise OptionError(f"classes={list(options.classes)!r} does not apply to target_kind={options.target_kind!r}; leave it unset.")
        return list(options.classes)
    owner = source.dataset if hasattr(source, "dataset") and hasattr(source, "indices") else None  # a torch Subset
    for candidate in (getattr(source, "classes", None), getattr(owner, "classes", None), _label_names(source)):
        if _names(candidate):
            return list(candidate)
    return None


def _label_names(source: Any) -> Any:
    """The class names of a Hugging Face dataset's label feature (a ``ClassLabel``, or a sequence of one), else ``None``."""
    features = getattr(source, "features", None)
    if not isinstance(features, Mapping):
        return None
    for key in LABEL_KEYS:
        if key in features:
            feature = features[key]
            return getattr(feature, "names", None) or getattr(getattr(feature, "feature", None), "names", None)
    return None


def _names(value: Any) -> bool:
    """Whether ``value`` is a usable list of class names (non-empty, distinct, non-empty strings)."""
    return (isinstance(value, (list, tuple)) and bool(value) and all(isinstance(c, str) and c for c in value)
            and len(set(value)) == len(value))


# --- reading one sample (in a reader process) -------------------------------------------------------------------------


class _BadSample(LightningLMDBError, ValueError):
    """A sample that cannot be packed; ``args[0]`` is the reason."""


def read_sample(dataset: Any, task: tuple[int, str, str, int | None, int | None, int]) -> tuple[int, bytes | None, int | None, Any]:
    """Read one sample of ``dataset`` and make its record, as :func:`lightning_lmdb.build.readers._read_one` does of a file.

    Args:
        dataset: The dataset.
        task: ``(index, key, storage or "check", max_pixels, resize, quality)``; ``key`` is the sample's index as text.

    Returns:
        ``(index, value, codec, target)`` (with ``"check"``: ``value`` is ``b""`` and ``codec`` ``None``), or
        ``(index, None, None, reason)`` for a bad sample.
    """
    index, key, storage, max_pixels, resize, quality = task
    try:
        sample = dataset[int(key)]
    except Exception as exc:  # noqa: BLE001 - the dataset's own error, reported as this sample's problem
        return index, None, None, f"dataset[{key}] raised {type(exc).__name__}: {exc}"
    try:
        image, target = sample_parts(sample)
        target = _plain_target(target)
        found = sample_image(image)
        data = _png(found) if isinstance(found, Image.Image) else found
        if isinstance(target, dict) and "boxes" in target and target.get("image_size") is None:  # boxes: the image they are on
            width, height = (found if isinstance(found, Image.Image) else Image.open(io.BytesIO(found))).size
            target["image_size"] = [height, width]
    except _BadSample as exc:
        return index, None, None, str(exc.args[0])
    except NotRegularFileError as exc:
        return index, None, None, exc.reason
    except OSError as exc:
        return index, None, None, f"cannot read its image file {str(exc.filename or image)!r} ({exc.strerror or exc})."
    name = f"{type(dataset).__qualname__}[{key}]"
    try:
        if storage == "check":  # validation only (find_bad_files, the raw backend's read of every sample)
            encode_record(data, "encoded", max_pixels=max_pixels, name=name)
            return index, b"", None, target
        codec, value = encode_record(data, storage, max_pixels=max_pixels, name=name, resize=resize, quality=quality)
    except ImageDecodeError as exc:
        return index, None, None, exc.reason
    return index, value, codec, target


def sample_parts(sample: Any) -> tuple[Any, Any]:
    """A sample's ``(image, target)``."""
    if isinstance(sample, Mapping):
        key = next((k for k in IMAGE_KEYS if k in sample), None)
        if key is None:
            shown = ", ".join(map(repr, list(sample)[:10]))
            raise _BadSample(f"the sample is a mapping without an 'image' key (its keys: {shown}); return {{'image': ..., 'label': ...}} "
                             "or (image, target).")
        return sample[key], next((sample[k] for k in LABEL_KEYS if k in sample), None)
    if isinstance(sample, (tuple, list)):
        if len(sample) != 2:
            raise _BadSample(f"the sample is a {type(sample).__name__} of {len(sample)} items; return (image, target), or a mapping "
                             "with 'image' and 'label' keys.")
        return sample[0], sample[1]
    return sample, None


def sample_image(image: Any) -> Image.Image | bytes:
    """A sample's image as a PIL image (pixels: a PIL image, an array, a tensor) or as the bytes of its image file."""
    if isinstance(image, (str, os.PathLike)):
        return read_file(image)
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, Mapping) and ("bytes" in image or "path" in image):  # a Hugging Face Image feature with decode=False
        if image.get("bytes") is not None:
            return bytes(image["bytes"])
        if image.get("path"):
            return read_file(image["path"])
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(image, torch.Tensor):
        if image.dtype != torch.uint8:
            raise _BadSample(f"the image is a {image.dtype} tensor; convert it to torch.uint8 (values 0-255), e.g. "
                             "(x * 255).round().clamp(0, 255).to(torch.uint8) for values in [0, 1].")
        if image.ndim == 3 and image.shape[0] in (1, 2, 3, 4):
            image = image.permute(1, 2, 0)
        elif image.ndim != 2:
            raise _BadSample(f"the image is a tensor of shape {tuple(image.shape)}; expected C x H x W (C from 1 to 4) or H x W.")
        return _pil_of_array(image.detach().cpu().numpy())
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            raise _BadSample(f"the image is a {image.dtype} array; convert it to uint8 (values 0-255), e.g. "
                             "(x * 255).round().clip(0, 255).astype(np.uint8) for values in [0, 1].")
        if not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (1, 2, 3, 4))):
            raise _BadSample(f"the image is an array of shape {image.shape}; expected H x W x C (C from 1 to 4) or H x W.")
        return _pil_of_array(image)
    raise _BadSample(f"the image is a {type(image).__module__}.{type(image).__qualname__}; expected a path, the bytes of an image "
                     "file, a PIL image, a uint8 array (H x W x C) or a uint8 tensor (C x H x W).")


def _pil_of_array(pixels: np.ndarray) -> Image.Image:
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    return Image.fromarray(np.ascontiguousarray(pixels))


def _png(image: Image.Image) -> bytes:
    """A PIL image as a fast-to-write PNG (lossless); a mode PNG lacks is converted to RGB first (what is served anyway)."""
    try:
        if image.mode not in _PNG_MODES:
            image = image.convert("RGB")
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=1)
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise _BadSample(f"its PIL image cannot be read or written as PNG ({type(exc).__name__}: {exc}).") from None
    return buffer.getvalue()


_TARGET_HELP = ("return an int (class index), a str (class name), a list of them (multi-label), a float or a list / tensor of "
                "floats (regression), a dict of 'boxes' and 'labels' (detection), or None (no target)")


def _plain_target(target: Any) -> Any:
    """A sample's target as plain JSON values: ``None``, an int, a float, a str, or a list of those."""
    if target is None or isinstance(target, str):
        return target
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(target, torch.Tensor):
        if target.dtype == torch.bool or target.is_complex() or target.ndim > 1:
            raise _BadSample(f"its target is a {target.dtype} tensor of shape {tuple(target.shape)}; {_TARGET_HELP}.")
        return target.detach().cpu().tolist()
    if isinstance(target, (np.ndarray, np.generic)):
        if target.dtype.kind not in "iuf" or target.ndim > 1:
            raise _BadSample(f"its target is a {target.dtype} array of shape {target.shape}; {_TARGET_HELP}.")
        return target.tolist()
    if isinstance(target, (list, tuple)):
        return [_plain_item(item) for item in target]
    if isinstance(target, Boxes):
        target = target.to_json()
    if isinstance(target, Mapping) and "boxes" in target:  # detection: {"boxes": [[x1, y1, x2, y2], ...], "labels": [...], ...}
        return {str(key): _plain_nested(value) for key, value in target.items()}
    return _plain_item(target)


def _plain_nested(value: Any) -> Any:
    """A value of a structured target as plain JSON values (tensors and arrays as nested lists)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain_nested(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain_nested(v) for k, v in value.items()}
    return _plain_item(value)


def _plain_item(value: Any) -> int | float | str:
    if isinstance(value, np.generic) and value.dtype.kind in "iuf":
        value = value.item()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.ndim == 0 and value.dtype != torch.bool:
        value = value.item()
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _BadSample(f"its target {value!r} is a {type(value).__name__}; {_TARGET_HELP}.")
    return int(value) if isinstance(value, int) else float(value)


# --- the targets of the records (in the building process) ------------------------------------------------------------


class FoundTargets(NamedTuple):
    """A build's targets: the kind, the classes in index order, the K names of a regression target, one target per record."""

    kind: str
    classes: list[str]
    target_names: list[str]
    targets: list[Target]


#: The kind a target of each shape gives when the first sample decides (see :func:`_shape`).
_INFERRED = {"none": "none", "int": "class", "name": "class", "float": "regression", "ints": "multilabel", "names": "multilabel",
             "empty": "multilabel", "floats": "regression", "boxes": "boxes"}
_FITS = {"class": ("int", "name"), "multilabel": ("ints", "names", "empty"), "regression": ("int", "float", "ints", "floats")}
_SHAPE_WORDS = {"none": "no target", "int": "a class index", "name": "a class name", "float": "a number", "ints": "a list of class "
                "indices", "names": "a list of class names", "empty": "an empty list", "floats": "a list of numbers"}


def _shape(raw: Any) -> str:
    """What a plain target looks like: ``none``, ``int``, ``name``, ``float``, ``ints``, ``names``, ``empty``, ``floats`` or ``other``."""
    scalar = {type(None): "none", int: "int", float: "float", str: "name"}  # by exact type: a bool is none of them
    if isinstance(raw, dict) and "boxes" in raw:
        return "boxes"
    if not isinstance(raw, list) or not raw:
        return scalar.get(type(raw), "other") if not isinstance(raw, list) else "empty"
    kinds = {type(v) for v in raw}
    return "ints" if kinds == {int} else "names" if kinds == {str} else "floats" if kinds <= {int, float} else "other"


class RecordTargets:
    """Checks each record's target against the kind (the given one, else the first target's) and makes the build's targets.

    The builder :meth:`check`\\ s every target as its record arrives (a misfit is a bad sample), after feeding it the
    targets of the records a resumed build had committed; :meth:`finish` makes the targets of every record.

    Args:
        kind: ``target_kind=`` as given; ``None``: the first target decides.
        classes: The class names in index order when known before the build (``classes=``, the dataset's), else ``None``.
    """

    def __init__(self, kind: str | None, classes: Sequence[str] | None):
        self.kind, self.given_kind = kind, kind
        self.classes = list(classes) if classes else None
        self.known = {c: k for k, c in enumerate(self.classes or [])}
        self.first: Any = None  # the first target: named when it decided the kind
        self.flavour: str | None = None  # "int" or "name": how the class targets name their classes
        self.width: int | None = None  # K of a regression target
        self.top = -1  # the largest class index seen

    @classmethod
    def of(cls, scan: SourceScan) -> RecordTargets:
        """The checker of ``scan``'s records (a :class:`DatasetScan`)."""
        return cls(getattr(scan, "given_kind", None), scan.classes or None)

    def check(self, raw: Any) -> str | None:
        """``None`` when ``raw`` (a record's plain target) fits, remembering what it decides; else why not (a bad sample)."""
        shape = _shape(raw)
        kind = self.kind or _INFERRED.get(shape)
        if kind is None:
            return f"its target {_shown(raw)} is not one of the supported targets: {_TARGET_HELP}."
        problem = self._misfit(kind, shape, raw)
        if problem is not None:
            hint = (f" (the first target, {_shown(self.first)}, made the kind {kind!r}; {_SET_KIND})" if self.given_kind is None
                    else f" (target_kind={kind!r})")
            return f"its target {_shown(raw)} {problem}{hint}."
        if self.kind is None:
            self.kind, self.first = kind, raw
        if kind in ("class", "multilabel"):
            items = raw if isinstance(raw, list) else [raw]
            if items:
                self.flavour = "int" if isinstance(items[0], int) else "name"
                if self.flavour == "int":
                    self.top = max(self.top, *items)
        elif kind == "regression":
            self.width = len(raw) if isinstance(raw, list) else 1
        return None

    def _misfit(self, kind: str, shape: str, raw: Any) -> str | None:
        if kind not in _FITS and kind != "none":  # a kind of yours (or mask): its entry says what fits
            entry = target_kind(kind)
            if entry.in_record:
                return f"is not a mask: a {kind!r} target comes with its record, which a dataset does not have"
            try:
                entry.hold(raw)
            except ValueError as exc:
                return str(exc)
            return None
        if kind == "none":
            return None if self.given_kind == "none" or shape == "none" else f"is {_SHAPE_WORDS.get(shape, 'a value')}, not None"
        if shape not in _FITS.get(kind, ()):  # "mask": a dataset has no masks (yet)
            return f"is {_SHAPE_WORDS.get(shape, 'malformed')}, which does not fit a {kind!r} target"
        if kind == "regression":
            numbers = raw if isinstance(raw, list) else [raw]
            if not all(math.isfinite(v) for v in numbers):
                return "holds a number that is not finite"
            if self.width is not None and len(numbers) != self.width:
                return f"has {len(numbers)} numbers, the targets before it have {self.width}"
            return None
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            return None
        flavour = "int" if isinstance(items[0], int) else "name"
        if self.flavour is not None and flavour != self.flavour:
            return (f"names classes by {'index' if flavour == 'int' else 'name'}, the targets before it by "
                    f"{'index' if self.flavour == 'int' else 'name'}; use one or the other")
        for item in items:
            if flavour == "int":
                if item < 0:
                    return f"holds the negative class index {item}"
                if self.classes is not None and item >= len(self.classes):
                    return f"holds the class index {item}, out of range: there are {len(self.classes)} classes (0..{len(self.classes) - 1})"
                if self.classes is None and item >= _MAX_INDEX_CLASSES:
                    return f"holds the class index {item}, which would make {item + 1} classes; pass classes= to name the classes"
            elif self.classes is not None and item not in self.known:
                shown = self.classes if len(self.classes) <= 20 else [*self.classes[:20], "..."]
                return f"holds {item!r}, not one of the classes {shown}; fix the target or add the class to classes="
        return None

    def finish(self, raws: Sequence[Any]) -> FoundTargets:
        """The targets of the records whose plain targets are ``raws`` (each fitting; in record order).

        Raises:
            ValueError: A target that does not fit (the records were not checked by this kind and classes).
        """
        for i, raw in enumerate(raws):
            problem = self.check(raw)
            if problem is not None:
                raise ValueError(f"record {i}: {problem}")
        kind = self.kind or "none"
        if kind not in _FITS and kind != "none":  # a kind of yours: held as its entry holds it
            entry = target_kind(kind)
            held = [entry.hold(raw) for raw in raws]
            classes = list(self.classes or [])
            if not classes and held and all(isinstance(t, Boxes) for t in held):  # boxes without classes: the indices used
                classes = [str(k) for k in range(max((max(t.labels, default=-1) for t in held), default=-1) + 1)]  # type: ignore[union-attr]
            return FoundTargets(kind, classes, [], held)
        if kind == "none":
            return FoundTargets("none", [], [], [NO_TARGET] * len(raws))
        if kind == "regression":
            width = self.width or 0
            values: list[Target] = [tuple(float(v) for v in (raw if isinstance(raw, list) else [raw])) for raw in raws]
            return FoundTargets("regression", [], [f"value{k}" for k in range(width)], values)
        classes = self.classes
        if classes is None:  # the names found, sorted; or the indices up to the largest
            classes = (sorted({item for raw in raws for item in (raw if isinstance(raw, list) else [raw])}) if self.flavour == "name"
                       else [str(k) for k in range(self.top + 1)])
        known = {c: k for k, c in enumerate(classes)}

        def index(item: int | str) -> int:
            return item if isinstance(item, int) else known[item]

        if kind == "multilabel":
            return FoundTargets(kind, classes, [], [tuple(sorted({index(item) for item in raw})) for raw in raws])
        return FoundTargets(kind, classes, [], [index(raw) for raw in raws])


def _shown(raw: Any) -> str:
    text = "None" if raw is None else json.dumps(raw, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."
