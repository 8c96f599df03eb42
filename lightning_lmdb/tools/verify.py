"""Read a database back: describe it (``info``) and check it record by record (``verify``).

Neither imports torch or torchvision, except ``verify`` with a source folder (scanned as ``ImageFolder`` scans it).
With a source, ``verify`` also compares each record's target and split with the source's (a manifest relabelled since),
and each record's mask with its mask file (a segmentation database, :mod:`lightning_lmdb.sources.masks`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lightning_lmdb.codec.storage import DEFAULT_QUALITY, ImageDecodeError, RecordError, decode_record, encode_record, record_codec
from lightning_lmdb.sources import masks
from lightning_lmdb.sources.base import SourceFile, SourceOptions, SourceScan
from lightning_lmdb.store import database, envs
from lightning_lmdb.store import format as fmt
from lightning_lmdb.targets import named, target_kind


@dataclass
class VerifyReport:
    """The outcome of :func:`verify_lmdb`.

    Attributes:
        path: The database checked.
        count: Records in the database.
        checked: Records compared (checksum, and source when given).
        problems: One line per mismatch, naming the file; empty when everything matches.
        skipped: Source files the build left out as unreadable, with the reason it recorded: with a
            source, those still in the source folder (so missing from the database); without one,
            every recorded skip.
        allow_skipped: Whether ``skipped`` files are accepted (they are listed but do not fail the check).
        compared_with_source: Whether the records were compared with a source folder.
    """

    path: Path
    count: int
    checked: int = 0
    problems: list[str] = field(default_factory=list)
    skipped: list[fmt.Skipped] = field(default_factory=list)
    allow_skipped: bool = True
    compared_with_source: bool = False

    @property
    def ok(self) -> bool:
        """True when every check passed: no problems, and no skipped files unless they are allowed."""
        return not self.problems and (self.allow_skipped or not self.skipped)


def describe_lmdb(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Summarise a database: format, counts, classes, sizes, source and build options.

    Raises:
        FileNotFoundError, DatabaseError: As :func:`lightning_lmdb.store.format.open_env`.
    """
    meta = database.load_meta(path)
    size = database.database_bytes(path)
    source = meta.source
    return {
        "path": str(path),
        "format_version": meta.version,
        **({"shards": len(database.database_files(path))} if database.is_sharded(path) else {}),
        "storage": meta.storage,
        "count": meta.count,
        "codecs": codec_counts(meta.codecs),
        "target_kind": meta.target_kind,
        "num_classes": len(meta.classes),
        **({"ignore_index": meta.ignore_index} if meta.ignore_index is not None else {}),
        "classes": meta.classes,
        **({"target_names": meta.target_names} if meta.target_names else {}),
        **({"splits": split_counts(meta)} if meta.split_names else {}),
        **({meta.target_kind: summary} if (summary := target_kind(meta.target_kind).describe(meta)) is not None else {}),
        "file_bytes": size,
        "source_root": source.root,
        "source_files": source.num_files,
        "source_bytes": source.bytes,
        "size_ratio": size / source.bytes if source.bytes else float("nan"),
        "skipped": [{"path": s.path, "reason": s.reason} for s in meta.skipped],
        "options": meta.options,
        "created": meta.created,
        "library_version": meta.library_version,
        "build_id": meta.build_id,
    }


def split_counts(meta: fmt.Metadata) -> dict[str, int]:
    """Records per split the source assigned (a manifest's split column), in the order of ``meta.split_names``."""
    counts = np.bincount(np.asarray(meta.splits), minlength=len(meta.split_names)) if meta.splits is not None else []
    return {name: int(n) for name, n in zip(meta.split_names, counts, strict=False)}


