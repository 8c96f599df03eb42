"""Sharded databases: built whole or shard by shard, served, verified, staged and prepared as one database file is."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import lmdb
import numpy as np
import pytest
from imagegen import make_jpegs
from PIL import Image
from torch.utils.data import DataLoader

from lightning_lmdb import LMDBDataModule, LMDBImageDataset
from lightning_lmdb.build import readers, workcut
from lightning_lmdb.build.writer import BuildError, build, build_lmdb
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.sources.folder import scan_folder
from lightning_lmdb.store import format as fmt
from lightning_lmdb.store import shards
from lightning_lmdb.tools.bench import run_read_benchmark
from lightning_lmdb.tools.cli import main
from lightning_lmdb.tools.staging import stage
from lightning_lmdb.tools.verify import describe_lmdb, verify_lmdb


@pytest.fixture(autouse=True)
def _at_most_two_build_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build with the default ``workers=None`` (one process per core) starts at most 2 processes here, on any machine."""
    cores = readers.available_cores()
    monkeypatch.setattr(readers, "available_cores", lambda: min(2, cores))


def _records(path: Path) -> list[bytes]:
    """Every record value of a database (file or sharded folder), in global order."""
    values = []
    for part in shards.parts(path):
        env = lmdb.open(part.path, readonly=True, lock=False, subdir=False, max_dbs=2)
        try:
            with env.begin(db=env.open_db(fmt.RECORDS_DB, create=False)) as txn:
                values += [bytes(txn.get(fmt.record_key(i))) for i in range(part.count)]
        finally:
            env.close()
    return values


def _same_database(a: Path, b: Path) -> None:
    ma, mb = shards.load_meta(a, arrays=True), shards.load_meta(b, arrays=True)
    fields = ("count", "storage", "classes", "class_to_idx", "options", "source", "skipped")
    assert [getattr(ma, f) for f in fields] == [getattr(mb, f) for f in fields]
    assert np.array_equal(ma.targets, mb.targets) and np.array_equal(ma.checksums, mb.checksums)
    assert ma.paths.tolist() == mb.paths.tolist()
    assert _records(a) == _records(b)


@pytest.mark.parametrize("count", [2, 3])
def test_sharded_folder_serves_the_samples_of_one_file(image_folder: Path, tmp_path: Path, count: int) -> None:
    (image_folder / "dog" / "broken.png").write_bytes(b"\x89PNG not really")  # skipped: in a shard's range, not shard 0's
    (image_folder / "cat" / "fifo.jpg").unlink(missing_ok=True)
    os.mkfifo(image_folder / "cat" / "fifo.jpg")  # a non-regular file: recorded with shard 0
    one = build_lmdb(image_folder, tmp_path / "one.lmdb", on_error="skip", progress=False)
    report = build(image_folder, tmp_path / "many.lmdb", on_error="skip", progress=False, shards=count, workers=2)
    assert report.action == "built" and report.count == shards.load_meta(one).count
    folder = report.path
    assert folder.is_dir() and sorted(p.name for p in shards.database_files(folder)) == [
        shards.shard_name(i, count) for i in range(count)]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [s["offset"] for s in manifest["shards"]] == list(np.cumsum([0] + [s["count"] for s in manifest["shards"]][:-1]))
    _same_database(one, folder)
    assert {s.path for s in shards.load_meta(folder).skipped} == {"dog/broken.png", "cat/fifo.jpg"}

    a, b = LMDBImageDataset(one), LMDBImageDataset(folder)
    assert b.sharded and not a.sharded and len(a) == len(b) and a.targets == b.targets and a.paths == b.paths
    for i in range(len(a)):
        (ia, ta), (ib, tb) = a[i], b[i]
        assert ta == tb and np.array_equal(np.asarray(ia), np.asarray(ib))
    view = b.view([len(b) - 1, 0], None)
    assert view.targets == [a.targets[-1], a.targets[0]]
    assert build(image_folder, folder, on_error="skip", progress=False, shards=count).action == "up-to-date"


