"""What a build costs beyond decoding: a resume does the work left, not the work done; the scan imports no torch.

The checks count work (files decoded, records read back), never time.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
from imagegen import make_folder, make_jpegs
from torchvision.datasets.folder import IMG_EXTENSIONS as TV_EXTENSIONS
from torchvision.datasets.folder import find_classes as tv_find_classes
from torchvision.datasets.folder import make_dataset as tv_make_dataset

from lightning_lmdb.build import onefile, readers
from lightning_lmdb.build.writer import FAULT_ENV, build
from lightning_lmdb.sources import folder

COUNT, EVERY = 40, 4  # 10 commits of 4 records


def test_the_scan_is_torchvisions(tmp_path: Path) -> None:
    """The copies of torchvision's scan functions find the same classes and files in the same order."""
    root = make_folder(tmp_path / "src")
    nested = root / "cat" / "deeper" / "Z"
    nested.mkdir(parents=True)
    for name in ("b.PNG", "a.JpEg", "c.txt", "d.webp"):
        (nested / name).write_bytes(b"x")
    (root / "dog" / "UPPER.TIFF").write_bytes(b"x")
    assert folder.IMG_EXTENSIONS == TV_EXTENSIONS
    assert folder.find_classes(root) == tv_find_classes(root)
    _, class_to_idx = tv_find_classes(root)
    assert folder.make_dataset(root, class_to_idx, folder.IMG_EXTENSIONS) == tv_make_dataset(root, class_to_idx, TV_EXTENSIONS)
    (root / "empty").mkdir()
    _, class_to_idx = tv_find_classes(root)
    with pytest.raises(FileNotFoundError, match="empty"):
        folder.make_dataset(root, class_to_idx, folder.IMG_EXTENSIONS)
    with pytest.raises(FileNotFoundError):
        tv_make_dataset(root, class_to_idx, TV_EXTENSIONS)


@pytest.mark.slow
def test_a_build_imports_no_torch(tmp_path: Path) -> None:
    """Building a folder from a fresh interpreter never imports torch (1.5-3 s of start-up, all of a short resume's cost)."""
    source = make_jpegs(tmp_path / "src", 6)
    script = ("import sys; from lightning_lmdb.build.writer import build; "
              f"build({str(source)!r}, {str(tmp_path / 'db.lmdb')!r}, workers=2, progress=False); "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def _killed_build(source: Path, target: Path, point: str) -> None:
    os.environ[FAULT_ENV] = point
    build(source, target, workers=0, commit_every=EVERY, progress=False)


def test_a_resume_does_only_the_work_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after 9 of 10 commits (36 of 40 records), the resume decodes the 4 files left, not
    the 36 committed before."""
    source, target = make_jpegs(tmp_path / "src", COUNT), tmp_path / "db.lmdb"
    child = multiprocessing.get_context("fork").Process(target=_killed_build, args=(source, target, "commit:9"))
    child.start()
    child.join(60)
    assert child.exitcode == -9 and onefile.fsops.partial_path(target).exists()
    decoded: list[str] = []
    real = readers.encode_record

    def counting(data: bytes, storage: str, **kwargs):
        decoded.append(kwargs["name"])
        return real(data, storage, **kwargs)

    monkeypatch.setattr(readers, "encode_record", counting)
    report = build(source, target, workers=0, commit_every=EVERY, progress=False)
    assert (report.action, report.records_written, report.count) == ("resumed", COUNT - 9 * EVERY, COUNT)
    assert len(decoded) == COUNT - 9 * EVERY
    assert set(report.phases) == {"scan", "open", "write", "finish"}
    full = build(source, tmp_path / "full.lmdb", workers=0, commit_every=EVERY, progress=False)
    assert len(decoded) == 2 * COUNT - 9 * EVERY
    assert full.action == "built" and full.records_written == COUNT


def test_chunks_are_bounded_by_count_and_bytes() -> None:
    """What crosses between a reader process and the writer at once: at most CHUNK_FILES tasks and about CHUNK_BYTES expected
    bytes (a file over the bound goes alone), every task once, in order."""
    tasks = [(i,) for i in range(300)]
    big = readers.CHUNK_BYTES
    sizes = [big if i in (5, 6, 200) else 1000 for i in range(300)]
    chunks = readers.chunks_of(tasks, sizes, workers=1)
    assert [t for chunk in chunks for t in chunk] == tasks
    assert all(len(chunk) <= readers.CHUNK_FILES for chunk in chunks)
    for chunk in chunks:
        held = sum(sizes[t[0]] for t in chunk)
        assert held <= readers.CHUNK_BYTES or len(chunk) == 1
    assert [(5,)] in chunks and [(6,)] in chunks and [(200,)] in chunks
    decoded = readers.chunks_of(tasks, [1 << 20] * 300, workers=1, growth=readers.GROWTH)  # 1 MB files, 12 MB records each
    assert max(len(chunk) for chunk in decoded) == 1
    assert max(len(chunk) for chunk in readers.chunks_of(tasks, None, workers=2)) == 300 // 8  # a quarter of each reader's share


class _Pool:
    """A pool stand-in that reads at once and counts the chunks submitted."""

    def __init__(self) -> None:
        self.submitted = 0

    def apply_async(self, read, args):
        self.submitted += 1
        done = read(*args)

        class Result:
            def get(self):
                return done

        return Result()


def test_readers_read_at_most_a_window_ahead_of_the_writer() -> None:
    """However slow the writer, at most ``window`` chunks are submitted and not yet taken, and every result comes in order."""
    pool, chunks = _Pool(), [[(i, j) for j in range(3)] for i in range(20)]
    results = readers._in_order(pool, list, chunks, window=5)
    assert next(results) == (0, 0)
    assert pool.submitted == 6  # the window, and the chunk after the one taken
    assert [next(results) for _ in range(5)] == [(0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert pool.submitted == 7
    assert list(results) == [t for chunk in chunks[2:] for t in chunk] and pool.submitted == 20
