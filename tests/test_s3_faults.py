"""Faults of object storage, injected by a proxy that drops or stalls a connection on cue (tests/s3kit.py's FaultProxy,
never a timer): retried a bounded number of times, then one clear error naming the URL, and a rerun resumes; wrong
credentials refused by a server that checks them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3kit import KEY, SECRET, FaultProxy, S3Server, running_server

from lightning_lmdb.errors import RemoteAccessError, RemoteError
from lightning_lmdb.remote import fs, objects

BODY = os.urandom(1 << 20)


@pytest.fixture
def proxied(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, FaultProxy]]:
    """A bucket holding ``big.bin`` (1 MiB), reached through a fault proxy, with 3 tries and a 1 s stall limit."""
    monkeypatch.setattr(fs, "RETRIES", 3)
    monkeypatch.setattr(fs, "STALL_SECONDS", 1.0)
    monkeypatch.setattr(fs, "_filesystems", {})  # made afresh with the settings above
    bucket = s3.bucket("faults")
    s3.client.put_object(Bucket=bucket[5:], Key="big.bin", Body=BODY)
    proxy = FaultProxy(s3.endpoint)
    fs.use_options(bucket, {**s3.options, "endpoint_url": proxy.endpoint})
    yield bucket, proxy
    proxy.close()


def test_a_response_dropped_midway_is_fetched_again(proxied: tuple[str, FaultProxy]) -> None:
    bucket, proxy = proxied
    etag = objects.stat(f"{bucket}/big.bin").etag
    proxy.fail("drop", times=2)
    assert objects.read(f"{bucket}/big.bin", etag=etag) == BODY
    assert proxy.faults == 2, "two bodies cut after 64 KiB, the third read whole"


def test_a_connection_that_keeps_dropping_fails_naming_the_url_then_a_rerun_reads_it(proxied: tuple[str, FaultProxy]) -> None:
    bucket, proxy = proxied
    proxy.fail("drop", times=100)
    with pytest.raises(RemoteError, match=r"big\.bin: reading it failed 3 times .*a rerun resumes") as info:
        objects.read(f"{bucket}/big.bin")
    assert proxy.faults == 3 and "\n" not in str(info.value) and SECRET not in str(info.value)
    proxy.fail("", times=0)
    assert objects.read(f"{bucket}/big.bin") == BODY


def test_a_stalled_response_is_abandoned_and_fetched_again(proxied: tuple[str, FaultProxy]) -> None:
    bucket, proxy = proxied
    proxy.fail("stall", times=1)
    assert objects.read(f"{bucket}/big.bin") == BODY
    assert proxy.faults == 1, "no byte for STALL_SECONDS: the read was abandoned, then retried"


def test_an_upload_dropped_midway_is_sent_again(proxied: tuple[str, FaultProxy], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    bucket, proxy = proxied
    monkeypatch.setattr(objects, "MIN_PART", 5 << 20)
    monkeypatch.setattr(objects, "SINGLE_PUT", 5 << 20)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(1 << 20) * 11)
    proxy.fail("drop", direction="up", times=1, after=1 << 20)
    etag = objects.upload(str(big), f"{bucket}/up.bin", state=str(tmp_path / "state.json"))
    assert proxy.faults == 1
    assert etag == objects.expected_etag(str(big)) and objects.read(f"{bucket}/up.bin") == big.read_bytes()


def test_wrong_credentials_are_refused_in_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with running_server(INITIAL_NO_AUTH_ACTION_COUNT="2") as server:  # then every request must be signed by a known key
        server.client.create_bucket(Bucket="checked")
        server.client.put_object(Bucket="checked", Key="a.bin", Body=b"x")
        wrong = "wr0ng-secret-never-printed"
        fs.use_options("s3://checked", {"endpoint_url": server.endpoint, "key": "AKIAWRONGKEY00000000", "secret": wrong})
        for call in (lambda: objects.list_objects("s3://checked/"), lambda: objects.read("s3://checked/a.bin")):
            with pytest.raises(RemoteAccessError, match=r"s3://checked/.*access denied.*Check the credentials") as info:
                call()
            assert "\n" not in str(info.value) and wrong not in str(info.value) and KEY not in str(info.value)
