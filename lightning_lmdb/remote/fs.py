"""The ``fsspec`` filesystem of a URL: one per process, its storage options in memory only, bounded retries.

**Storage options** (``storage_options={...}`` in Python, ``data.storage_options`` in Hydra, ``--storage-option KEY=VALUE``
on the command line) are ``fsspec``'s keyword arguments for the scheme: for S3 (``s3fs``) ``key``, ``secret``, ``token``,
``endpoint_url`` (MinIO, Ceph), ``anon``, ``client_kwargs``, ``config_kwargs``. Without them the provider's standard chain
applies (for S3: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_PROFILE``, ``~/.aws/credentials`` and
``~/.aws/config``, an instance role). :func:`use_options` registers them for a URL prefix in this process; every call of
this layer on a URL under it uses them. They are never written anywhere: not to a database, a log, an error, a cache key
or a saved hyper-parameter (the callers pass them, the tests check each place).

**Per process.** A filesystem object holds sockets and an event loop, which a forked child must not share: the cache here
is keyed by the process id, so a reader process or a DataLoader worker makes its own on first use, never inheriting its
parent's. ``skip_instance_cache`` keeps ``fsspec``'s own cache out of it.

**Retries** (S3): each request is retried by ``s3fs`` up to :data:`RETRIES` times on a dropped connection, a timeout or a
throttle, sleeping ``min(0.1 x 1.7^i, 15)`` s between tries; ``botocore``'s own retries are off, so the count does not
multiply. A connection that sends no byte for :data:`STALL_SECONDS` counts as dropped. A body that drops mid-read is
fetched again by the callers (:mod:`~lightning_lmdb.remote.objects`: up to :data:`RETRIES` tries, backoff
``min(0.5 x 2^i, 8)`` s), then the error names the URL and says a rerun resumes. Tests shorten both through the
environment (``LIGHTNING_LMDB_REMOTE_RETRIES``, ``LIGHTNING_LMDB_REMOTE_STALL``).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from lightning_lmdb.errors import OptionError
from lightning_lmdb.remote import urls

#: Tries of one request (and of one object's body), and seconds without a byte before a connection counts as stalled.
RETRIES = int(os.environ.get("LIGHTNING_LMDB_REMOTE_RETRIES", "5"))
STALL_SECONDS = float(os.environ.get("LIGHTNING_LMDB_REMOTE_STALL", "60"))
#: Seconds to open a connection.
CONNECT_SECONDS = float(os.environ.get("LIGHTNING_LMDB_REMOTE_CONNECT", "10"))
#: What ``pip`` installs for object storage.
INSTALL_HINT = 'pip install "lightning_lmdb[cloud]"'

_options: dict[str, dict[str, Any]] = {}
_filesystems: dict[tuple[int, str, str], Any] = {}
_lock = threading.Lock()


def use_options(url: str, storage_options: dict[str, Any] | None) -> None:
    """Use ``storage_options`` for every URL under ``url``'s bucket (``s3://bucket``) in this process.

    Raises:
        OptionError: ``storage_options`` is not a mapping of option names to values.
    """
    if not storage_options:
        return
    if not isinstance(storage_options, dict) or not all(isinstance(key, str) for key in storage_options):
        raise OptionError("storage_options must be a mapping of option names to values (e.g. {'endpoint_url': 'http://...'}), "
                          f"not a {type(storage_options).__name__}.")
    _options[_root(url)] = dict(storage_options)


def options_for(url: str) -> dict[str, Any]:
    """The storage options registered for ``url``'s bucket (:func:`use_options`), or ``{}``."""
    return dict(_options.get(_root(url), {}))


def registered() -> dict[str, dict[str, Any]]:
    """Every registration of this process: what a spawned child gets (:func:`adopt`), in memory, never on disk."""
    return {root: dict(options) for root, options in _options.items()}


def adopt(registrations: dict[str, dict[str, Any]] | None) -> None:
    """Take a parent's registrations (:func:`registered`) in a child process."""
    for root, options in (registrations or {}).items():
        _options[root] = dict(options)


def _root(url: str) -> str:
    bucket, _ = urls.bucket_key(url)
    return f"{urls.scheme(url)}://{bucket}"


def filesystem(url: str) -> Any:
    """The ``fsspec`` filesystem for ``url`` in this process, with its registered options (made on first use).

    Raises:
        OptionError: The scheme's ``fsspec`` implementation is not installed (the message says what to install).
    """
    scheme = urls.scheme(url)
    options = options_for(url)
    key = (os.getpid(), scheme, json.dumps(options, sort_keys=True, default=str))
    with _lock:
        found = _filesystems.get(key)
        if found is None:
            found = _filesystems[key] = _make(scheme, options)
        return found


def _make(scheme: str, options: dict[str, Any]) -> Any:
    try:
        import fsspec
    except ImportError as exc:
        raise OptionError(f"Object storage ({scheme}://) needs fsspec and its {scheme} implementation: {INSTALL_HINT}.") from exc
    if scheme in ("s3", "s3a"):
        options = _s3_defaults(options)
    retries = options.pop("retries", None)
    try:
        made = fsspec.filesystem(scheme, skip_instance_cache=True, **options)
        if retries is not None:
            made.retries = retries  # s3fs: the tries of each request (a class attribute, not an argument)
        return made
    except ImportError as exc:
        raise OptionError(f"Object storage ({scheme}://) needs its fsspec implementation: {INSTALL_HINT} "
                          f"(for a scheme other than s3, its own package; untested). {exc}") from exc
    except TypeError as exc:
        raise OptionError(f"A storage option is not one {scheme}:// takes: {exc}. See docs/object-storage.md.") from exc


def _s3_defaults(options: dict[str, Any]) -> dict[str, Any]:
    """S3 options with this layer's retry policy: ``s3fs`` retries, ``botocore`` does not (the tries would multiply)."""
    out = dict(options)
    out.setdefault("retries", RETRIES)
    config = dict(out.get("config_kwargs") or {})
    config.setdefault("connect_timeout", CONNECT_SECONDS)
    config.setdefault("read_timeout", STALL_SECONDS)
    config.setdefault("retries", {"max_attempts": 1, "mode": "standard"})
    out["config_kwargs"] = config
    return out


def is_s3(url: str) -> bool:
    """Whether ``url`` is S3 (or S3-compatible): the scheme whose preconditions and multipart upload this layer uses."""
    return urls.scheme(url) in ("s3", "s3a")
