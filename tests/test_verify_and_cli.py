"""Reading back: integrity checks at open, verify, info, and the CLI."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest
from imagegen import make_jpegs, truncated_jpeg
from PIL import Image

import lightning_lmdb
from lightning_lmdb.build import writer
from lightning_lmdb.build.writer import BuildError, DiskFullError, build_lmdb
from lightning_lmdb.store import database, envs
from lightning_lmdb.store import format as fmt
from lightning_lmdb.tools import verify
from lightning_lmdb.tools.cli import main
from lightning_lmdb.tools.verify import describe_lmdb, verify_lmdb


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Path]:
    source = make_jpegs(tmp_path / "src", 40, size=48)
    return source, build_lmdb(source, tmp_path / "db.lmdb", workers=0, progress=False)


def test_truncated_database_is_refused_not_sigbus(built: tuple[Path, Path], tmp_path: Path) -> None:
    _, db = built
    cut = tmp_path / "cut.lmdb"
    shutil.copy(db, cut)
    with open(cut, "r+b") as handle:
        handle.truncate(db.stat().st_size // 2)
    with pytest.raises(fmt.DatabaseError, match="truncated"):
        envs.open_env(cut)


def test_foreign_lmdb_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.lmdb"
    env = lmdb.open(str(foreign), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"image_0", b"whatever")
    env.close()
    with pytest.raises(fmt.DatabaseError, match="not a lightning_lmdb database"):
        envs.open_env(foreign)
    (tmp_path / "plain.lmdb").write_bytes(b"x" * 10000)
    with pytest.raises(fmt.DatabaseError, match="not an LMDB file"):
        envs.open_env(tmp_path / "plain.lmdb")
    (tmp_path / "dirstyle.lmdb").mkdir()
    with pytest.raises(fmt.DatabaseError, match="is a folder"):
        envs.open_env(tmp_path / "dirstyle.lmdb")
    with pytest.raises(FileNotFoundError, match="lightning-lmdb build"):
        envs.open_env(tmp_path / "missing.lmdb")


def test_newer_format_is_refused(built: tuple[Path, Path]) -> None:
    _, db = built
    env = lmdb.open(str(db), subdir=False, max_dbs=2)
    with env.begin(write=True) as txn:
        meta = json.loads(bytes(txn.get(fmt.META_KEY)))
        meta["version"] = fmt.FORMAT_VERSION + 1
        txn.put(fmt.META_KEY, fmt.dump_json(meta))
    env.close()
    with pytest.raises(fmt.DatabaseError, match=f"format version {fmt.FORMAT_VERSION + 1}.*Upgrade"):
        envs.open_env(db)


def test_verify_passes_then_catches_a_modified_source_file(built: tuple[Path, Path]) -> None:
    source, db = built
    report = verify_lmdb(db, source)
    assert report.ok and report.checked == 40
    victim = source / "c1" / "img_00007.jpg"
    Image.new("RGB", (48, 48), "green").save(victim)
    report = verify_lmdb(db, source)
    assert not report.ok
    assert len(report.problems) == 1 and "c1/img_00007.jpg" in report.problems[0]
    victim.unlink()
    Image.new("RGB", (8, 8)).save(source / "c0" / "added.png")
    problems = verify_lmdb(db, source).problems
    assert any("c0/added.png: in the source but not in the database" in p for p in problems)
    assert any("c1/img_00007.jpg: in the database but no longer in the source" in p for p in problems)


def test_verify_decoded_compares_pixels(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 6, size=16)
    db = build_lmdb(source, tmp_path / "db.lmdb", storage="decoded", workers=0, progress=False)
    assert verify_lmdb(db, source).ok
    Image.new("RGB", (16, 16), "red").save(source / "c0" / "img_00002.jpg")
    assert [p.split(":")[0] for p in verify_lmdb(db, source).problems] == ["record 1 (c0/img_00002.jpg)"]


def test_verify_catches_a_damaged_record(built: tuple[Path, Path]) -> None:
    source, db = built
    payload = (source / "c0" / "img_00004.jpg").read_bytes()
    data = bytearray(db.read_bytes())
    offset = data.find(payload)
    assert offset > 0
    data[offset + len(payload) // 2] ^= 0xFF
    db.write_bytes(bytes(data))
    problems = verify_lmdb(db).problems
    assert problems == ["record 2 (c0/img_00004.jpg): checksum mismatch, the database is damaged"]


def test_cli_build_info_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = make_jpegs(tmp_path / "src", 10, size=16)
    db = tmp_path / "cli.lmdb"
    assert main(["build", str(source), str(db), "--workers", "0", "--quiet"]) == 0
    assert "built, 10 records" in capsys.readouterr().out
    assert main(["build", str(source), str(db), "--quiet"]) == 0
    assert "up-to-date" in capsys.readouterr().out
    assert main(["info", str(db)]) == 0
    out = capsys.readouterr().out
    assert "count: 10" in out and "c0, c1" in out
    assert main(["info", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == describe_lmdb(db)["count"] == 10
    assert main(["verify", str(db), "--source", str(source)]) == 0
    assert "OK" in capsys.readouterr().out
    (source / "c0" / "img_00000.jpg").write_bytes((source / "c0" / "img_00002.jpg").read_bytes())
    assert main(["verify", str(db), "--source", str(source)]) == 1
    assert "c0/img_00000.jpg" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "nope.lmdb")]) == 2
    assert "No database at" in capsys.readouterr().err
    assert main(["build", str(tmp_path / "nosuchdir"), str(db)]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_info_of_a_regression_database_shows_its_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = make_jpegs(tmp_path / "src", 2, size=8)
    manifest = source / "m.csv"
    manifest.write_text("path,x,y\nc0/img_00000.jpg,0.5,1\nc1/img_00001.jpg,-2,3.25\n", encoding="utf-8")
    assert main(["build", str(manifest), str(tmp_path / "r.lmdb"), "--workers", "0", "--quiet", "--label-column", "x,y"]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "r.lmdb")]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert "target_kind: regression" in lines and lines[-1] == "targets: K=2: x, y"
    assert not any(line.startswith(("num_classes", "classes")) for line in lines), "a regression target has no classes"


def test_file_names_that_are_not_utf8(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 3, size=16)
    odd = os.fsencode(source / "c0") + b"/\xff\xfe_latin1.png"
    Image.new("RGB", (8, 8), "blue").save(os.fsdecode(odd))
    db = build_lmdb(source, tmp_path / "db.lmdb", storage="encoded", workers=0, progress=False)  # bytes compared byte for byte
    assert verify_lmdb(db, source).ok
    with open(odd, "ab") as handle:
        handle.write(b"changed")
    result = subprocess.run([sys.executable, "-m", "lightning_lmdb.tools.cli", "verify", str(db), "--source", str(source)],
                            capture_output=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert b"(c0/\xff\xfe_latin1.png): differs from the source file" in result.stdout, "the name prints as its original bytes"


def test_cli_build_of_a_manifest_path_that_cannot_be_a_file_name(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    source = make_jpegs(tmp_path / "src", 2, size=8)
    manifest = source / "m.csv"  # a NUL: no file name can hold it (os.stat raised ValueError, the CLI a traceback)
    manifest.write_text('path\nc0/img_00000.jpg\n"x\0.jpg"\nc1/img_00001.jpg\n', encoding="utf-8")
    target = tmp_path / "db.lmdb"
    assert main(["build", str(manifest), str(target), "--workers", "0", "--quiet"]) == 2
    assert "m.csv line 3: 'x\\x00.jpg' cannot be a file name (it holds a NUL character)" in _one_error_line(capsys, "build")
    assert main(["build", str(manifest), str(target), "--workers", "0", "--quiet", "--on-error", "skip"]) == 0
    assert [s["reason"] for s in describe_lmdb(target)["skipped"]] == [
        "m.csv line 3: 'x\\x00.jpg' cannot be a file name (it holds a NUL character); fix the path"]
    jsonl = source / "m.jsonl"  # a lone surrogate: not UTF-8, so no file name either (os.stat raised UnicodeEncodeError)
    jsonl.write_text('{"path": "c0/img_00000.jpg"}\n{"path": "x\\ud800.jpg"}\n', encoding="utf-8")
    report = writer.build(jsonl, tmp_path / "j.lmdb", workers=0, progress=False, on_error="skip")
    assert report.count == 1 and [s.reason for s in report.skipped] == [
        "m.jsonl line 2: 'x\\ud800.jpg' cannot be a file name (it is not valid Unicode text); fix the path"]
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Skipped 1 bad file")][-1]
    assert "  'x\\ud800.jpg': " in summary and summary.encode("utf-8"), "the summary escapes the path: a UTF-8 log handler can write it"


# --- the CLI: --version, and expected failures as one line ------------------------------------------


def test_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(["--version"])
    assert excinfo.value.code == 0
    assert capsys.readouterr().out == f"lightning-lmdb {lightning_lmdb.__version__}\n"


def _raising(error: BaseException) -> Callable[..., None]:
    """A stand-in for a library function that fails with ``error``."""

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    return fail


def _one_error_line(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"lightning-lmdb {command}: ")
    return lines[0]


@pytest.mark.parametrize(
    ("error", "status", "expected"),
    [
        (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), 2,
         ["error: No space left on device (while building '{target}')", "free some space"]),
        (PermissionError(errno.EACCES, "Permission denied", "/ro/x.lmdb"), 2, ["error: Permission denied: '/ro/x.lmdb'", "permissions"]),
        (OSError(errno.EROFS, os.strerror(errno.EROFS), "/ro/x.lmdb"), 2, ["'/ro/x.lmdb'", "read-only"]),
        (DiskFullError(errno.ENOSPC, "The disk holding /d is full (1.0 MB free). Free space and rerun."), 2,
         ["error: The disk holding /d is full (1.0 MB free). Free space and rerun."]),
        (lmdb.Error("mdb_txn_commit: Input/output error"), 2,
         ["error: LMDB failed: mdb_txn_commit: Input/output error", "'{target}'", "rerun"]),
        (BuildError("/s/c0/bad.jpg: corrupt\nNothing was lost: rerun."), 2, ["error: /s/c0/bad.jpg: corrupt Nothing was lost: rerun."]),
        (KeyboardInterrupt(), 130, ["interrupted; rerun to resume"]),
    ],
    ids=["ENOSPC", "EACCES", "EROFS", "DiskFullError", "lmdb.Error", "multi-line", "Ctrl-C"],
)
def test_cli_build_failures_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    error: BaseException, status: int, expected: list[str],
) -> None:
    monkeypatch.setattr(writer, "build", _raising(error))
    target = tmp_path / "x.lmdb"
    assert main(["build", str(tmp_path), str(target), "--quiet"]) == status
    line = _one_error_line(capsys, "build")
    for text in expected:
        assert text.format(target=target) in line
    assert "[Errno" not in line


def test_cli_info_and_verify_failures_are_one_line(
    built: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source, db = built
    monkeypatch.setattr(verify, "describe_lmdb", _raising(lmdb.Error("mdb_cursor_get: Input/output error")))
    assert main(["info", str(db)]) == 2
    assert "LMDB failed: mdb_cursor_get: Input/output error" in _one_error_line(capsys, "info")
    monkeypatch.setattr(verify, "verify_lmdb", _raising(PermissionError(errno.EACCES, "Permission denied", str(source))))
    assert main(["verify", str(db), "--source", str(source)]) == 2
    assert f"Permission denied: '{source}'" in _one_error_line(capsys, "verify")


@pytest.mark.parametrize("below", ["x.lmdb", "sub/x.lmdb"], ids=["parent-is-a-file", "ancestor-is-a-file"])
def test_cli_build_target_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], below: str) -> None:
    source = make_jpegs(tmp_path / "src", 2, size=16)
    (tmp_path / "afile").write_text("not a folder")
    assert main(["build", str(source), str(tmp_path / "afile" / below), "--workers", "0", "--quiet"]) == 2
    line = _one_error_line(capsys, "build")
    assert str(tmp_path / "afile") in line
    assert "choose another path" in line


@pytest.mark.slow
def test_cli_subprocess_target_under_a_file_prints_no_traceback(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 2, size=16)
    (tmp_path / "afile").write_text("not a folder")
    target = tmp_path / "afile" / "sub" / "x.lmdb"
    result = subprocess.run([sys.executable, "-m", "lightning_lmdb.tools.cli", "build", str(source), str(target)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"lightning-lmdb build: error: Not a directory: '{tmp_path / 'afile' / 'sub'}'; "
                                          "a part of that path is a file, not a folder; choose another path"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", [[], ["--shards", "2"]], ids=["one-file", "sharded"])
def test_ctrl_c_during_a_parallel_build_prints_one_line_and_resumes(tmp_path: Path, layout: list[str]) -> None:
    """The builder sends SIGINT to its process group -- itself and its workers, as Ctrl-C does -- right after its third commit
    (the test hook ``FAULT_ENV``), so the interrupt lands mid-build at a known point, never by racing the build with sleeps."""
    source = make_jpegs(tmp_path / "src", 80, size=16)
    target = tmp_path / "db.lmdb"
    args = ["build", str(source), str(target), "--workers", "2", "--quiet", "--commit-every", "2", *layout]
    result = subprocess.run([sys.executable, "-m", "lightning_lmdb.tools.cli", *args], capture_output=True, text=True, timeout=120,
                            start_new_session=True, env={**os.environ, writer.FAULT_ENV: "commit:3:INT"})
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr, "no worker process may print a traceback"
    assert result.stderr.splitlines() == ["lightning-lmdb build: interrupted; rerun to resume"]
    report = writer.build(source, target, workers=0, progress=False, **({"shards": 2} if layout else {}))
    assert report.count == 80
    if not layout:  # three commits of two records each survived the interrupt
        assert report.action == "resumed" and report.records_written == 80 - 3 * 2
    else:  # each shard process counts its own commits: the first to reach its third interrupted the build (the other may not
        assert report.records_written <= 80 - 3 * 2  # have committed yet)


def test_cli_sigint_handler_is_scoped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen = []

    def build(*args: object, **kwargs: object) -> None:
        seen.append(signal.getsignal(signal.SIGINT))
        raise lightning_lmdb.BuildError("stop here")

    monkeypatch.setattr(writer, "build", build)
    assert main(["build", str(tmp_path), str(tmp_path / "x.lmdb")]) == 2
    assert seen[-1] not in (signal.default_int_handler, signal.SIG_IGN), "workers must ignore SIGINT while the CLI runs"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "restored afterwards"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # e.g. started as a background job: stays uninterruptible
    try:
        assert main(["build", str(tmp_path), str(tmp_path / "x.lmdb")]) == 2
        assert seen[-1] is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    capsys.readouterr()


# --- verify --source: completeness, skipped files -----------------------------------------------------


@pytest.fixture
def built_with_skips(tmp_path: Path) -> tuple[Path, Path]:
    """A database built with on_error="skip" from a folder with two unreadable files."""
    source = make_jpegs(tmp_path / "src", 6, size=16)
    (source / "c0" / "x_corrupt.jpg").write_bytes(truncated_jpeg())
    (source / "c1" / "x_text.jpg").write_text("hello, I am not a JPEG")
    db = build_lmdb(source, tmp_path / "db.lmdb", workers=0, progress=False, on_error="skip")
    return source, db


def test_verify_with_source_fails_on_skipped_files(built_with_skips: tuple[Path, Path]) -> None:
    source, db = built_with_skips
    report = verify_lmdb(db, source)
    assert not report.ok
    assert report.problems == []
    reasons = {s.path: s.reason for s in report.skipped}
    assert reasons.keys() == {"c0/x_corrupt.jpg", "c1/x_text.jpg"}
    assert "corrupt or truncated" in reasons["c0/x_corrupt.jpg"] and "not an image" in reasons["c1/x_text.jpg"]
    allowed = verify_lmdb(db, source, allow_skipped=True)
    assert allowed.ok and len(allowed.skipped) == 2
    integrity = verify_lmdb(db)
    assert integrity.ok and len(integrity.skipped) == 2, "without a source, skips are listed but only integrity is checked"


def test_verify_with_source_reports_added_and_deleted_files_beside_skips(built_with_skips: tuple[Path, Path]) -> None:
    source, db = built_with_skips
    Image.new("RGB", (8, 8)).save(source / "c1" / "added_later.png")
    (source / "c0" / "img_00002.jpg").unlink()
    (source / "c1" / "x_text.jpg").unlink()  # a skipped file deleted since: no longer missing from the database
    report = verify_lmdb(db, source, allow_skipped=True)
    assert not report.ok
    assert report.problems == [
        "c1/added_later.png: in the source but not in the database",
        "c0/img_00002.jpg: in the database but no longer in the source",
    ]
    assert [s.path for s in report.skipped] == ["c0/x_corrupt.jpg"]


def test_cli_verify_skipped_files(built_with_skips: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    source, db = built_with_skips
    assert main(["verify", str(db), "--source", str(source)]) == 1
    out = capsys.readouterr().out
    assert "c0/x_corrupt.jpg: skipped at build time: " in out and "corrupt or truncated" in out
    assert "c1/x_text.jpg: skipped at build time: " in out
    assert out.splitlines()[-1].endswith(
        "FAILED: 0 problems, 2 source files skipped at build time (pass --allow-skipped to accept them)"
    )
    assert main(["verify", str(db), "--source", str(source), "--allow-skipped"]) == 0
    out = capsys.readouterr().out
    assert "c0/x_corrupt.jpg: skipped at build time" in out
    assert out.splitlines()[-1].endswith("OK (2 source files skipped at build time, accepted with --allow-skipped)")
    assert main(["verify", str(db)]) == 0
    out = capsys.readouterr().out
    assert "c1/x_text.jpg: skipped at build time" in out and ": OK (2 source files were skipped" in out
    assert main(["info", str(db)]) == 0
    out = capsys.readouterr().out
    assert "skipped: 2" in out and "c0/x_corrupt.jpg: " in out and "corrupt or truncated" in out
    assert main(["info", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == describe_lmdb(db)["skipped"] == [
        {"path": s.path, "reason": s.reason} for s in database.load_meta(db).skipped
    ]


# --- verify's last line reads correctly for one and for many ----------------------------------------------


def _build_with_skips(tmp_path: Path, skips: int) -> tuple[Path, Path]:
    """Six good JPEGs and ``skips`` (1 or 2) unreadable files, built with on_error="skip"."""
    source = make_jpegs(tmp_path / "src", 6, size=16)
    (source / "c0" / "x_corrupt.jpg").write_bytes(truncated_jpeg())
    if skips == 2:
        (source / "c1" / "x_text.jpg").write_text("hello, I am not a JPEG")
    return source, build_lmdb(source, tmp_path / "db.lmdb", workers=0, progress=False, on_error="skip")


_VERIFY_LAST_LINES = {
    1: {
        "checksums": "6 of 6 records checked (checksums only; pass --source to compare with the files): OK "
                     "(1 source file was skipped at build time and is not in the database; pass --source to check completeness)",
        "source": "6 of 6 records checked (checksums, and compared with the files in {source}): FAILED: 0 problems, "
                  "1 source file skipped at build time (pass --allow-skipped to accept it)",
        "allowed": "6 of 6 records checked (checksums, and compared with the files in {source}): OK "
                   "(1 source file skipped at build time, accepted with --allow-skipped)",
    },
    2: {
        "checksums": "6 of 6 records checked (checksums only; pass --source to compare with the files): OK "
                     "(2 source files were skipped at build time and are not in the database; pass --source to check completeness)",
        "source": "6 of 6 records checked (checksums, and compared with the files in {source}): FAILED: 0 problems, "
                  "2 source files skipped at build time (pass --allow-skipped to accept them)",
        "allowed": "6 of 6 records checked (checksums, and compared with the files in {source}): OK "
                   "(2 source files skipped at build time, accepted with --allow-skipped)",
    },
}


@pytest.mark.parametrize("skips", [1, 2])
def test_cli_verify_wording_for_one_and_two_skipped_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], skips: int) -> None:
    source, db = _build_with_skips(tmp_path, skips)
    expected = {mode: f"{db}: " + line.format(source=source) for mode, line in _VERIFY_LAST_LINES[skips].items()}
    assert main(["verify", str(db)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == expected["checksums"]
    assert main(["verify", str(db), "--source", str(source)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == expected["source"]
    assert main(["verify", str(db), "--source", str(source), "--allow-skipped"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == expected["allowed"]


def test_cli_verify_wording_for_one_record_one_problem_and_one_more(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = make_jpegs(tmp_path / "src", 1, size=16)
    db = build_lmdb(source, tmp_path / "one.lmdb", workers=0, progress=False)
    assert main(["verify", str(db)]) == 0
    assert capsys.readouterr().out == f"{db}: 1 of 1 record checked (checksums only; pass --source to compare with the files): OK\n"
    (source / "c0" / "img_00000.jpg").write_bytes(truncated_jpeg())
    Image.new("RGB", (8, 8)).save(source / "c0" / "added_later.png")
    assert main(["verify", str(db), "--source", str(source), "--max-problems", "1"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [
        "... and 1 more problem",
        f"{db}: 1 of 1 record checked (checksums, and compared with the files in {source}): FAILED: 2 problems",
    ]


@pytest.mark.slow
def test_info_and_verify_import_neither_torch_nor_torchvision(built: tuple[Path, Path]) -> None:
    _, db = built
    code = textwrap.dedent(f"""
        import sys
        from lightning_lmdb.tools.cli import main
        assert main(["info", {str(db)!r}]) == 0
        assert main(["info", {str(db)!r}, "--json"]) == 0
        assert main(["verify", {str(db)!r}]) == 0
        print(sorted(m for m in ("torch", "torchvision") if m in sys.modules))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-1] == "[]", "info and verify (no --source) must not import torch or torchvision"
    assert ": 40 of 40 records checked (checksums only" in result.stdout


