"""The object-storage layer (lightning_lmdb.remote) against a real S3 server on loopback (tests/s3kit.py)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
from s3kit import KEY, SECRET, S3Server

from lightning_lmdb.errors import (
    RemoteAccessError,
    RemoteChangedError,
    RemoteExistsError,
    RemoteNotFoundError,
)
from lightning_lmdb.remote import fs, objects, urls


def test_urls() -> None:
    assert urls.is_remote("s3://b/k") and urls.is_remote("gs://b") and not urls.is_remote("/data/x")
    assert not urls.is_remote("file:///data/x") and not urls.is_remote(Path("s3:/b")) and not urls.is_remote("C:\\x")
    assert urls.redact(f"s3://{KEY}:{SECRET}@bkt/a.lmdb?X-Amz-Signature=abc&t=1") == "s3://***@bkt/a.lmdb?***"
    message = urls.redact(f"failed: 's3://u:{SECRET}@b/x?sig=1' then https://h/p?token={SECRET} end")
    assert SECRET not in message and "s3://***@b/x?***" in message and "https://h/p?***" in message
    assert urls.join("s3://b/x/", "c0", "1.jpg") == "s3://b/x/c0/1.jpg"
    assert urls.relative("s3://b/x/c0/1.jpg", "s3://b/x/") == "c0/1.jpg"
    assert urls.bucket_key("s3://b/x/y") == ("b", "x/y") and urls.name("s3://b/x/y/") == "y"
    assert urls.parent("s3://b/x/a.csv") == "s3://b/x"


@pytest.fixture
def bucket(s3: S3Server) -> str:
    url = s3.bucket()
    fs.use_options(url, s3.options)
    return url


def test_read_each_yields_in_order_and_a_failed_request_yields_its_error(bucket: str) -> None:
    for i in range(5):
        objects.write(f"{bucket}/e/{i}.bin", bytes([i]) * (i + 1))
    requests = [(f"{bucket}/e/{i}.bin", None, None, None) for i in (4, 0, 3)] + [(f"{bucket}/e/missing.bin", None, None, None),
                                                                                (f"{bucket}/e/1.bin", None, None, None)]
    got = list(objects.read_each(requests, concurrency=2))
    assert got[:3] == [b"\4" * 5, b"\0", b"\3" * 4] and got[4] == b"\1" * 2, "in the order asked, the others unharmed"
    assert isinstance(got[3], RemoteNotFoundError) and "e/missing.bin: no such object" in str(got[3])
    with pytest.raises(RemoteNotFoundError, match=r"e/missing\.bin"):
        objects.read_many(requests)
    arriving = objects.read_each(requests, concurrency=1)
    assert next(arriving) == b"\4" * 5
    arriving.close()  # a caller that stops early: the rest are not waited for


def test_write_list_read_with_preconditions(bucket: str) -> None:
    etag = objects.write(f"{bucket}/a/x.bin", b"hello")
    objects.write(f"{bucket}/a/sub/y.bin", b"yy")
    listed = objects.list_objects(f"{bucket}/a")
    assert [(o.url, o.size) for o in listed] == [(f"{bucket}/a/sub/y.bin", 2), (f"{bucket}/a/x.bin", 5)]
    assert listed[1].etag == etag
    assert objects.read(f"{bucket}/a/x.bin", etag=etag, start=1, end=3) == b"el"
    assert objects.read_many([(o.url, o.etag, None, None) for o in listed], concurrency=2) == [b"yy", b"hello"]
    with pytest.raises(RemoteExistsError, match="exists already"):
        objects.write(f"{bucket}/a/x.bin", b"again", if_absent=True)
    objects.write(f"{bucket}/a/x.bin", b"changed")
    with pytest.raises(RemoteChangedError, match=r"a/x\.bin changed since it was listed"):
        objects.read(f"{bucket}/a/x.bin", etag=etag)
    with pytest.raises(RemoteNotFoundError, match="no such object"):
        objects.read(f"{bucket}/a/missing.bin")
    objects.delete([f"{bucket}/a/x.bin", f"{bucket}/a/never.bin"])
    assert not objects.exists(f"{bucket}/a/x.bin")


def test_wrong_credentials_and_missing_bucket_give_one_clear_line(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    url = s3.bucket("nocred")
    fs.use_options(url, {"endpoint_url": s3.endpoint})
    with pytest.raises(RemoteAccessError, match="no credentials found") as info:
        objects.list_objects(url)
    assert "\n" not in str(info.value)
    missing = "s3://no-such-bucket-here"
    fs.use_options(missing, s3.options)
    with pytest.raises(RemoteNotFoundError, match="no-such-bucket-here") as info:
        objects.list_objects(f"{missing}/x")
    assert SECRET not in str(info.value) and KEY not in str(info.value)


def test_multipart_upload_resumes_from_the_parts_sent(bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objects, "MIN_PART", 5 << 20)
    monkeypatch.setattr(objects, "SINGLE_PUT", 5 << 20)
    monkeypatch.setattr(objects, "PART_CONCURRENCY", 1)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(1 << 20) * 11)  # 11 MiB: 3 parts of 5 MiB (the last 1 MiB)
    state = tmp_path / "upload.json"
    script = ("import sys; sys.path[:0] = sys.argv[1:2]; from lightning_lmdb.remote import fs, objects; "
              "objects.MIN_PART = objects.SINGLE_PUT = 5 << 20; objects.PART_CONCURRENCY = 1; "
              f"fs.use_options({bucket!r}, {dict(fs.options_for(bucket))!r}); "
              f"objects.upload({str(big)!r}, {bucket + '/big.bin'!r}, state={str(state)!r})")
    killed = subprocess.run([sys.executable, "-c", script, str(Path.cwd())],
                            env={**os.environ, objects.FAULT_ENV: "upload:2"}, timeout=120)
    assert killed.returncode == -9, "killed after 2 of 3 parts"
    assert state.exists() and not objects.exists(f"{bucket}/big.bin"), "an unfinished multipart upload is no object"
    sent = []
    etag = objects.upload(str(big), f"{bucket}/big.bin", state=str(state), on_part=sent.append)
    assert etag == objects.expected_etag(str(big)) == objects.stat(f"{bucket}/big.bin").etag
    assert etag.endswith("-3") and not state.exists()
    assert objects.read(f"{bucket}/big.bin") == big.read_bytes()


def _child_filesystem(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put(id(fs.filesystem("s3://any-bucket")))


def test_a_forked_child_makes_its_own_filesystem(bucket: str) -> None:
    parent = fs.filesystem("s3://any-bucket")
    queue: multiprocessing.Queue = multiprocessing.get_context("fork").Queue()  # type: ignore[type-arg]
    child = multiprocessing.get_context("fork").Process(target=_child_filesystem, args=(queue,))
    child.start()
    made = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0 and fs.filesystem("s3://any-bucket") is parent
    assert made != id(parent), "the child made its own (an inherited one would sit at the parent's address)"


def test_a_precondition_failure_is_read_from_the_response_not_the_message() -> None:
    timeout = OSError('Read timeout on endpoint URL: "http://127.0.0.1:34121/b/big.bin"')  # the port holds "412"
    assert not objects._precondition_failed(timeout)

    class Answer(Exception):
        response = {"Error": {"Code": "PreconditionFailed"}, "ResponseMetadata": {"HTTPStatusCode": 412}}

    try:
        raise OSError("translated") from Answer("At least one")
    except OSError as exc:
        assert objects._precondition_failed(exc), "found on the error it was raised from"
