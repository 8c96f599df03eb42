"""A manifest's box columns (:mod:`lightning_lmdb.sources.manifest`): target kind ``"boxes"``.

A manifest (JSON Lines or CSV) holds boxes when it has a ``boxes`` column and ``target_kind`` is unset, or under
``target_kind="boxes"``: per row ``boxes`` is ``[[x1, y1, x2, y2], ...]`` in pixels of the image as stored (``XYXY``), and the
labels column -- ``label_column=``, else ``labels``, else ``label`` -- the class of each box, ``[name, ...]`` or ``[index,
...]`` (one per box, in order). A CSV cell holds the same JSON text (``"[[0, 0, 10, 10]]"``). An empty cell, or ``[]`` in
both, is an image without boxes. Classes: the sorted names (as ImageFolder sorts its folders) or, for indices, ``"0"`` ..
``"N"``; ``classes=`` gives them in index order.

Row errors (a cell that is not such a list, a box that is not four numbers, a count of labels that differs from the
boxes', an unknown class name, an index out of range) are the manifest's row errors (``SourceScan.special``, naming the
line); once the rows are read, :func:`finish` reads each image's header and applies the box rules of
:mod:`lightning_lmdb.sources.boxcheck` (degenerate boxes dropped, a pixel past an edge clipped, more refused).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from lightning_lmdb.errors import OptionError, SourceError
from lightning_lmdb.remote.objects import RemoteObject
from lightning_lmdb.sources import boxcheck
from lightning_lmdb.sources.base import SourceFile, SourceOptions
from lightning_lmdb.sources.manifestfile import Table
from lightning_lmdb.targets.boxes import Boxes

__all__ = ["BOXES_COLUMN", "box_targets", "finish", "holds_boxes"]

#: The column of a manifest's boxes.
BOXES_COLUMN = "boxes"
#: What a raw row holds until :func:`finish`: the boxes as written and the class indices.
RawBoxes = tuple[tuple[tuple[float, ...], ...], tuple[int, ...]]


def holds_boxes(table: Table, options: SourceOptions) -> bool:
    """Whether the manifest's targets are boxes: ``target_kind="boxes"``, or a ``boxes`` column with ``target_kind`` unset."""
    return options.target_kind == "boxes" or (options.target_kind is None and BOXES_COLUMN in table.columns)


def _labels_column(table: Table, options: SourceOptions) -> str:
    given = options.label_column
    if isinstance(given, tuple):
        raise OptionError(f"label_column={list(given)!r}: a boxes manifest has one labels column (one class per box); name it alone.")
    if given is not None:
        if given not in table.columns:
            raise SourceError(f"{table.path} has no column {given!r} (label_column={given!r}); its columns are {table.columns}.")
        return given
    found = next((name for name in ("labels", "label") if name in table.columns), None)
    if found is None:
        raise SourceError(f"{table.path} has a 'boxes' column but no 'labels' column (one class per box); its columns are "
                          f"{table.columns}. Name it with label_column= (CLI --label-column, Hydra data.source_options.label_column).")
    return found


def _cell(value: Any, is_csv: bool, what: str) -> list[Any] | str:
    """The list in a cell, or the row error."""
    if value is None or value == "":
        return []
    if is_csv:
        try:
            value = json.loads(value)
        except ValueError:
            return f"{what} cell {value[:80]!r} is not a JSON list"
    if not isinstance(value, list):
        return f"{what} {str(value)[:80]!r} is not a list"
    return value


