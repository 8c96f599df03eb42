"""Run by tests/test_fastget.py in a fresh interpreter (``obstore``'s runtime must not start in the test process, whose later
tests fork): the GETs of an allowed process through ``obstore``, their errors, retries and stalls, and a fork after it.

Usage: ``python fastget_child.py ENDPOINT``; prints ``OK`` when every check held.
"""

from __future__ import annotations

import os
import signal
import sys

import boto3
from s3kit import KEY, SECRET, FaultProxy, running_server

from lightning_lmdb.errors import RemoteAccessError, RemoteChangedError, RemoteError, RemoteNotFoundError
from lightning_lmdb.remote import fastget, fs, objects

endpoint = sys.argv[1]
options = {"endpoint_url": endpoint, "key": KEY, "secret": SECRET}
client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name="us-east-1")
name = f"fastget-{os.getpid()}"
client.create_bucket(Bucket=name)
bodies = {f"k/{i}.bin": os.urandom(1000 + i) for i in range(5)}
bodies["k/big.bin"] = os.urandom(1 << 20)
for key, body in bodies.items():
    client.put_object(Bucket=name, Key=key, Body=body)
bucket = f"s3://{name}"
fs.use_options(bucket, options)
listed = {item.url: item for item in objects.list_objects(f"{bucket}/k")}

# not allowed: s3fs; allowed: obstore, the same bytes, in order, ETags as preconditions, ranges too
assert fastget.store_for(f"{bucket}/k/0.bin") is None
fastget.allow()
assert fastget.store_for(f"{bucket}/k/0.bin") is not None
requests = [(url, item.etag, None, None) for url, item in listed.items()]
assert objects.read_many(requests, concurrency=3) == [bodies[url.split("/", 3)[3]] for url in listed]
assert objects.read(f"{bucket}/k/big.bin", start=10, end=20) == bodies["k/big.bin"][10:20]
got = list(objects.read_each([requests[1], (f"{bucket}/k/none.bin", None, None, None), requests[0]], concurrency=2))
assert got[0] == bodies[requests[1][0].split("/", 3)[3]] and got[2] == bodies[requests[0][0].split("/", 3)[3]]
assert isinstance(got[1], RemoteNotFoundError), got[1]
assert objects.read(f"{bucket}/k/big.bin", start=(1 << 20) - 5) == bodies["k/big.bin"][-5:]

# credentials from botocore's chain (here the environment) or none at all (anon: unsigned requests), as on the s3fs path
os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
client.put_object_acl(Bucket=name, Key="k/1.bin", ACL="public-read")
for given in ({"endpoint_url": endpoint}, {"endpoint_url": endpoint, "anon": True}):
    fs.use_options(bucket, given)
    assert fastget.store_for(f"{bucket}/k/1.bin") is not None
    assert objects.read_many([(f"{bucket}/k/1.bin", None, None, None)] * 2) == [bodies["k/1.bin"]] * 2, given
try:
    objects.read_many([(f"{bucket}/k/2.bin", None, None, None)] * 2)
    raise AssertionError("an unsigned request read a private object")
except RemoteAccessError as exc:
    assert "access denied" in str(exc), exc
del os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
fs.use_options(bucket, {"endpoint_url": endpoint})
fastget._stores.clear()  # the store above holds the environment's credentials
assert fastget.store_for(f"{bucket}/k/1.bin") is None, "no credentials anywhere: s3fs, which says so in one line"
fs.use_options(bucket, options)

# errors: one line naming the URL, as on the s3fs path
for url, error, text in ((f"{bucket}/k/missing.bin", RemoteNotFoundError, "no such object"),
                         (f"s3://no-such-bucket-{os.getpid()}/a.bin", RemoteNotFoundError, "no such bucket")):
    fs.use_options(url, options)
    assert fastget.store_for(url) is not None
    try:
        objects.read(url)
        raise AssertionError(f"{url} was read")
    except error as exc:
        assert text in str(exc) and url in str(exc) and "\n" not in str(exc), exc
client.put_object(Bucket=name, Key="k/0.bin", Body=b"changed")
try:
    objects.read(f"{bucket}/k/0.bin", etag=listed[f"{bucket}/k/0.bin"].etag)
    raise AssertionError("a changed object was read")
except RemoteChangedError as exc:
    assert "changed since it was listed" in str(exc), exc

# a dropped or stalled response is fetched again (3 tries, 1 s without a byte); one that keeps dropping fails in one line
fs.RETRIES, fs.STALL_SECONDS = 3, 1.0
proxy = FaultProxy(endpoint)
fs.use_options(bucket, {**options, "endpoint_url": proxy.endpoint})
big = f"{bucket}/k/big.bin"
proxy.fail("drop", times=2)
assert objects.read(big, etag=listed[big].etag) == bodies["k/big.bin"] and proxy.faults == 2
proxy.fail("stall", times=1)
assert objects.read(big) == bodies["k/big.bin"] and proxy.faults == 1
proxy.fail("drop", times=100)
try:
    objects.read(big)
    raise AssertionError("read through a connection that always drops")
except RemoteError as exc:
    assert "reading it failed 3 times" in str(exc) and "\n" not in str(exc) and SECRET not in str(exc), exc
assert proxy.faults == 3 and proxy.agents == {"object_store"}, (proxy.faults, proxy.agents)
proxy.fail("", times=0)

# wrong credentials, on a server that checks them
with running_server(INITIAL_NO_AUTH_ACTION_COUNT="2") as server:
    server.client.create_bucket(Bucket="checked")
    server.client.put_object(Bucket="checked", Key="a.bin", Body=b"x")
    fs.use_options("s3://checked", {"endpoint_url": server.endpoint, "key": "AKIAWRONGKEY00000000", "secret": "wr0ng-secret"})
    try:
        objects.read_many([("s3://checked/a.bin", None, None, None)] * 2)
        raise AssertionError("read with wrong credentials")
    except RemoteAccessError as exc:
        assert "access denied" in str(exc) and "wr0ng-secret" not in str(exc), exc

# a bucket that answers "wrong region" (a redirect S3 sends and moto never does: the classification is forced here) goes
# back to s3fs for the rest of the process, which answers the request itself
fs.use_options(bucket, options)
assert fastget.store_for(big) is not None
real_classify, fastget.classify = fastget.classify, lambda exc: "region"
try:
    objects.read(f"{bucket}/k/missing.bin")
    raise AssertionError("a missing object was read")
except RemoteNotFoundError as exc:
    assert "no such object" in str(exc), exc
fastget.classify = real_classify
assert fastget.store_for(big) is None and objects.read(f"{bucket}/k/1.bin") == bodies["k/1.bin"]

# a child forked after obstore ran here does not use it (its runtime's threads are not forked: it would hang), even allowed
pid = os.fork()
if pid == 0:
    signal.alarm(20)
    fastget.allow()
    fs.use_options(bucket, options)
    ok = fastget.store_for(big) is None and objects.read(big) == bodies["k/big.bin"]
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, f"the forked child: {os.waitstatus_to_exitcode(status)}"
proxy.close()
print("OK")
