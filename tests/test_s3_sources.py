"""Building from object storage (#34): an image folder under an S3 prefix, a manifest at a URL, staleness by ETag, the If-Match
fetch, resume after a kill, and the raw backend, against a real S3 server on loopback (tests/s3kit.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from imagegen import make_folder, make_jpegs, read_records
from s3kit import KEY, SECRET, S3Server

from lightning_lmdb.build.writer import build
from lightning_lmdb.errors import BuildError, RemoteChangedError, RemoteNotFoundError, SourceError
from lightning_lmdb.remote import fs, objects, urls
from lightning_lmdb.sources.base import kind_name, kind_of, scan_source


def upload(folder: Path, prefix: str) -> list[str]:
    """Every file under ``folder`` put under ``prefix`` (same relative keys); their URLs."""
    put = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            url = urls.join(prefix, path.relative_to(folder).as_posix())
            objects.write(url, path.read_bytes())
            put.append(url)
    return put


@pytest.fixture
def bucket(s3: S3Server) -> str:
    url = s3.bucket()
    fs.use_options(url, s3.options)
    return url


@pytest.fixture
def images(tmp_path: Path, bucket: str) -> tuple[Path, str]:
    """A local ImageFolder (3 classes, non-ASCII names, a non-image file) and the same files under ``BUCKET/train/``."""
    local = make_folder(tmp_path / "train", per_class=6)
    upload(local, f"{bucket}/train")
    return local, f"{bucket}/train/"


def same_records(a: Path, b: Path) -> None:
    (meta_a, values_a), (meta_b, values_b) = read_records(a), read_records(b)
    assert values_a == values_b and len(values_a) > 0
    for key in ("targets", "paths", "checksums", "classes", "class_to_idx", "count", "target_kind"):
        assert meta_a[key] == meta_b[key], key


def test_a_folder_under_a_prefix_scans_and_builds_as_the_local_folder(images: tuple[Path, str], tmp_path: Path) -> None:
    local, prefix = images
    assert kind_name(kind_of(prefix)) == "folder"
    remote_scan, local_scan = scan_source(prefix), scan_source(local)
    assert remote_scan.root == prefix.rstrip("/") and remote_scan.classes == local_scan.classes
    assert [(f.relpath, f.target, f.size) for f in remote_scan.files] == [(f.relpath, f.target, f.size) for f in local_scan.files]
    assert all(f.etag and f.mtime_ns == 0 and f.path.startswith("s3://") for f in remote_scan.files)
    assert all(not f.etag for f in local_scan.files), "a local file has no ETag (its fingerprint is as before)"
    report = build(prefix, tmp_path / "s3.lmdb", workers=0, progress=False)
    build(local, tmp_path / "local.lmdb", workers=0, progress=False)
    assert report.action == "built"
    same_records(tmp_path / "s3.lmdb", tmp_path / "local.lmdb")
    assert read_records(tmp_path / "s3.lmdb")[0]["source"]["root"] == prefix.rstrip("/")
    again = build(prefix, tmp_path / "s3.lmdb", workers=0, progress=False)
    assert again.action == "up-to-date"


def test_a_build_of_objects_defaults_to_more_readers_than_cores(images: tuple[Path, str]) -> None:
    from lightning_lmdb.build import readers

    local, prefix = images
    cores = readers.available_cores()
    assert readers.default_readers(scan_source(prefix)) == readers.REMOTE_READERS_PER_CORE * cores == 4 * cores
    assert readers.default_readers(scan_source(local)) == cores, "a local folder: one reader per core, as before"


def test_nothing_changed_is_up_to_date_without_a_fetch_and_one_changed_object_is_stale(images: tuple[Path, str], tmp_path: Path,
                                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _, prefix = images
    target = tmp_path / "s3.lmdb"
    build(prefix, target, workers=0, progress=False)
    fetched: list[str] = []
    real = objects.read_each  # what read_many and the readers fetch through
    monkeypatch.setattr(objects, "read_each", lambda requests, *a, **k: fetched.extend(r[0] for r in requests) or real(requests, *a, **k))
    assert build(prefix, target, workers=0, progress=False, on_stale="error").action == "up-to-date"
    assert fetched == []
    changed = scan_source(prefix).files[1]
    objects.write(changed.path, local_bytes_of(images[0], changed.relpath) + b"\0")  # same image, new bytes: a new ETag
    from lightning_lmdb.errors import StaleDatabaseError

    with pytest.raises(StaleDatabaseError, match="ETag"):
        build(prefix, target, workers=0, progress=False, on_stale="error")
    assert build(prefix, target, workers=0, progress=False).action == "built"


def local_bytes_of(folder: Path, relpath: str) -> bytes:
    return (folder / relpath).read_bytes()


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_an_object_overwritten_after_the_scan_fails_the_build_naming_it(images: tuple[Path, str], tmp_path: Path, workers: int) -> None:
    local, prefix = images
    scan = scan_source(prefix)
    victim = scan.files[3]
    objects.write(victim.path, local_bytes_of(local, scan.files[0].relpath))  # another image now
    from lightning_lmdb.build.onefile import _Writer
    from lightning_lmdb.options import BuildOptions

    with pytest.raises(RemoteChangedError) as caught:
        _Writer(scan, tmp_path / "x.lmdb", BuildOptions(workers=workers, progress=False, commit_every=2)).run()
    message = str(caught.value)
    assert urls.redact(victim.path) in message and "changed since it was listed" in message and "a rerun resumes" in message
    assert SECRET not in message and KEY not in message
    # a rerun lists again and finishes; it equals a clean build of what is there now
    assert build(prefix, tmp_path / "x.lmdb", workers=0, progress=False, commit_every=2).action in ("resumed", "built")
    build(prefix, tmp_path / "clean.lmdb", workers=0, progress=False)
    same_records(tmp_path / "x.lmdb", tmp_path / "clean.lmdb")


def test_a_manifest_at_a_url_with_relative_keys_and_a_full_url_builds_as_the_local_manifest(images: tuple[Path, str],
                                                                                            tmp_path: Path, bucket: str) -> None:
    local, prefix = images
    relpaths = [f.relpath for f in scan_source(local).files]
    rows = [(rel, rel.split("/")[0]) for rel in relpaths]
    (local / "labels.csv").write_text("path,label\n" + "".join(f"{rel},{label}\n" for rel, label in rows), encoding="utf-8")
    remote_rows = [(urls.join(prefix, rel) if k == 2 else rel, label) for k, (rel, label) in enumerate(rows)]
    manifest = f"{prefix}labels.csv"
    objects.write(manifest, ("path,label\n" + "".join(f"{p},{label}\n" for p, label in remote_rows)).encode())
    assert kind_name(kind_of(manifest)) == "manifest"
    scan = scan_source(manifest)
    assert len(scan.files) == len(rows) and all(f.etag for f in scan.files) and not scan.special
    build(manifest, tmp_path / "s3.lmdb", workers=0, progress=False)
    build(local / "labels.csv", tmp_path / "local.lmdb", workers=0, progress=False)
    (meta_a, values_a), (meta_b, values_b) = read_records(tmp_path / "s3.lmdb"), read_records(tmp_path / "local.lmdb")
    assert values_a == values_b and meta_a["targets"] == meta_b["targets"] and meta_a["classes"] == meta_b["classes"]
    assert meta_a["paths"][2] == urls.join(prefix, relpaths[2]) and meta_a["paths"][:2] == meta_b["paths"][:2]
    # JSON Lines too; a missing object is a bad row of the build, named
    lines = [{"path": rel, "label": label} for rel, label in rows[:3]] + [{"path": "cat/missing.png", "label": "cat"}]
    objects.write(f"{prefix}labels.jsonl", "\n".join(json.dumps(line) for line in lines).encode())
    with pytest.raises(BuildError, match="missing.png"):
        build(f"{prefix}labels.jsonl", tmp_path / "j.lmdb", workers=0, progress=False)
    assert build(f"{prefix}labels.jsonl", tmp_path / "j.lmdb", workers=0, progress=False, on_error="skip").count == 3


def test_the_listings_of_a_manifest_are_one_per_prefix(images: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, prefix = images
    rels = [f.relpath for f in scan_source(prefix).files]
    objects.write(f"{prefix}m.csv", ("path\n" + "".join(f"{rel}\n" for rel in rels)).encode())
    listed: list[str] = []
    real = objects.list_objects
    monkeypatch.setattr(objects, "list_objects", lambda url: listed.append(url) or real(url))
    monkeypatch.setattr(objects, "stat", lambda url: pytest.fail("a HEAD per object"))
    scan = scan_source(f"{prefix}m.csv")
    assert len(scan.files) == len(rels) and len(listed) == len({rel.split("/")[0] for rel in rels})
    listed.clear()
    assert len(scan_source(prefix).files) == len(rels) and listed == [prefix], "a prefix's scan is one listing"


def test_a_missing_bucket_or_prefix_is_one_clear_line(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    fs.use_options("s3://no-such-bucket-llmdb", s3.options)
    with pytest.raises(RemoteNotFoundError) as caught:
        build("s3://no-such-bucket-llmdb/train/", tmp_path / "x.lmdb", workers=0, progress=False)
    assert "no such bucket" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(FileNotFoundError) as missing:
        build(f"{bucket}/nothing/", tmp_path / "x.lmdb", workers=0, progress=False)
    assert f"{bucket}/nothing" in str(missing.value) and "\n" not in str(missing.value)
    with pytest.raises(RemoteNotFoundError) as json_missing:
        scan_source(f"{bucket}/coco/instances.json")
    assert f"{bucket}/coco/instances.json" in str(json_missing.value) and "\n" not in str(json_missing.value)
    for name in ("images/a.jpg", "labels/a.txt"):
        objects.write(f"{bucket}/yolo/{name}", b"x")
    with pytest.raises(SourceError, match="names no classes"):  # a YOLO layout, read as one
        scan_source(f"{bucket}/yolo/")
    from lightning_lmdb.datamodule.module import LMDBDataModule

    with pytest.raises(RemoteNotFoundError) as construction:
        LMDBDataModule("s3://no-such-bucket-llmdb/train/", cache_dir=tmp_path / "c", storage_options=s3.options)
    assert "no such bucket" in str(construction.value) and "\n" not in str(construction.value)
    objects.write(f"{bucket}/flat/a.txt", b"x")
    with pytest.raises(SourceError, match="No images found"):
        scan_source(f"{bucket}/flat")


_KILLED = """
import sys
from lightning_lmdb.build.writer import build
from lightning_lmdb.remote import fs
fs.use_options(sys.argv[1], {"endpoint_url": sys.argv[3], "key": sys.argv[4], "secret": sys.argv[5]})
build(sys.argv[1], sys.argv[2], workers=int(sys.argv[6]), commit_every=4, progress=False)
"""


def _killed_build(prefix: str, target: Path, s3: S3Server, workers: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LIGHTNING_LMDB_TEST_KILL_AT": "commit:2", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", _KILLED, prefix, str(target), s3.endpoint, KEY, SECRET, str(workers)], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_killed_build_resumes_and_equals_a_clean_build(images: tuple[Path, str], tmp_path: Path, s3: S3Server, workers: int) -> None:
    _, prefix = images
    target = tmp_path / "s3.lmdb"
    killed = _killed_build(prefix, target, s3, workers)
    assert killed.returncode == -9, killed.stderr
    assert not target.exists() and Path(f"{target}.partial").exists()
    report = build(prefix, target, workers=workers, commit_every=4, progress=False)
    assert report.action == "resumed" and report.records_written < report.count
    build(prefix, tmp_path / "clean.lmdb", workers=0, progress=False)
    same_records(target, tmp_path / "clean.lmdb")


@pytest.mark.slow
def test_reader_processes_fetch_with_the_parents_options_spawned(tmp_path: Path, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    local = make_jpegs(tmp_path / "j", 40)
    upload(local, f"{bucket}/j")
    monkeypatch.setattr(multiprocessing, "get_context", lambda method=None, _real=multiprocessing.get_context: _real("spawn"))
    build(f"{bucket}/j", tmp_path / "s3.lmdb", workers=2, progress=False)
    build(local, tmp_path / "local.lmdb", workers=0, progress=False)
    same_records(tmp_path / "s3.lmdb", tmp_path / "local.lmdb")


def _served(dm: Any, split: str = "test") -> list[tuple[Any, Any]]:
    dm.prepare_data()
    dm.setup(split)
    return list(getattr(dm, f"{split}_dataloader")())


def test_the_datamodule_builds_a_prefix_into_cache_dir_and_the_raw_backend_serves_the_same(tmp_path: Path, s3: S3Server,
                                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from lightning_lmdb.datamodule.module import LMDBDataModule
    from lightning_lmdb.read.transforms import eval_transform

    bucket = s3.bucket()
    local = make_jpegs(tmp_path / "src", 12, size=16)
    fs.use_options(bucket, s3.options)
    upload(local, f"{bucket}/train")
    monkeypatch.setattr(fs, "_options", {})  # only what the DataModule is given
    prefix = f"{bucket}/train/"
    common = {"cache_dir": tmp_path / "cache", "batch_size": 5, "num_workers": 0, "eval_transform": eval_transform(8),
              "build_workers": 0}
    batches = {}
    for backend in ("lmdb", "raw"):
        dm = LMDBDataModule(prefix, test_dir=prefix, backend=backend, storage_options=s3.options, **common)
        assert dm.sources["test"] == prefix and dm.hparams["test_dir"] == prefix
        batches[backend] = _served(dm)
    built = list((tmp_path / "cache").glob("*.lmdb"))
    assert len(built) == 1 and built[0].name.startswith("train-")
    assert not any(value in built[0].name for value in (KEY, SECRET, s3.endpoint))
    assert not any(SECRET in path.read_bytes().decode("latin-1") for path in (tmp_path / "cache").rglob("*") if path.is_file())
    local_dm = LMDBDataModule(local, test_dir=local, backend="raw", **{**common, "cache_dir": tmp_path / "c2"})
    batches["local"] = _served(local_dm)
    for (xa, ya), (xb, yb), (xc, yc) in zip(batches["lmdb"], batches["raw"], batches["local"], strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and torch.equal(xa, xc) and torch.equal(ya, yc)


@pytest.mark.slow
def test_the_raw_backend_reads_objects_in_spawned_workers(tmp_path: Path, s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from lightning_lmdb.datamodule.module import LMDBDataModule
    from lightning_lmdb.read.transforms import eval_transform

    bucket = s3.bucket()
    local = make_jpegs(tmp_path / "src", 8, size=16)
    fs.use_options(bucket, s3.options)
    upload(local, f"{bucket}/train")
    monkeypatch.setattr(fs, "_options", {})
    common = {"batch_size": 4, "eval_transform": eval_transform(8), "build_workers": 0, "cache_dir": tmp_path / "cache"}
    remote = LMDBDataModule(f"{bucket}/train", test_dir=f"{bucket}/train", backend="raw", num_workers=1,
                            multiprocessing_context="spawn", persistent_workers=False, storage_options=s3.options, **common)
    here = LMDBDataModule(local, test_dir=local, backend="raw", num_workers=0, **common)
    for (xa, ya), (xb, yb) in zip(_served(remote), _served(here), strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_a_chunks_objects_are_fetched_together_with_their_etags(images: tuple[Path, str], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _, prefix = images
    calls: list[tuple[int, int, bool]] = []
    real = objects.read_each

    def counted(requests: list, concurrency: int = 0) -> Iterator[bytes]:
        calls.append((len(requests), concurrency, all(etag for _, etag, _, _ in requests)))
        return real(requests, concurrency)

    monkeypatch.setattr(objects, "read_each", counted)
    monkeypatch.setattr(objects, "read", lambda *a, **k: pytest.fail("one GET at a time"))
    report = build(prefix, tmp_path / "s3.lmdb", workers=0, progress=False)
    assert sum(n for n, _, _ in calls) == report.count and len(calls) < report.count
    assert all(concurrency == objects.FETCH_CONCURRENCY and tagged for _, concurrency, tagged in calls)


def test_a_hugging_face_folder_under_a_prefix_is_read_through_its_metadata_file(images: tuple[Path, str], tmp_path: Path) -> None:
    local, prefix = images
    rels = [f.relpath for f in scan_source(local).files]
    objects.write(f"{prefix}metadata.csv", ("file_name,label\n" + "".join(f"{rel},{rel[0]}\n" for rel in rels)).encode())
    with pytest.raises(SourceError, match="metadata.csv"):
        scan_source(prefix)
    scan = scan_source(f"{prefix}metadata.csv")
    assert [f.relpath for f in scan.files] == rels and scan.classes == sorted({rel[0] for rel in rels})


def test_a_sharded_build_from_a_prefix_equals_the_local_one(images: tuple[Path, str], tmp_path: Path) -> None:
    local, prefix = images
    build(prefix, tmp_path / "s3", workers=0, progress=False, shards=2)
    build(local, tmp_path / "local", workers=0, progress=False, shards=2)
    for name in ("shard-00000-of-00002.lmdb", "shard-00001-of-00002.lmdb"):
        same_records(tmp_path / "s3" / name, tmp_path / "local" / name)
