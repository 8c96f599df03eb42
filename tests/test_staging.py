"""Staging a database to local disk: checked against its source, resumed after a kill, skipped when current, refused when damaged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from imagegen import make_folder, make_jpegs

from lightning_lmdb import LMDBDataModule, LMDBImageDataset, build_lmdb
from lightning_lmdb.experiment.datamodule import ExperimentDataModule
from lightning_lmdb.store import envs, shards
from lightning_lmdb.store.format import DatabaseError
from lightning_lmdb.tools import staging

BLOCK = 16 << 10


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return build_lmdb(make_jpegs(tmp_path / "src", 40, size=48), tmp_path / "shared" / "train.lmdb", workers=0, progress=False)


def _samples(path: Path) -> list[tuple[bytes, int]]:
    dataset = LMDBImageDataset(path)
    out = [(dataset[i][0].tobytes(), dataset[i][1]) for i in range(len(dataset))]
    envs.close_all()
    return out


def test_copies_checks_and_skips_a_current_copy(database: Path, tmp_path: Path) -> None:
    report = staging.stage(database, tmp_path / "local", block_size=BLOCK)
    assert report.action == "copied" and report.path == tmp_path / "local" / "train.lmdb"
    assert report.bytes_copied == database.stat().st_size > 3 * BLOCK
    assert report.path.read_bytes() == database.read_bytes() and _samples(report.path) == _samples(database)
    assert sorted(p.name for p in report.path.parent.iterdir()) == ["train.lmdb", "train.lmdb.staged.json", "train.lmdb.staging.lock"]
    again = staging.stage(database, tmp_path / "local", block_size=BLOCK)
    assert again.action == "up-to-date" and again.bytes_copied == 0
    build_lmdb(tmp_path / "src", database, workers=0, progress=False, overwrite=True)  # a rebuild: another build id
    assert staging.stage(database, tmp_path / "local", block_size=BLOCK).action == "copied"
    assert report.path.read_bytes() == database.read_bytes()


@pytest.mark.slow
def test_a_killed_copy_resumes_from_its_last_intact_block(database: Path, tmp_path: Path) -> None:
    script = f"from lightning_lmdb import staging; staging.stage({str(database)!r}, {str(tmp_path / 'local')!r}, block_size={BLOCK})"
    killed = subprocess.run([sys.executable, "-c", script], env={**os.environ, staging.FAULT_ENV: "3"}, capture_output=True, timeout=120)
    assert killed.returncode == 17, killed.stderr
    partial = tmp_path / "local" / "train.lmdb.staging"
    assert partial.stat().st_size == 3 * BLOCK and not (tmp_path / "local" / "train.lmdb").exists()
    with open(partial, "r+b") as handle:  # damage the third block: only the first two are kept
        handle.seek(2 * BLOCK + 10)
        handle.write(b"\xff" * 8)
    report = staging.stage(database, tmp_path / "local", block_size=BLOCK)
    assert report.action == "resumed" and report.bytes_copied == database.stat().st_size - 2 * BLOCK
    assert report.path.read_bytes() == database.read_bytes()
    assert not partial.exists() and not partial.with_name("train.lmdb.staging.json").exists()


@pytest.mark.slow
def test_a_killed_copy_of_a_sharded_database_resumes_and_is_whole_only_at_the_end(database: Path, tmp_path: Path) -> None:
    folder = build_lmdb(tmp_path / "src", tmp_path / "shared" / "sharded.lmdb", shards=2, workers=0, progress=False)
    script = f"from lightning_lmdb import staging; staging.stage({str(folder)!r}, {str(tmp_path / 'local')!r}, block_size={BLOCK})"
    killed = subprocess.run([sys.executable, "-c", script], env={**os.environ, staging.FAULT_ENV: "3"}, capture_output=True, timeout=120)
    assert killed.returncode == 17, killed.stderr
    copy = tmp_path / "local" / "sharded.lmdb"
    assert not (copy / "manifest.json").exists(), "the manifest comes last: a killed copy is never a database"
    with pytest.raises(DatabaseError):
        LMDBImageDataset(copy)
    report = staging.stage(folder, tmp_path / "local", block_size=BLOCK)
    total = sum(p.stat().st_size for p in shards.database_files(folder))
    assert report.action == "resumed" and report.bytes_copied == total - 3 * BLOCK
    assert _samples(copy) == _samples(folder) == _samples(database)
    assert staging.stage(folder, tmp_path / "local", block_size=BLOCK).action == "up-to-date"


def test_a_copy_that_reads_back_differently_is_refused_and_deleted(database: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    copy = staging._copy

    def copy_then_damage(source: Path, partial: Path, *args: object) -> int:
        copied = copy(source, partial, *args)
        with open(partial, "r+b") as handle:  # what a bad disk or a write lost in a crash would leave
            handle.seek(BLOCK + 5)
            handle.write(b"\x00\x01")
        return copied

    monkeypatch.setattr(staging, "_copy", copy_then_damage)
    with pytest.raises(staging.StagingError, match=r"train\.lmdb\.staging.*read back differently from the source at block 1"):
        staging.stage(database, tmp_path / "local", block_size=BLOCK)
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["train.lmdb.staging.lock"]


def test_refuses_to_stage_onto_itself(database: Path) -> None:
    with pytest.raises(ValueError, match="holds the database"):
        staging.stage(database, database.parent)


def test_datamodule_reads_the_staged_copy(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "images", per_class=4)
    settings = dict(cache_dir=tmp_path / "shared", image_size=16, batch_size=64, num_workers=0, build_workers=0, val_fraction=0.5)
    plain = LMDBDataModule(source, **settings)
    plain.prepare_data()
    plain.setup("fit")
    staged = ExperimentDataModule(source, local_cache_dir=tmp_path / "local", **settings)
    staged.prepare_data()
    staged.setup("fit")
    copy = tmp_path / "local" / plain.database_path("train").name
    assert Path(staged.datasets["train"].path) == copy and copy.read_bytes() == plain.database_path("train").read_bytes()
    assert staged.cached_files() == [str(copy)] and {"prepare_s", "stage_s", "setup_s"} <= set(staged.timings)
    a, b = next(iter(plain.val_dataloader())), next(iter(staged.val_dataloader()))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    envs.close_all()
