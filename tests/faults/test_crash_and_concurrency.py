"""Crash safety (SIGKILL part-way, resume) and concurrent builders of one target."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from imagegen import make_jpegs, read_records

from lightning_lmdb import format as fmt
from lightning_lmdb.writer import build


def _contents(path: Path) -> tuple[dict, list[bytes]]:
    meta, values = read_records(path)
    meta.pop("created"), meta.pop("build_id")
    return meta, values


def _spawn(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_resume_after_sigkill_mid_transaction(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 120, size=48)
    target = tmp_path / "out.lmdb"
    # Die by SIGKILL (the whole process group, pool workers included) inside the 4th write
    # transaction, after its records were put and before it commits.
    proc = _spawn(f"""
        import os, signal
        from lightning_lmdb import format as fmt, writer
        real, calls = fmt.dump_json, []
        def dump_json(obj):
            calls.append(1)
            if len(calls) == 4:
                os.killpg(0, signal.SIGKILL)
            return real(obj)
        writer.fmt.dump_json = dump_json
        writer.build({str(source)!r}, {str(target)!r}, workers=2, commit_every=10, progress=False)
    """)
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    assert not target.exists() and fmt.partial_path(target).exists()
    with pytest.raises(fmt.DatabaseError, match="incomplete build"):
        fmt.open_env(target)

    report = build(source, target, workers=2, commit_every=10, progress=False)
    assert report.action == "resumed"
    assert report.records_written == 120 - 30, "three batches of ten were committed before the kill"
    assert not fmt.partial_path(target).exists()
    reference = build(source, tmp_path / "reference.lmdb", workers=0, progress=False)
    assert reference.records_written == 120
    assert _contents(target) == _contents(reference.path)


def test_sigkill_at_random_moments_never_corrupts(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 300, size=64)
    target = tmp_path / "out.lmdb"
    rng = random.Random(0)
    code = f"""
        from lightning_lmdb.writer import build
        build({str(source)!r}, {str(target)!r}, workers=0, commit_every=3, progress=False)
    """
    for _ in range(4):
        proc = _spawn(code)
        deadline = time.monotonic() + 60
        while not fmt.partial_path(target).exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.15))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        if target.exists():  # the build finished before the kill: the finished file must be whole
            break
    report = build(source, target, workers=0, progress=False)
    assert report.records_written < 300 or report.action == "up-to-date"
    reference = build(source, tmp_path / "reference.lmdb", workers=0, progress=False)
    assert _contents(target) == _contents(reference.path)


def test_concurrent_builders_produce_one_build(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 200, size=48)
    target = tmp_path / "shared.lmdb"
    code = f"""
        import json
        from lightning_lmdb.writer import build
        report = build({str(source)!r}, {str(target)!r}, workers=1, commit_every=20, progress=False)
        print(json.dumps({{"action": report.action, "written": report.records_written}}))
    """
    procs = [_spawn(code) for _ in range(3)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["action"] for r in results) == ["built", "up-to-date", "up-to-date"]
    assert sum(r["written"] for r in results) == 200
    meta, values = _contents(target)
    assert meta["count"] == len(values) == 200


def test_unusable_partial_is_discarded_and_rebuilt(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 6, size=16)
    target = tmp_path / "out.lmdb"
    fmt.partial_path(target).write_bytes(b"garbage left by something else" * 300)
    report = build(source, target, workers=0, progress=False)
    assert report.action == "built" and report.count == 6
    assert _contents(target)[1] == [Path(p).read_bytes() for p in sorted(map(str, source.rglob("*.jpg")))]


def test_partial_with_unreadable_progress_is_discarded(tmp_path: Path) -> None:
    import lmdb

    source = make_jpegs(tmp_path / "src", 6, size=16)
    target = tmp_path / "out.lmdb"
    env = lmdb.open(str(fmt.partial_path(target)), subdir=False, max_dbs=3)
    with env.begin(write=True) as txn:
        txn.put(fmt.PROGRESS_KEY, b"{not json")
    env.close()
    report = build(source, target, workers=0, progress=False)
    assert report.action == "built" and report.count == 6
