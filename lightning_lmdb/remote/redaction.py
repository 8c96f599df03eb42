"""What stands for a secret: ``storage_options`` values replaced by ``"***"`` in a config before anything saves it.

Used by :mod:`~lightning_lmdb.datamodule` (the config ``LightningCLI`` saves) and :mod:`~lightning_lmdb.experiment.secrets`
(Hydra's files and logs). Plain Python: no Lightning, Hydra or ``jsonargparse`` import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

#: What a secret is written as.
REDACTED = "***"
#: The key whose values are secrets wherever it appears in a config.
SECRET_KEY = "storage_options"
#: A value that only names an environment variable (``${oc.env:NAME}``, also ``${env:NAME}``): kept as it is.
_ENV_REFERENCE = re.compile(r"^\$\{(?:oc\.)?env:[A-Za-z_][A-Za-z0-9_]*\}$")


def is_env_reference(value: object) -> bool:
    """Whether ``value`` is ``${oc.env:NAME}`` (or ``${env:NAME}``) with no default: a name, not a secret."""
    return isinstance(value, str) and _ENV_REFERENCE.match(value.strip()) is not None


def redact_options(value: Any) -> Any:
    """``value`` (a ``storage_options`` mapping, or one of its values) with every leaf ``"***"`` but environment references."""
    if isinstance(value, Mapping):
        return {key: redact_options(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_options(item) for item in value]
    if value is None or is_env_reference(value):
        return value
    return REDACTED


def redacted_namespace(config: Any) -> Any:
    """A deep copy of a ``jsonargparse`` namespace with every ``storage_options`` value redacted (:func:`redact_options`)."""
    import copy

    out = copy.deepcopy(config)
    stack = [out]
    while stack:
        node = stack.pop()
        items = vars(node) if hasattr(node, "__dict__") and not isinstance(node, (dict, list)) else node
        if isinstance(items, dict):
            for key in list(items):
                if key == SECRET_KEY and items[key]:
                    items[key] = redact_options(items[key])
                elif isinstance(items[key], (dict, list)) or type(items[key]).__name__ == "Namespace":
                    stack.append(items[key])
        elif isinstance(items, list):
            stack.extend(item for item in items if isinstance(item, (dict, list)) or type(item).__name__ == "Namespace")
    return out
