"""The manifest source kind: a CSV, TSV or JSON Lines file that lists images and their targets.

Two layouts are accepted:

* **A manifest file** (Kaggle style, e.g. ``train.csv``): a ``.csv`` (comma), ``.tsv`` (tab), ``.jsonl`` or ``.ndjson``
  file (any case). Its image paths are relative to its own folder, or to ``root=``.
* **A Hugging Face ImageFolder**: a folder that directly holds ``metadata.csv`` or ``metadata.jsonl`` beside its images;
  that folder is the root. The metadata file wins over class subfolders: a folder that has both is read through its
  metadata file (an INFO log says so), never as an ImageFolder. A folder with both metadata files is refused: keep one.

**Reading.** UTF-8 (a spreadsheet's byte-order mark is accepted). CSV and TSV: the first row is the header; rows of empty
cells are ignored; spaces around a header name, a label or split cell, or a multi-label token are dropped (``path, label``).
JSON Lines: one object per line, each line parsed alone, its keys the columns (a missing key is an empty cell). Blank lines
are ignored; messages name the file's physical lines (a CSV header is line 1).

**Columns** (options of :class:`~lightning_lmdb.sources.base.SourceOptions`): the image column ``path_column`` (default
``path``, else Hugging Face's ``file_name``); the target column(s) ``label_column`` (default ``label`` when present, else
no target); the split column ``split_column`` (default ``split`` when present: each row's cell is its split name). A
column named by an option but missing from the manifest is an error that lists the columns it has.

**Paths.** A relative path is relative to the root and must stay inside it: it is normalised (``a/./b`` is ``a/b``)
without resolving symbolic links, and one that climbs out with ``..`` is a row error. An absolute path is used as
written (and is its own ``relpath``). Rows keep the file's order; images are not filtered by extension. A missing image
is kept (size 0): the build reports it, naming the manifest line (``SourceFile.origin``).

**Targets** (``target_kind``; ``None`` infers it):

* ``"class"``: class names (the classes are the sorted names, as ImageFolder sorts its folders, unless ``classes=`` gives
  them in index order) or integer indices (JSON integers; in a CSV, a column whose cells are all written as indices,
  ``0|[1-9][0-9]*``, else all are names -- ``01``, ``+1``, ``1_1`` are names, so never one class with ``1`` or ``11`` -- and
  names when ``classes=`` lists every cell, e.g. classes ``"3"`` and ``"7"``). Indices without ``classes=`` give the classes
  ``"0"`` .. ``"N"`` (N the largest index).
* ``"multilabel"``: a JSON list of names or indices, or a cell split by ``label_sep`` (required for a CSV; whitespace
  around each label is dropped). An empty cell or list is no labels; a single JSON name or index is a list of one. The
  target is the sorted tuple of class indices.
* ``"regression"``: K numbers per row, from K columns (``label_column=("x", "y")``) or from one JSON column of K-number
  lists. The target is a tuple of K floats; ``target_names`` are the columns (``col[0]`` .. ``col[K-1]`` for a list
  column). Every row has the same K.
* ``"none"``: no label column; every target is ``NO_TARGET``.

Inference: names or integers give ``"class"``, lists ``"multilabel"``, numbers with a fraction ``"regression"``; anything
mixed or unclear (names with fractions, whole-number floats like ``1.0``) asks for ``target_kind``. Booleans are not numbers.

**Masks** (segmentation, :mod:`lightning_lmdb.sources.masks`): a column of mask paths, ``mask_column`` (default ``mask`` when present
and ``target_kind`` is unset or ``"mask"``), makes the target kind ``"mask"``: each row's mask is a second image path,
placed like the image (relative to the root, inside it; on object storage a key under the root prefix, or a full URL, listed
with the images and fetched ``If-Match`` its listed ETag); a missing mask is reported by the build, naming the line. A
manifest with both ``label`` and ``mask`` columns needs ``target_kind`` (``"mask"``: the label column is not read).
``ignore_index``, ``num_classes`` (and ``classes``) say how the mask values are read; without a mask column they are refused.

**Boxes** (detection, :mod:`lightning_lmdb.sources.boxcolumns`): a ``boxes`` column (``[[x1, y1, x2, y2], ...]`` in pixels
per row) with ``target_kind`` unset, or ``target_kind="boxes"``, makes the target kind ``"boxes"``; the labels column
(``label_column=``, else ``labels``, else ``label``) gives one class name or index per box. Each image's header is read and
the box rules of :mod:`lightning_lmdb.sources.boxcheck` applied.

**Row errors** do not stop the scan: an empty or malformed label, a label not among ``classes=``, an index out of range,
an empty image (or mask) cell, a path out of the root, a path no file name can hold (a NUL, a lone surrogate), an image listed
twice (the later row; compared as absolute normalised paths, symbolic links not followed), an empty split cell, a FIFO or other
non-regular file. Each goes in ``SourceScan.special`` with a reason naming the manifest and the line; the build refuses
it, or skips and records it with ``on_error="skip"``. A problem with the whole file (not UTF-8, not JSON, no header, no
data rows, a missing column, an unclear target kind) raises :class:`~lightning_lmdb.errors.SourceError`.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lightning_lmdb.errors import OptionError, SourceError
from lightning_lmdb.remote import urls
from lightning_lmdb.remote.urls import is_remote
from lightning_lmdb.sources import boxcolumns, masks, objectstore
from lightning_lmdb.sources.base import NO_TARGET, Labels, SourceFile, SourceOptions, SourceScan, not_regular_reason
from lightning_lmdb.sources.manifestfile import Table, read_table
from lightning_lmdb.targets import TargetKind, target_kind

__all__ = ["DESCRIPTION", "MANIFEST_SUFFIXES", "METADATA_NAMES", "NAME", "accepts", "classes", "has_samples", "labels", "scan"]

log = logging.getLogger(__name__)

#: The suffixes of a manifest file (compared case-insensitively).
MANIFEST_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")
#: The metadata files that make a folder a Hugging Face ImageFolder.
METADATA_NAMES = ("metadata.csv", "metadata.jsonl")
#: This source kind's name and what it accepts (:mod:`lightning_lmdb.sources.base`: the "not a known source" messages and CLI help).
NAME = "manifest"
DESCRIPTION = (f"a CSV / TSV / JSON Lines manifest ({', '.join(MANIFEST_SUFFIXES)}) or a folder holding "
               f"{' / '.join(METADATA_NAMES)}")
_SET_KIND = ("Set target_kind= to 'class', 'multilabel' or 'regression' (CLI --target-kind, Hydra data.source_options.target_kind).")
_TAG_WORDS = {"name": "names", "int": "integers", "whole": "whole-number decimals like 1.0", "frac": "numbers with a fraction",
              "list": "lists", "fraclist": "lists of numbers with a fraction", "wholelist": "lists of whole-number decimals"}
_MAX_INDEX_CLASSES = 1_000_000
_UP = os.pardir + os.sep
_INDEX = re.compile("0|[1-9][0-9]*")  # a class index in a CSV cell; any other cell is a name


def accepts(source: object) -> bool:
    """Whether ``source`` is a manifest file, or a folder holding ``metadata.csv`` / ``metadata.jsonl`` (no parse)."""
    if is_remote(source):  # a manifest object: named so (nothing is requested here; its scan reads it)
        return not source.endswith("/") and urls.name(source).lower().endswith(MANIFEST_SUFFIXES)  # type: ignore[attr-defined]
    if not isinstance(source, Path):
        return False
    if source.suffix.lower() in MANIFEST_SUFFIXES and source.is_file():
        return True
    return source.is_dir() and any((source / name).is_file() for name in METADATA_NAMES)


def scan(source: Path, options: SourceOptions | None = None) -> SourceScan:
    """Scan a manifest: parse it, check every row, stat every image (see the module docstring).

    Raises:
        SourceError: The manifest as a whole cannot be read (the message names the file, and the line or the column).
        OptionError: Options that contradict each other or the manifest (e.g. ``label_sep`` with ``target_kind="class"``).
    """
    options = options or SourceOptions()
    table, root, path_col, label_cols, split_col, mask_col = _open(source, options, announce=True)
    targets = _targets(table, label_cols, options) if mask_col is None else _Targets("mask", [NO_TARGET] * len(table.rows))
    mask_cells = table.column(mask_col) if mask_col is not None else None
    splits = table.column(split_col) if split_col else None
    if splits is not None and table.is_csv:
        splits = [split.strip() for split in splits]
    separator = "/" if is_remote(root) else os.sep
    prefix = str(root) if str(root).endswith(separator) else str(root) + separator
    name, lines, bad, errors, values = table.name, table.lines, table.bad, targets.errors, targets.values
    # the objects it lists (images and masks): one listing per prefix holding them (their size and ETag), never one request per row
    placed = [_place(cell, prefix, path_col)[1] for cell in table.column(path_col)]
    if mask_cells is not None:
        placed += [_place(cell, prefix, str(mask_col), "mask")[1] for cell in mask_cells]
    listed = objectstore.stat_many([path for path in placed if is_remote(path)]) if any(map(is_remote, placed)) else {}
    files: list[SourceFile] = []
    special: list[tuple[str, str]] = []
    seen: dict[str, tuple[int, str]] = {}  # absolute path -> the line that lists it first, and its relpath
    for i, cell in enumerate(table.column(path_col)):
        line, mask_rel, mask = lines[i], "", ""
        origin = f"{name} line {line}"
        relpath, path, problem = _place(cell, prefix, path_col)
        if problem is None:  # one image written two ways (a.png, ./a.png, ROOT/a.png) is one image: compared as absolute paths
            first, written = seen.setdefault(path if is_remote(path) else os.path.abspath(path), (line, relpath))
            also = "" if written == relpath else f" (as {written!r})"
            problem = bad.get(i) or (f"{relpath!r} is listed twice, line {first} lists it already{also}; remove one of the rows"
                                     if first != line else errors.get(i))
        split = splits[i] if splits is not None else ""
        if problem is None and splits is not None and (not isinstance(split, str) or not split):
            problem = (f"empty split cell (column {split_col!r}); give the row a split name like train or val" if split in (None, "")
                       else f"split {split!r} is not a name (a string)")
        if problem is None and mask_cells is not None:
            mask_rel, mask, problem = _place(mask_cells[i], prefix, str(mask_col), "mask")
        etag = ""
        if problem is None and is_remote(path):  # an object: its listing's size and ETag (missing: size 0, the build reports it)
            found = listed.get(path)
            size, mtime, etag = (found.size, 0, found.etag) if found is not None else (0, 0, "")
        else:
            size, mtime, problem = _stat(path, relpath) if problem is None else (0, 0, problem)
        mask_etag = ""
        if problem is None and mask and is_remote(mask):  # a mask object: likewise (missing: the build reports it, naming the line)
            found = listed.get(mask)
            mask_size, mask_mtime, mask_etag = (found.size, 0, found.etag) if found is not None else (0, 0, "")
        else:
            mask_size, mask_mtime, problem = _stat(mask, mask_rel) if problem is None and mask else (0, 0, problem)
        if problem is not None:
            special.append((relpath, f"{origin}: {problem}"))
            continue
        files.append(SourceFile(path, relpath, values[i], size, mtime, split, origin, mask, mask_size, mask_mtime, etag, mask_etag))
    if mask_col is not None:
        return masks.mask_scan(root, files, special, options, {"manifest": table.name, "mask_column": mask_col})
    described: dict[str, Any] = {"manifest": table.name, "kind": targets.kind, "classes": targets.classes, "target_names": targets.names}
    meta: dict[str, Any] = {}
    if targets.kind == "boxes":  # each image's header read, the box rules applied
        files, meta = boxcolumns.finish(files, special, options)
        described["clip"] = bool(options.clip_boxes)
    identity = json.dumps(described, sort_keys=True, ensure_ascii=False)
    return SourceScan(root=root, classes=targets.classes, class_to_idx={c: k for k, c in enumerate(targets.classes)}, files=files,
                      special=special, target_kind=targets.kind, target_names=targets.names, identity=identity, target_meta=meta)


def has_samples(source: Path, options: SourceOptions | None = None) -> bool:
    """Whether the manifest has at least one data row (reads up to its first one)."""
    if is_remote(source):
        return bool(read_table(source).rows)  # type: ignore[arg-type]
    manifest = _manifest_file(source)
    with open(manifest, encoding="utf-8-sig", errors="replace", newline="") as handle:
        if manifest.suffix.lower() not in (".csv", ".tsv"):
            return any(line.strip() for line in handle)
        rows = (row for row in csv.reader(handle, delimiter=("\t" if manifest.suffix.lower() == ".tsv" else ",")) if any(row))
        try:
            return next(rows, None) is not None and next(rows, None) is not None
        except csv.Error as exc:
            raise SourceError(f"{str(manifest)!r}: {exc}. Fix the file (is it a {manifest.suffix} file?).") from None


def classes(source: Path, options: SourceOptions | None = None) -> tuple[list[str], dict[str, int]]:
    """The classes and ``class_to_idx`` of the manifest (it is parsed, its images are not looked at)."""
    found = labels(source, options)
    return found.classes, found.class_to_idx


def labels(source: Path, options: SourceOptions | None = None) -> Labels:
    """The classes, target kind and target names of the manifest (it is parsed, its images are not looked at)."""
    options = options or SourceOptions()
    table, _, _, label_cols, _, mask_col = _open(source, options)
    if mask_col is not None:
        return masks.mask_labels(options)
    targets = _targets(table, label_cols, options)
    return Labels(targets.classes, {c: k for k, c in enumerate(targets.classes)}, targets.kind, list(targets.names))


@dataclass
class _Targets:
    kind: str
    values: list[Any]  # per row: its Target, or None with a reason in errors
    errors: dict[int, str] = field(default_factory=dict)
    classes: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)


def _open(source: Path, options: SourceOptions, announce: bool = False) -> tuple[Table, Path, str, list[str], str | None, str | None]:
    """The parsed manifest of ``source``, its root, and its image, label, split and mask columns."""
    manifest = _manifest_file(source, announce)
    table = read_table(manifest)
    if not table.rows:
        raise SourceError(f"{table.path} has no data rows: list one image per row (below the header, for a CSV).")
    root = _root(manifest, options)
    path_col = _column(table, "path_column", options.path_column, ("path", "file_name"))
    if path_col is None:
        raise SourceError(f"{table.path} has no image column: expected 'path' (or Hugging Face's 'file_name'); its columns are "
                          f"{table.columns}. Name yours with path_column= (CLI --path-column, Hydra data.source_options.path_column).")
    mask_col = masks.mask_column(table.path, table.columns, options)
    if options.label_column is None:
        label_cols = ["label"] if "label" in table.columns and mask_col is None else []
    else:
        given = (options.label_column,) if isinstance(options.label_column, str) else options.label_column
        label_cols = [_column(table, "label_column", name, ()) or name for name in given]
    return table, root, path_col, label_cols, _column(table, "split_column", options.split_column, ("split",)), mask_col


def _manifest_file(source: Path, announce: bool = False) -> Path:
    """The manifest of ``source``: itself, or a Hugging Face folder's metadata file."""
    if is_remote(source) or not source.is_dir():
        return source
    found = [source / name for name in METADATA_NAMES if (source / name).is_file()]
    if len(found) != 1:
        raise SourceError(f"{str(source)!r} holds {'both' if found else 'neither'} metadata.csv {'and' if found else 'nor'} "
                          "metadata.jsonl: a Hugging Face image folder has one metadata file; keep one.")
    if announce and any(entry.is_dir() for entry in os.scandir(source)):
        log.info("%s: reading its images and labels from %s, not from its subfolders.", source, found[0].name)
    return found[0]


