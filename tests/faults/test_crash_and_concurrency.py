"""Crash safety (SIGKILL at exact points and at random moments, then resume) and concurrent builders of one target.

Every build that may die runs in a child forked from this (already imported) test process and leading
its own process group (see ``faultkit``): the builder's kill points SIGKILL that group, pool workers
included, and never pytest.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import shutil
import signal
from pathlib import Path

import pytest
from faultkit import Child, contents, leftovers, run_forked, sharded_contents
from imagegen import make_jpegs

from lightning_lmdb.build import onefile as filebuild
from lightning_lmdb.build.writer import FAULT_ENV, build
from lightning_lmdb.store import database, envs, shards
from lightning_lmdb.store import format as fmt
from lightning_lmdb.tools import cli
from lightning_lmdb.tools.verify import verify_lmdb

COUNT, EVERY = 40, 10  # 40 images, a commit every 10: commits 1-4 hold 10-40 records, then the final one

#: (kill point, builder workers): every point in this process, and the pool for the points that matter most.
KILL_POINTS = [
    ("commit:1", 0), ("commit:3", 0), ("final", 0), ("rename", 0), ("fsync", 0),
    ("commit:1", 2), ("final", 2), ("rename", 2),
]


@pytest.fixture(scope="module")
def source_and_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("kill")
    source = make_jpegs(root / "src", COUNT, size=24)
    return source, build(source, root / "reference.lmdb", workers=0, progress=False).path


def _build_report(source: Path, target: Path, **kwargs) -> tuple[str, int, int]:
    report = build(source, target, progress=False, **kwargs)
    return report.action, report.records_written, report.count


def _rerun_expectation(point: str) -> tuple[str, int]:
    """(action, records_written) of the rerun after a kill at ``point``."""
    name, _, n = point.partition(":")
    if name == "commit":
        return "resumed", COUNT - EVERY * int(n)  # the committed batches are kept
    if name in ("final", "rename"):
        return "resumed", 0  # every record was committed: only the metadata / the rename is left
    return "up-to-date", 0  # fsync: the finished file was renamed into place before the kill


@pytest.mark.slow
@pytest.mark.parametrize(("point", "workers"), KILL_POINTS, ids=[f"{p}-workers{w}" for p, w in KILL_POINTS])
def test_sigkill_at_exact_point_then_rerun_equals_reference(
    tmp_path: Path, source_and_reference: tuple[Path, Path], point: str, workers: int
) -> None:
    source, reference = source_and_reference
    target = tmp_path / "out.lmdb"
    killed = run_forked(build, source, target, workers=workers, commit_every=EVERY, progress=False, env={FAULT_ENV: point})
    assert killed.status == "signalled" and killed.signum == signal.SIGKILL, f"the builder was not killed at {point}: {killed}"

    partial = fmt.partial_path(target)
    if point == "fsync":  # renamed already: the target is whole, nothing is left beside it
        assert contents(target) == contents(reference)
        assert leftovers(target) == []
    else:  # the target is absent and says so; the partial is the unfinished (or finished, for rename) build
        assert not target.exists() and partial.exists()
        with pytest.raises(fmt.DatabaseError, match="incomplete build"):
            envs.open_env(target)
        if point == "rename":
            env = envs.open_env(partial)  # a complete, valid database that only lacks its name
            assert fmt.read_meta(env, partial).count == COUNT
            env.close()
        else:
            with pytest.raises(fmt.DatabaseError, match="unfinished build"):
                envs.open_env(partial)
    inode = partial.stat().st_ino if point == "rename" else None

    report = build(source, target, workers=workers, commit_every=EVERY, progress=False)
    assert (report.action, report.records_written, report.count) == (*_rerun_expectation(point), COUNT)
    if inode is not None:
        assert target.stat().st_ino == inode, "the finished .partial should have been renamed, not rebuilt"
    assert leftovers(target) == []
    assert contents(target) == contents(reference)


@pytest.mark.slow
def test_finished_partial_of_a_changed_source_is_rebuilt_not_renamed(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 8, size=16)
    target = tmp_path / "out.lmdb"
    killed = run_forked(build, source, target, workers=0, progress=False, env={FAULT_ENV: "rename"})
    assert killed.signum == signal.SIGKILL, str(killed)
    make_jpegs(tmp_path / "more", 1, size=16, seed=5)
    shutil.copy(tmp_path / "more" / "c0" / "img_00000.jpg", source / "c1" / "extra.jpg")

    report = build(source, target, workers=0, progress=False)
    assert (report.action, report.records_written, report.count) == ("built", 9, 9)
    assert contents(target) == contents(build(source, tmp_path / "reference.lmdb", workers=0, progress=False).path)


def _build_dying_inside_transaction(source: Path, target: Path, nth: int) -> None:
    """Build, SIGKILLing the process group inside the ``nth`` write transaction, after its puts, before its commit."""
    real, calls = fmt.dump_json, []

    def dump_json(obj):
        calls.append(1)
        if len(calls) == nth:
            os.killpg(0, signal.SIGKILL)
        return real(obj)

    fmt.dump_json = dump_json  # this forked child only
    build(source, target, workers=2, commit_every=10, progress=False)


@pytest.mark.slow
def test_resume_after_sigkill_mid_transaction(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 120, size=32)
    target = tmp_path / "out.lmdb"
    killed = run_forked(_build_dying_inside_transaction, source, target, 4)
    assert killed.status == "signalled" and killed.signum == signal.SIGKILL, str(killed)
    assert not target.exists() and fmt.partial_path(target).exists()
    with pytest.raises(fmt.DatabaseError, match="incomplete build"):
        envs.open_env(target)

    report = build(source, target, workers=2, commit_every=10, progress=False)
    assert report.action == "resumed"
    assert report.records_written == 120 - 30, "three batches of ten were committed before the kill"
    assert leftovers(target) == []
    reference = build(source, tmp_path / "reference.lmdb", workers=0, progress=False)
    assert reference.records_written == 120
    assert contents(target) == contents(reference.path)


def _resumable(target: Path) -> bool:
    """Whether ``TARGET.partial`` holds committed progress (or a finished build) that a rerun will resume."""
    partial = fmt.partial_path(target)
    if not partial.exists():
        return False
    try:
        envs.open_env(partial).close()
    except fmt.DatabaseError as exc:
        return "unfinished build" in str(exc)
    return True  # finished, killed before the rename


@pytest.mark.slow
def test_sigkill_at_random_moments_never_corrupts(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 300, size=40)
    target = tmp_path / "out.lmdb"
    reference = build(source, tmp_path / "reference.lmdb", workers=0, commit_every=3, progress=False)
    expected = contents(reference.path)
    rng = random.Random(0)
    scale = reference.seconds  # kills land at random within a build's time, adapted to how long builds take now
    kills, resumable = [], 0
    for attempt in range(16):
        child = Child(build, source, target, workers=2 if attempt % 2 else 0, commit_every=3, progress=False)
        finished = child.exited_within(rng.uniform(0.1, 0.9) * scale)
        if not finished:
            child.kill()
        outcome = child.outcome(timeout=60)
        if finished:
            assert outcome.status == "returned", str(outcome)
        else:
            assert outcome.status == "signalled" or outcome.status == "returned", str(outcome)  # it may finish as it is killed
            kills.append(attempt)
        if target.exists():  # finished (or killed after the rename): the file in place must be whole
            assert contents(target) == expected
            assert leftovers(target) == []
            target.unlink()  # start over, to land more kills part-way
            scale *= 0.7
            continue
        # Killed part-way: the target says the build is incomplete (or that nothing was started yet).
        with pytest.raises((fmt.DatabaseError, FileNotFoundError), match="incomplete build|No database"):
            envs.open_env(target)
        if _resumable(target):
            resumable += 1
            if resumable == 3:
                break
        else:
            scale *= 1.5  # killed before the first commit: aim later
    assert resumable >= 1, f"kills at attempts {kills}, none after a commit: the kill moments miss the build"
    resume = _resumable(target)
    report = build(source, target, workers=0, progress=False)
    assert report.action == ("resumed" if resume else "built")
    assert leftovers(target) == []
    assert contents(target) == expected


@pytest.mark.slow
@pytest.mark.parametrize("leftover", [False, True], ids=["fresh", "after-a-kill"])
def test_concurrent_builders_produce_one_build(tmp_path: Path, source_and_reference: tuple[Path, Path], leftover: bool) -> None:
    source, reference = source_and_reference
    target = tmp_path / "shared.lmdb"
    written_before = 0
    if leftover:  # a killed build left a partial with two batches: exactly one of the four resumes it
        killed = run_forked(build, source, target, workers=0, commit_every=EVERY, progress=False, env={FAULT_ENV: "commit:2"})
        assert killed.signum == signal.SIGKILL, str(killed)
        written_before = 2 * EVERY
    gate, release = os.pipe()  # every builder blocks on the gate until `release` is closed: one start for all
    children: list[Child] = []
    try:
        for _ in range(4):
            children.append(Child(_build_report, source, target, workers=0, commit_every=EVERY, gate=gate, close=(release,)))
    finally:
        os.close(gate)
        os.close(release)
    outcomes = [child.outcome(timeout=120) for child in children]
    assert all(o.status == "returned" for o in outcomes), "\n".join(map(str, outcomes))
    actions = sorted(o.value[0] for o in outcomes)
    assert actions == sorted(["resumed" if leftover else "built"] + ["up-to-date"] * 3)
    assert sum(o.value[1] for o in outcomes) == COUNT - written_before
    assert all(o.value[2] == COUNT for o in outcomes)
    assert leftovers(target) == []
    assert contents(target) == contents(reference)


def test_unusable_partial_is_discarded_and_rebuilt(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 6, size=16)
    target = tmp_path / "out.lmdb"
    fmt.partial_path(target).write_bytes(b"garbage left by something else" * 300)
    report = build(source, target, workers=0, progress=False)
    assert report.action == "built" and report.count == 6
    assert contents(target)[1] == [Path(p).read_bytes() for p in sorted(map(str, source.rglob("*.jpg")))]


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


# --- sharded builds: killed part-way, and one process per shard at once ------------------------------

SHARDS, SHARD_COUNT = 3, 36  # 36 images in 3 shards of about 12, a commit every 4 records

#: (kill point, its n-th occurrence over the whole sharded build, builder workers). With ``workers=0`` the shards
#: are built one after another in one process: ``commit`` 5 lands in shard 1 after shard 0 is finished,
#: ``rename`` 2 leaves shard 1 complete but unnamed, ``fsync`` 3 leaves every shard and no manifest. With
#: ``workers=2`` a pool process per shard: the first of them to reach the point kills the whole group.
SHARDED_KILLS = [("commit", 5, 0), ("rename", 2, 0), ("fsync", 3, 0), ("commit", 2, 2), ("final", 1, 2)]


@pytest.fixture(scope="module")
def sharded_source_and_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A source folder and its uninterrupted sharded build (one process)."""
    root = tmp_path_factory.mktemp("sharded")
    source = make_jpegs(root / "src", SHARD_COUNT, size=16)
    return source, build(source, root / "reference.lmdb", shards=SHARDS, workers=0, progress=False).path


