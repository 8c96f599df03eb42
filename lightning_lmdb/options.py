"""Every build choice, declared, defaulted and validated once: :class:`BuildOptions`.

``build_lmdb``, the ``lightning-lmdb build`` command and ``LMDBDataModule`` all construct one, so a bad
value fails the same way everywhere (at construction, naming the value and the valid choices) and a
new option is added here only. The CLI takes its ``choices=`` from :func:`choices` (``storage``: the registered storage
modes, :func:`lightning_lmdb.codec.storage.register_storage_mode`; the others from their ``Literal``) and its defaults from the
class (``BuildOptions.storage`` ...), as ``LMDBDataModule``'s signature does;
``LMDBDataModule`` names its database files by :meth:`BuildOptions.cache_key`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

from lightning_lmdb.codec import storage as codec
from lightning_lmdb.codec.storage import DEFAULT_MAX_PIXELS, DEFAULT_QUALITY, VALIDATE_LEVELS, Validate
from lightning_lmdb.errors import OptionError
from lightning_lmdb.sources.base import SourceOptions

#: The built-in storage modes (documentation and type hints: the valid values are the registry's, ``codec.STORAGE_MODES``).
Storage = Literal["auto", "encoded", "decoded"]
OnError = Literal["raise", "skip"]
OnStale = Literal["rebuild", "error", "ignore"]


def choices() -> dict[str, tuple[str, ...]]:
    """The valid values of each choice-valued option: ``storage`` the registered storage modes, the others their ``Literal``'s."""
    return {"storage": codec.STORAGES, "on_error": get_args(OnError), "on_stale": get_args(OnStale), "validate": VALIDATE_LEVELS}


def __getattr__(name: str) -> Any:
    if name == "CHOICES":  # read when asked: a storage mode registered since is in it
        return choices()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: The options that shape a database's contents: stored in its metadata and compared by the stale check
#: (``quality`` only with ``resize``: it changes nothing otherwise).
CONTENT_OPTIONS = ("storage", "max_pixels", "resize", "quality", "manifest")
#: The options that give ``LMDBDataModule`` a database of its own (:meth:`BuildOptions.cache_key`; ``quality`` only with
#: ``resize``): changing one builds another file beside the first, so switching back finds the first still built. The
#: other content option, ``max_pixels``, rebuilds the same database in place (its stale check compares it); the rest
#: (``workers``, ``on_error``, ``on_stale``, ``overwrite``, ``commit_every``, ``progress``, ``shard``, ``validate``) change how a
#: build runs, not which database it is.
CACHE_KEY_OPTIONS = ("storage", "resize", "quality", "shards", "manifest")


