"""S3 GETs through ``obstore`` (lightning_lmdb.remote.fastget): only in processes that fork nothing (a build's readers,
DataLoader workers), the same bytes, retries and errors as the ``s3fs`` path, never in a child forked after it ran."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from imagegen import make_folder, read_records
from s3kit import FaultProxy, S3Server

from lightning_lmdb.build.writer import build
from lightning_lmdb.remote import fastget, fs, objects, urls

HERE = Path(__file__).parent


def test_the_options_it_maps_are_s3fs_names_and_any_other_keeps_s3fs() -> None:
    assert fastget._mappable({"key": "k", "secret": "s", "endpoint_url": "http://x", "client_kwargs": {"region_name": "eu-west-1"}})
    assert fastget._mappable({"anon": True}) and fastget._mappable({"profile": "p", "token": "t"}) and fastget._mappable({})
    assert not fastget._mappable({"requester_pays": True})
    assert not fastget._mappable({"client_kwargs": {"verify": False}})
    assert not fastget._mappable({"config_kwargs": {"s3": {"addressing_style": "virtual"}}})


def test_a_process_not_allowed_keeps_s3fs() -> None:
    assert os.getpid() not in fastget._allowed, "the test process (which forks) never takes the obstore path"
    assert fastget.store_for("s3://bucket/a.bin") is None


@pytest.mark.slow
def test_gets_errors_faults_and_a_fork_in_a_fresh_process(s3: S3Server) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(HERE / "fastget_child.py"), s3.endpoint], capture_output=True, text=True,
                          timeout=240, env=env)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-4000:]


@pytest.mark.slow
def test_a_builds_readers_and_the_raw_backends_workers_get_through_obstore_and_retry(
        s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from lightning_lmdb.datamodule.module import LMDBDataModule
    from lightning_lmdb.read.transforms import eval_transform

    bucket = s3.bucket("fast")
    fs.use_options(bucket, s3.options)
    local = make_folder(tmp_path / "train", per_class=8)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            objects.write(urls.join(f"{bucket}/train", path.relative_to(local).as_posix()), path.read_bytes())
    monkeypatch.setattr(fs, "RETRIES", 3)
    proxy = FaultProxy(s3.endpoint)
    fs.use_options(bucket, {**s3.options, "endpoint_url": proxy.endpoint})
    try:
        proxy.fail("drop", times=2, after=4 << 10)  # two responses cut: the readers fetch them again
        report = build(f"{bucket}/train/", tmp_path / "s3.lmdb", workers=2, progress=False)
        assert report.action == "built" and proxy.faults == 2
        assert "object_store" in proxy.agents, f"the readers' GETs were made by {proxy.agents}"
        build(local, tmp_path / "local.lmdb", workers=0, progress=False)
        assert read_records(tmp_path / "s3.lmdb")[1] == read_records(tmp_path / "local.lmdb")[1]
        proxy.agents.clear()
        common = {"batch_size": 4, "eval_transform": eval_transform(8), "build_workers": 0, "cache_dir": tmp_path / "cache"}
        remote = LMDBDataModule(f"{bucket}/train", test_dir=f"{bucket}/train", backend="raw", num_workers=2,
                                persistent_workers=False, storage_options={**s3.options, "endpoint_url": proxy.endpoint}, **common)
        here = LMDBDataModule(local, test_dir=local, backend="raw", num_workers=0, **common)
        served = []
        for dm in (remote, here):
            dm.prepare_data()
            dm.setup("test")
            served.append(list(dm.test_dataloader()))
        for (xa, ya), (xb, yb) in zip(*served, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert "object_store" in proxy.agents, f"the workers' GETs were made by {proxy.agents}"
    finally:
        proxy.close()