def _root(manifest: Path, options: SourceOptions) -> Path:
    if options.root is not None and is_remote(options.root):
        return options.root.rstrip("/")  # type: ignore[return-value]
    if is_remote(manifest):  # the manifest's "folder": its URL without its name
        if options.root is not None:
            raise SourceError(f"root={options.root!r} is a local folder, but the manifest {urls.redact(str(manifest))} is on object "
                              "storage: give root= as a URL (s3://bucket/prefix), or leave it unset (the manifest's own prefix).")
        return urls.parent(str(manifest))  # type: ignore[return-value]
    if options.root is None:
        return manifest.parent.resolve()
    root = Path(options.root).expanduser().resolve()
    if not root.is_dir():
        raise SourceError(f"root={options.root!r} is not a folder ({str(root)!r}); pass the folder that the image paths of "
                          f"{str(manifest)!r} are relative to.")
    return root


def _column(table: Table, option: str, given: str | None, defaults: tuple[str, ...]) -> str | None:
    """``given`` (which must be a column), else the first of ``defaults`` the manifest has, else None."""
    if given is not None:
        if given not in table.columns:
            raise SourceError(f"{table.path} has no column {given!r} ({option}={given!r}); its columns are {table.columns}.")
        return given
    return next((name for name in defaults if name in table.columns), None)


