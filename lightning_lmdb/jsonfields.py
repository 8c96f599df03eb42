"""Typed reading of JSON objects read back from disk (a database's header, a sharded folder's manifest).

:class:`JsonFields` gives each field of one object with its type checked; a missing field or a wrong type
is a :class:`~lightning_lmdb.errors.DatabaseError` that names the file and the field. Re-exported by
:mod:`lightning_lmdb.store.format`.
"""

from __future__ import annotations

import os
from typing import Any

from lightning_lmdb.errors import DatabaseError


class JsonFields:
    """Typed access to one JSON object's fields; a missing field or wrong type is a ``DatabaseError`` naming it."""

    def __init__(self, obj: dict[str, Any], path: str | os.PathLike[str], prefix: str = ""):
        self.obj, self.path, self.prefix = obj, path, prefix

    def fail(self, name: str, problem: str) -> Any:
        raise DatabaseError(
            f"Metadata of {str(self.path)!r}: field {self.prefix}{name!r} {problem}. The database is damaged or was "
            "written by another tool; rebuild it with lightning-lmdb build."
        )

    def __call__(self, name: str, kind: type) -> Any:
        if name not in self.obj:
            self.fail(name, "is missing")
        value = self.obj[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.fail(name, f"should be {_JSON_NAMES[kind]}, not {type(value).__name__} ({_short(value)})")
        return value

    def list_of(self, name: str, kind: type, length: int | None = None) -> list[Any]:
        value = self(name, list)
        for i, item in enumerate(value):
            if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
                self.fail(f"{name}[{i}]", f"should be {_JSON_NAMES[kind]}, not {type(item).__name__} ({_short(item)})")
        if length is not None and len(value) != length:
            self.fail(name, f"holds {len(value)} entries, but count is {length}")
        return value

    def dict_of(self, name: str, kind: type) -> dict[str, Any]:
        value = self(name, dict)
        for key, item in value.items():
            if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
                self.fail(f"{name}[{key!r}]", f"should be {_JSON_NAMES[kind]}, not {type(item).__name__} ({_short(item)})")
        return value


_JSON_NAMES = {int: "an integer", str: "a string", list: "a list", dict: "an object"}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
