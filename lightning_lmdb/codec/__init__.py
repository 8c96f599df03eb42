"""Codec: bytes to pixels and back -- what a record holds and how it is decoded.

Contract: a **storage mode** (:class:`~lightning_lmdb.codec.storage.StorageMode`, registered with
:func:`~lightning_lmdb.codec.storage.register_storage_mode`) decides how a source file becomes a record; a **record
codec** (:class:`~lightning_lmdb.codec.storage.RecordCodec`, :func:`~lightning_lmdb.codec.storage.register_record_codec`)
is the one-byte tag a record starts with and how its bytes decode; a **decoder**
(:class:`~lightning_lmdb.codec.decoders.ImageDecoder`, :func:`~lightning_lmdb.codec.decoders.register_decoder`) turns
a file's bytes into pixels (PIL, OpenCV, TorchCodec, nvJPEG).

Modules: ``storage`` (storage modes and record codecs: the registries), ``decoders`` (the decoder registry),
``zstd`` (compressed pixels), ``imageinfo`` (what a file's header says). A new storage mode, record codec or
decoder is a file of its own here plus one registration call. ``lightning_lmdb.codec`` re-exports ``storage``.
Imports nothing above :mod:`lightning_lmdb.errors`; importing it does not import torch.
"""

from __future__ import annotations

from typing import Any

from lightning_lmdb.codec import storage as _storage
from lightning_lmdb.codec.storage import *  # noqa: F403  (the old module's names, at the package's path)


def __getattr__(name: str) -> Any:
    return getattr(_storage, name)
