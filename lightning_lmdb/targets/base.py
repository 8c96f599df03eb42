"""The target-kind contract (:class:`TargetKind`) and its registry.

A target kind is everything that depends on what a sample's target is, in one object: how a scan holds it
(:meth:`TargetKind.hold`), the typed arrays that store it in a database's metadata (:meth:`TargetKind.pack`,
:meth:`TargetKind.read`), what a sample serves (:meth:`TargetKind.item`), its geometry under the joint crop / resize /
flip of the image (:meth:`TargetKind.geometry`), its collate (:meth:`TargetKind.collate`) and how ``verify`` compares it
(:meth:`TargetKind.named`). The library's kinds (``class``, ``multilabel``, ``regression``, ``none``, ``mask``, ``boxes``) are
entries of the registry like any other; a kind of yours is one :func:`register_target_kind` call.

This module imports nothing of the library but the table and plain helpers, so that :mod:`lightning_lmdb.sources.base` can ask the
registry (``SourceOptions(target_kind=...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from lightning_lmdb.errors import OptionError

if TYPE_CHECKING:
    from lightning_lmdb.jsonfields import JsonFields

#: Target given to every sample of a source without labels (e.g. a flat folder).
NO_TARGET = -1
#: One sample's target as a scan holds it: a class index (``"class"``; ``NO_TARGET`` for ``"none"``), a sorted tuple of
#: class indices (``"multilabel"``), a tuple of K floats (``"regression"``) -- or what a kind of yours holds (plain
#: numbers in tuples: it is written to JSON while a build runs).
Target = int | tuple[int, ...] | tuple[float, ...]


class TargetKind:
    """One target kind: a subclass sets :attr:`name` and :attr:`DESCRIPTION` and overrides what differs from a class index.

    The defaults are those of a per-record integer (``class``): ``meta/targets`` holds it, a sample serves it as an
    ``int``, the image's geometry leaves it as it is and batches stack it (``default_collate``).

    Storage: a kind stores its targets in a :class:`~lightning_lmdb.targets.base.TargetTable` whose arrays are the database's
    typed metadata arrays -- ``index`` (``meta/targets``, ``int32`` per record, always written), ``labels``
    (``meta/labels``, ``int32``), ``offsets`` (``meta/label-offsets``, ``int64`` per record plus one) and ``values``
    (``meta/values``, ``float32``). What they mean is the kind's: numpy arrays and JSON only, never pickle.

    An instance is pickled by its class (a spawned loader worker imports the class's module) and registers itself in the
    process that unpickles it when its name is unknown there, so a kind registered at run time reaches spawned workers
    with the dataset that carries it.
    """

    #: The kind's name: ``target_kind=`` and the header's ``target_kind`` field.
    name: ClassVar[str] = ""
    #: What a target of this kind is, in a few words (error messages and docs).
    DESCRIPTION: ClassVar[str] = ""
    #: Whether its stored targets are lists of class indices (``meta/labels`` are checked against the classes).
    class_lists: ClassVar[bool] = False
    #: Whether each record holds its target (a ``mask``: packed with the image), rather than the metadata's arrays alone.
    in_record: ClassVar[bool] = False
    #: Whether the image's crop / resize / flip changes the target (:meth:`geometry`).
    has_geometry: ClassVar[bool] = False
    #: Whether a batch's targets differ in shape (:meth:`collate` returns a list).
    variable_length: ClassVar[bool] = False
    #: Whether a database of this kind needs format version 3 (typed targets); ``class`` and ``none`` do not.
    typed: ClassVar[bool] = True
    #: Whether the default transforms must keep the whole image (objects whole: boxes): the DataModule then serves a letterbox
    #: resize with scale jitter and flip (:class:`lightning_lmdb.read.transforms.LetterboxResize`) instead of a random crop.
    keeps_whole: ClassVar[bool] = False

    @property
    def custom_collate(self) -> bool:
        """Whether a batch's targets need this kind's :meth:`collate` (a loader's ``collate_fn``), not ``default_collate``."""
        return self.variable_length or type(self).collate is not TargetKind.collate

    def __reduce__(self) -> tuple[Callable[..., TargetKind], tuple[Any, ...]]:
        return _unpickled, (type(self), dict(self.__dict__))

    # --- scan -----------------------------------------------------------------------------------

    def hold(self, raw: Any) -> Target:
        """A plain target (JSON-like: numbers, strings, lists; as a ``Dataset`` sample or a manifest cell gives it) as a scan holds it.

        Raises:
            ValueError: ``raw`` does not fit the kind (the message completes "its target ... ").
        """
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ValueError(f"is not an integer, which a {self.name!r} target is")
        return raw

    def width(self, classes: Sequence[str], target_names: Sequence[str]) -> int:
        """The length of a served target tensor (:attr:`TargetTable.width`); 0 when it has none."""
        return 0

    # --- storage --------------------------------------------------------------------------------

    def pack(self, targets: Sequence[Any], width: int) -> TargetTable:
        """The table of a scan's per-record targets (as :meth:`hold` made them)."""
        return TargetTable(self.name, np.array(targets, dtype=np.int32).reshape(len(targets)), 0)

    def concat(self, tables: Sequence[TargetTable]) -> TargetTable:
        """The tables of consecutive parts (a sharded database's shards) as one."""
        first = tables[0]
        index = np.concatenate([t.index for t in tables])
        labels = offsets = values = None
        if first.offsets is not None:  # offsets into labels (when the kind has them), else into values
            inner = [t.labels if t.labels is not None else t.values for t in tables]
            starts = np.cumsum([0] + [len(a) for a in inner[:-1]])  # type: ignore[arg-type]
            offsets = concat_offsets([t.offsets for t in tables], starts)  # type: ignore[misc]
        if first.labels is not None:
            labels = np.concatenate([t.labels for t in tables])  # type: ignore[misc]
        if first.values is not None:
            values = np.concatenate([t.values for t in tables])  # type: ignore[misc]
        return TargetTable(first.kind, index, first.width, labels=labels, offsets=offsets, values=values)

    def read(self, get: JsonFields, read: Callable[[str], np.ndarray], meta: Any) -> dict[str, np.ndarray]:
        """The typed arrays of a database header of this kind, checked: fields of :class:`lightning_lmdb.store.format.Metadata`
        (``labels``, ``label_offsets``, ``values``; none for a class index, which ``meta/targets`` holds).

        Args:
            get: The header's fields (``get.fail(field, why)`` raises the :class:`DatabaseError` naming it).
            read: Reads (and checks against its digest) one metadata array by name (:data:`lightning_lmdb.store.format.ARRAYS`).
            meta: The metadata read so far (``count``, ``classes``, ``target_names``).
        """
        return {}

    def table(self, meta: Any) -> TargetTable:
        """The targets of a database's metadata (:class:`lightning_lmdb.store.format.Metadata`) as a dataset serves them."""
        width = self.width(meta.classes, meta.target_names)
        return TargetTable(self.name, meta.targets, width, labels=meta.labels, offsets=meta.label_offsets, values=meta.values,
                           extra=dict(getattr(meta, "target_arrays", None) or {}) or None)

    # --- serving ----------------------------------------------------------------------------------

    def item(self, table: TargetTable, row: int) -> Any:
        """Record ``row``'s target as a dataset serves it (``ds[i][1]`` before any ``target_transform``)."""
        return int(table.index[row])

    def tolist(self, table: TargetTable, rows: np.ndarray | None) -> list[Any]:
        """The targets of ``rows`` (all when ``None``) as plain values (what :meth:`named` and the checks compare)."""
        return (table.index if rows is None else table.index[rows]).tolist()

    def at_size(self, target: Any, size: tuple[int, int]) -> Any:
        """The served target (:meth:`item`) in the pixels of its image as stored, ``size`` ``(height, width)`` in its file (a
        database built with ``resize=`` stores smaller images): ``target`` itself unless the kind's coordinates need scaling.
        Called for a :attr:`has_geometry` kind before :meth:`geometry`, with or without a transform."""
        return target

    def geometry(self, target: Any, crop: Any, params: Sequence[int], size: tuple[int, int], **context: Any) -> Any:
        """The target after the image's crop, resize and flip: ``target`` itself unless :attr:`has_geometry`.

        Args:
            target: The served target (:meth:`item`; a mask's ``H x W`` tensor).
            crop: The :class:`lightning_lmdb.read.transforms.ResizedCrop` applied to the image (its ``size``, ``train``,
                ``resize_ratio``; :meth:`~lightning_lmdb.read.transforms.ResizedCrop.map_points` maps coordinates, and
                :meth:`~lightning_lmdb.read.transforms.ResizedCrop.apply_mask` resamples a mask).
            params: ``(top, left, crop height, crop width, flip)`` in the pixels of the image in its file.
            size: ``(height, width)`` of the image in its file.
            context: What the dataset knows besides (``fill``: the ignore index of a mask set).
        """
        return target

    def collate(self, targets: list[Any]) -> Any:
        """A batch's targets: stacked (``default_collate``); a list for a :attr:`variable_length` kind."""
        if self.variable_length:
            return list(targets)
        from torch.utils.data import default_collate

        return default_collate(targets)

    def named(self, classes: Sequence[str], target: Any) -> Any:
        """A target as a value that does not depend on the class indices, to compare a database's targets with a source's
        (whose classes may have changed); ``None``: not compared this way."""
        return None

    def describe(self, meta: Any) -> dict[str, Any] | None:
        """What ``lightning-lmdb info`` shows of a database's targets besides its classes (a JSON object, shown under the kind's
        name); ``None``: nothing more."""
        return None


def _unpickled(cls: type[TargetKind], state: dict[str, Any]) -> TargetKind:
    """A kind unpickled (a spawned worker's dataset): the registered one of its name, else this one, registered here."""
    kind = cls.__new__(cls)
    kind.__dict__.update(state)
    known = _KINDS.get(kind.name)
    if known is not None and type(known) is cls:
        return known
    if known is None:
        _KINDS[kind.name] = kind
    return kind


_KINDS: dict[str, TargetKind] = {}


def register_target_kind(kind: TargetKind) -> TargetKind:
    """Add (or replace) a target kind: ``target_kind=kind.name`` is then accepted by every source option, build and dataset.

    Register it in a module your code imports (a spawned loader worker imports the modules of what it unpickles; the
    datasets carry their kind, which registers itself there).

    Returns:
        ``kind``.

    Raises:
        OptionError: ``kind`` has no name or is not a :class:`TargetKind`.
    """
    if not isinstance(kind, TargetKind):
        raise OptionError(f"register_target_kind takes a TargetKind (lightning_lmdb.targets.TargetKind), not {type(kind).__name__}.")
    if not kind.name or not isinstance(kind.name, str):
        raise OptionError(f"The target kind {type(kind).__name__} has no name: set its class attribute name = '...'.")
    _KINDS[kind.name] = kind
    return kind


def unregister_target_kind(name: str) -> None:
    """Remove the target kind ``name`` (nothing if it is not registered)."""
    _KINDS.pop(name, None)


def target_kinds() -> tuple[TargetKind, ...]:
    """The registered target kinds, in registration order."""
    return tuple(_KINDS.values())


def kind_names() -> tuple[str, ...]:
    """The registered target kinds' names, in registration order."""
    return tuple(_KINDS)


def target_kind(name: str) -> TargetKind:
    """The registered target kind ``name``.

    Raises:
        OptionError: No kind of that name is registered (the message names it, the known kinds, and how to register one).
    """
    kind = _KINDS.get(name)
    if kind is None:
        raise OptionError(unknown_kind(name))
    return kind


def unknown_kind(name: Any) -> str:
    """The message for a target kind ``name`` that is not registered."""
    return (f"target_kind={name!r} is not one of {', '.join(map(repr, _KINDS))}. A kind of your own is registered with "
            "lightning_lmdb.targets.register_target_kind(MyKind()) -- in a module that spawned loader workers import too.")


def concat_offsets(parts: Sequence[np.ndarray], starts: Sequence[int] | np.ndarray) -> np.ndarray:
    """Consecutive offset arrays (each per record plus one) as one, part ``i``'s shifted by ``starts[i]``."""
    return np.concatenate([[0]] + [o[1:] + s for o, s in zip(parts, starts, strict=True)]).astype(np.int64)


@dataclass(frozen=True, eq=False)
class TargetTable:
    """Every record's target, typed: numpy arrays, never one Python object per record. Its kind builds each sample's target.

    Attributes:
        kind: The target kind's name (:func:`lightning_lmdb.targets.target_kind`).
        index: ``int32`` per record: the class index (``class``), else ``-1``.
        width: Length of a served target tensor: the number of classes (``multilabel``; ``mask``: its classes), K (``regression``),
            else 0.
        labels: ``multilabel`` (``mask``: the classes its mask holds): each record's class indices, concatenated (``int32``).
        offsets: ``multilabel``, ``mask``: ``int64`` per record plus one; record ``i``'s labels are ``labels[offsets[i]:offsets[i+1]]``
            (a kind of variable length without labels: into ``values``).
        values: ``regression``: ``float32`` ``count x K`` (a kind of yours: as it packs them).
        extra: More typed arrays of the kind, by their name in :data:`lightning_lmdb.store.format.ARRAYS` (``boxes``: the
            boxes, their flags, image ids and sizes); ``None`` for the kinds without.
    """

    kind: str
    index: np.ndarray
    width: int = 0
    labels: np.ndarray | None = None
    offsets: np.ndarray | None = None
    values: np.ndarray | None = None
    extra: dict[str, np.ndarray] | None = None

    @classmethod
    def pack(cls, kind: str, targets: Sequence[Target], width: int = 0) -> TargetTable:
        """The table of a scan's per-file targets (:data:`lightning_lmdb.sources.base.Target`) of kind ``kind``.

        Args:
            kind: The target kind.
            targets: One target per record, of that kind.
            width: The number of classes (``multilabel``, ``mask``) or of values per record (``regression``).
        """
        return target_kind(kind).pack(targets, width)

    @classmethod
    def concat(cls, tables: Sequence[TargetTable]) -> TargetTable:
        """The tables of consecutive parts (a sharded database's shards) as one."""
        return target_kind(tables[0].kind).concat(tables)

    def __len__(self) -> int:
        return len(self.index)

    def item(self, row: int) -> Any:
        """Record ``row``'s target as a dataset serves it: an ``int``, or a ``float32`` tensor ``[width]`` (the kind's :meth:`item`).

        Raises:
            TypeError: A ``mask`` table: a mask is read with its record, not from this table (:meth:`tolist` gives the classes
                each mask holds).
        """
        return target_kind(self.kind).item(self, row)

    def tolist(self, rows: np.ndarray | None = None) -> list[Any]:
        """The targets of ``rows`` (all when ``None``) as plain values: class indices, lists of class indices (``multilabel``; the
        classes each mask holds for ``mask``), or lists of floats."""
        return target_kind(self.kind).tolist(self, rows)

    def freeze(self) -> TargetTable:
        """``self``, with its arrays made read-only."""
        for array in (self.index, self.labels, self.offsets, self.values, *(self.extra or {}).values()):
            if array is not None:
                array.flags.writeable = False
        return self


def check_offsets(get: JsonFields, offsets: np.ndarray, items: np.ndarray, what: str, whose: str) -> None:
    """Fail (naming the header's ``arrays``: "holds ``what`` that do not index its ``whose``") unless ``offsets`` index ``items``
    (start at 0, end at its length, never decrease)."""
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(items) or np.any(np.diff(offsets) < 0):
        get.fail("arrays", f"holds {what} that do not index its {whose}")