def verify_lmdb(
    path: str | os.PathLike[str], source: str | os.PathLike[str] | None = None, *, allow_skipped: bool = False,
    manifest: SourceOptions | None = None,
) -> VerifyReport:
    """Check every record against its stored checksum and, with ``source``, against the source files.

    Without a source this checks the database's integrity only: every record is present and matches
    its checksum. Files the build skipped as unreadable are listed (``report.skipped``) but do not
    fail the check, since the database is whole as built.

    With a source folder it also checks completeness: the file sets must match, and each record must
    equal its file: the same bytes for ``encoded`` storage; otherwise what the builder's codec makes of
    the file now (the same RGB pixels for ``decoded`` storage; the same resize, and the same re-encoded
    bytes or pixels, for a ``resize=`` build -- a JPEG re-encoded by another library build may differ
    by rounding, accepted up to a mean absolute difference of 1 of 255). Reported as problems: source
    files missing from the database (e.g. added after the build), database records no longer in the
    source (deleted or renamed since), records that differ from their file (modified since), records whose
    target or split differs from the source's (a manifest relabelled since), records whose mask differs from its mask
    file's values (or whose mask is now another file). Source
    files the build skipped as unreadable are missing too: they are listed in ``report.skipped`` with
    the reason recorded at build time and fail the check unless ``allow_skipped`` is True.

    Args:
        path: The database file or sharded folder.
        source: The folder or manifest it was built from, to compare byte for byte (optional).
        allow_skipped: With ``source``, accept source files that the build skipped (they are still
            listed in ``report.skipped``). Without a source, skipped files never fail the check.
        manifest: How to read ``source`` when it is a manifest; ``None`` (or none set): as the build read it (the options
            its database records).

    Returns:
        A report; ``report.ok`` is True only when everything matches.

    Raises:
        FileNotFoundError, DatabaseError: The database cannot be opened (see ``format.open_env``).
        FileNotFoundError, ValueError: ``source`` is missing or holds no images (see ``sources.scan_source``).
    """
    meta, parts = database.open_database(path, arrays=True)
    assert meta.paths is not None and meta.checksums is not None  # arrays=True; checksums under each part's algorithm (Part.checksum)
    paths = meta.paths.tolist()
    mask_paths = meta.mask_paths.tolist() if meta.mask_paths is not None and len(meta.mask_paths) == meta.count else None
    with_source = source is not None
    report = VerifyReport(Path(path), meta.count, allow_skipped=allow_skipped or not with_source, compared_with_source=with_source)
    files: dict[str, SourceFile] = {}
    scan_root = ""
    if source is None:
        report.skipped = list(meta.skipped)
    else:
        from lightning_lmdb.sources.base import scan_source  # torchvision's scan: only a check against the source pays for importing torch

        if manifest is None or manifest.is_default():  # read the source as the build did
            manifest = SourceOptions.of(meta.options.get("manifest"))
        scan = scan_source(source, manifest)
        scan_root = str(scan.root)
        files = {f.relpath: f for f in scan.files}
        report.problems += _compare_targets(meta, paths, scan, files)
        in_source = files.keys() | {relpath for relpath, _ in scan.special}
        stored = set(paths)
        report.skipped = [s for s in meta.skipped if s.path in in_source and s.path not in stored]
        skipped = {s.path for s in report.skipped}
        report.problems += [f"{p}: in the source but not in the database" for p in sorted(in_source - stored - skipped)]
        report.problems += [f"{p}: in the database but no longer in the source" for p in sorted(stored - files.keys())]
    sharded = database.is_sharded(path)
    for part in parts:  # one file, or each shard of a sharded folder
        where = f" ({Path(part.path).name})" if sharded else ""
        with envs.reading(part.path) as opened, opened.env.begin(db=opened.records, buffers=True) as txn:
            entries = txn.stat(opened.records)["entries"]
            if entries != part.count:
                report.problems.append(f"{part.path} holds {entries} records, its metadata says {part.count}")
            for local in range(part.count):
                index = part.offset + local
                relpath, expected = paths[index], meta.checksums[index]
                value = txn.get(fmt.record_key(local))
                report.checked += 1
                if value is None:
                    report.problems.append(f"record {index}{where} ({relpath}): missing")
                    continue
                if fmt.checksum(value, part.checksum) != expected.tobytes():
                    report.problems.append(f"record {index}{where} ({relpath}): checksum mismatch, the database is damaged")
                    continue
                if relpath in files:
                    stored_mask = mask_paths[index] if mask_paths is not None else None
                    problem = _compare_record(value, int(meta.codecs[index]), files[relpath], meta, scan_root, stored_mask)
                    if problem:
                        report.problems.append(f"record {index}{where} ({relpath}): {problem}")
    return report


