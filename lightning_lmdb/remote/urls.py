"""URLs of object storage: recognising one, joining, and printing it without secrets."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

from lightning_lmdb.errors import OptionError

#: ``scheme://``: two or more letters (``C:\\`` is a Windows drive, not a URL); ``file://`` is a local path.
_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]+)://")


def is_remote(path: object) -> bool:
    """Whether ``path`` is a URL of object storage (``s3://...``), not a local path (``file://`` counts as local)."""
    if not isinstance(path, str):
        return False
    found = _URL.match(path)
    return found is not None and found.group(1).lower() != "file"


def scheme(url: str) -> str:
    """The URL's scheme, lower case (``"s3"``)."""
    found = _URL.match(url)
    if found is None:
        raise ValueError(f"{redact(url)!r} is not a URL (scheme://bucket/key).")
    return found.group(1).lower()


def redact(text: str) -> str:
    """``text`` (a URL, or a message holding URLs) with every URL's user info and query string replaced by ``***``.

    ``s3://KEY:SECRET@bucket/a.lmdb?X-Amz-Signature=...`` prints as ``s3://***@bucket/a.lmdb?***``.
    """
    return _ANY_URL.sub(lambda found: _redact_one(found.group(0)), text)


_ANY_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]+://[^\s'\"<>]+")


def _redact_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("://", 1)[0] + "://***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "***" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def join(url: str, *parts: str) -> str:
    """``url`` with ``parts`` appended, ``/``-separated (``join("s3://b/x/", "c0", "1.jpg")`` -> ``s3://b/x/c0/1.jpg``)."""
    out = url.rstrip("/")
    for part in parts:
        part = part.replace(os.sep, "/").strip("/")
        if part:
            out = f"{out}/{part}"
    return out


def name(url: str) -> str:
    """The last ``/``-separated part of ``url`` (a trailing ``/`` ignored)."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def parent(url: str) -> str:
    """``url`` without its last part (``s3://b/x/a.csv`` -> ``s3://b/x``)."""
    head, _, _ = url.rstrip("/").rpartition("/")
    return head if "://" in head and not head.endswith(":/") else url


def relative(url: str, root: str) -> str:
    """``url`` relative to ``root`` (a prefix of it), ``/``-separated.

    Raises:
        ValueError: ``url`` is not under ``root``.
    """
    base = root.rstrip("/") + "/"
    if not url.startswith(base):
        raise ValueError(f"{redact(url)} is not under {redact(root)}")
    return url[len(base):]


def bucket_key(url: str) -> tuple[str, str]:
    """``(bucket, key)`` of ``scheme://bucket/key`` (``key`` may be ``""``)."""
    rest = url.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    if "@" in bucket:
        bucket = bucket.rsplit("@", 1)[1]
    return bucket, key


def refuse_user_info(url: str, what: str) -> None:
    """Refuse a URL that carries credentials (``s3://KEY:SECRET@bucket/...``): it would be kept wherever the URL is (saved
    hyper-parameters, a database's metadata, logs).

    Raises:
        OptionError: ``url`` has user info; the message shows it redacted and where credentials go instead.
    """
    if "@" in url.split("://", 1)[-1].split("/", 1)[0]:
        raise OptionError(f"{what} {redact(url)} carries credentials in the URL, which would be saved with it. Give the bare URL "
                          "and the credentials as storage_options={'key': ..., 'secret': ...} (Hydra: data.storage_options, "
                          "CLI: --storage-option key=...) or the provider's environment variables.")
