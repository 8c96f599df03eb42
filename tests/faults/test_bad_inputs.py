"""Bad source files under both ``on_error`` policies: a clear ``BuildError`` naming the file, or a listed skip.

Builds run in this process (``workers=0``). A FIFO named like an image must never be opened for reading
(it would block forever): the module-wide timeout turns such a hang into a fast failure.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from faultkit import contents
from imagegen import bomb_png, make_jpegs, truncated_jpeg

from lightning_lmdb.build import readers
from lightning_lmdb.build.writer import BuildError, build
from lightning_lmdb.read.raw import RawImageDataset
from lightning_lmdb.sources.folder import scan_folder

pytestmark = pytest.mark.timeout(60)

GOOD = 4


def _write(data: Callable[[], bytes]) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data())


def _dangling(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere.jpg")


#: kind -> (file name, how to make it, what the reason must say)
BAD = {
    "empty": ("x_empty.jpg", _write(lambda: b""), "the file is empty"),
    "truncated-jpeg": ("x_truncated.jpg", _write(truncated_jpeg), "corrupt or truncated"),
    "not-an-image": ("x_text.jpg", _write(lambda: b"hello, I am not a JPEG" * 10), "not an image"),
    "bomb": ("x_bomb.png", _write(bomb_png), "exceeds the limit"),
    "dangling-symlink": ("x_dangling.jpg", _dangling, "cannot read the file: no such file (a symbolic link to a missing file)."),
    "fifo": ("x.png", os.mkfifo, "is a FIFO"),
}
LAYOUTS = ("classes", "flat")


def _source(root: Path, layout: str, kinds: list[str]) -> tuple[Path, dict[str, str]]:
    """GOOD small JPEGs (in class folders or flat) plus the bad files of ``kinds``; returns (source, relpath -> reason)."""
    source = make_jpegs(root, GOOD, size=16)
    folder = source / "c1"
    if layout == "flat":
        for path in sorted(source.rglob("*.jpg")):
            path.rename(source / path.name)
        for sub in ("c0", "c1"):
            (source / sub).rmdir()
        folder = source
    bad = {}
    for kind in kinds:
        name, make, reason = BAD[kind]
        make(folder / name)
        bad[(folder / name).relative_to(source).as_posix()] = reason
    return source, bad


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", BAD)
def test_bad_file_raises_naming_it(tmp_path: Path, kind: str, layout: str) -> None:
    source, bad = _source(tmp_path / "src", layout, [kind])
    (relpath, reason), = bad.items()
    target = tmp_path / "out.lmdb"
    with pytest.raises(BuildError) as excinfo:
        build(source, target, workers=0, progress=False, on_error="raise")
    message = str(excinfo.value)
    assert str(source / relpath) in message
    assert reason in message
    assert "data.on_error=skip" in message
    assert not target.exists()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", BAD)
def test_bad_file_is_skipped_with_its_reason(tmp_path: Path, kind: str, layout: str) -> None:
    source, bad = _source(tmp_path / "src", layout, [kind])
    report = build(source, tmp_path / "out.lmdb", workers=0, progress=False, on_error="skip")
    assert (report.action, report.count) == ("built", GOOD)
    assert {s.path for s in report.skipped} == bad.keys()
    for skipped in report.skipped:
        assert bad[skipped.path] in skipped.reason


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_bad_file_is_skipped_and_recorded(tmp_path: Path, layout: str) -> None:
    source, bad = _source(tmp_path / "src", layout, list(BAD))
    report = build(source, tmp_path / "out.lmdb", workers=0, progress=False, on_error="skip")
    assert (report.action, report.count, report.records_written) == ("built", GOOD, GOOD)
    assert {s.path: s.reason for s in report.skipped}.keys() == bad.keys()
    for skipped in report.skipped:
        assert bad[skipped.path] in skipped.reason, skipped
    meta, values = contents(report.path)
    assert meta["skipped"] == [{"path": s.path, "reason": s.reason} for s in report.skipped]
    assert meta["source"]["num_files"] == GOOD + len(bad)
    assert values == [(source / p).read_bytes() for p in meta["paths"]]
    assert not set(meta["paths"]) & bad.keys()


@pytest.mark.parametrize(("error", "reason"), [
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), "cannot read the file: no such file."),
    (PermissionError(errno.EACCES, "Permission denied"), "cannot read the file (Permission denied). Check its permissions."),
    (OSError(errno.EIO, "Input/output error"), "cannot read the file (Input/output error)."),
])
def test_an_unreadable_file_gets_the_hint_of_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError,
                                                       reason: str) -> None:
    def fail(path: object) -> bytes:
        raise error

    monkeypatch.setattr(readers, "read_file", fail)  # running as root, chmod 000 would not stop the read
    assert readers._read_one((0, str(tmp_path / "x.jpg"), "encoded", None, None, 0)) == (0, None, reason)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_raw_dataset_leaves_a_fifo_out(tmp_path: Path, layout: str) -> None:
    source, bad = _source(tmp_path / "src", layout, ["fifo"])
    (fifo,) = bad
    assert [p for p, _ in scan_folder(source).special] == [fifo]
    dataset = RawImageDataset(source)
    assert str(source / fifo) not in dataset.files()
    assert len(dataset) == GOOD
    assert [dataset[i][0].size for i in range(len(dataset))] == [(16, 16)] * GOOD