@dataclass(frozen=True)
class BuildOptions:
    """How to build a database.

    Attributes:
        storage: ``"auto"`` chooses per image: lossy files (JPEG, lossy WebP) and 16-bit PNGs keep their bytes,
            every other image is stored as zstd-compressed RGB pixels (about the files' size, PIL's exact pixels,
            read back many times faster than PNG); ``"encoded"`` keeps every file's original bytes;
            ``"decoded"`` stores raw RGB pixels (no decode at read time, 4-8x larger). See :mod:`lightning_lmdb.codec.storage`.
        workers: Reader/decoder processes; ``None`` for one per available core (four per core for a source on object
            storage, whose readers wait on the network part of the time), ``0`` to read in-process.
        on_error: ``"raise"`` stops at the first bad file naming it; ``"skip"`` leaves bad files out and
            records them with the reason.
        on_stale: When the source changed since the target was built: ``"rebuild"``, ``"error"``, or
            ``"ignore"`` (use the existing database without scanning the source).
        overwrite: Rebuild even if the existing database is up to date.
        max_pixels: Refuse images with more pixels (decompression bombs); ``None`` for no limit.
        resize: Pre-resized storage: shrink every image whose shorter side is larger than this to exactly this
            (aspect kept, never upscaled, OpenCV ``INTER_AREA``), stored re-encoded (JPEG at ``quality`` for lossy
            sources; zstd pixels for lossless ones with ``"auto"``, PNG with ``"encoded"``) or as pixels (``"decoded"``). ``None``: keep
            the original size. It changes the pixels a model sees (see :mod:`lightning_lmdb.codec.storage`).
        quality: JPEG quality (1-100) of the images ``resize`` re-encodes.
        commit_every: Records per write transaction (the most work a crash can lose).
        progress: Show a progress bar.
        shards: ``None``: one database file. ``K``: a sharded database, a folder of ``K`` shard files and a
            manifest (:mod:`lightning_lmdb.store.shards`); each shard is built by its own process, up to ``workers``
            at a time, reading and decoding in that process.
        shard: With ``shards``: build this shard alone (``0 <= shard < shards``), e.g. one task of a job array;
            whichever build completes the last shard writes the manifest.
        validate: How a file whose record keeps its bytes is checked at build time (:mod:`lightning_lmdb.codec.storage`):
            ``"reduced"`` (default) decodes such a JPEG at 1/8 scale (the whole compressed stream still read; other kept
            files, e.g. lossy WebP, fully); ``"full"`` decodes every file fully (the behaviour before this option);
            ``"header"`` decodes none of them, only their headers (a damaged one is then found when read: the dataset
            raises naming the record). Every level refuses a decompression bomb from its header before decoding, and a
            file stored as pixels is always decoded fully. It never changes a good file's record, so it is neither a
            content option (a database built before it, with full decodes, is up to date at every level) nor part of the
            database's name (:meth:`cache_key`). Images with masks and a ``Dataset``'s samples are always decoded fully.
        manifest: How to read a manifest source (:class:`~lightning_lmdb.sources.base.SourceOptions`, or a mapping of its
            fields); its fields may also be given by name to :meth:`replace` and ``build_lmdb`` (``label_column="tags"``).

    Raises:
        ValueError: A value out of range or not one of the choices (named, with the valid values).
    """

    storage: Storage = "auto"
    workers: int | None = None
    on_error: OnError = "raise"
    on_stale: OnStale = "rebuild"
    overwrite: bool = False
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    resize: int | None = None
    quality: int = DEFAULT_QUALITY
    commit_every: int = 1000
    progress: bool = True
    shards: int | None = None
    shard: int | None = None
    manifest: SourceOptions = SourceOptions()
    validate: Validate = "reduced"

    def __post_init__(self) -> None:
        object.__setattr__(self, "manifest", SourceOptions.of(self.manifest))
        for name, valid in choices().items():
            value = getattr(self, name)
            if value not in valid:
                raise OptionError(f"{name}={value!r} is not one of {', '.join(map(repr, valid))}.")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0):
            raise OptionError(f"workers={self.workers!r} must be an integer >= 0 (0 reads in this process, None uses every core).")
        bad_pixels = isinstance(self.max_pixels, bool) or not isinstance(self.max_pixels, int) or self.max_pixels < 1
        if self.max_pixels is not None and bad_pixels:
            raise OptionError(f"max_pixels={self.max_pixels!r} must be a positive integer, or None for no limit.")
        if self.resize is not None and (isinstance(self.resize, bool) or not isinstance(self.resize, int) or self.resize < 1):
            raise OptionError(f"resize={self.resize!r} must be a positive integer (the shorter side to shrink to), or None.")
        if isinstance(self.quality, bool) or not isinstance(self.quality, int) or not 1 <= self.quality <= 100:
            raise OptionError(f"quality={self.quality!r} must be an integer from 1 to 100 (JPEG quality of resized images).")
        if isinstance(self.commit_every, bool) or not isinstance(self.commit_every, int) or self.commit_every < 1:
            raise OptionError(f"commit_every={self.commit_every!r} must be an integer >= 1.")
        if self.shards is not None and (isinstance(self.shards, bool) or not isinstance(self.shards, int) or self.shards < 1):
            raise OptionError(f"shards={self.shards!r} must be an integer >= 1 (shard files of the folder), or None for one file.")
        if self.shard is not None:
            if self.shards is None:
                raise OptionError(f"shard={self.shard!r} needs shards= (the shard count): e.g. shard=0, shards=4 (CLI: --shard 0/4).")
            if isinstance(self.shard, bool) or not isinstance(self.shard, int) or not 0 <= self.shard < self.shards:
                raise OptionError(f"shard={self.shard!r} must be an integer from 0 to {self.shards - 1} (shards={self.shards}).")

    def content(self) -> dict[str, Any]:
        """The options that shape the contents (:data:`CONTENT_OPTIONS`), as stored in the metadata.

        ``resize`` and ``quality`` are left out when ``resize`` is ``None``, and ``manifest`` (the options set, as plain
        values) when none is set, so a database built before they existed (whose options lack them) is still up to
        date. The database records how its manifest was read: ``verify --source`` reads it the same way.
        """
        skip = ("resize", "quality") if self.resize is None else ()
        content = {name: getattr(self, name) for name in CONTENT_OPTIONS if name not in (*skip, "manifest")}
        return {**content, "manifest": self.manifest.as_dict()} if not self.manifest.is_default() else content

    def cache_key(self) -> str:
        """The part of ``LMDBDataModule``'s database file name hash that comes from the options (:data:`CACHE_KEY_OPTIONS`).

        Each is ``"\\0"`` and a value: the storage as is, then ``resize=R`` and ``quality=Q`` when resizing, then
        ``shards=K`` when sharded, then ``manifest=`` and the manifest options set, as sorted JSON, when any is set (two
        readings of one manifest, e.g. two label columns, are two databases). Never change this text: the hash of an
        existing combination names every cached database built with it, and another text would orphan them all
        (``tests/test_options.py`` pins it).
        """
        parts = [self.storage]
        if self.resize is not None:
            parts += [f"resize={self.resize}", f"quality={self.quality}"]
        if self.shards is not None:
            parts.append(f"shards={self.shards}")
        if not self.manifest.is_default():
            parts.append("manifest=" + json.dumps(self.manifest.as_dict(), sort_keys=True))
        return "".join(f"\0{part}" for part in parts)

    def replace(self, **changes: Any) -> BuildOptions:
        """A copy with some options changed (validated again); a field of :class:`SourceOptions` changes ``manifest``'s."""
        fields = {f.name for f in dataclasses.fields(SourceOptions)}
        manifest = {name: changes.pop(name) for name in list(changes) if name in fields}
        if manifest:
            changes["manifest"] = dataclasses.replace(SourceOptions.of(changes.get("manifest", self.manifest)), **manifest)
        return dataclasses.replace(self, **changes)