def _place(cell: Any, prefix: str, column: str, what: str = "image") -> tuple[str, str, str | None]:
    """``(relpath, path, None)`` of an image (or mask) cell (``prefix``: the root and a separator), or ``(cell as written, "", reason)``."""
    if not isinstance(cell, str) or not cell:
        return ("" if cell is None else str(cell)), "", (f"empty {what} cell (column {column!r})" if cell in (None, "")
                                                         else f"{what} path {cell!r} is not a string")
    if cell.startswith("/") or (os.name == "nt" and os.path.isabs(cell)) or is_remote(cell):  # absolute, or a full URL
        return cell, cell, None
    native = os.path.normpath(cell)
    if native == os.pardir or native.startswith(_UP):
        return cell, "", (f"{what} path {cell!r} leads out of the root {prefix[:-1] or prefix!r}; list it relative to the root, give "
                          "its absolute path, or set root= to a folder that holds it")
    return native.replace(os.sep, "/"), prefix + native, None


def _stat(path: str, relpath: str) -> tuple[int, int, str | None]:
    """``(size, mtime_ns, None)`` of a listed file (``0, 0`` when missing or unreadable: the build reports it, naming the line), or
    ``(0, 0, reason)`` for a FIFO, socket, device or folder."""
    try:
        st = os.stat(path)
    except OSError:
        return 0, 0, None
    except ValueError:  # a NUL character, or text that is no file name (a lone surrogate: not UTF-8)
        why = "it holds a NUL character" if "\0" in path else "it is not valid Unicode text"
        return 0, 0, f"{relpath!r} cannot be a file name ({why}); fix the path"
    return st.st_size, st.st_mtime_ns, (None if stat.S_ISREG(st.st_mode) else f"{relpath!r} {not_regular_reason(st.st_mode)}")