@pytest.mark.parametrize(("context", "workers"), [("fork", 2), pytest.param("spawn", 1, marks=pytest.mark.slow)])
def test_sharded_dataset_in_worker_processes(image_folder: Path, tmp_path: Path, context: str, workers: int) -> None:
    """Forked workers share the indices; a spawned one (slow: it imports torch) gets the dataset pickled."""
    folder = build_lmdb(image_folder, tmp_path / "db.lmdb", shards=3, progress=False)
    dataset = LMDBImageDataset(folder, decoder="opencv")
    loader = DataLoader(dataset, batch_size=None, num_workers=workers, multiprocessing_context=context)
    seen = [(int(image.sum()), target) for image, target in loader]
    assert seen == [(int(dataset[i][0].sum()), dataset[i][1]) for i in range(len(dataset))]


def test_shard_jobs_combine_into_the_database_of_one_build(image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "jobs.lmdb"
    assert main(["build", str(image_folder), str(folder), "--shard", "1/3", "--quiet"]) == 0
    assert "shard 1/3: built" in capsys.readouterr().out
    assert not (folder / "manifest.json").exists()
    with pytest.raises(fmt.DatabaseError, match=r"shard\(s\) 0/3, 2/3 are missing.*--shard I/3"):
        LMDBImageDataset(folder)
    assert main(["info", str(folder)]) == 2 and "missing" in capsys.readouterr().err
    assert main(["build", str(image_folder), str(folder), "--shard", "0/3", "--quiet"]) == 0
    assert main(["build", str(image_folder), str(folder), "--shard", "2/3", "--quiet"]) == 0  # the last one writes the manifest
    assert (folder / "manifest.json").exists()
    whole = build_lmdb(image_folder, tmp_path / "whole.lmdb", shards=3, progress=False)
    one = build_lmdb(image_folder, tmp_path / "one.lmdb", progress=False)
    _same_database(folder, whole)
    _same_database(folder, one)
    assert main(["build", str(image_folder), str(folder), "--shards", "3", "--quiet"]) == 0
    assert "up-to-date" in capsys.readouterr().out
    assert main(["verify", str(folder), "--source", str(image_folder)]) == 0
    assert ": OK" in capsys.readouterr().out
    assert main(["info", str(folder), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["shards"] == 3 and info["count"] == shards.load_meta(one).count
    assert main(["build", str(image_folder), str(folder), "--shard", "3/3"]) == 2
    assert "from 0 to 2" in capsys.readouterr().err
    assert main(["build", str(image_folder), str(folder), "--shard", "1/2", "--shards", "3"]) == 2


def test_a_bad_file_stops_its_shard_and_a_rerun_with_skip_completes_the_build(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 60, size=16)
    bad = source / "c1" / "img_00051.jpg"
    bad.write_bytes(b"not a jpeg")  # in shard 1 of 2 (c1, the second half of the bytes)
    files = scan_folder(source).files
    start = workcut.work_ranges(scan_folder(source), "auto", None, 2)[1][0]
    before = [f.path for f in files].index(str(bad)) - start
    folder = tmp_path / "db.lmdb"
    with pytest.raises(BuildError, match=rf"(?s)img_00051\.jpg.*Nothing was lost: the {before} files of shard-00001-of-00002\.lmdb before"):
        build_lmdb(source, folder, shards=2, workers=2, progress=False)
    report = build(source, folder, shards=2, workers=2, progress=False, on_error="skip")  # shard 0 is kept, shard 1 resumes
    assert report.action == "resumed" and [s.path for s in report.skipped] == ["c1/img_00051.jpg"]
    assert shards.load_meta(folder).options["on_error"] == "skip"
    _same_database(folder, build_lmdb(source, tmp_path / "one.lmdb", on_error="skip", progress=False))


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file of ``folder`` with its size and modification time: what a write would change."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_a_reader_never_writes_a_missing_manifest(image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = build_lmdb(image_folder, tmp_path / "db.lmdb", shards=2, progress=False)
    written = (folder / "manifest.json").read_bytes()
    (folder / "manifest.json").unlink()  # e.g. the last job of an array died after its shard
    (folder / "build-lock").unlink()  # as a copy on a read-only disk holds it (root ignores chmod: no write must be tried at all)
    before = _listing(folder)
    with pytest.raises(fmt.DatabaseError, match=r"has every shard but no manifest\.json.*lightning-lmdb build SOURCE .* --shards 2"):
        LMDBImageDataset(folder)
    assert main(["info", str(folder)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
    with pytest.raises(fmt.DatabaseError, match="no manifest.json"):
        verify_lmdb(folder)
    assert _listing(folder) == before, "a reader wrote into the database folder"
    assert build(image_folder, folder, shards=2, progress=False).action == "up-to-date"  # the shards are kept; the build writes it
    assert (folder / "manifest.json").read_bytes() == written  # a pure function of the shards


def test_shards_of_different_scans_are_refused(image_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "db.lmdb"
    build(image_folder, folder, shards=2, shard=0, progress=False)
    (image_folder / "dog" / "late.png").write_bytes((image_folder / "dog").glob("*.png").__next__().read_bytes())
    with pytest.raises(fmt.DatabaseError, match="another scan of the source.*--shards 2 rebuilds"):
        build(image_folder, folder, shards=2, shard=1, progress=False)  # it completes the set: its manifest check refuses
    with pytest.raises(fmt.DatabaseError, match="no manifest.json.*--shards 2"):
        LMDBImageDataset(folder)  # nor does a reader write one: it names the build that checks the shards (and rebuilds them)
    assert not (folder / "manifest.json").exists()
    report = build(image_folder, folder, shards=2, progress=False)  # the final build rebuilds the stale shard 0
    assert report.action == "built" and report.records_written == shards.parts(folder)[0].count
    _same_database(folder, build_lmdb(image_folder, tmp_path / "one.lmdb", progress=False))


def test_rebuild_and_replaced_shards(image_folder: Path, tmp_path: Path) -> None:
    folder = build_lmdb(image_folder, tmp_path / "db.lmdb", shards=2, progress=False)
    old = LMDBImageDataset(folder)
    other = build_lmdb(image_folder, tmp_path / "other.lmdb", shards=2, progress=False, overwrite=True)
    first = shards.database_files(folder)[0]
    os.replace(shards.database_files(other)[0], first)  # another build's shard: same records, other build id
    with pytest.raises(fmt.DatabaseError, match="does not match the manifest"):
        LMDBImageDataset(folder)
    with pytest.raises(fmt.DatabaseError, match="replaced since this dataset was created"):
        old[0]
    assert build(image_folder, folder, shards=2, progress=False).action == "up-to-date"  # shards current: manifest only
    assert len(LMDBImageDataset(folder)) == len(old)
    (image_folder / "cat" / "new.png").write_bytes(next((image_folder / "dog").glob("*.png")).read_bytes())
    with pytest.raises(fmt.DatabaseError, match="was built from a source that changed"):
        build(image_folder, folder, shards=2, progress=False, on_stale="error")
    report = build(image_folder, folder, shards=4, progress=False)  # another count: the old shards are removed
    assert report.action == "built" and len(shards.database_files(folder)) == 4
    _same_database(folder, build_lmdb(image_folder, tmp_path / "one.lmdb", progress=False))


def test_a_missing_shard_is_named_and_rebuilt_alone(image_folder: Path, tmp_path: Path) -> None:
    folder = build_lmdb(image_folder, tmp_path / "db.lmdb", shards=3, progress=False)
    shards.database_files(folder)[1].unlink()
    with pytest.raises(fmt.DatabaseError, match=r"shard-00001-of-00003\.lmdb', a shard of .* is missing.*--shards 3"):
        LMDBImageDataset(folder)
    report = build(image_folder, folder, shards=3, progress=False)
    assert report.action == "built" and report.records_written == shards.parts(folder)[1].count
    _same_database(folder, build_lmdb(image_folder, tmp_path / "one.lmdb", progress=False))


def test_layouts_never_replace_each_other(image_folder: Path, tmp_path: Path) -> None:
    single = build_lmdb(image_folder, tmp_path / "one.lmdb", progress=False)
    with pytest.raises(FileExistsError, match="is a file"):
        build_lmdb(image_folder, single, shards=2, progress=False)
    folder = build_lmdb(image_folder, tmp_path / "many.lmdb", shards=2, progress=False)
    with pytest.raises(FileExistsError, match="is a sharded database folder"):
        build_lmdb(image_folder, folder, progress=False)
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a sharded database"):
        build_lmdb(image_folder, tmp_path / "stuff", shards=2, progress=False)
    assert (tmp_path / "stuff" / "keep.txt").read_text() == "mine"
    for first in ("shard-00001-of-00002.lmdb.build-lock", "build-lock"):  # what another node's build creates first
        (tmp_path / first).mkdir()
        (tmp_path / first / first).touch()
        built = build_lmdb(image_folder, tmp_path / first, shards=2, shard=0, progress=False)
        assert (built / "shard-00000-of-00002.lmdb").is_file(), "a folder another node has begun is joined, not refused"
    with pytest.raises(ValueError, match="more than the"):
        build_lmdb(image_folder, tmp_path / "x.lmdb", shards=1000, progress=False)
    with pytest.raises(ValueError, match="needs shards="):
        BuildOptions(shard=0)
    with pytest.raises(ValueError, match="from 0 to 1"):
        BuildOptions(shards=2, shard=2)


def test_verify_bench_and_staging_take_a_sharded_folder(image_folder: Path, tmp_path: Path) -> None:
    folder = build_lmdb(image_folder, tmp_path / "db.lmdb", shards=2, progress=False)
    assert verify_lmdb(folder, image_folder).ok
    assert describe_lmdb(folder)["file_bytes"] == sum(p.stat().st_size for p in shards.database_files(folder))
    rows = run_read_benchmark(image_folder, folder, passes=1, out=lambda _line: None)
    assert {r["samples"] for r in rows} == {shards.load_meta(folder).count}
    assert len(shards.database_files(folder)) == 2  # not rebuilt as one file

    local = tmp_path / "local"
    report = stage(folder, local)
    assert report.action == "copied" and report.path == local / folder.name
    _same_database(folder, report.path)
    assert stage(folder, local).action == "up-to-date"

    second = shards.database_files(folder)[1]
    part = shards.parts(folder)[1]
    env = lmdb.open(str(second), subdir=False, readonly=True, lock=False, max_dbs=2)
    with env.begin(db=env.open_db(fmt.RECORDS_DB, create=False), buffers=True) as txn:
        value = bytes(txn.get(fmt.record_key(0)))
    env.close()
    data = bytearray(second.read_bytes())
    at = data.find(value)
    data[at + len(value) // 2] ^= 0xFF
    second.write_bytes(bytes(data))
    problems = verify_lmdb(folder).problems
    assert problems == [f"record {part.offset} ({second.name}) ({shards.load_meta(folder, arrays=True).paths[part.offset]}): "
                        "checksum mismatch, the database is damaged"]


def test_datamodule_serves_a_sharded_database(image_folder: Path, tmp_path: Path) -> None:
    common = dict(cache_dir=tmp_path / "cache", batch_size=4, num_workers=0, image_size=16, build_workers=0)
    dm = LMDBDataModule(image_folder, shards=2, **common)
    dm.prepare_data()
    path = dm.database_path("train")
    assert path.is_dir() and path != LMDBDataModule(image_folder, **common).database_path("train")
    dm.setup("fit")
    assert sum(len(b[1]) for b in dm.train_dataloader()) + len(dm.datasets["val"]) == shards.load_meta(path).count
    assert dm.cached_files() == [str(p) for p in shards.database_files(path)]
    staged = LMDBDataModule(image_folder, shards=2, local_cache_dir=tmp_path / "local", **common)
    staged.prepare_data()
    staged.setup("fit")
    assert staged.datasets["train"].path.startswith(str(tmp_path / "local"))
    assert staged.datasets["train"].targets == dm.datasets["train"].targets


def _spoil_shard(source: Path, index: int, of: int) -> list[str]:
    """Overwrite every file of shard ``index``'s range with garbage of the same size (so the ranges stay), returning their paths."""
    files = scan_folder(source).files
    start, stop = workcut.work_ranges(scan_folder(source), "auto", None, of)[index]
    rng = np.random.default_rng(1)
    for f in files[start:stop]:
        Path(f.path).write_bytes(b"\0" + rng.integers(0, 256, f.size - 1, dtype=np.uint8).tobytes())
    return [f.relpath for f in files[start:stop]]


def test_a_shard_whose_files_are_all_bad_is_an_empty_shard(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = make_jpegs(tmp_path / "src", 12, size=16, classes=3)
    bad = _spoil_shard(source, 1, 3)
    one = build_lmdb(source, tmp_path / "one.lmdb", on_error="skip", workers=0, progress=False)
    assert shards.load_meta(one).count == 12 - len(bad)

    report = build(source, tmp_path / "api.lmdb", on_error="skip", shards=3, workers=2, progress=False)
    assert report.count == 12 - len(bad) and sorted(s.path for s in report.skipped) == sorted(bad)
    assert [p.count for p in shards.parts(report.path)][1] == 0 and not list(report.path.glob("*.partial"))
    _same_database(one, report.path)
    dataset = LMDBImageDataset(report.path)
    assert [dataset[i][1] for i in range(len(dataset))] == LMDBImageDataset(one).targets
    assert verify_lmdb(report.path, source, allow_skipped=True).ok and verify_lmdb(report.path).problems == []
    assert describe_lmdb(report.path)["count"] == 12 - len(bad)

    assert main(["build", str(source), str(tmp_path / "cli.lmdb"), "--shards", "3", "--on-error", "skip", "--quiet"]) == 0
    assert f"{12 - len(bad)} records" in capsys.readouterr().out
    _same_database(one, tmp_path / "cli.lmdb")
    assert main(["info", str(tmp_path / "cli.lmdb")]) == 0

    dm = LMDBDataModule(source, shards=3, on_error="skip", cache_dir=tmp_path / "cache", val_fraction=0, batch_size=4, num_workers=0,
                        image_size=16, build_workers=0)
    dm.prepare_data()
    dm.setup("fit")
    assert sum(len(b[1]) for b in dm.train_dataloader()) == 12 - len(bad)


def test_a_sharded_build_of_only_bad_files_is_refused(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 4, size=16)
    for path in source.rglob("*.jpg"):
        path.write_bytes(b"not a jpeg")
    folder = tmp_path / "db.lmdb"
    with pytest.raises(BuildError, match="Every image in .* was skipped as unreadable"):
        build_lmdb(source, folder, on_error="skip", shards=2, workers=0, progress=False)
    assert not (folder / "manifest.json").exists()


def _skewed_folder(root: Path) -> Path:
    """Two classes of tiny icons, then a class of four large noise images (most of the bytes)."""
    rng = np.random.default_rng(0)
    for name, count, side in (("a_icons", 12, 8), ("b_icons", 12, 8), ("c_big", 4, 256)):
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(root / name / f"{i:03d}.png")
    return root


def test_shards_are_cut_where_the_estimated_work_is_even(tmp_path: Path) -> None:
    source = _skewed_folder(tmp_path / "src")
    folder = build_lmdb(source, tmp_path / "db.lmdb", shards=2, storage="decoded", workers=2, progress=False)
    metas = [shards.load_meta(p) for p in shards.database_files(folder)]
    works = workcut.scan_works(scan_folder(source).files, "decoded", None)
    held = [sum(works[m.shard.start:m.shard.stop]) for m in metas]
    assert max(held) < 1.5 * min(held) and metas[1].shard.stop - metas[1].shard.start < 24, f"unbalanced shards: {held} work"
    _same_database(folder, build_lmdb(source, tmp_path / "one.lmdb", storage="decoded", workers=0, progress=False))  # same order

    # each task of a job array computes the same ranges from its own scan
    jobs = tmp_path / "jobs.lmdb"
    for index in (1, 0):
        build(source, jobs, shards=2, shard=index, storage="decoded", workers=0, progress=False)
    assert [shards.load_meta(p).shard for p in shards.database_files(jobs)] == [m.shard for m in metas]


@pytest.mark.parametrize("sizes", [[5] * 7, [0] * 5, [10**9] + [1] * 9, [1] * 9 + [10**9], [3, 10**6, 3, 3, 10**6, 3]])
@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_shard_ranges_are_contiguous_and_none_is_empty(sizes: list[int], count: int) -> None:
    ranges = shards.shard_ranges(sizes, count)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(sizes) and len(ranges) == count
    assert all(start < stop for start, stop in ranges) and all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    if sizes == [3, 10**6, 3, 3, 10**6, 3] and count == 2:
        assert ranges == [(0, 3), (3, 6)], "one large file in each shard"


def test_a_refused_build_leaves_nothing_behind(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = make_jpegs(tmp_path / "src", 4, size=16)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["build", str(source), str(tmp_path / "x.lmdb"), "--shards", "500", "--quiet"]) == 2
    assert "shards=500 is more than the 4 images" in capsys.readouterr().err
    with pytest.raises(ValueError, match="more than the 4 images"):
        build_lmdb(source, tmp_path / "new" / "x.lmdb", shards=5, progress=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_lmdb(tmp_path / "missing", tmp_path / "new" / "y.lmdb", shards=2, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert main(["build", str(source), str(tmp_path / "x.lmdb"), "--quiet"]) == 0  # the plain build is not in the way of anything
    assert shards.load_meta(tmp_path / "x.lmdb").count == 4
