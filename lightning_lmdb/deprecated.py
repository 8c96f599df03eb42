"""Old names kept for one release: a module's ``__getattr__`` that answers them with a ``DeprecationWarning``.

A module that renamed a module-level name keeps the old one working with::

    __getattr__ = deprecated_names(__name__, {"OldName": (NewThing, "NewName")})

Reading ``module.OldName`` (or ``from module import OldName``) then returns ``NewThing`` and warns, naming the new name;
any other missing name raises ``AttributeError`` as usual. The new name is written as ``module.NewName`` unless it holds a
dot (then it is taken as the full path).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any


def deprecated_names(module: str, renamed: Mapping[str, tuple[Any, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` answering each old name of ``renamed`` (old name -> (the object, its new name)) with a warning.

    Args:
        module: The module's ``__name__``.
        renamed: Each old name, with the object it now is and the name to use instead.
    """

    def __getattr__(name: str) -> Any:
        if name in renamed:
            value, new = renamed[name]
            where = new if "." in new else f"{module}.{new}"
            warnings.warn(f"{module}.{name} is deprecated, use {where} (the old name is removed in the next release).",
                          DeprecationWarning, stacklevel=2)
            return value
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` (an argument or attribute) is deprecated in favour of ``new``."""
    warnings.warn(f"{old} is deprecated, use {new} (the old name is removed in the next release).", DeprecationWarning,
                  stacklevel=stacklevel)


def renamed_class(new: type, old_name: str) -> type:
    """The class ``new`` under its old name ``old_name``: reading it is silent, constructing it warns and returns a ``new``.

    ``isinstance(x, Old)`` and ``issubclass(C, Old)`` answer as for ``new``, so code that checks against the old name keeps
    working, and an instance made through the old name is a plain ``new`` (equal to one made directly, pickled as one).
    """
    module = new.__module__

    class _Renamed(type(new)):  # type: ignore[misc]
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            warn_renamed(f"{module}.{old_name}", f"{module}.{new.__qualname__}")
            return new(*args, **kwargs)

        def __instancecheck__(cls, instance: Any) -> bool:
            return isinstance(instance, new)

        def __subclasscheck__(cls, subclass: type) -> bool:
            return issubclass(subclass, new)

    doc = f"Deprecated alias of :class:`{new.__qualname__}` (constructing it warns); removed in the next release."
    return _Renamed(old_name, (new,), {"__doc__": doc, "__module__": module, "__qualname__": old_name})
