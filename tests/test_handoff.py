"""What crosses from the builder's reader processes to its writer: a chunk's records through a file in shared memory
(:func:`lightning_lmdb.build.readers._handed`), the same records as through the pipe, and nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from imagegen import make_jpegs, read_records

from lightning_lmdb.build import readers
from lightning_lmdb.build.writer import build

RESULTS = [(3, b"abc", "e3"), (4, None, "a bad file"), (5, b"", "e5"), (6, b"x" * 1000, "e6")]


def test_a_chunk_crosses_through_a_file_and_comes_back_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "_shared", str(tmp_path))
    monkeypatch.setattr(readers, "SHARED_BYTES", 1000)
    handed = readers._handed(RESULTS)
    assert isinstance(handed, tuple), "1,003 record bytes >= SHARED_BYTES: through a file"
    assert [p.stat().st_size for p in tmp_path.iterdir()] == [1003]
    taken = readers._taken(handed)
    assert [(i, None if v is None else bytes(v), e) for i, v, e in taken] == RESULTS
    assert not list(tmp_path.iterdir()), "the writer removes the file once read"
    monkeypatch.setattr(readers, "SHARED_BYTES", 1004)
    assert readers._handed(RESULTS) is RESULTS, "a chunk below SHARED_BYTES goes through the pipe"


def test_a_file_that_cannot_be_written_sends_the_chunk_through_the_pipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "_shared", str(tmp_path / "gone"))  # as /dev/shm full: the write fails
    monkeypatch.setattr(readers, "SHARED_BYTES", 1)
    assert readers._handed(RESULTS) is RESULTS
    assert readers._taken(RESULTS) is RESULTS


def test_the_folder_is_removed_and_a_dead_writers_folder_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "SHARED_ROOT", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    orphan = tmp_path / f"{readers.SHARED_PREFIX}{dead.stdout.strip()}-abc"
    alive = tmp_path / f"{readers.SHARED_PREFIX}{os.getppid()}-abc"
    other = tmp_path / "someone-elses"
    for folder in (orphan, alive, other):
        folder.mkdir()
        (folder / "1-0").write_bytes(b"x")
    with readers._shared_folder() as folder:
        assert folder is not None and Path(folder).parent == tmp_path
        assert Path(folder).name.startswith(f"{readers.SHARED_PREFIX}{os.getpid()}-")
        assert not orphan.exists(), "a killed writer's folder is removed"
        assert alive.exists() and other.exists(), "a running process's folder, and what is not ours, stay"
    assert not Path(folder).exists()
    monkeypatch.setattr(readers, "SHARED_ROOT", str(tmp_path / "none"))
    with readers._shared_folder() as folder:
        assert folder is None, "no shared memory: the pipe"


@pytest.mark.slow
def test_a_build_through_shared_memory_stores_what_the_pipe_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = make_jpegs(tmp_path / "src", 24, size=64)
    root = tmp_path / "shm"
    root.mkdir()
    monkeypatch.setattr(readers, "SHARED_ROOT", str(root))
    monkeypatch.setattr(readers, "SHARED_BYTES", 1)  # read by the forked readers too
    taken = []
    real = readers._taken

    def spy(handed: object) -> object:
        taken.append(isinstance(handed, tuple))
        return real(handed)

    monkeypatch.setattr(readers, "_taken", spy)
    build(source, tmp_path / "shm.lmdb", workers=2, commit_every=5, progress=False)
    assert taken and all(taken), "every chunk crossed through a file"
    assert not list(root.iterdir()), "nothing left in shared memory"
    monkeypatch.setattr(readers, "SHARED_ROOT", str(tmp_path / "none"))
    build(source, tmp_path / "pipe.lmdb", workers=2, commit_every=5, progress=False)
    (shm_meta, shm_values), (pipe_meta, pipe_values) = read_records(tmp_path / "shm.lmdb"), read_records(tmp_path / "pipe.lmdb")
    assert shm_values == pipe_values and len(shm_values) == 24
    assert shm_meta["checksums"] == pipe_meta["checksums"] and shm_meta["targets"] == pipe_meta["targets"]
    assert taken.count(False) >= 2, "without shared memory: through the pipe"
