"""Page-cache eviction and residency measurement on a real file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import ci
import pytest

from lightning_lmdb.tools.pagecache import evict, evict_tree, resident_fraction

SIZE = 4 << 20  # a few MB: many pages, quick to write


@pytest.fixture
def cache_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder on a filesystem that honours POSIX_FADV_DONTNEED (:func:`ci.evictable_folder`)."""
    with ci.evictable_folder(tmp_path) as folder:
        yield folder


def test_evict_then_read_back(cache_dir: Path) -> None:
    path = cache_dir / "data.bin"
    path.write_bytes(os.urandom(SIZE))
    with open(path, "rb") as f:  # clean the pages, so eviction without sync=True works too
        os.fsync(f.fileno())
    path.read_bytes()
    assert resident_fraction(path) > 0.95
    assert evict([path]) == SIZE
    assert resident_fraction(path) < 0.05
    path.read_bytes()
    assert resident_fraction(path) > 0.95


def test_dirty_pages_need_sync(cache_dir: Path) -> None:
    path = cache_dir / "dirty.bin"
    path.write_bytes(os.urandom(SIZE))
    evict([path], sync=True)
    assert resident_fraction(path) < 0.05


def test_evict_tree_and_partial_read(cache_dir: Path) -> None:
    root = cache_dir / "tree"
    (root / "sub").mkdir(parents=True)
    files = [root / "a.bin", root / "sub" / "b.bin"]
    for f in files:
        f.write_bytes(os.urandom(SIZE // 2))
    (root / "link").symlink_to(files[0])
    assert evict_tree(root, sync=True) == SIZE
    assert all(resident_fraction(f) < 0.05 for f in files)
    with open(files[1], "rb") as f:  # read half of one file
        f.read(SIZE // 4)
    assert resident_fraction(files[0]) < 0.05
    assert 0.3 < resident_fraction(files[1]) <= 1.0


def test_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.bin"
    with pytest.raises(FileNotFoundError, match="nope.bin"):
        evict([missing])
    with pytest.raises(FileNotFoundError, match="nope.bin"):
        resident_fraction(missing)
    with pytest.raises(FileNotFoundError, match="nope"):
        evict_tree(tmp_path / "nope")
    with pytest.raises(IsADirectoryError, match="evict_tree"):
        evict([tmp_path])
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        evict_tree(tmp_path / "f")
    (tmp_path / "empty").write_bytes(b"")
    assert resident_fraction(tmp_path / "empty") == 0.0


def test_evictable_folder_fails_on_ci_where_nothing_honours_eviction(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(ci, "honours_eviction", lambda folder: False)
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kwargs: made.append(mkdtemp(**kwargs)) or made[-1])
    with pytest.raises(pytest.fail.Exception, match="honours posix_fadvise"), ci.evictable_folder(tmp_path):
        pass
    assert len(made) == 1 and not Path(made[0]).exists(), "its fallback folder is removed"


def test_evictable_folder_falls_back_to_the_checkouts_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A tmpfs tmp_path (which keeps every page cached) gives way to a folder beside the tests."""
    monkeypatch.delenv("CI", raising=False)
    honours = ci.honours_eviction
    monkeypatch.setattr(ci, "honours_eviction", lambda folder: folder != tmp_path and honours(folder))
    with ci.evictable_folder(tmp_path) as folder:
        assert folder.parent == Path(ci.__file__).parent and folder.is_dir()
    assert not folder.exists()