def _tag(value: Any, is_csv: bool) -> str | None:
    """What a label value looks like, for inferring the target kind (None: empty; "other": malformed for every kind)."""
    if value is None or value == "":
        return None
    if isinstance(value, list):
        floats = [v for v in value if isinstance(v, float)]
        return "list" if not floats else "wholelist" if all(v.is_integer() for v in floats) else "fraclist"
    if isinstance(value, str):
        if not is_csv or not _numeric(value):
            return "name"
        try:
            value = int(value)
        except ValueError:
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "other"
    return "int" if isinstance(value, int) else "whole" if value.is_integer() else "frac"


def _numeric(cell: str) -> bool:
    """Whether a CSV cell may be read as a number: Python's ``int`` / ``float`` of plain ASCII, no ``_`` (``1_1``, ``٣`` are names)."""
    if not cell.isascii() or "_" in cell or cell != cell.strip():
        return False
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _firsts(values: list[Any]) -> list[int]:
    """Per row, the first row with the same value, compared by type and value (``1``, ``1.0`` and ``True`` differ)."""
    first: dict[Any, int] = {}
    out = []
    for i, value in enumerate(values):
        key = (list, tuple([(v.__class__, v) for v in value])) if value.__class__ is list else (value.__class__, value)
        try:
            out.append(first.setdefault(key, i))
        except TypeError:  # unhashable: a JSON object, or a list holding one
            out.append(i)
    return out


