"""Keeping ``storage_options`` (object-storage credentials) out of what a run writes: configs, overrides, logs, summaries.

:class:`~lightning_lmdb.LMDBDataModule` never saves its ``storage_options`` (not a hyper-parameter, so not in a checkpoint or
``hparams.yaml``), but the tools around it copy their input: Hydra writes the composed config and the command-line overrides
to ``.hydra/`` (and ``multirun.yaml``), Hydra's launcher logs each job's overrides, ``LightningCLI`` saves its parsed
config as ``config.yaml``. This module redacts them, with no Hydra import (``train.py`` calls it on Hydra's files):

- :func:`redact_tree`: a config (nested mappings and lists) with every value under a ``storage_options`` key replaced by
  ``"***"``, except a reference to an environment variable (``${oc.env:AWS_SECRET_ACCESS_KEY}``: the name is no secret and
  the config stays reusable);
- :func:`redact_override`: one Hydra override (``+data.storage_options.secret=...``) with its value replaced when its key
  path contains ``storage_options``;
- :func:`redact_yaml_file`: a YAML file rewritten with both (only when something changed);
- :class:`RedactingRecordFactory`: log records with the secrets of the command line replaced, whatever logs them;
- :class:`RedactedSaveConfigCallback`: ``LightningCLI``'s ``config.yaml`` without them.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.cli import SaveConfigCallback  # imports jsonargparse only where it is installed

from lightning_lmdb.remote.redaction import REDACTED, SECRET_KEY, is_env_reference, redact_options, redacted_namespace

#: Values too plain to replace as text (``anon=true`` must not turn every ``true`` of a file into ``***``).
_PLAIN = {"true", "false", "null", "none", "~", ""}


def redact_tree(value: Any) -> Any:
    """A copy of ``value`` (nested mappings and lists) with what is under every ``storage_options`` key redacted
    (:func:`redact_options`), and every string that is a Hydra override of one, or holds several (``override_dirname``),
    redacted (:func:`redact_override`, :func:`redact_text`)."""
    if isinstance(value, Mapping):
        return {key: redact_options(item) if key == SECRET_KEY else redact_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_tree(item) for item in value]
    if isinstance(value, str):  # an override, or several joined (hydra.job.override_dirname)
        return redact_override(value) if "," not in value else redact_text(value, ())
    return value


_OVERRIDE = re.compile(r"^(?P<key>[~+]{0,2}[\w.\-/@:]+)=(?P<value>.*)$", re.S)


def _override_parts(override: str) -> tuple[str, str] | None:
    found = _OVERRIDE.match(override)
    if found is None or SECRET_KEY not in found.group("key").split("/")[-1].split("."):
        return None
    return found.group("key"), found.group("value")


def redact_override(override: str) -> str:
    """A Hydra override (``key=value``) with its value ``"***"`` when the key path contains ``storage_options``
    (``+data.storage_options.secret=XYZ`` -> ``+data.storage_options.secret=***``; a whole mapping
    ``data.storage_options={key:K,secret:S}`` -> ``data.storage_options=***``); an environment reference is kept."""
    parts = _override_parts(override)
    if parts is None:
        return override
    key, value = parts
    return override if is_env_reference(value) or value.strip().lower() in ("null", "{}") else f"{key}={REDACTED}"


def override_secrets(overrides: Iterable[str]) -> list[str]:
    """The values of the overrides under ``storage_options`` (what :func:`redact_text` replaces in any text), and the values
    inside a mapping given whole (``{key:K,secret:S}``), longest first; environment references and plain words left out."""
    found: set[str] = set()
    for override in overrides:
        parts = _override_parts(override)
        if parts is None or is_env_reference(parts[1]):
            continue
        value = parts[1].strip()
        candidates = [value]
        if value.startswith("{") and value.endswith("}"):  # Hydra's dict syntax: {key:K,secret:S}
            candidates += [item.partition(":")[2].strip() for item in value[1:-1].split(",")]
        found.update(c.strip("'\"") for c in candidates if c.strip("'\"").lower() not in _PLAIN and not is_env_reference(c))
    return sorted(found, key=len, reverse=True)


def option_values(options: Any) -> list[str]:
    """The string leaves of a ``storage_options`` mapping that could be secrets (plain words such as ``true`` left out, and
    environment references), longest first: what :func:`redact_text` replaces."""
    found: set[str] = set()
    stack = [options]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, str) and value.strip().lower() not in _PLAIN and not is_env_reference(value):
            found.add(value)
    return sorted(found, key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``"***"`` and every override under ``storage_options`` in it
    (``...storage_options.X=VALUE``: a quoted value, a ``{...}`` mapping, or up to a space, comma or quote) redacted."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return _INLINE.sub(lambda found: found.group(0) if is_env_reference(found.group(2)) else f"{found.group(1)}{REDACTED}", text)


_INLINE = re.compile(SECRET_KEY.join((r"((?<!\w)", r"""(?:\.[\w\-]+)*=)(\{[^}]*\}|'[^']*'|"[^"]*"|[^\s,'"]+)""")))


