"""Object storage: every path that may be a URL (``s3://bucket/key``) goes through this layer.

* :mod:`~lightning_lmdb.remote.urls`: what is a URL, how one is joined, and how it is printed (user info and query string
  redacted: a URL in a log, an error or ``info`` never carries a secret).
* :mod:`~lightning_lmdb.remote.fs`: the ``fsspec`` filesystem of a URL, made once per process (after a fork or spawn,
  never inherited), its storage options (credentials, ``endpoint_url``) kept in memory only, and the retry policy.
* :mod:`~lightning_lmdb.remote.objects`: the object operations the library needs, each one request or a bounded series
  of retried ones: list a prefix (size and ETag, no per-object HEAD), read an object or a byte range of it with an ETag
  precondition (``If-Match``), write a small object only if absent (``If-None-Match: *``), upload a file in parts.
* :mod:`~lightning_lmdb.remote.fastget`: the S3 ``GET`` s of the processes that fork nothing (a build's readers, the raw
  backend's loader workers) through ``obstore``, a third of ``s3fs``'s CPU per request.

S3 and S3-compatible servers (MinIO, Ceph) are what is tested, through ``s3fs``; other ``fsspec`` schemes (``gs://``,
``az://``) go through the same calls without the preconditions and are untested. A local path never reaches this layer:
it keeps the plain ``os`` code path. Installed with ``pip install "lightning_lmdb[cloud]"``.
"""