def _infer(table: Table, column: str, values: list[Any], firsts: list[int]) -> str:
    first: dict[str, int] = {}
    for i, value in enumerate(values):
        tag = _tag(value, table.is_csv) if firsts[i] == i else None
        if tag is not None:
            first.setdefault(tag, i)
    tags = set(first) - {"other"}  # malformed for any kind: row errors of the kind inferred from the rest
    if tags in ({"int"}, {"name"}) or (table.is_csv and tags == {"int", "name"}):
        return "class"
    if tags == {"list"}:
        return "multilabel"
    if ("frac" in tags and tags <= {"int", "whole", "frac"}) or ("fraclist" in tags and tags <= {"list", "fraclist", "wholelist"}):
        return "regression"
    found = ", ".join(f"{_TAG_WORDS[t]} (line {table.lines[i]}: {values[i]!r})" for t, i in sorted(first.items(), key=lambda x: x[1])
                      if t != "other")
    single = first.get("name", first.get("int"))
    if "list" in tags and tags <= {"list", "name", "int"} and single is not None:  # multi-label rows, some written as one label
        raise SourceError(f"{table.path}: column {column!r} holds lists of labels and single labels: {found}. For a multi-label target "
                          f"set target_kind='multilabel' (CLI --target-kind multilabel, Hydra data.source_options.target_kind): a single "
                          f"label is then a list of one; or write line {table.lines[single]}'s label as a list: "
                          f"{json.dumps([values[single]], ensure_ascii=False)}.")
    raise SourceError(f"{table.path}: cannot tell which kind of target column {column!r} holds: {found or 'no values'}. {_SET_KIND}")