def redact_yaml_file(path: str | os.PathLike[str], secrets: Iterable[str] = ()) -> bool:
    """Rewrite the YAML file ``path`` (Hydra's ``config.yaml``, ``hydra.yaml``, ``overrides.yaml``, ``multirun.yaml``) with
    :func:`redact_tree` applied, and then every one of ``secrets`` left in its text (``hydra.job.override_dirname``)
    replaced. Returns whether it changed; an unchanged file is not rewritten, a missing one is skipped.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        return False
    original = path.read_text(encoding="utf-8")
    loaded = yaml.safe_load(original)
    redacted = redact_tree(loaded)
    text = original if redacted == loaded else yaml.safe_dump(redacted, sort_keys=False, allow_unicode=True, width=1 << 16)
    text = redact_text(text, secrets) if any(secret in text for secret in secrets) else text
    if text == original:
        return False
    temporary = path.with_name(f".{path.name}.redacting")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)
    return True


class RedactingRecordFactory:
    """A ``logging`` record factory whose records have ``secrets`` (and any ``storage_options...=VALUE``) redacted from
    their message: installed with :meth:`install`, it covers every logger and handler, whatever configures them later
    (Hydra's launcher logs each job's overrides before the job starts).
    """

    def __init__(self, secrets: Iterable[str], base: Callable[..., logging.LogRecord] | None = None):
        self.secrets = [s for s in secrets if s]
        self.base = base or logging.getLogRecordFactory()

    def add(self, secrets: Iterable[str]) -> None:
        """Redact ``secrets`` too from now on (e.g. the values of a config's ``storage_options``, once composed)."""
        self.secrets = sorted({*self.secrets, *(s for s in secrets if s)}, key=len, reverse=True)

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.base(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 -- a bad format string is logging's to report, as it would be without this factory
            return record
        if SECRET_KEY in message or any(secret in message for secret in self.secrets):
            record.msg, record.args = redact_text(message, self.secrets), None
        return record

    @classmethod
    def install(cls, secrets: Iterable[str]) -> RedactingRecordFactory:
        """Make a factory over the current one and install it (process-wide)."""
        factory = cls(secrets)
        logging.setLogRecordFactory(factory)
        return factory


class RedactedSaveConfigCallback(SaveConfigCallback):
    """``LightningCLI``'s ``SaveConfigCallback`` writing ``config.yaml`` with every ``storage_options`` value ``"***"``.

    Lightning's own callback saves the parsed arguments as given, ``--data.storage_options`` included; pass this one instead:
    ``LightningCLI(Model, LMDBDataModule, save_config_callback=RedactedSaveConfigCallback)``. A config saved so reruns with
    the credentials from the environment once the ``***`` entries are deleted (or replaced by your own).
    """

    def __init__(self, parser: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(parser, redacted_namespace(config), *args, **kwargs)
