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


_FAULTS = """
import resource, sys
from lightning_lmdb.build.readers import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):  # what a build's writer does: a batch of chunks of megabytes held, then freed at its commit, again
    batch = [bytearray(4 << 20) for _ in range(16)]
    for chunk in batch:
        chunk[::4096] = b"x" * len(chunk[::4096])
    del batch, chunk
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.slow
def test_keep_freed_memory_spares_the_page_faults_of_reallocating() -> None:
    """With glibc's defaults a freed batch of 64 MB goes back to the kernel and the next one faults in 16,384 fresh pages;
    kept, the pages are reused (counted as page faults, never timed)."""
    def faults(mode: str) -> tuple[str, int]:
        done = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True, timeout=60)
        kept, count = done.stdout.split()
        return kept, int(count)

    assert faults("keep")[0] == "True", "CI runs on glibc: the settings must take"
    default, kept = faults("default")[1], faults("keep")[1]
    assert default > 8 * 16_384, default
    assert kept < 3 * 16_384, kept