def _targets(table: Table, columns: list[str], options: SourceOptions) -> _Targets:
    kind, n = options.target_kind, len(table.rows)
    if boxcolumns.holds_boxes(table, options):  # a boxes column (detection): lightning_lmdb.sources.boxcolumns
        values, errors, found = boxcolumns.box_targets(table, options)
        return _Targets("boxes", values, errors, classes=found)
    if kind is not None and kind not in _READ_HERE:  # a kind of yours: each cell held as its entry holds it
        return _held(table, columns, target_kind(kind), options)
    if kind == "none" or not columns:
        if kind not in (None, "none"):
            raise SourceError(f"{table.path} has no 'label' column for target_kind={kind!r}; its columns are {table.columns}. "
                              "Name the target column with label_column= (CLI --label-column, Hydra data.source_options.label_column).")
        unused = {k: v for k, v in options.as_dict().items() if k in ("classes", "label_sep")}
        if unused:
            raise OptionError(f"{', '.join(f'{k}={v!r}' for k, v in unused.items())}: the target of {table.path} is 'none' (no label "
                              "column); set label_column=, or leave these unset.")
        return _Targets("none", [NO_TARGET] * n)
    if options.label_sep is not None and kind not in (None, "multilabel"):
        raise OptionError(f"label_sep={options.label_sep!r} splits multi-label cells; it does not apply to target_kind={kind!r}.")
    if len(columns) > 1 and kind not in (None, "regression"):
        raise OptionError(f"label_column={columns!r}: several label columns make a regression target, not target_kind={kind!r}.")
    if len(columns) > 1 or kind == "regression":
        if options.classes is not None:
            raise OptionError(f"classes={list(options.classes)!r} does not apply to a regression target; leave it unset.")
        return _regression(table, columns)
    values = table.column(columns[0])
    if table.is_csv:  # "path, label": a cell's spaces are not part of its label, as a header name's are not part of the name
        values = [value.strip() for value in values]
    firsts = _firsts(values)  # each distinct label is looked at once
    if kind is None:
        kind = "multilabel" if options.label_sep is not None else _infer(table, columns[0], values, firsts)
        if kind == "regression":
            return _targets(table, columns, replace(options, target_kind="regression"))
    return _categorical(table, columns[0], values, firsts, kind == "multilabel", options)


