"""Shared fixtures: tiny generated image folders in tmp_path, the ``list`` source kind, a small disk."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from ci import small_tmpfs
from imagegen import make_folder
from s3kit import s3  # noqa: F401  -- the loopback S3 server fixture

# A suite started in the background of a non-interactive shell (``cmd &``, nohup) inherits SIGINT
# ignored, and so would every process it starts: the Ctrl-C tests would see nothing interrupted.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """Three classes (one non-ASCII) of mixed-mode images with some non-ASCII file names."""
    return make_folder(tmp_path / "src")


@pytest.fixture
def list_kind():
    """The "list" source kind of ``seamkit`` (a ``.list`` file of ``path class`` lines), registered first, removed after the test."""
    import seamkit

    from lightning_lmdb.sources import base as sources

    seamkit.CALLS.clear()
    sources.register_source_kind(seamkit, before="manifest")
    yield seamkit
    sources.unregister_source_kind(seamkit)


@pytest.fixture
def small_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A small tmpfs mounted on a fresh folder, unmounted afterwards (skipped without root, a failure on CI): of the test module's
    ``SMALL_DISK`` size (e.g. ``"2m"``), else 256 KiB."""
    disk = tmp_path / "disk"
    disk.mkdir()
    with small_tmpfs(disk, getattr(request.module, "SMALL_DISK", "256k")):
        yield disk