def _sharded_build_killed_at(source: Path, target: Path, point: str, nth: int, workers: int) -> None:
    """A sharded build that SIGKILLs its process group at the ``nth`` time one process reaches the kill point ``point``.

    The builder's own kill points (``FAULT_ENV``) count per shard; this counts over a process's shards.
    """
    real, seen = filebuild._fault, []

    def fault(name: str, count: int = 0) -> None:
        if name == point:
            seen.append(count)
            if len(seen) == nth:
                os.killpg(0, signal.SIGKILL)
        real(name, count)

    filebuild._fault = fault  # this forked child (and the shard processes it forks) only
    build(source, target, shards=SHARDS, workers=workers, commit_every=4, progress=False)


def _finished_shards(folder: Path) -> dict[str, tuple[int, int]]:
    """``{file name: (inode, record count)}`` of the finished shard files in ``folder``."""
    return {path.name: (path.stat().st_ino, database.load_meta(path).count) for path in shards.shard_files(folder).values()}


def _same_sharded_database(folder: Path, reference: Path, source: Path) -> None:
    """``folder`` holds what the uninterrupted ``reference`` build holds, nothing is left over, and it verifies against ``source``."""
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in reference.iterdir()), "one manifest, no leftovers"
    assert sharded_contents(folder) == sharded_contents(reference)
    report = verify_lmdb(folder, source)
    assert report.ok and report.checked == SHARD_COUNT, report.problems