#: The target kinds whose cells this module reads itself (names, indices, lists, numbers); a mask column is read apart.
_READ_HERE = ("class", "multilabel", "regression", "none")


def _held(table: Table, columns: list[str], kind: TargetKind, options: SourceOptions) -> _Targets:
    """The targets of a registered kind of yours: one column, each cell (a JSON value; a CSV cell is parsed as JSON) given to
    the kind's :meth:`~lightning_lmdb.targets.TargetKind.hold`; a cell it refuses is a row error."""
    if len(columns) != 1:
        raise OptionError(f"target_kind={kind.name!r} reads one label column, not {columns or 'none'}: name it with label_column= "
                          "(CLI --label-column, Hydra data.source_options.label_column).")
    result = _Targets(kind.name, [None] * len(table.rows), classes=list(options.classes or ()))
    for i, value in enumerate(table.column(columns[0])):
        if value is None or value == "":
            result.errors[i] = "empty label"
            continue
        try:
            result.values[i] = kind.hold(json.loads(value) if table.is_csv else value)
        except ValueError as exc:  # json.JSONDecodeError too
            result.errors[i] = f"label {value!r} {exc}" if not isinstance(exc, json.JSONDecodeError) else f"malformed label {value!r}"
    return result


def _tokens(value: Any, multi: bool, sep: str | None) -> list[Any] | str:
    """The labels of one cell (names or ints, unchecked; a multi-label cell's single name or index is a list of one), or a row error."""
    if value is None or value == "":
        return [] if multi else "empty label"
    if multi and isinstance(value, str) and sep is not None:
        return [t for t in (part.strip() for part in value.split(sep)) if t]
    items = [value] if not isinstance(value, list) else value if multi else None
    if items is None or any(isinstance(t, bool) or not isinstance(t, (str, int)) or t == "" for t in items):
        return f"malformed label {value!r}: expected {'a list of class names or indices' if multi else 'a class name or index'}"
    return items


