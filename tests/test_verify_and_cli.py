"""Reading back: integrity checks at open, verify, info, and the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
from imagegen import make_jpegs
from PIL import Image

from lightning_lmdb import format as fmt
from lightning_lmdb.cli import main
from lightning_lmdb.verify import describe_lmdb, verify_lmdb
from lightning_lmdb.writer import build_lmdb


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
        fmt.open_env(cut)


def test_foreign_lmdb_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.lmdb"
    env = lmdb.open(str(foreign), subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"image_0", b"whatever")
    env.close()
    with pytest.raises(fmt.DatabaseError, match="not a lightning_lmdb database"):
        fmt.open_env(foreign)
    (tmp_path / "plain.lmdb").write_bytes(b"x" * 10000)
    with pytest.raises(fmt.DatabaseError, match="not an LMDB file"):
        fmt.open_env(tmp_path / "plain.lmdb")
    (tmp_path / "dirstyle.lmdb").mkdir()
    with pytest.raises(fmt.DatabaseError, match="is a folder"):
        fmt.open_env(tmp_path / "dirstyle.lmdb")
    with pytest.raises(FileNotFoundError, match="lightning-lmdb build"):
        fmt.open_env(tmp_path / "missing.lmdb")


def test_newer_format_is_refused(built: tuple[Path, Path]) -> None:
    _, db = built
    env = lmdb.open(str(db), subdir=False, max_dbs=2)
    with env.begin(write=True) as txn:
        meta = json.loads(bytes(txn.get(fmt.META_KEY)))
        meta["version"] = fmt.FORMAT_VERSION + 1
        txn.put(fmt.META_KEY, fmt.dump_json(meta))
    env.close()
    with pytest.raises(fmt.DatabaseError, match=f"format version {fmt.FORMAT_VERSION + 1}.*Upgrade"):
        fmt.open_env(db)


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


def test_file_names_that_are_not_utf8(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 3, size=16)
    odd = os.fsencode(source / "c0") + b"/\xff\xfe_latin1.png"
    Image.new("RGB", (8, 8), "blue").save(os.fsdecode(odd))
    db = build_lmdb(source, tmp_path / "db.lmdb", workers=0, progress=False)
    assert verify_lmdb(db, source).ok
    with open(odd, "ab") as handle:
        handle.write(b"changed")
    result = subprocess.run([sys.executable, "-m", "lightning_lmdb.cli", "verify", str(db), "--source", str(source)],
                            capture_output=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert b"(c0/\xff\xfe_latin1.png): differs from the source file" in result.stdout, "the name prints as its original bytes"