@pytest.mark.slow
@pytest.mark.parametrize(("point", "nth", "workers"), SHARDED_KILLS, ids=[f"{p}{n}-workers{w}" for p, n, w in SHARDED_KILLS])
def test_sharded_build_killed_part_way_then_rerun_equals_uninterrupted(
    tmp_path: Path, sharded_source_and_reference: tuple[Path, Path], point: str, nth: int, workers: int
) -> None:
    source, reference = sharded_source_and_reference
    target = tmp_path / "out.lmdb"
    killed = run_forked(_sharded_build_killed_at, source, target, point, nth, workers)
    assert killed.status == "signalled" and killed.signum == signal.SIGKILL, f"not killed at {point} {nth}: {killed}"

    assert not (target / shards.MANIFEST_NAME).exists(), "the manifest comes last"
    with pytest.raises(fmt.DatabaseError, match=r"manifest.*lightning-lmdb build SOURCE"):
        shards.load_meta(target)  # a reader refuses the unfinished folder, saying what to run
    finished = _finished_shards(target)
    if workers == 0:  # the shards before the kill's are finished (all of them for fsync 3)
        assert len(finished) == {"commit": 1, "rename": 1, "fsync": SHARDS}[point], sorted(finished)
    kept = sum(count for _, count in finished.values())

    report = build(source, target, shards=SHARDS, workers=workers, commit_every=4, progress=False)
    assert report.count == SHARD_COUNT
    if point == "fsync":
        assert (report.action, report.records_written) == ("up-to-date", 0), "every shard was there: only the manifest was missing"
    else:
        assert report.records_written < SHARD_COUNT - kept, "the interrupted shard's committed records are kept, not written again"
    assert {name: ino for name, (ino, _) in _finished_shards(target).items() if name in finished} == {
        name: ino for name, (ino, _) in finished.items()}, "finished shards are kept as they are, not rebuilt"
    _same_sharded_database(target, reference, source)