def box_targets(table: Table, options: SourceOptions) -> tuple[list[RawBoxes | None], dict[int, str], list[str]]:
    """Per row its raw boxes (``None`` with a row error), the row errors, and the classes.

    Raises:
        SourceError: No labels column, or names mixed with indices.
        OptionError: Options that do not apply to boxes (``label_sep``, several label columns).
    """
    if options.label_sep is not None:
        raise OptionError(f"label_sep={options.label_sep!r} splits multi-label cells; a boxes manifest's labels are a JSON list per row.")
    if BOXES_COLUMN not in table.columns:
        raise SourceError(f"{table.path} has no 'boxes' column for target_kind='boxes'; its columns are {table.columns}. A boxes manifest "
                          "lists per row boxes: [[x1, y1, x2, y2], ...] in pixels and labels: [class, ...].")
    label_col = _labels_column(table, options)
    rows: list[tuple[list[Any], list[Any]] | None] = []
    errors: dict[int, str] = {}
    for i, (boxes, labels) in enumerate(zip(table.column(BOXES_COLUMN), table.column(label_col))):
        b, lab = _cell(boxes, table.is_csv, "boxes"), _cell(labels, table.is_csv, "labels")
        problem = b if isinstance(b, str) else lab if isinstance(lab, str) else None
        if problem is None and len(b) != len(lab):
            problem = f"{len(b)} boxes but {len(lab)} labels (column {label_col!r}); give one label per box"
        if problem is None:
            bad = next((box for box in b if not isinstance(box, list) or len(box) != 4
                        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box)), None)
            if bad is not None:
                problem = f"box {str(bad)[:80]} is not [x1, y1, x2, y2] (four numbers, pixels)"
            elif any(isinstance(t, bool) or not isinstance(t, (str, int)) or t == "" for t in lab):
                problem = f"labels {str(lab)[:80]} are not class names or indices"
        if problem is not None:
            errors[i] = problem
            rows.append(None)
        else:
            rows.append((b, lab))
    tokens = {t for row in rows if row is not None for t in row[1]}
    names, indices = [t for t in tokens if isinstance(t, str)], [t for t in tokens if isinstance(t, int)]
    if names and indices:
        raise SourceError(f"{table.path}: column {label_col!r} mixes class names ({sorted(names)[:3]}) and class indices "
                          f"({sorted(indices)[:3]}); use one or the other.")
    if options.classes is not None:
        found = list(options.classes)
        known: dict[Any, int] = ({k: k for k in indices if 0 <= k < len(found)} if indices else {c: k for k, c in enumerate(found)})
    elif indices:
        found = [str(k) for k in range(max(indices) + 1)]
        known = {k: k for k in indices}
    else:
        found = sorted(names)
        known = {c: k for k, c in enumerate(found)}
    values: list[RawBoxes | None] = []
    for i, row in enumerate(rows):
        if row is None:
            values.append(None)
            continue
        unknown = next((t for t in row[1] if t not in known), None)
        if unknown is not None:
            errors[i] = (f"class index {unknown} is out of range: there are {len(found)} classes" if isinstance(unknown, int) else
                         f"label {unknown!r} is not one of the classes {found[:20]}; fix the label or add the class to classes=")
            values.append(None)
            continue
        values.append((tuple(tuple(float(v) for v in box) for box in row[0]), tuple(known[t] for t in row[1])))
    return values, errors, found


def finish(files: list[SourceFile], special: list[tuple[str, str]], options: SourceOptions) -> tuple[list[SourceFile], dict[str, Any]]:
    """The files with their :class:`~lightning_lmdb.targets.boxes.Boxes` (each image's header read, the box rules applied), and
    the ``target_meta``; an image that is missing, unreadable or has a refused box goes to ``special`` (named by its line). The
    headers of objects (rows naming URLs) are fetched concurrently, each by a ranged GET with its listed ETag."""
    tally = boxcheck.BoxTally(clip=bool(options.clip_boxes))
    kept: list[SourceFile] = []
    # objects (listed with an ETag): their headers fetched at once, by ranged GETs (boxcheck.Images)
    listed = {f.path: RemoteObject(f.path, f.size, f.etag) for f in files if f.etag}
    remote = boxcheck.Images(listed, listed) if listed else None
    for f in files:
        raw: RawBoxes = f.target  # type: ignore[assignment]
        problem = None if f.size or f.mtime_ns else "the image file is missing; add it, or remove the row"
        if problem is None:
            try:
                width, height, orientation = remote.header(f.path) if remote is not None and f.etag else boxcheck.image_header(f.path)
            except OSError as exc:
                problem = f"{f.relpath!r} {exc}"
        boxes, labels = [], []
        for box, label in zip(*raw) if problem is None else ():
            try:
                found = tally.box(*box, width, height)
            except boxcheck.BadBox as exc:
                problem = str(exc)
                break
            if found is not None:
                boxes.append(found)
                labels.append(label)
        if problem is not None:
            special.append((f.relpath, f"{f.origin}: {problem}"))
            continue
        tally.orientation(f.relpath, orientation)
        kept.append(replace(f, target=Boxes(tuple(boxes), tuple(labels), image_size=(height, width))))  # type: ignore[arg-type]
    return kept, tally.meta(format="manifest")
