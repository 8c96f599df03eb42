"""Page-cache eviction and residency measurement on a real file."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from ci import require

from lightning_lmdb.cache import evict, evict_tree, resident_fraction

SIZE = 4 << 20  # a few MB: many pages, quick to write


def _honours_fadvise(folder: Path) -> bool:
    probe = folder / "fadvise-probe.bin"
    probe.write_bytes(os.urandom(1 << 20))
    try:
        probe.read_bytes()
        evict([probe], sync=True)
        return resident_fraction(probe) < 0.1
    finally:
        probe.unlink()


@pytest.fixture
def cache_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder on a filesystem that honours POSIX_FADV_DONTNEED: tmp_path, else one beside the tests (the checkout's disk).

    Neither: a skip with the reason here, a failure on CI (its checkout is on an ordinary disk, which honours it).
    """
    if _honours_fadvise(tmp_path):
        yield tmp_path
    else:
        fallback = Path(tempfile.mkdtemp(prefix=".cache-test-", dir=Path(__file__).parent))
        try:
            require(_honours_fadvise(fallback),
                    f"Neither {tmp_path} nor {fallback} honours posix_fadvise(DONTNEED) (tmpfs or a network filesystem?): "
                    "run the tests from a checkout on a local disk.")
            yield fallback
        finally:
            shutil.rmtree(fallback, ignore_errors=True)


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


def test_cache_dir_fails_on_ci_where_nothing_honours_eviction(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(f"{__name__}._honours_fadvise", lambda folder: False)
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kwargs: made.append(mkdtemp(**kwargs)) or made[-1])
    fixture = cache_dir.__wrapped__(tmp_path)  # the fixture's own function
    with pytest.raises(pytest.fail.Exception, match="honours posix_fadvise"):
        next(fixture)
    assert len(made) == 1 and not Path(made[0]).exists(), "its fallback folder is removed"