@pytest.mark.slow
def test_a_shard_process_killed_alone_fails_the_build_instead_of_hanging(
    tmp_path: Path, sharded_source_and_reference: tuple[Path, Path]
) -> None:
    """A shard process killed on its own (the OOM killer's way): the build must fail, saying what to do, not hang.

    ``FAULT_ENV`` in a shard process, which leads no process group, kills that process alone (every shard process
    at its first commit). The build takes well under a second here: the 30 s deadline only tells a hang from a result
    (a ``multiprocessing.Pool`` waited forever for the dead worker's result).
    """
    source, reference = sharded_source_and_reference
    target = tmp_path / "out.lmdb"
    outcome = run_forked(build, source, target, shards=SHARDS, workers=2, commit_every=4, progress=False, env={FAULT_ENV: "commit:1"},
                         timeout=30)
    assert outcome.raised("BuildError"), f"the build did not fail with a BuildError when its shard processes died: {outcome}"
    assert re.search(rf"shard [01]/{SHARDS} \(.*shard-0000[01]-of-0000{SHARDS}\.lmdb\) was killed by SIGKILL", outcome.message), (
        outcome.message)
    assert "a rerun of the build resumes" in outcome.message and "\n" not in outcome.message, outcome.message
    assert not (target / shards.MANIFEST_NAME).exists()
    report = build(source, target, shards=SHARDS, workers=2, commit_every=4, progress=False)
    assert report.count == SHARD_COUNT
    assert report.records_written < SHARD_COUNT, "the killed shard's committed records are kept, not written again"
    _same_sharded_database(target, reference, source)


def _cli_build(*args: str) -> tuple[int, str]:
    """``lightning-lmdb build ARGS``: its exit status and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(["build", *args])
    return code, out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(3))  # a race shows only sometimes: each start is another chance to hit it
@pytest.mark.parametrize("folder", ["absent", "empty"])
def test_one_process_per_shard_started_at_once_make_one_database(
    tmp_path: Path, sharded_source_and_reference: tuple[Path, Path], folder: str, attempt: int
) -> None:
    """A job array on a shared filesystem: ``--shard I/K`` for every I at the same moment, into one target folder.

    With the race fixed in b02bdce (a folder holding only another task's lock files was refused as "not a
    sharded database") this failed in about one start of two here.
    """
    source, reference = sharded_source_and_reference
    target = tmp_path / "shared" / "train.lmdb"
    if folder == "empty":
        target.mkdir(parents=True)
    gate, release = os.pipe()  # every task blocks on the gate until `release` is closed: one start for all
    children: list[Child] = []
    try:
        for index in range(SHARDS):
            args = (str(source), str(target), "--shard", f"{index}/{SHARDS}", "--workers", "0", "--commit-every", "4", "--quiet")
            children.append(Child(_cli_build, *args, gate=gate, close=(release,)))
    finally:
        os.close(gate)
        os.close(release)
    outcomes = [child.outcome(timeout=120) for child in children]
    assert all(o.status == "returned" for o in outcomes), "\n".join(map(str, outcomes))
    for index, outcome in enumerate(outcomes):
        code, printed = outcome.value
        assert code == 0 and f"shard {index}/{SHARDS}: built" in printed, printed
    _same_sharded_database(target, reference, source)
    single = build(source, tmp_path / "single.lmdb", workers=0, progress=False).path
    assert [value for _, values in sharded_contents(target)[1] for value in values] == contents(single)[1], "the records of one file"
