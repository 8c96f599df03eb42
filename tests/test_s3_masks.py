"""Segmentation masks on object storage (#34): a manifest's mask column and an images prefix paired with a masks prefix
(``masks_dir=``), built and served from S3 as from the same local files, against a real S3 server on loopback (tests/s3kit.py):
one listing per prefix (no request per object), staleness by each mask's size and ETag, masks fetched with the images
``If-Match`` their listed ETags, a changed or missing mask named."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from s3kit import S3Server
from test_masks_build import _manifest, _pairs, _records
from test_s3_sources import same_records, upload

from lightning_lmdb.build.writer import build
from lightning_lmdb.errors import BuildError, OptionError, RemoteChangedError, SourceError, StaleDatabaseError
from lightning_lmdb.remote import fs, objects, urls
from lightning_lmdb.sources.base import PrefixFingerprint, SourceOptions, scan_source
from lightning_lmdb.store import database


@pytest.fixture
def data(tmp_path: Path, s3: S3Server) -> tuple[Path, str, list[tuple[str, str]]]:
    """A local ``data/`` (``images/``, ``masks/``, a manifest ``list.csv`` with a mask column) and the same files under
    ``BUCKET/data``; the pairs' relative paths."""
    bucket = s3.bucket()
    fs.use_options(bucket, s3.options)
    root = tmp_path / "data"
    pairs = _pairs(root / "images", root / "masks", count=9)
    _manifest(root, [(f"images/{i}", f"masks/{m}") for i, m in pairs])
    upload(root, f"{bucket}/data")
    return root, f"{bucket}/data", pairs


def same_masks(a: Path, b: Path) -> None:
    """Both databases hold the same images and masks, and the same targets and classes."""
    same_records(a, b)
    for (image_a, mask_a), (image_b, mask_b) in zip(_records(a), _records(b), strict=True):
        np.testing.assert_array_equal(image_a, image_b)
        np.testing.assert_array_equal(mask_a, mask_b)
        assert mask_a.dtype == mask_b.dtype


