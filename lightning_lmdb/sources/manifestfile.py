"""Reading a manifest file (:mod:`lightning_lmdb.sources.manifest`) into a :class:`Table`: its columns, and per data row its physical
line and its cells.

UTF-8 (a spreadsheet's byte-order mark is accepted). CSV and TSV: the first row is the header; rows of empty cells are
ignored. JSON Lines: one object per line, each line parsed alone (an object split over two lines is an error naming the line),
its keys the columns (a missing key is an empty cell). Blank lines are ignored.
A file that cannot be read as a whole (not UTF-8, not JSON, no header, a column named twice) raises
:class:`~lightning_lmdb.errors.SourceError` naming the file and the line.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from lightning_lmdb.errors import SourceError
from lightning_lmdb.remote.urls import is_remote, redact

__all__ = ["Table", "read_table"]


@dataclass
class Table:
    """A parsed manifest: its columns, and per data row its physical line and its cells."""

    path: str  # the manifest, quoted, for file-level messages
    name: str  # its file name, for row messages
    is_csv: bool
    columns: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    rows: list[Any] = field(default_factory=list)  # lists of cells (CSV), dicts (JSON Lines)
    bad: dict[int, str] = field(default_factory=dict)  # row index -> a row error found while reading

    def column(self, name: str) -> list[Any]:
        """The cells of column ``name``, one per row (``""`` / ``None`` where a row has none)."""
        if not self.is_csv:
            return [row.get(name) for row in self.rows]
        i = self.columns.index(name)
        return [row[i] if i < len(row) else "" for row in self.rows]


def read_table(manifest: Path) -> Table:
    """The table of the manifest file ``manifest`` (``.csv`` / ``.tsv``: CSV, else JSON Lines); a URL is read in one GET."""
    if is_remote(manifest):
        from lightning_lmdb.remote import objects

        url = str(manifest)
        data, shown = objects.read(url), redact(url)
        manifest = _Named(url.split("://", 1)[1])
        manifest.shown = shown  # type: ignore[attr-defined]
    else:
        data, shown = manifest.read_bytes(), str(manifest)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        raise SourceError(f"{shown!r} line {line} is not UTF-8 text (byte {exc.object[exc.start]:#04x}); "
                          "save the manifest as UTF-8.") from None
    return (_read_csv if manifest.suffix.lower() in (".csv", ".tsv") else _read_jsonl)(manifest, text)


class _Named(PurePosixPath):
    """A manifest object's name as its messages show it: the redacted URL (its suffix and name as a path's)."""

    def __str__(self) -> str:
        return self.shown  # type: ignore[attr-defined]


def _read_csv(manifest: Path, text: str) -> Table:
    table = Table(repr(str(manifest)), manifest.name, True)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=("\t" if manifest.suffix.lower() == ".tsv" else ","))
    header, last = None, 0
    try:
        for row in reader:
            line, last = last + 1, reader.line_num
            if not any(row):
                continue
            if header is None:
                header = [name.strip() for name in row]
            else:
                if len(row) > len(header):
                    table.bad[len(table.rows)] = (f"{len(row)} cells, the header has {len(header)}; quote a cell that holds "
                                                  f"{'a tab' if manifest.suffix.lower() == '.tsv' else 'a comma'}")
                table.rows.append(row)
                table.lines.append(line)
    except csv.Error as exc:
        raise SourceError(f"{table.path} line {reader.line_num}: {exc}. Fix the file (is it a {manifest.suffix} file?).") from None
    if header is None:
        raise SourceError(f"{table.path} is empty: a manifest starts with a header row naming its columns (e.g. path,label).")
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise SourceError(f"{table.path}: the header names column(s) {twice} more than once; rename them.")
    table.columns = header
    return table


def _read_jsonl(manifest: Path, text: str) -> Table:
    table = Table(repr(str(manifest)), manifest.name, False)
    numbered = [(number, line) for number, line in enumerate(text.split("\n"), 1) if line.strip()]
    # each line alone: parsed together, an object split over two lines could pass as rows (and a row take another line's labels)
    rows = [_json_object(table.path, number, line) for number, line in numbered]
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    table.columns, table.rows, table.lines = list(columns), rows, [number for number, _ in numbered]
    return table


def _json_object(path: str, number: int, line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as exc:
        why = f"{exc.msg}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise SourceError(f"{path} line {number} is not JSON ({why}): a JSON Lines manifest holds one JSON object per line.") from None
    if not isinstance(row, dict):
        raise SourceError(f"{path} line {number} is a JSON {type(row).__name__}, not an object: write one object per line, "
                          'e.g. {"path": "a.jpg", "label": "cat"}.')
    return row
