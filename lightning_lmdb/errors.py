"""Every error the project raises on purpose: one base class, :class:`LightningLMDBError`.

``except lightning_lmdb.LightningLMDBError`` catches them all. Each also derives from the built-in
exception its kind of problem always raised (``ValueError`` for bad input, ``OSError`` for the disk,
``RuntimeError`` for a damaged database), so existing ``except`` clauses keep working. Messages name the
value or the file and say what to do. The ``lightning-lmdb`` command and ``train.py`` print these (and
``OSError`` / ``lmdb.Error``) as one line; anything else is a bug and shows its traceback.

The classes are re-exported by the modules that raise them (e.g. ``lightning_lmdb.build.writer.BuildError``).
"""

from __future__ import annotations

__all__ = ["LightningLMDBError", "OptionError", "SourceError", "ResumeError", "BuildError", "DiskFullError", "CacheDirError",
           "DatabaseError", "StaleDatabaseError", "RecordError", "ImageDecodeError", "NotRegularFileError", "StagingError",
           "NetfsError", "NetfsUnavailableError", "RemoteError", "RemoteNotFoundError", "RemoteAccessError", "RemoteChangedError",
           "RemoteExistsError", "RemoteIncompleteError"]


class LightningLMDBError(Exception):
    """The base of every error lightning_lmdb raises on purpose (bad input, a damaged database, a full disk ...)."""


class OptionError(LightningLMDBError, ValueError):
    """An option (argument, CLI flag or Hydra key) with a value that cannot be used; the message names it and the valid values."""


class SourceError(LightningLMDBError, ValueError):
    """A source that cannot be packed as given: no images, a target inside it, an unusable layout."""


class ResumeError(LightningLMDBError, ValueError):
    """A saved loader position that does not apply here (another split, batch size, seed or database build)."""


class BuildError(LightningLMDBError, ValueError):
    """A source file could not be packed (with ``on_error="raise"``), or a sharded build's shard process died (a rerun resumes)."""


class DiskFullError(LightningLMDBError, OSError):
    """The disk filled up during a build or staging (``errno.ENOSPC``); nothing committed is lost and a rerun with space resumes."""


class CacheDirError(LightningLMDBError, OSError):
    """``cache_dir`` (or ``local_cache_dir``) cannot be written: a read-only file system, or no permission."""


class DatabaseError(LightningLMDBError, RuntimeError):
    """A file is not a usable lightning_lmdb database: incomplete, foreign, too new or damaged."""


class StaleDatabaseError(DatabaseError):
    """The target was built from a source that has changed since (with ``on_stale="error"``)."""


class RecordError(LightningLMDBError, ValueError):
    """A stored record value that does not parse (the database is damaged)."""


class ImageDecodeError(LightningLMDBError, ValueError):
    """Bytes that are not a decodable image, or an image over the pixel limit.

    Attributes:
        name: The image (usually its path).
        reason: What is wrong with it and what to do, without the name.
    """

    def __init__(self, name: str, reason: str):
        super().__init__(f"{name}: {reason}")
        self.name, self.reason = name, reason


class NotRegularFileError(LightningLMDBError, OSError):
    """A path named like an image is a FIFO, socket or device, not a regular file.

    Attributes:
        reason: What it is and what to do, without the path.
    """

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.reason = reason


class StagingError(LightningLMDBError, RuntimeError):
    """A staged copy did not read back equal to its source (the message names the file and the block)."""


class NetfsError(LightningLMDBError, RuntimeError):
    """A latency mount could not be made or kept (the message says why)."""


class NetfsUnavailableError(NetfsError):
    """FUSE cannot be used here: the message says what is missing and what to install."""


class RemoteError(LightningLMDBError, OSError):
    """Object storage failed (a connection that kept dropping, an unexpected answer); the message names the redacted URL."""


class RemoteNotFoundError(RemoteError):
    """No such bucket or object."""


class RemoteAccessError(RemoteError):
    """Object storage refused the request: credentials or permissions."""


class RemoteChangedError(RemoteError):
    """An object changed since it was listed (its ``If-Match`` ETag precondition failed)."""


class RemoteExistsError(RemoteError):
    """A write only-if-absent found the object there: another publisher got there first."""


class RemoteIncompleteError(RemoteError):
    """A remote database without its marker object, or whose parts do not match it: an upload that did not finish."""