def test_a_manifest_with_a_mask_column_at_a_url_builds_as_the_local_manifest(data: tuple[Path, str, list[tuple[str, str]]],
                                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, prefix, pairs = data
    listed: list[str] = []
    real_list = objects.list_objects
    monkeypatch.setattr(objects, "list_objects", lambda url: listed.append(url) or real_list(url))
    monkeypatch.setattr(objects, "stat", lambda url: pytest.fail("a HEAD per object"))
    scan = scan_source(f"{prefix}/list.csv")
    assert sorted(listed) == [f"{prefix}/images/", f"{prefix}/masks/"] or listed == [f"{prefix}/"], listed
    assert scan.target_kind == "mask" and not scan.special and len(scan.files) == len(pairs)
    assert all(f.mask.startswith("s3://") and f.mask_etag and f.mask_size and f.mask_mtime_ns == 0 and f.etag for f in scan.files)
    local = scan_source(root / "list.csv")
    assert [f.mask_size for f in scan.files] == [f.mask_size for f in local.files]
    assert all(not f.mask_etag for f in local.files), "a local mask has no ETag"

    requests: list[int] = []
    real_each = objects.read_each  # what read_many and the readers fetch through

    def counted(wanted: list, concurrency: int = objects.FETCH_CONCURRENCY) -> Iterator[bytes]:
        if wanted[0][0].endswith(".csv"):  # the manifest itself (objects.read)
            return real_each(wanted, concurrency)
        assert all(etag for _, etag, _, _ in wanted), "every object fetched If-Match its listed ETag"
        requests.append(len(wanted))
        return real_each(wanted, concurrency)

    monkeypatch.setattr(objects, "read_each", counted)
    real_read = objects.read  # one GET: the manifest's; the images and masks come in chunks
    monkeypatch.setattr(objects, "read", lambda url, *a, **k: real_read(url, *a, **k) if url.endswith(".csv") else pytest.fail(url))
    report = build(f"{prefix}/list.csv", tmp_path / "s3.lmdb", workers=0, progress=False)
    assert report.action == "built" and sum(requests) == 2 * len(pairs) and len(requests) < len(pairs), requests
    build(root / "list.csv", tmp_path / "local.lmdb", workers=0, progress=False)
    same_masks(tmp_path / "s3.lmdb", tmp_path / "local.lmdb")
    meta = database.load_meta(tmp_path / "s3.lmdb", arrays=True)
    assert meta.mask_paths is not None and meta.mask_paths.tolist() == [f"masks/{m}" for _, m in pairs]

    # nothing changed: up to date without a fetch; one mask object rewritten (same values, new bytes: a new ETag): stale
    requests.clear()
    assert build(f"{prefix}/list.csv", tmp_path / "s3.lmdb", workers=0, progress=False, on_stale="error").action == "up-to-date"
    assert requests == []
    monkeypatch.undo()
    objects.write(scan.files[2].mask, (root / "masks" / pairs[2][1]).read_bytes() + b"\0")
    assert scan_source(f"{prefix}/list.csv").files[2].mask_size == scan.files[2].mask_size + 1
    with pytest.raises(StaleDatabaseError, match="changed since"):
        build(f"{prefix}/list.csv", tmp_path / "s3.lmdb", workers=0, progress=False, on_stale="error")
    assert build(f"{prefix}/list.csv", tmp_path / "s3.lmdb", workers=0, progress=False).action == "built"


def test_a_mask_etag_changes_the_fingerprint_and_a_local_masks_is_as_before(data: tuple[Path, str, list[tuple[str, str]]]) -> None:
    root, prefix, _ = data
    local = scan_source(root / "list.csv")
    digest = hashlib.sha256(f"{local.identity}\0".encode())
    for f in local.files:  # the fingerprint of a local mask source as it always was: no ETag of any kind in it
        mask = f.mask[len(str(local.root)) + 1:]
        digest.update(f"{f.relpath}\0{f.target}\0{f.size}\0{f.mtime_ns}\0{mask}\0{f.mask_size}\0{f.mask_mtime_ns}\n".encode())
    assert local.fingerprint() == digest.hexdigest()
    remote = scan_source(f"{prefix}/list.csv")
    import dataclasses

    other = [dataclasses.replace(f, mask_etag=f.mask_etag + "x") if k == 3 else f for k, f in enumerate(remote.files)]
    assert PrefixFingerprint(other, remote.identity, remote.root).advance(len(other)) != remote.fingerprint()


def _writer_run(scan: Any, target: Path, workers: int) -> None:
    from lightning_lmdb.build.onefile import _Writer
    from lightning_lmdb.options import BuildOptions

    _Writer(scan, target, BuildOptions(workers=workers, progress=False, commit_every=2)).run()


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_mask_object_overwritten_after_the_scan_fails_the_build_naming_it(data: tuple[Path, str, list[tuple[str, str]]],
                                                                           tmp_path: Path, s3: S3Server, workers: int) -> None:
    root, prefix, pairs = data
    scan = scan_source(f"{prefix}/list.csv")
    victim = scan.files[4]
    objects.write(victim.mask, (root / "masks" / pairs[4][1]).read_bytes() + b"\0")
    with pytest.raises(RemoteChangedError) as caught:
        _writer_run(scan, tmp_path / "x.lmdb", workers)
    message = str(caught.value)
    assert urls.redact(victim.mask) in message and "changed since it was listed" in message
    assert victim.path not in message and s3.options["secret"] not in message
    # a rerun lists again and finishes, as a clean build of what is there now
    assert build(f"{prefix}/list.csv", tmp_path / "x.lmdb", workers=0, progress=False, commit_every=2).action in ("resumed", "built")
    build(f"{prefix}/list.csv", tmp_path / "clean.lmdb", workers=0, progress=False)
    same_masks(tmp_path / "x.lmdb", tmp_path / "clean.lmdb")


def test_a_missing_mask_object_is_reported_for_its_row(data: tuple[Path, str, list[tuple[str, str]]], tmp_path: Path) -> None:
    root, prefix, pairs = data
    rows = [(f"images/{i}", f"masks/{m}") for i, m in pairs]
    rows[5] = (rows[5][0], "masks/gone.png")
    objects.write(f"{prefix}/gone.csv", ("path,mask\n" + "".join(f"{i},{m}\n" for i, m in rows)).encode())
    scan = scan_source(f"{prefix}/gone.csv")
    assert len(scan.files) == len(rows) and scan.files[5].mask_etag == "" and scan.files[5].mask_size == 0
    with pytest.raises(BuildError) as caught:
        build(f"{prefix}/gone.csv", tmp_path / "x.lmdb", workers=0, progress=False)
    assert "gone.png" in str(caught.value) and "line 7" in str(caught.value)
    report = build(f"{prefix}/gone.csv", tmp_path / "x.lmdb", workers=0, progress=False, on_error="skip")
    assert report.count == len(rows) - 1
    skipped = database.load_meta(tmp_path / "x.lmdb").skipped
    assert [s.path for s in skipped] == [rows[5][0]] and "its mask" in skipped[0].reason and "gone.png" in skipped[0].reason
    # the local manifest with the same row skips the same sample
    _manifest(root, rows, "gone.csv")
    build(root / "gone.csv", tmp_path / "local.lmdb", workers=0, progress=False, on_error="skip")
    same_masks(tmp_path / "x.lmdb", tmp_path / "local.lmdb")


def test_an_images_prefix_paired_with_a_masks_prefix_builds_as_the_local_folders(data: tuple[Path, str, list[tuple[str, str]]],
                                                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, prefix, pairs = data
    listed: list[str] = []
    real_list = objects.list_objects
    monkeypatch.setattr(objects, "list_objects", lambda url: listed.append(url) or real_list(url))
    monkeypatch.setattr(objects, "stat", lambda url: pytest.fail("a HEAD per object"))
    options = SourceOptions(masks_dir=f"{prefix}/masks/")
    scan = scan_source(f"{prefix}/images/", options)
    assert listed == [f"{prefix}/images/", f"{prefix}/masks/"]
    assert [f.relpath for f in scan.files] == sorted(i for i, _ in pairs) and scan.target_kind == "mask"
    assert all(f.mask_etag and f.etag and f.mask.startswith(f"{prefix}/masks/") for f in scan.files)
    monkeypatch.undo()
    build(f"{prefix}/images", tmp_path / "s3.lmdb", masks_dir=f"{prefix}/masks", workers=0, progress=False)
    build(root / "images", tmp_path / "local.lmdb", masks_dir=str(root / "masks"), workers=0, progress=False)
    same_masks(tmp_path / "s3.lmdb", tmp_path / "local.lmdb")
    meta = database.load_meta(tmp_path / "s3.lmdb", arrays=True)
    assert meta.mask_paths is not None and meta.mask_paths.tolist() == [f"{prefix}/masks/{m}" for _, m in sorted(pairs)]
    assert build(f"{prefix}/images", tmp_path / "s3.lmdb", masks_dir=f"{prefix}/masks", workers=0, progress=False,
                 on_stale="error").action == "up-to-date"


def test_a_masks_dir_on_the_other_side_or_inside_the_images_is_refused(data: tuple[Path, str, list[tuple[str, str]]]) -> None:
    root, prefix, pairs = data
    with pytest.raises(SourceError, match="masks_dir='masks' is a local folder, but the images .* are on object storage.*full URL"):
        scan_source(f"{prefix}/images", SourceOptions(masks_dir="masks"))
    with pytest.raises(SourceError, match="is a URL of object storage, but the images .* are a local folder"):
        scan_source(root / "images", SourceOptions(masks_dir=f"{prefix}/masks"))
    with pytest.raises(SourceError, match="one or hold each other"):
        scan_source(f"{prefix}", SourceOptions(masks_dir=f"{prefix}/masks"))
    with pytest.raises(SourceError, match="holds no objects"):
        scan_source(f"{prefix}/images", SourceOptions(masks_dir=f"{prefix}/nothing"))
    with pytest.raises(OptionError, match=r"masks_dir s3://\*\*\*@.* carries credentials") as info:  # it would be stored
        scan_source(f"{prefix}/images", SourceOptions(masks_dir=f"s3://AKIAKEY:s3cr3t@{prefix[5:]}/masks"))
    assert "s3cr3t" not in str(info.value)
    objects.delete([f"{prefix}/masks/{pairs[0][1]}"])
    with pytest.raises(SourceError, match=rf"1 image\(s\) in .* without a mask .*{pairs[0][0]}"):
        scan_source(f"{prefix}/images", SourceOptions(masks_dir=f"{prefix}/masks"))


@pytest.mark.parametrize("source", ["manifest", "folder"])
def test_the_raw_backend_serves_an_s3_mask_source_as_the_local_one(data: tuple[Path, str, list[tuple[str, str]]], source: str) -> None:
    import torch

    from lightning_lmdb.read.raw import RawImageDataset

    root, prefix, _ = data
    if source == "manifest":
        remote, local = RawImageDataset(f"{prefix}/list.csv", decoder="pil"), RawImageDataset(root / "list.csv", decoder="pil")
    else:
        remote = RawImageDataset(f"{prefix}/images", decoder="pil", manifest=SourceOptions(masks_dir=f"{prefix}/masks"))
        local = RawImageDataset(root / "images", decoder="pil", manifest=SourceOptions(masks_dir=str(root / "masks")))
    assert remote.target_kind == local.target_kind == "mask" and remote.classes == local.classes and len(remote) == len(local) == 9
    for i in range(len(local)):
        (image_a, mask_a), (image_b, mask_b) = remote[i], local[i]
        assert np.array_equal(np.asarray(image_a), np.asarray(image_b)) and np.asarray(image_a).size
        assert torch.is_tensor(mask_a) and mask_a.dtype == torch.int64 and torch.equal(mask_a, mask_b)


def test_the_raw_backend_fetches_a_samples_image_and_mask_together(data: tuple[Path, str, list[tuple[str, str]]],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_lmdb.read.raw import RawImageDataset

    _, prefix, _ = data
    raw = RawImageDataset(f"{prefix}/list.csv", decoder="pil")
    calls: list[list[str]] = []
    real = objects.read_many
    monkeypatch.setattr(objects, "read_many", lambda wanted, *a, **k: calls.append([r[0] for r in wanted]) or real(wanted, *a, **k))
    raw[3]
    assert len(calls) == 1 and calls[0] == [raw.files()[3], raw.mask_files()[3]]


def _served(dm: Any, split: str = "test") -> list[tuple[Any, Any]]:
    dm.prepare_data()
    dm.setup(split)
    return list(getattr(dm, f"{split}_dataloader")())


@pytest.mark.parametrize("workers", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_the_datamodule_serves_an_s3_images_prefix_with_masks_as_the_local_folders(data: tuple[Path, str, list[tuple[str, str]]],
                                                                                   tmp_path: Path, s3: S3Server,
                                                                                   monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    import torch

    from lightning_lmdb.datamodule.module import LMDBDataModule
    from lightning_lmdb.read.transforms import eval_transform

    root, prefix, _ = data
    monkeypatch.setattr(fs, "_options", {})  # only what the DataModule is given
    # with a worker: forked (its GETs through obstore, remote.fastget); spawned workers reading objects: test_s3_sources
    common = {"batch_size": 4, "eval_transform": eval_transform(8), "build_workers": 0, "num_workers": workers,
              **({"multiprocessing_context": "fork", "persistent_workers": False} if workers else {})}
    batches = {}
    for backend in ("lmdb", "raw"):
        dm = LMDBDataModule(f"{prefix}/images", test_dir=f"{prefix}/images", backend=backend, storage_options=s3.options,
                            source_options={"masks_dir": f"{prefix}/masks"}, cache_dir=tmp_path / "cache", **common)
        assert dm.target_kind == "mask"
        batches[backend] = _served(dm)
    local = LMDBDataModule(root / "images", test_dir=root / "images", backend="raw", source_options={"masks_dir": str(root / "masks")},
                           cache_dir=tmp_path / "c2", **common)
    batches["local"] = _served(local)
    assert len(batches["local"]) == 3
    for (xa, ya), (xb, yb), (xc, yc) in zip(batches["lmdb"], batches["raw"], batches["local"], strict=True):
        assert torch.equal(xa, xb) and torch.equal(xa, xc) and torch.equal(ya, yb) and torch.equal(ya, yc) and ya.dtype == torch.int64


def test_a_sharded_build_of_an_s3_mask_manifest_equals_the_local_one(data: tuple[Path, str, list[tuple[str, str]]],
                                                                     tmp_path: Path) -> None:
    root, prefix, _ = data
    build(f"{prefix}/list.csv", tmp_path / "s3", workers=0, progress=False, shards=2, num_classes=400)
    build(root / "list.csv", tmp_path / "local", workers=0, progress=False, shards=2, num_classes=400)
    for name in ("shard-00000-of-00002.lmdb", "shard-00001-of-00002.lmdb"):
        same_records(tmp_path / "s3" / name, tmp_path / "local" / name)