def _categorical(table: Table, column: str, values: list[Any], firsts: list[int], multi: bool, options: SourceOptions) -> _Targets:
    if multi and table.is_csv and options.label_sep is None:
        raise OptionError(f"{table.path}: a CSV multi-label column ({column!r}) needs label_sep=, the character between the "
                          "labels of a cell (e.g. '|'; CLI --label-sep, Hydra data.source_options.label_sep).")
    distinct = {i: _tokens(value, multi, options.label_sep) for i, value in enumerate(values) if firsts[i] == i}
    tokens = {t for cell in distinct.values() if isinstance(cell, list) for t in cell}
    if table.is_csv:  # every cell an index (0, 7, 12; not 07, +7, 1_2): class indices -- unless a given class list names them
        named = bool(options.classes) and tokens <= set(options.classes)
        number: dict[Any, int] | None = ({t: int(t) for t in tokens} if not named and all(_INDEX.fullmatch(t) for t in tokens)
                                         else None)
        if number is None and not named and options.classes is None and tokens and all(_numeric(t) and float(t).is_integer()
                                                                                         for t in tokens):
            odd = next(i for i, c in distinct.items() if isinstance(c, list) and any(not _INDEX.fullmatch(t) for t in c))
            log.warning("%s: column %r is read as class names, not indices: line %d's %r is not written as an index (0, 1, 2, ...). "
                        "Write the indices so, or pass classes= to give the names in index order.",
                        table.path, column, table.lines[odd], values[odd])
    else:
        where = {kind: next((i for i, c in distinct.items() if isinstance(c, list) and any(isinstance(t, kind) for t in c)), None)
                 for kind in (str, int)}
        if where[str] is not None and where[int] is not None:
            raise SourceError(f"{table.path}: column {column!r} mixes class names (line {table.lines[where[str]]}) and class "
                              f"indices (line {table.lines[where[int]]}); use one or the other.")
        number = {t: t for t in tokens} if where[int] is not None else None
    result = _Targets("multilabel" if multi else "class", [None] * len(values), classes=list(options.classes or ()))
    if number is not None:
        top = max(number.values(), default=-1)
        if options.classes is None and top >= _MAX_INDEX_CLASSES:
            raise SourceError(f"{table.path} column {column!r}: class index {top} would make {top + 1} classes; is it the label "
                              "column? Pass classes= to name the classes.")
        result.classes = result.classes if options.classes is not None else [str(k) for k in range(top + 1)]
        known = {t: k for t, k in number.items() if 0 <= k < len(result.classes)}
    else:
        result.classes = result.classes if options.classes is not None else sorted(tokens)
        known = {c: k for k, c in enumerate(result.classes)}
    outcomes = {i: _resolve(cell, known, multi, number is not None, result.classes) for i, cell in distinct.items()}
    for i, first in enumerate(firsts):
        target, error = outcomes[first]
        if error is None:
            result.values[i] = target
        else:
            result.errors[i] = error
    return result


def _resolve(cell: list[Any] | str, known: dict[Any, int], multi: bool, indices: bool, classes: list[str]) -> tuple[Any, str | None]:
    """The target of a cell's labels, or the row error."""
    if isinstance(cell, str):
        return None, cell
    unknown = next((t for t in cell if t not in known), None)
    if unknown is None:
        return (tuple(sorted({known[t] for t in cell})) if multi else known[cell[0]]), None
    if indices:
        return None, f"class index {unknown} is out of range: there are {len(classes)} classes (0..{len(classes) - 1})"
    shown = repr(classes) if len(classes) <= 20 else f"[{', '.join(map(repr, classes[:20]))}, ...]"
    return None, f"label {unknown!r} is not one of the classes {shown}; fix the label or add the class to classes="


def _number(value: Any) -> float | str:
    """A finite float of a regression cell, or a row error."""
    if value is None or value == "":
        return "empty label"
    try:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError
        number = float(value)
    except (ValueError, OverflowError):
        return f"malformed label {value!r}: not a number"
    return number if math.isfinite(number) else f"label {value!r} is not a finite number"


def _regression(table: Table, columns: list[str]) -> _Targets:
    cells = [table.column(c) for c in columns]
    first = next((v for v in cells[0] if v is not None and v != ""), None) if len(columns) == 1 else None
    listed = isinstance(first, list)
    result, k = _Targets("regression", [None] * len(table.rows)), None
    for i, row in enumerate(zip(*cells)):
        if listed and (not isinstance(row[0], list) or not row[0]):
            result.errors[i] = "empty label" if row[0] in (None, "") else f"malformed label {row[0]!r}: expected a list of numbers"
            continue
        numbers = [_number(v) for v in (row[0] if listed else row)]
        bad = next((j for j, x in enumerate(numbers) if isinstance(x, str)), None)
        if bad is not None:
            result.errors[i] = numbers[bad] + (f" (column {columns[bad]!r})" if len(columns) > 1 else "")
        elif k is not None and len(numbers) != k:
            result.errors[i] = f"label has {len(numbers)} numbers, the rows above have {k}"
        else:
            k = len(numbers)
            result.values[i] = tuple(numbers)
    result.names = [f"{columns[0]}[{j}]" for j in range(k or 0)] if listed else list(columns)
    return result
