"""Build: a source's scan, written into a database -- crash-safe, resumable, in parallel.

Contract: :func:`~lightning_lmdb.build.writer.build_lmdb` is the entry point (``lightning_lmdb.build_lmdb``);
it builds one file (``onefile``) or a sharded folder (``sharded``), with a pool of reader processes
(``readers``) that read, validate and encode each source file through :mod:`lightning_lmdb.codec`.
Writes only through :mod:`lightning_lmdb.store`.
"""