def _compare_targets(meta: fmt.Metadata, paths: list[str], scan: SourceScan, files: dict[str, SourceFile]) -> list[str]:
    """The records whose target or split differs from what the source says now (a manifest relabelled since the build);
    ``files``: the scan's files by relative path.

    A source whose targets come with its records (masks: compared record by record) has its kind and given classes compared.
    """
    kind, from_records = meta.target_kind, scan.targets_from_records and scan.target_kind == meta.target_kind
    if from_records:
        comparable = scan.classes in ([], meta.classes)
    else:  # targets as names: a class added or removed leaves the others comparable
        comparable = (scan.target_kind, scan.target_names) == (kind, meta.target_names)
    if not comparable:
        return [f"the source's targets are {scan.target_kind} over {len(scan.classes) or len(scan.target_names)} classes or values "
                f"({scan.classes or scan.target_names}), the database's {kind} over {meta.classes or meta.target_names}"]
    problems = []
    if not from_records and scan.classes != meta.classes:  # records named below when their class names differ too
        problems.append(f"the source's classes are {scan.classes}, the database's {meta.classes}: the class indices differ")
    stored, splits = meta.target_table().tolist(), meta.splits
    for index, relpath in enumerate(paths):
        file = files.get(relpath)
        if file is None:
            continue
        was, now = named(kind, meta.classes, stored[index]), named(kind, scan.classes, file.target)
        if not from_records and was != now:
            problems.append(f"record {index} ({relpath}): target {was!r} in the database, {now!r} in the source (relabelled since)")
        split = meta.split_names[splits[index]] if splits is not None else ""
        if file.split != split:
            problems.append(f"record {index} ({relpath}): split {split!r} in the database, {file.split!r} in the source")
    return problems


def codec_counts(codecs: np.ndarray) -> dict[str, int]:
    """How many records use each record codec, by its name (most used first)."""
    ids, counts = np.unique(codecs, return_counts=True)
    pairs = sorted(((record_codec(int(i)).name, int(n)) for i, n in zip(ids, counts, strict=True)), key=lambda pair: -pair[1])
    return dict(pairs)


def _compare_record(value: memoryview, codec: int, file: SourceFile, meta: fmt.Metadata, root: str, stored_mask: str | None) -> str | None:
    """Why a record differs from its source file (and a segmentation record from its mask file), else ``None``."""
    if not target_kind(meta.target_kind).in_record:  # the record is the image alone
        return _compare_with_source(value, codec, file.path, meta)
    try:
        image, mask = masks.unpack(value)
        values = masks.decode_mask(mask)
    except RecordError as exc:
        return f"a damaged record ({exc})"
    problem = _compare_with_source(image, codec, file.path, meta)
    if problem:
        return problem
    prefix = root.rstrip(os.sep) + os.sep
    now = file.mask[len(prefix):].replace(os.sep, "/") if file.mask.startswith(prefix) else file.mask
    if stored_mask is not None and stored_mask != now:
        return f"its mask is {stored_mask!r} in the database, {now!r} in the source (the source was changed after the build)"
    try:
        with open(file.mask, "rb") as handle:
            expected = masks.resize_mask(masks.read_mask(handle.read(), file.mask), meta.options.get("resize"))
    except OSError as exc:
        return f"cannot read its source mask file {file.mask!r} ({exc})"
    except ImageDecodeError as exc:
        return f"its source mask no longer reads as a mask ({exc})"
    if expected.shape != values.shape or not np.array_equal(expected, values):
        return f"its mask differs from the source mask file {file.mask!r} (the file was modified after the build)"
    return None


def _compare_with_source(value: memoryview, codec: int, file_path: str, meta: fmt.Metadata) -> str | None:
    try:
        with open(file_path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        return f"cannot read the source file ({exc})"
    resize = meta.options.get("resize")
    file_bytes = record_codec(codec).file_bytes
    if file_bytes and resize is None:
        return None if value == data else "differs from the source file (the file was modified after the build)"
    try:  # what the builder would store for the file now
        again_codec, expected = encode_record(data, meta.storage, max_pixels=None, name=file_path, resize=resize,
                                              quality=meta.options.get("quality", DEFAULT_QUALITY))
    except ImageDecodeError as exc:
        return f"the source file no longer decodes ({exc})"
    if value == expected:
        return None
    try:  # another build of the image libraries may re-encode to other bytes: compare the pixels
        stored, again = (np.asarray(decode_record(v, c)) for v, c in ((value, codec), (expected, again_codec)))
    except (ImageDecodeError, RecordError) as exc:
        return str(exc)
    if stored.shape == again.shape:
        difference = np.abs(stored.astype(np.int16) - again.astype(np.int16)).mean()
        if difference == 0 or (file_bytes and difference <= 1.0):  # a lossy re-encode
            return None
    what = "decoded pixels" if resize is None else f"pixels (resized to {resize})"
    return f"{what} differ from the source file (the file was modified after the build)"
