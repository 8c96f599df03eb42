"""Shared fixtures: tiny generated image folders in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest
from imagegen import make_folder


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """Three classes (one non-ASCII) of mixed-mode images with some non-ASCII file names."""
    return make_folder(tmp_path / "src")
