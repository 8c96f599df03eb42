"""A database is a source too: ``LMDBDataModule(train_dir=<a database file or sharded folder>)`` serves it in place.

Nothing is built or written to ``cache_dir`` for it; the raw backend reads the files it was built from.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from imagegen import make_folder, make_jpegs

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.build.writer import build_lmdb
from lightning_lmdb.datamodule.options import is_database
from lightning_lmdb.errors import DatabaseError, OptionError, SourceError
from lightning_lmdb.read.transforms import eval_transform
from lightning_lmdb.store import database

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path, cache_dir: Path, backend: str = "lmdb", **kwargs: object) -> LMDBDataModule:
    settings = {"val_fraction": 0.25, "image_size": 8, "decoder": "pil", "batch_size": 4, "num_workers": 0, "build_workers": 0,
                "train_transform": eval_transform(8), "eval_transform": eval_transform(8), **kwargs}
    return LMDBDataModule(path, cache_dir=cache_dir, backend=backend, **settings)  # type: ignore[arg-type]


def _samples(dm: LMDBDataModule, split: str) -> list[tuple[torch.Tensor, object]]:
    dataset = dm.datasets[split]
    return [dataset[i] for i in range(len(dataset))]


def _same_samples(a: list[tuple[torch.Tensor, object]], b: list[tuple[torch.Tensor, object]]) -> bool:
    same = (torch.equal(x, y) and torch.equal(torch.as_tensor(s), torch.as_tensor(t)) for (x, s), (y, t) in zip(a, b, strict=True))
    return len(a) == len(b) and all(same)


def _state(db: Path) -> dict[str, int]:
    """The mtime of each file of the database and of the folder it sits in (nothing may be added beside it)."""
    files = [db, *db.iterdir()] if db.is_dir() else [db]
    return {str(p): p.stat().st_mtime_ns for p in [*files, *db.parent.iterdir()]}


def _built(tmp_path: Path, shards: int | None) -> tuple[Path, Path]:
    source = make_folder(tmp_path / "src", per_class=6)
    db = build_lmdb(source, tmp_path / "dbs" / "x.lmdb", workers=0, progress=False, shards=shards)
    return source, Path(db)


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
@pytest.mark.parametrize("shards", [None, 2], ids=["file", "sharded"])
def test_a_database_is_served_in_place_with_the_folders_samples(tmp_path: Path, shards: int | None, backend: str) -> None:
    source, db = _built(tmp_path, shards)
    before, build = _state(db), database.build_id(db)
    cache = tmp_path / "cache"
    cache.mkdir()

    given = _module(db, cache, backend)
    assert given.database_path("train") == db and given.given_databases == {"train"}
    meta = database.load_meta(db)
    assert (given.classes, given.class_to_idx, given.num_classes) == (meta.classes, meta.class_to_idx, 3), "from its metadata"
    given.prepare_data()
    given.setup("fit")
    from_folder = _module(source, tmp_path / "folder_cache", backend)
    from_folder.prepare_data()
    from_folder.setup("fit")

    for split in ("train", "val"):  # the val_fraction split of the database: the same samples as the folder's
        assert _same_samples(_samples(given, split), _samples(from_folder, split)), split
    assert len(given.datasets["val"]) == round(0.25 * meta.count)
    images, targets = next(iter(given.train_dataloader()))
    assert images.shape[1:] == (3, 8, 8) and len(targets) == 4
    assert given.database_paths() == ([db] if backend == "lmdb" else [])
    assert list(cache.rglob("*")) == [], "nothing is written to cache_dir for a given database"
    assert _state(db) == before and database.build_id(db) == build, "the database (and its folder) are left as they were"


def test_a_given_database_is_staged_to_local_cache_dir(tmp_path: Path) -> None:
    source, db = _built(tmp_path, None)
    before = _state(db)
    cache, local = tmp_path / "cache", tmp_path / "local"
    dm = _module(db, cache, local_cache_dir=local, val_fraction=0)
    dm.prepare_data()
    dm.setup("fit")
    staged = local / db.name
    assert staged.is_file() and database.build_id(staged) == database.build_id(db)
    assert Path(dm.datasets["train"].path) == staged, "the loaders read the local copy"
    assert not cache.exists() and _state(db) == before


def test_on_stale_does_not_apply_to_a_given_database(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source, db = _built(tmp_path, None)
    count = database.load_meta(db).count
    shutil.copy(next(source.rglob("*.png")), source / "cat" / "added.png")  # the source changed since the build
    with caplog.at_level(logging.INFO):
        dm = _module(db, tmp_path / "cache", on_stale="error", val_fraction=0)
    assert any("served as it is" in r.getMessage() and "on_stale='error'" in r.getMessage() for r in caplog.records), caplog.text
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.datasets["train"]) == count, "served as it was built"
    raw = _module(db, tmp_path / "cache", "raw", on_stale="error", val_fraction=0)
    raw.setup("fit")
    assert len(raw.datasets["train"]) == count, "the raw backend reads the files the database holds, no more"
    assert not (tmp_path / "cache").exists()


def test_the_raw_backend_names_a_database_whose_files_are_gone(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "gone", 4, size=8)
    db = Path(build_lmdb(source, tmp_path / "x.lmdb", workers=0, progress=False))
    shutil.rmtree(source)
    assert LMDBDataModule(db, cache_dir=tmp_path / "cache", backend="raw").num_classes == 2, "the classes are the database's"
    dm = _module(db, tmp_path / "cache", "raw", val_fraction=0)
    with pytest.raises(SourceError) as raised:
        dm.setup("fit")
    message = str(raised.value)
    assert str(db) in message and str(source) in message and "backend=lmdb" in message and "restore the files" in message
    lmdb = _module(db, tmp_path / "cache", "lmdb", val_fraction=0)  # the fix: serve the database itself
    lmdb.setup("fit")
    assert len(lmdb.datasets["train"]) == 4


def test_what_is_a_database(tmp_path: Path) -> None:
    source, db = _built(tmp_path, 2)
    single = Path(build_lmdb(source, tmp_path / "single.lmdb", workers=0, progress=False))
    (tmp_path / "labels.csv").write_text("path,label\ncat/0.png,cat\n")
    (tmp_path / "notes.txt").write_text("x" * 64)
    os.mkfifo(tmp_path / "pipe")
    assert is_database(db) and is_database(single)
    assert not any(is_database(p) for p in (source, tmp_path / "labels.csv", tmp_path / "notes.txt", tmp_path / "pipe", tmp_path / "nope"))


def test_a_file_that_is_neither_a_database_nor_a_manifest_is_refused_naming_it(tmp_path: Path) -> None:
    stray = tmp_path / "weights.bin"
    stray.write_bytes(b"\0" * 4096)
    with pytest.raises(FileNotFoundError) as raised:
        LMDBDataModule(stray, cache_dir=tmp_path / "cache")
    message = str(raised.value)
    assert "train_dir" in message and str(stray) in message and "neither a known source nor a database" in message
    assert "is a file that is none of: a CSV / TSV / JSON Lines manifest" in message
    assert "lightning-lmdb build" in message and "data.train_dir=" in message


def test_a_damaged_database_is_refused_at_construction_naming_the_key(tmp_path: Path) -> None:
    _, db = _built(tmp_path, None)
    damaged = tmp_path / "half.lmdb"
    damaged.write_bytes(db.read_bytes()[: db.stat().st_size // 2])
    with pytest.raises(DatabaseError, match=rf"val_dir '{damaged}' is a database that cannot be served: .*truncated.*data\.val_dir="):
        LMDBDataModule(db, val_dir=damaged, cache_dir=tmp_path / "cache")


def test_two_given_databases_of_one_name_cannot_share_local_cache_dir(tmp_path: Path) -> None:
    source, db = _built(tmp_path, None)
    other = Path(build_lmdb(source, tmp_path / "other" / "x.lmdb", workers=0, progress=False))
    with pytest.raises(OptionError, match="both named 'x.lmdb'.*local_cache_dir"):
        LMDBDataModule(db, val_dir=other, cache_dir=tmp_path / "cache", local_cache_dir=tmp_path / "local")
    assert LMDBDataModule(db, val_dir=other, cache_dir=tmp_path / "cache").given_databases == {"train", "val"}


@pytest.mark.slow
def test_train_py_serves_a_database_without_building(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 12, size=16, classes=3)
    db = tmp_path / "dbs" / "x.lmdb"
    built = subprocess.run([sys.executable, "-m", "lightning_lmdb.tools.cli", "build", str(source), str(db), "--workers", "0"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)  # as a user would: the CLI
    assert built.returncode == 0 and db.is_file(), built.stderr[-2000:]
    before, cache = _state(db), tmp_path / "cache"
    cmd = [sys.executable, "train.py", "data=lmdb", f"data.train_dir={db}", f"data.cache_dir={cache}", "trainer.max_epochs=1",
           f"paths.data_dir={tmp_path / 'data'}", f"hydra.run.dir={tmp_path / 'run'}", "data.image_size=16", "loader=debug",
           "data.build_workers=0", "trainer.enable_progress_bar=false", "model.width=8"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "is a database (12 records): served as it is" in result.stdout + result.stderr
    assert not cache.exists() and _state(db) == before, "nothing built, nothing written to cache_dir"
    assert not (tmp_path / "data").exists(), "no demo dataset either"


def test_an_image_folder_holding_a_manifest_json_of_its_own_is_a_source(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 6, size=16, classes=2)
    (source / "manifest.json").write_text('{"dataset": "mine", "version": 3}')  # e.g. a dataset's own description
    dm = LMDBDataModule(source, cache_dir=tmp_path / "cache", num_workers=0, build_workers=0, val_fraction=0)
    assert not dm.given_databases and dm.num_classes == 2
    dm.prepare_data()
    assert dm.database_path("train").is_file(), "built from the folder, not refused as a database"