@pytest.mark.parametrize("raised", [ValueError("a bug's message"), KeyError("a bug")])
def test_cli_shows_the_traceback_of_a_bug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                          raised: Exception) -> None:
    """Only the project's errors, OSError and lmdb.Error are one line: a bare ValueError raised inside is a bug, not bad input."""
    database = lightning_lmdb.build_lmdb(make_jpegs(tmp_path / "src", 3), tmp_path / "db.lmdb", workers=0, progress=False)

    def broken(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(verify, "describe_lmdb", broken)
    with pytest.raises(type(raised)) as excinfo:  # out of main(): the console script prints its traceback
        main(["info", str(database)])
    assert excinfo.value is raised
    monkeypatch.setattr(verify, "describe_lmdb", lambda *a, **k: (_ for _ in ()).throw(lightning_lmdb.DatabaseError("damaged")))
    assert main(["info", str(database)]) == 2
    assert capsys.readouterr().err.strip().endswith("damaged"), "a project error is one line"


def test_every_project_error_derives_from_the_one_base() -> None:
    import importlib
    import inspect
    import pkgutil

    from lightning_lmdb import errors

    found = set()
    for module in pkgutil.walk_packages(lightning_lmdb.__path__, "lightning_lmdb."):
        for _, cls in inspect.getmembers(importlib.import_module(module.name), inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__.startswith("lightning_lmdb"):
                found.add(cls)
    assert found >= {getattr(errors, name) for name in errors.__all__}
    assert [cls.__name__ for cls in found if not issubclass(cls, lightning_lmdb.LightningLMDBError)] == []
    assert "LightningLMDBError" in lightning_lmdb.__all__
